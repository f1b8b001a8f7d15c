//! Code nodes against a real Docker engine and the locally built runner images.
//! Skipped loudly without an engine; failing instead with HEDDLE_REQUIRE_DOCKER=1.

mod common;

use common::*;
use heddle_core::Value;
use heddle_kernel::ErrorKind;
use heddle_runners::{CodeNodes, ProcessOwner, RunnersConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

macro_rules! require_docker {
    () => {
        if !docker_ready().await {
            return;
        }
    };
}

async fn assert_no_leftovers(id: &str) {
    let left = containers_of(id).await;
    assert!(left.is_empty(), "containers left behind for {id}: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_round_trip_with_inputs_and_structured_result() {
    require_docker!();
    let id = node_id("py-round-trip");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[
            (
                "code",
                Value::str(
                    "print('hello from python')\n\
                     set_result({'sum': a + len(b['xs']), 'name': name.upper(), 'keys': sorted(inputs)})",
                ),
            ),
            ("a", Value::Int(40)),
            ("b", json(json!({"xs": [1, 2]}))),
            ("name", Value::str("ada")),
        ]),
    )
    .await;
    assert_eq!(
        r.value(),
        json!({"sum": 42, "name": "ADA", "keys": ["a", "b", "name"]})
    );
    assert_eq!(r.stdout, vec!["hello from python"]);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_round_trip_with_inputs_and_structured_result() {
    require_docker!();
    let id = node_id("js-round-trip");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.javascript",
        props(&[
            (
                "code",
                Value::str(
                    "console.log('hello from node');\n\
                     await new Promise((r) => setTimeout(r, 10));\n\
                     set_result({ total: items.reduce((s, x) => s + x, 0), flag: !cfg.off, input });",
                ),
            ),
            ("items", json(json!([1, 2, 3.5]))),
            ("cfg", json(json!({"off": false}))),
            ("input", Value::Null),
        ]),
    )
    .await;
    assert_eq!(
        r.value(),
        json!({"total": 6.5, "flag": true, "input": null})
    );
    assert_eq!(r.stdout, vec!["hello from node"]);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_round_trip_with_inputs_and_structured_result() {
    require_docker!();
    let id = node_id("bash-round-trip");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            (
                "code",
                Value::str(
                    "echo \"hi $who\" >&2\n\
                     echo \"list is $xs\"\n\
                     set_result \"{\\\"n\\\": $((n + 1)), \\\"who\\\": \\\"$who\\\"}\"",
                ),
            ),
            ("n", Value::Int(41)),
            ("who", Value::str("bash")),
            ("xs", json(json!([1, 2]))),
        ]),
    )
    .await;
    assert_eq!(r.value(), json!({"n": 42, "who": "bash"}));
    assert_eq!(r.stdout, vec!["list is [1,2]"]);
    assert_eq!(r.stderr, vec!["hi bash"]);
    assert_no_leftovers(&id).await;
}

