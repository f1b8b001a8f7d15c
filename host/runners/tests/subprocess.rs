//! Subprocess mode: host interpreters (python3, node, bash, sh, ruby, and lua with the
//! cjson module must be on PATH; `scripts/test` installs them from Debian's packages).

mod common;

use common::*;
use heddle_core::Value;
use heddle_kernel::ErrorKind;
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn sub(code_key: &str, code: &str) -> Vec<(&'static str, Value)> {
    let key: &'static str = if code_key == "command" {
        "command"
    } else {
        "code"
    };
    vec![(key, Value::str(code)), ("mode", Value::str("subprocess"))]
}

fn with(
    mut base: Vec<(&'static str, Value)>,
    more: &[(&'static str, Value)],
) -> Vec<(&'static str, Value)> {
    base.extend(more.iter().cloned());
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "py",
        "code.python",
        props(&with(
            sub(
                "code",
                "print('hi')\nset_result({'double': [2 * v for v in xs], 'who': who})",
            ),
            &[("xs", json(json!([1, 2]))), ("who", Value::str("py"))],
        )),
    )
    .await;
    assert_eq!(r.value(), json!({"double": [2, 4], "who": "py"}));
    assert_eq!(r.stdout, vec!["hi"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "js",
        "code.javascript",
        props(&with(
            sub(
                "code",
                "console.error('warn'); set_result({ keys: Object.keys(obj), n: n * 2 });",
            ),
            &[
                ("obj", json(json!({"a": 1, "b": 2}))),
                ("n", Value::Int(21)),
            ],
        )),
    )
    .await;
    assert_eq!(r.value(), json!({"keys": ["a", "b"], "n": 42}));
    assert_eq!(r.stderr, vec!["warn"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruby_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "rb",
        "code.ruby",
        props(&with(
            sub(
                "code",
                "puts \"hi #{who}\"\n$stderr.puts 'warn'\nset_result({ 'double' => xs.map { |v| v * 2 }, 'n' => n + 1, 'keys' => inputs.keys.sort, 'none' => nothing })",
            ),
            &[
                ("xs", json(json!([1, 2]))),
                ("who", Value::str("rb")),
                ("n", Value::Int(41)),
                ("nothing", Value::Null),
            ],
        )),
    )
    .await;
    assert_eq!(
        r.value(),
        json!({"double": [2, 4], "n": 42, "keys": ["n", "nothing", "who", "xs"], "none": null})
    );
    assert_eq!(r.stdout, vec!["hi rb"]);
    assert_eq!(r.stderr, vec!["warn"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "lua",
        "code.lua",
        props(&with(
            sub(
                "code",
                "print('hi ' .. who)\nio.stderr:write('warn\\n')\nlocal d = {}\nfor i, v in ipairs(xs) do d[i] = v * 2 end\nset_result({ double = d, n = n + 1, half = n / 2, none = nothing == require('cjson').null })",
            ),
            &[
                ("xs", json(json!([1, 2]))),
                ("who", Value::str("lua")),
                ("n", Value::Int(41)),
                ("nothing", Value::Null),
            ],
        )),
    )
    .await;
    // Whole numbers stay integers (`n + 1` is 42, not 42.0); `null` is cjson.null, not nil.
    assert_eq!(
        r.value(),
        json!({"double": [2, 4], "n": 42, "half": 20.5, "none": true})
    );
    assert_eq!(r.stdout, vec!["hi lua"]);
    assert_eq!(r.stderr, vec!["warn"]);
}

/// An error in Ruby or Lua code fails the node with the interpreter's message, which
/// names the line of the user's code (not of the prelude around it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ruby_and_lua_errors_name_the_line_of_the_code() {
    for (ty, code, line) in [
        ("code.ruby", "x = 1\nraise 'boom'", "<code>:2"),
        ("code.lua", "local x = 1\nerror('boom')", "code:2"),
        ("code.lua", "local x = = 1", "code:1"),
    ] {
        let r = run_node(&subprocess_nodes(), "bad", ty, props(&sub("code", code))).await;
        let m = &r.error().message;
        assert!(m.starts_with("node bad: "), "{ty}: {m}");
        assert!(m.contains("exited with code 1"), "{ty}: {m}");
        assert!(m.contains(line), "{ty} names {line}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "sh",
        "code.bash",
        props(&with(
            sub(
                "code",
                "for i in 1 2 3; do echo line$i; done\nset_result \"[$a, \\\"$b\\\"]\"",
            ),
            &[("a", Value::Int(7)), ("b", Value::str("x"))],
        )),
    )
    .await;
    assert_eq!(r.value(), json!([7, "x"]));
    assert_eq!(r.stdout, vec!["line1", "line2", "line3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_command_round_trip() {
    let r = run_node(
        &subprocess_nodes(),
        "cmd",
        "code.shell",
        props(&with(
            sub("command", "echo \"$x\" | tr a-z A-Z"),
            &[("x", Value::str("loud"))],
        )),
    )
    .await;
    assert_eq!(r.value(), json!("LOUD"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonzero_exit_fails_with_code_and_stderr() {
    let r = run_node(
        &subprocess_nodes(),
        "fail",
        "code.bash",
        props(&sub("code", "echo 'it broke' >&2; exit 4")),
    )
    .await;
    let e = r.error();
    assert_eq!(e.signature.as_deref(), Some("code:exit:4"));
    assert!(e.message.contains("it broke"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("bg.pid");
    // A background child that would outlive its parent if only the parent were killed.
    let code = format!(
        "sleep 300 & echo $! > {}; echo started; wait",
        pidfile.display()
    );
    let r = run_node(
        &subprocess_nodes(),
        "slow",
        "code.bash",
        props(&with(
            sub("code", &code),
            &[("timeout_s", Value::Float(1.0))],
        )),
    )
    .await;
    assert_eq!(r.error().kind, ErrorKind::Deadline, "{:?}", r.result);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!process_alive(pid), "background process {pid} survived");
}

fn process_alive(pid: i32) -> bool {
    // A zombie is dead for our purposes (it is reaped by init, not us).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_terminates_the_process_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let code = format!("echo $$ > {}; echo running; sleep 300", pidfile.display());
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let r = run_node_with(
        &subprocess_nodes(),
        "cancel",
        "code.bash",
        props(&with(sub("code", &code), &[("timeout_s", Value::Int(100))])),
        cancel,
        move |l| {
            if l == "running" {
                trigger.cancel()
            }
        },
    )
    .await;
    assert_eq!(r.error().kind, ErrorKind::Cancelled, "{:?}", r.result);
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!process_alive(pid), "process {pid} survived the cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subprocess_mode_needs_the_operators_consent() {
    let r = run_node(
        &code_nodes(),
        "denied",
        "code.python",
        props(&sub("code", "print(1)")),
    )
    .await;
    assert!(
        r.error().message.contains("allow_subprocess"),
        "{}",
        r.error().message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_only_limits_are_refused_in_subprocess_mode() {
    let r = run_node(
        &subprocess_nodes(),
        "mem",
        "code.python",
        props(&with(
            sub("code", "print(1)"),
            &[("memory_mb", Value::Int(64))],
        )),
    )
    .await;
    let m = &r.error().message;
    assert!(
        m.contains("`memory_mb`") && m.contains("cannot be enforced"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subprocess_runs_are_logged_as_unsandboxed() {
    let r = run_node(
        &subprocess_nodes(),
        "log",
        "code.bash",
        props(&sub("code", "echo 1")),
    )
    .await;
    assert_eq!(r.value(), json!(1));
    assert!(
        r.logs.iter().any(|l| l.contains("no memory, network")),
        "{:?}",
        r.logs
    );
}

/// NaN and Infinity have no JSON form: handing one to set_result is an error naming the
/// node, in every language, not a string "NaN".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_json_numbers_in_set_result_are_errors_naming_the_node() {
    for (ty, key, code) in [
        ("code.python", "code", "set_result(float('nan'))"),
        ("code.python", "code", "set_result({'x': [float('inf')]})"),
        ("code.javascript", "code", "set_result(NaN)"),
        ("code.javascript", "code", "set_result({ x: [Infinity] })"),
        ("code.bash", "code", "set_result NaN"),
        ("code.ruby", "code", "set_result(0.0 / 0)"),
        (
            "code.ruby",
            "code",
            "set_result({ 'x' => [Float::INFINITY] })",
        ),
        ("code.lua", "code", "set_result(0/0)"),
        ("code.lua", "code", "set_result({ x = { math.huge } })"),
    ] {
        let r = run_node(&subprocess_nodes(), "nan", ty, props(&sub(key, code))).await;
        let m = &r.error().message;
        assert!(m.starts_with("node nan: "), "{ty} {code}: {m}");
        assert!(
            m.contains("NaN and Infinity"),
            "{ty} {code}: {m}\nstderr: {:?}",
            r.stderr
        );
    }
    // A printed `nan` is text the code wrote, and stays text.
    let r = run_node(
        &subprocess_nodes(),
        "printed",
        "code.python",
        props(&sub("code", "print(float('nan'))")),
    )
    .await;
    assert_eq!(r.value(), json!("nan"));
}

/// Who runs the tests, for the path of the scratch root.
fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    tempfile::tempfile().unwrap().metadata().unwrap().uid()
}

/// What a heddle killed with `kill -9` leaves in subprocess mode (a process carrying its
/// owner token, a scratch directory named after it) is removed by the sweep, and a live
/// heddle's is not.
#[test]
fn the_sweep_kills_and_removes_what_a_dead_owner_left() {
    let root = std::env::temp_dir().join(format!("heddle-code-{}", uid()));
    let run_once = heddle_runners::remove_orphan_processes().unwrap();
    let _ = run_once; // creates the root and clears anything older
    let me = heddle_runners::ProcessOwner::current().token();
    let (prefix, start) = me.rsplit_once('-').unwrap();
    // This pid with another start time: gone, its pid reused.
    let dead = format!("{prefix}-{}", start.parse::<u64>().unwrap() + 1);
    let dead_dir = root.join(format!("{dead}-abc123"));
    let live_dir = root.join(format!("{me}-def456"));
    std::fs::create_dir(&dead_dir).unwrap();
    std::fs::write(dead_dir.join("file"), "x").unwrap();
    std::fs::create_dir(&live_dir).unwrap();
    let spawn = |owner: &str| {
        std::process::Command::new("sleep")
            .arg("300")
            .env("HEDDLE_OWNER", owner)
            .spawn()
            .unwrap()
    };
    let mut orphan = spawn(&dead);
    let mut alive = spawn(&me);

    let swept = heddle_runners::remove_orphan_processes().unwrap();
    assert!(swept.processes >= 1, "{swept:?}");
    assert!(swept.directories >= 1, "{swept:?}");
    // Reaped here: killed by the sweep, so wait returns at once.
    let status = orphan.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    assert!(!dead_dir.exists());
    assert!(live_dir.exists());
    assert!(
        alive.try_wait().unwrap().is_none(),
        "a live owner's process was killed"
    );
    alive.kill().unwrap();
    alive.wait().unwrap();
    std::fs::remove_dir(&live_dir).unwrap();
}