/// Ruby and Lua run in their images under the same defaults as the other languages:
/// no network (only loopback), uid 1000, and the memory limit enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruby_and_lua_run_sandboxed_with_inputs_and_structured_results() {
    require_docker!();
    let cases = [
        (
            "code.ruby",
            "puts 'hello from ruby'\n\
             uid = File.read('/proc/self/status')[/^Uid:\\s+(\\d+)/, 1].to_i\n\
             set_result({ 'sum' => a + b['xs'].sum, 'uid' => uid, 'ifaces' => Dir.children('/sys/class/net').sort })",
            "x = 'x' * (300 * 1024 * 1024)\nputs x.size",
            "x = 'x' * (30 * 1024 * 1024)\nputs x.size",
            "hello from ruby",
        ),
        (
            "code.lua",
            "print('hello from lua')\n\
             local uid\n\
             for l in io.lines('/proc/self/status') do uid = uid or tonumber(l:match('^Uid:%s+(%d+)')) end\n\
             local ifaces = {}\n\
             for l in io.lines('/proc/net/dev') do local n = l:match('^%s*([%w]+):'); if n then ifaces[#ifaces + 1] = n end end\n\
             table.sort(ifaces)\n\
             local sum = a\n\
             for _, x in ipairs(b.xs) do sum = sum + x end\n\
             set_result({ sum = sum, uid = uid, ifaces = ifaces })",
            "local x = string.rep('x', 300 * 1024 * 1024)\nprint(#x)",
            "local x = string.rep('x', 30 * 1024 * 1024)\nprint(#x)",
            "hello from lua",
        ),
    ];
    for (ty, code, too_big, fits, said) in cases {
        let id = node_id(&ty.replace('.', "-"));
        let r = run_node(
            &code_nodes(),
            &id,
            ty,
            props(&[
                ("code", Value::str(code)),
                ("a", Value::Int(39)),
                ("b", json(json!({"xs": [1, 2]}))),
            ]),
        )
        .await;
        assert_eq!(
            r.value(),
            json!({"sum": 42, "uid": 1000, "ifaces": ["lo"]}),
            "{ty}"
        );
        assert_eq!(r.stdout, vec![said], "{ty}");
        assert_no_leftovers(&id).await;
        let r = run_node(
            &code_nodes(),
            &id,
            ty,
            props(&[("code", Value::str(too_big)), ("memory_mb", Value::Int(64))]),
        )
        .await;
        let e = r.error();
        assert_eq!(e.kind, ErrorKind::MemoryLimit, "{ty}: {e:?}");
        assert!(e.message.contains("64 MiB"), "{ty}: {}", e.message);
        assert_no_leftovers(&id).await;
        // The same allocation, smaller, fits: the failure above is the limit's.
        let r = run_node(
            &code_nodes(),
            &id,
            ty,
            props(&[("code", Value::str(fits)), ("memory_mb", Value::Int(256))]),
        )
        .await;
        assert_eq!(r.value(), json!(30 * 1024 * 1024), "{ty}");
        assert_no_leftovers(&id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_command_result_is_the_last_stdout_line() {
    require_docker!();
    let id = node_id("shell-round-trip");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.shell",
        props(&[
            (
                "command",
                Value::str("echo first; printf '{\"greeting\": \"%s\"}\\n' \"$g\""),
            ),
            ("g", Value::str("hello world")),
        ]),
    )
    .await;
    assert_eq!(r.value(), json!({"greeting": "hello world"}));
    assert_eq!(r.stdout.len(), 2);
    // A last line that is not JSON is the result as text.
    let r = run_node(
        &code_nodes(),
        &id,
        "code.shell",
        props(&[("command", Value::str("echo plain text"))]),
    )
    .await;
    assert_eq!(r.value(), json!("plain text"));
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_kills_and_reports() {
    require_docker!();
    let id = node_id("time-limit");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            ("code", Value::str("echo started; sleep 60; echo never")),
            ("timeout_s", Value::Float(1.5)),
        ]),
    )
    .await;
    let e = r.error();
    assert_eq!(e.kind, ErrorKind::Deadline, "{e:?}");
    assert_eq!(e.signature.as_deref(), Some("code:timeout"));
    assert!(e.message.contains("time limit"), "{}", e.message);
    assert_eq!(r.stdout, vec!["started"]);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_kills_and_reports() {
    require_docker!();
    let id = node_id("memory-limit");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[
            (
                "code",
                Value::str("x = b'x' * (300 * 1024 * 1024)\nprint(len(x))"),
            ),
            ("memory_mb", Value::Int(64)),
        ]),
    )
    .await;
    let e = r.error();
    assert_eq!(e.kind, ErrorKind::MemoryLimit, "{e:?}");
    assert!(e.message.contains("64 MiB"), "{}", e.message);
    assert_no_leftovers(&id).await;
    // The same allocation fits in a larger limit, so the failure above is the limit's.
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[
            (
                "code",
                Value::str("x = b'x' * (30 * 1024 * 1024)\nprint(len(x))"),
            ),
            ("memory_mb", Value::Int(256)),
        ]),
    )
    .await;
    assert_eq!(r.value(), json!(31457280));
}

const CONNECT: &str = "import os, socket\n\
ifaces = sorted(os.listdir('/sys/class/net'))\n\
try:\n    socket.create_connection(('172.17.0.1', 9), timeout=3)\n    err = None\n\
except OSError as e:\n    err = e.errno\n\
set_result({'ifaces': ifaces, 'errno': err})";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_is_off_by_default() {
    require_docker!();
    let id = node_id("network-off");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[("code", Value::str(CONNECT))]),
    )
    .await;
    // Only loopback, and connecting to the host's bridge address is unreachable (101).
    assert_eq!(r.value(), json!({"ifaces": ["lo"], "errno": 101}));
    // Control: with the network on, the same attempt reaches the host (refused or
    // timed out, but not "unreachable"), so the check above can fail.
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[
            ("code", Value::str(CONNECT)),
            ("network", Value::Bool(true)),
        ]),
    )
    .await;
    let v = r.value();
    assert_ne!(v["errno"], json!(101), "{v}");
    assert!(v["ifaces"].as_array().unwrap().len() > 1, "{v}");
    assert!(
        r.logs.iter().any(|l| l.contains("network enabled")),
        "loosening the sandbox is logged: {:?}",
        r.logs
    );
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_uid_1000_without_capabilities() {
    require_docker!();
    let id = node_id("uid");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[(
            "code",
            Value::str(
                "import os\n\
                 caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))]\n\
                 set_result({'uid': os.getuid(), 'gid': os.getgid(), 'caps': caps})",
            ),
        )]),
    )
    .await;
    assert_eq!(
        r.value(),
        json!({"uid": 1000, "gid": 1000, "caps": ["0000000000000000", "0000000000000000", "1"]})
    );
    assert_no_leftovers(&id).await;
}

fn workspace_nodes(root: &std::path::Path) -> CodeNodes {
    CodeNodes::new(RunnersConfig {
        workspace_roots: vec![root.to_path_buf()],
        ..RunnersConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_workspace_cannot_be_written() {
    require_docker!();
    let id = node_id("ro-workspace");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "from the host\n").unwrap();
    // World-writable, so the writable case below shows the read-only flag is what stops uid 1000.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let nodes = workspace_nodes(dir.path());
    let code = "cat /workspace/in.txt; echo out > /workspace/out.txt && echo wrote";
    let ws = Value::str(dir.path().to_str().unwrap());
    let r = run_node(
        &nodes,
        &id,
        "code.bash",
        props(&[
            ("code", Value::str(code)),
            ("workspace", ws.clone()),
            ("workspace_read_only", Value::Bool(true)),
        ]),
    )
    .await;
    let e = r.error();
    assert!(e.message.contains("Read-only file system"), "{}", e.message);
    assert_eq!(e.signature.as_deref(), Some("code:exit:1"));
    assert_eq!(r.stdout, vec!["from the host"]);
    assert!(!dir.path().join("out.txt").exists());
    let r = run_node(
        &nodes,
        &id,
        "code.bash",
        props(&[("code", Value::str(code)), ("workspace", ws)]),
    )
    .await;
    assert_eq!(r.value(), json!("wrote"));
    assert!(dir.path().join("out.txt").exists());
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_outside_the_operator_roots_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let r = run_node(
        &workspace_nodes(dir.path()),
        "ws",
        "code.bash",
        props(&[
            ("code", Value::str("true")),
            ("workspace", Value::str(other.path().to_str().unwrap())),
        ]),
    )
    .await;
    let e = r.error();
    assert!(e.message.contains("workspace_roots"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_root_keeps_tmp_writable() {
    require_docker!();
    let id = node_id("ro-root");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            (
                "code",
                Value::str(
                    "echo x > /tmp/ok && echo tmp-ok; echo y > /home/f 2>/dev/null || echo root-ro",
                ),
            ),
            ("read_only_root", Value::Bool(true)),
            ("user", Value::str("")),
        ]),
    )
    .await;
    // Even as root (user ""), the root filesystem refuses writes.
    assert_eq!(r.stdout, vec!["tmp-ok", "root-ro"]);
    assert!(
        r.logs.iter().any(|l| l.contains("image's user")),
        "{:?}",
        r.logs
    );
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_flood_is_capped() {
    require_docker!();
    let id = node_id("flood");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            (
                "code",
                Value::str("yes flood | head -n 200000; echo done >&2"),
            ),
            ("output_limit_bytes", Value::Int(10_000)),
        ]),
    )
    .await;
    assert!(r.result.is_ok(), "{:?}", r.result);
    let forwarded: usize = r.stdout.iter().chain(&r.stderr).map(|l| l.len() + 1).sum();
    let marker = r.stderr.last().expect("a truncation marker");
    assert!(marker.contains("output limit of 10000 bytes"), "{marker}");
    assert!(
        forwarded <= 10_000 + marker.len() + 1,
        "{forwarded} bytes forwarded"
    );
    assert!(r.stdout.len() < 200_000 && !r.stdout.is_empty());
    assert!(r.logs.iter().any(|l| l.contains("dropped")), "{:?}", r.logs);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_run_leaves_no_container() {
    require_docker!();
    let id = node_id("cancel");
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let probe_id = id.clone();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
    let mut seen_tx = Some(seen_tx);
    let nodes = code_nodes();
    let run = run_node_with(
        &nodes,
        &id,
        "code.python",
        props(&[
            (
                "code",
                Value::str("import time\nprint('running', flush=True)\ntime.sleep(60)"),
            ),
            ("timeout_s", Value::Int(120)),
        ]),
        cancel,
        move |line| {
            if line == "running" {
                let _ = seen_tx.take().map(|tx| tx.send(vec![line.to_string()]));
            }
        },
    );
    let watcher = async move {
        // The container exists while the code runs...
        seen_rx.await.unwrap();
        let during = containers_of(&probe_id).await;
        trigger.cancel();
        during
    };
    let (r, during) = tokio::join!(run, watcher);
    assert_eq!(during.len(), 1, "one container while running: {during:?}");
    assert_eq!(r.error().kind, ErrorKind::Cancelled, "{:?}", r.result);
    // ...and none once the cancelled invocation has returned.
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_stream_while_the_code_runs() {
    require_docker!();
    let id = node_id("streaming");
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    // Cancel on the first line: if lines were only delivered at exit, the code (which
    // sleeps 60 s after it) would hit its 20 s time limit instead of being cancelled.
    let r = run_node_with(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            ("code", Value::str("echo first; sleep 60; echo second")),
            ("timeout_s", Value::Int(20)),
        ]),
        cancel,
        move |_| trigger.cancel(),
    )
    .await;
    assert_eq!(r.stdout, vec!["first"]);
    assert_eq!(r.error().kind, ErrorKind::Cancelled, "{:?}", r.result);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_code_reports_exit_code_and_stderr_tail() {
    require_docker!();
    let id = node_id("exit-code");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[(
            "code",
            Value::str("import sys\nprint('about to fail')\nprint('boom: bad input', file=sys.stderr)\nsys.exit(3)"),
        )]),
    )
    .await;
    let e = r.error();
    assert_eq!(e.kind, ErrorKind::Node);
    assert_eq!(e.signature.as_deref(), Some("code:exit:3"));
    assert!(e.message.contains("exited with code 3"), "{}", e.message);
    assert!(e.message.contains("boom: bad input"), "{}", e.message);
    assert!(e.message.contains(&id), "names the node: {}", e.message);

    let r = run_node(
        &code_nodes(),
        &id,
        "code.javascript",
        props(&[("code", Value::str("const x = ;"))]),
    )
    .await;
    let e = r.error();
    assert!(e.message.contains("SyntaxError"), "{}", e.message);
    assert_eq!(e.signature.as_deref(), Some("code:exit:1"));

    let r = run_node(
        &code_nodes(),
        &id,
        "code.python",
        props(&[("code", Value::str("def broken(:\n  pass"))]),
    )
    .await;
    let e = r.error();
    assert!(e.message.contains("SyntaxError"), "{}", e.message);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_image_names_the_image_and_the_build_command() {
    require_docker!();
    let id = node_id("missing-image");
    let r = run_node(
        &code_nodes(),
        &id,
        "code.bash",
        props(&[
            ("code", Value::str("true")),
            ("image", Value::str("heddle/not-built:0")),
        ]),
    )
    .await;
    let e = r.error();
    assert_eq!(e.kind, ErrorKind::Host);
    assert_eq!(e.signature.as_deref(), Some("code:missing-image"));
    assert!(e.message.contains("heddle/not-built:0"), "{}", e.message);
    assert!(e.message.contains("heddle images build"), "{}", e.message);
    assert_no_leftovers(&id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_engine_says_how_to_start_one_or_use_subprocess() {
    // Needs no engine: points at a socket that does not exist.
    let nodes = CodeNodes::new(RunnersConfig {
        docker_host: Some("unix:///nonexistent/heddle-test/docker.sock".into()),
        ..RunnersConfig::default()
    });
    let r = run_node(
        &nodes,
        "no-engine",
        "code.bash",
        props(&[("code", Value::str("true"))]),
    )
    .await;
    let e = r.error();
    assert_eq!(e.signature.as_deref(), Some("code:no-engine"));
    assert!(e.message.contains("no Docker engine"), "{}", e.message);
    assert!(e.message.contains("dockerd"), "{}", e.message);
    assert!(e.message.contains("subprocess"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_properties_are_refused_at_create_naming_node_and_property() {
    let nodes = code_nodes();
    let r = run_node(&nodes, "n1", "code.python", props(&[])).await;
    assert!(
        r.error()
            .message
            .contains("node n1: property `code` is required")
    );
    let r = run_node(
        &nodes,
        "n2",
        "code.python",
        props(&[("code", Value::str("")), ("timeout_s", Value::Int(-1))]),
    )
    .await;
    assert!(
        r.error().message.contains("`timeout_s`"),
        "{}",
        r.error().message
    );
    let r = run_node(
        &nodes,
        "n3",
        "code.python",
        props(&[("code", Value::str("")), ("mode", Value::str("vm"))]),
    )
    .await;
    assert!(
        r.error().message.contains("`mode`"),
        "{}",
        r.error().message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_images_again_skips_the_present_ones() {
    require_docker!();
    let lines = std::sync::Mutex::new(Vec::new());
    let progress = |l: &str| lines.lock().unwrap().push(l.to_string());
    let outcomes = heddle_runners::build_images(
        &RunnersConfig::default(),
        &heddle_runners::BuildOptions::default(),
        &progress,
    )
    .await
    .expect("images present");
    assert_eq!(outcomes.len(), 5);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, heddle_runners::ImageOutcome::Present { .. })),
        "{outcomes:?}"
    );
    assert!(lines.lock().unwrap().iter().all(|l| l.contains("present")));
}

/// Creates a stopped container labelled as ours, owned by `owner` (a token).
async fn fake_leftover(docker: &bollard::Docker, node: &str, owner: &str) {
    use bollard::models::ContainerCreateBody;
    let labels = std::collections::HashMap::from([
        (heddle_runners::LABEL_RUNNER.to_string(), "1".to_string()),
        (heddle_runners::LABEL_NODE.to_string(), node.to_string()),
        (heddle_runners::LABEL_OWNER.to_string(), owner.to_string()),
    ]);
    docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            ContainerCreateBody {
                image: Some(RunnersConfig::default().images.bash),
                cmd: Some(vec!["true".into()]),
                labels: Some(labels),
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_are_found_and_removed_by_label() {
    require_docker!();
    let docker = heddle_runners::connect_docker(None).await.unwrap();
    let id = node_id("leftover");
    // Every heddle process on this machine sweeps the containers of dead owners of this
    // host when its first runner connects (other tests in this binary, other suites on
    // the same engine), so a dead owner's container may vanish at any moment: owner
    // scoping is checked with owners of other hosts, which no sweep judges. The tokens
    // carry this process's pid so a parallel run of this test cannot touch them.
    let foreign = |n: u32| format!("0123456789abcdef-0123456789ab-{}-{n}", std::process::id());
    let (mine, theirs) = (foreign(1), foreign(2));
    fake_leftover(&docker, &format!("{id}-x"), &mine).await;
    fake_leftover(&docker, &format!("{id}-y"), &theirs).await;
    let removed = heddle_runners::remove_leftovers(&docker, Some(&mine))
        .await
        .unwrap();
    assert_eq!(removed, 1, "only the named owner's container");
    assert_no_leftovers(&format!("{id}-x")).await;
    assert_eq!(containers_of(&format!("{id}-y")).await.len(), 1);

    // This host and boot, this pid but another start time: a process that is gone and
    // whose pid was reused (by this test process).
    let me = ProcessOwner::current().token();
    let (prefix, start) = me.rsplit_once('-').unwrap();
    let dead_owner = format!("{prefix}-{}", start.parse::<u64>().unwrap() + 1);
    fake_leftover(&docker, &format!("{id}-b"), &dead_owner).await;

    // The sweep removes a dead owner's containers, not a live one's nor another host's.
    let live_id = format!("{id}-live");
    let nodes = code_nodes();
    let cancel = CancellationToken::new();
    let live = run_node_with(
        &nodes,
        &live_id,
        "code.bash",
        props(&[
            ("code", Value::str("echo up; sleep 30")),
            ("timeout_s", Value::Int(60)),
        ]),
        cancel.clone(),
        |_| {},
    );
    let sweep = async {
        while containers_of(&live_id).await.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // The node's own first connection swept already; a second sweep finds the
        // live container again and must leave it.
        heddle_runners::remove_orphans(&docker).await.unwrap();
        let live_left = containers_of(&live_id).await.len();
        cancel.cancel();
        live_left
    };
    let (live, live_left) = tokio::join!(live, sweep);
    assert_no_leftovers(&format!("{id}-b")).await;
    assert_eq!(live_left, 1, "a live owner's container is not an orphan");
    assert_eq!(
        containers_of(&format!("{id}-y")).await.len(),
        1,
        "another host's container is not judged"
    );
    heddle_runners::remove_leftovers(&docker, Some(&theirs))
        .await
        .unwrap();
    assert_eq!(live.error().kind, ErrorKind::Cancelled);
    assert_no_leftovers(&live_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn author_limits_narrow_the_workspace_to_read_only() {
    require_docker!();
    let id = node_id("limits-files");
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let limits = heddle_core::NodeLimits {
        files: Some(heddle_core::graph::AccessLevel::Read),
        ..Default::default()
    };
    let r = run_node_full(
        &workspace_nodes(dir.path()),
        &id,
        "code.bash",
        props(&[
            ("code", Value::str("echo x > /workspace/f")),
            ("workspace", Value::str(dir.path().to_str().unwrap())),
        ]),
        Some(&limits),
        CancellationToken::new(),
        |_| {},
    )
    .await;
    let e = r.error();
    assert!(e.message.contains("Read-only file system"), "{}", e.message);
    assert_no_leftovers(&id).await;
}

/// A caller that goes away while its container is being set up (a node's time limit or
/// a cancel dropping the invocation between the container's creation and its start)
/// leaves nothing behind: the start finishes on its own and its driver removes the
/// container, which the tracker waits for. Deterministic: the start is polled one step
/// at a time and dropped as soon as its container exists, before it could have been
/// attached and started (each of those is another round trip to the engine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_dropped_while_the_container_is_set_up_leaves_no_container() {
    require_docker!();
    let id = node_id("dropped-start");
    let mut spec = heddle_runners::RunSpec::new(
        heddle_runners::Mode::Docker,
        RunnersConfig::default().images.bash,
        vec!["sleep".into(), "3600".into()],
    );
    spec.labels = vec![(heddle_runners::LABEL_NODE.to_string(), id.clone())];
    spec.name_hint = id.clone();
    let runner = heddle_runners::Runner::default();
    // Connected first: the drop below is meant to land in the container's set-up.
    runner.docker().await.unwrap();
    let tracker = tokio_util::task::TaskTracker::new();
    let mut start = Box::pin(runner.start_tracked(spec, &tracker));
    // Dropped once its container exists (or once it returned: with the start a task
    // of its own, it may get that far between two looks; the `Running` is dropped then).
    let mut settled = false;
    for _ in 0..10_000 {
        if futures_util::poll!(start.as_mut()).is_ready() || !containers_of(&id).await.is_empty() {
            settled = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(settled, "the container was never created");
    drop(start);
    tracker.close();
    tracker.wait().await;
    assert_no_leftovers(&id).await;
}
