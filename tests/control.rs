//! Controllers and controlled nodes through the real binary (seed 002, "Control
//! events"): `heddle.run_each` runs a controlled node once per item with every event in
//! flight at once and gets the replies back in order; bad wiring is refused before the
//! run and bad overrides fail by name; a durable run killed while the controller waits
//! for replies resumes with the replies recorded before the crash, not run again.

mod support;

use support::store::{OK, PAUSED, StoreDir, expect, report, text};
use support::{INVALID, heddle_in, stderr, write};

/// Five items; `e` (controlled, `heddle.eval`) multiplies each by ten; its replies are
/// collected by `each`, and each value it produces also goes to output `seen`.
const RUN_EACH: &str = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "items", "type": "heddle.constant", "properties": {"value": [1, 2, 3, 4, 5]}},
    {"id": "each", "type": "heddle.run_each", "properties": {"property": "value"}},
    {"id": "e", "type": "heddle.eval", "properties": {"expression": "value * 10"}},
    {"id": "results", "type": "heddle.output"},
    {"id": "seen", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "items", "sourceHandle": "value", "target": "each", "targetHandle": "items"},
    {"source": "each", "sourceHandle": "__control__", "target": "e", "targetHandle": "__control__", "edge_type": "control"},
    {"source": "each", "sourceHandle": "results", "target": "results", "targetHandle": "value"},
    {"source": "e", "sourceHandle": "result", "target": "seen", "targetHandle": "value"}
  ]
}"#;

#[test]
fn run_each_gets_every_reply_in_order_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "g.json", RUN_EACH);
    let o = heddle_in(dir.path(), &["run", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    assert_eq!(
        r["outputs"]["results"],
        serde_json::json!([[10, 20, 30, 40, 50]])
    );
    assert_eq!(
        r["outputs"]["seen"],
        serde_json::json!([10, 20, 30, 40, 50])
    );
}

#[test]
fn a_control_edge_into_a_node_that_is_not_controlled_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        &RUN_EACH.replace(
            "\"heddle.eval\", \"properties\": {\"expression\": \"value * 10\"}",
            "\"heddle.passthrough\", \"properties\": {}",
        ),
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect(&o, INVALID);
    let err = stderr(&o);
    assert!(
        err.contains("not a controlled node") && err.contains("__control__") && err.contains('e'),
        "{err}"
    );
}

#[test]
fn an_override_of_a_property_the_target_lacks_fails_the_run_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "g.json",
        &RUN_EACH.replace("{\"property\": \"value\"}", "{\"property\": \"colour\"}"),
    );
    let o = heddle_in(dir.path(), &["run", "g.json"]);
    expect(&o, support::FAILED);
    let err = format!("{}{}", support::stdout(&o), stderr(&o));
    assert!(
        err.contains("`colour`") && err.contains("node e") && err.contains("__control__"),
        "{err}"
    );
}

#[test]
fn a_recovered_controller_gets_the_recorded_replies_and_the_target_runs_no_event_again() {
    // The run pauses at a gate after `each` collected its replies; approving it runs on
    // in a new process, which recomputes `each` (a deterministic built-in): it sends
    // its five events again, and the journal answers each with the reply recorded
    // before the pause, without `e` running again.
    let graph = RUN_EACH
        .replace(
            r#"{"id": "results", "type": "heddle.output"},"#,
            r#"{"id": "results", "type": "heddle.output"},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "ship"}},"#,
        )
        .replace(
            r#"{"source": "each", "sourceHandle": "results", "target": "results", "targetHandle": "value"}"#,
            r#"{"source": "each", "sourceHandle": "results", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "results", "targetHandle": "value"}"#,
        );
    let env = StoreDir::with_graph(&graph);
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, PAUSED);
    let id = support::store::run_id(&o);
    assert_eq!(env.records("completed", "e").len(), 5, "{}", text(&o));
    let o = env.heddle(&["runs", "approve", &id, "ship", "--json"]);
    expect(&o, OK);
    assert_eq!(
        report(&o)["outputs"]["results"],
        serde_json::json!([[10, 20, 30, 40, 50]]),
        "{}",
        text(&o)
    );
    assert_eq!(
        env.records("completed", "e").len(),
        5,
        "a recorded reply was run again"
    );
}

// ----- a WASM controller driving a WASM controlled node (heddle:node 0.2) ----------

#[test]
fn a_wasm_controller_drives_a_wasm_controlled_node_and_gets_its_replies_in_order() {
    let env = StoreDir::with_control_nodes();
    let o = env.heddle(&["nodes", "demo"]);
    expect(&o, OK);
    let listing = support::stdout(&o);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("demo.shout") && l.contains("controlled")),
        "{listing}"
    );
    let o = env.heddle(&["run", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    let want = serde_json::json!(["HELLO?", "CONTROLLED?", "NODES?"]);
    assert_eq!(r["outputs"]["words"], serde_json::json!([want]));
    assert_eq!(r["outputs"]["shouted"], want);
    // The controller got its context: the one node it drives.
    let o = env.heddle(&[
        "run",
        "--json",
        "g.json",
        "--input",
        "sentence=one two three four five six seven eight",
    ]);
    expect(&o, OK);
    assert_eq!(
        report(&o)["outputs"]["words"],
        serde_json::json!([[
            "ONE?", "TWO?", "THREE?", "FOUR?", "FIVE?", "SIX?", "SEVEN?", "EIGHT?"
        ]])
    );
}

#[test]
fn a_wasm_controller_killed_mid_run_resumes_with_the_recorded_replies() {
    let env = StoreDir::with_control_nodes();
    // `shout` is not retry-safe: each reply is on disk before the controller sees it.
    // The process dies right after the second, while `each` waits for the third.
    let id = env.crash("after-result:shout:2", &[]);
    assert_eq!(env.records("completed", "shout").len(), 2);
    assert!(env.records("completed", "each").is_empty());
    let o = env.heddle(&["runs", "resume", &id, "--json"]);
    expect(&o, OK);
    let want = serde_json::json!(["HELLO?", "CONTROLLED?", "NODES?"]);
    assert_eq!(
        report(&o)["outputs"]["words"],
        serde_json::json!([want]),
        "{}",
        text(&o)
    );
    // `each` ran again and sent its three events; the first two were answered from the
    // journal, only the third ran.
    let shout = env.records("completed", "shout");
    assert_eq!(shout.len(), 3, "{shout:#?}");
    assert_eq!(env.records("started", "shout").len(), 3);
}

#[test]
fn two_controllers_of_one_node_each_get_their_own_recorded_replies_on_recovery() {
    // Both controllers run again after the gate; their events reach `e` interleaved in
    // whatever order the two tasks run, and each still gets the replies recorded for its
    // own events (a controlled node's invocations are numbered per controller).
    let graph = r#"{
  "format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "small", "type": "heddle.constant", "properties": {"value": [1, 2, 3, 4]}},
    {"id": "large", "type": "heddle.constant", "properties": {"value": [100, 200, 300, 400]}},
    {"id": "a", "type": "heddle.run_each", "properties": {"property": "value"}},
    {"id": "b", "type": "heddle.run_each", "properties": {"property": "value"}},
    {"id": "e", "type": "heddle.eval", "properties": {"expression": "value * 10"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "ship"}},
    {"id": "a_out", "type": "heddle.output"},
    {"id": "b_out", "type": "heddle.output"}
  ],
  "edges": [
    {"source": "small", "sourceHandle": "value", "target": "a", "targetHandle": "items"},
    {"source": "large", "sourceHandle": "value", "target": "b", "targetHandle": "items"},
    {"source": "a", "sourceHandle": "__control__", "target": "e", "targetHandle": "__control__", "edge_type": "control"},
    {"source": "b", "sourceHandle": "__control__", "target": "e", "targetHandle": "__control__", "edge_type": "control"},
    {"source": "a", "sourceHandle": "results", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "a_out", "targetHandle": "value"},
    {"source": "b", "sourceHandle": "results", "target": "b_out", "targetHandle": "value"}
  ]
}"#;
    let env = StoreDir::with_graph(graph);
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, PAUSED);
    let id = support::store::run_id(&o);
    assert_eq!(env.records("completed", "e").len(), 8, "{}", text(&o));
    let o = env.heddle(&["runs", "approve", &id, "ship", "--json"]);
    expect(&o, OK);
    let r = report(&o);
    assert_eq!(
        r["outputs"]["a_out"],
        serde_json::json!([[10, 20, 30, 40]]),
        "{}",
        text(&o)
    );
    assert_eq!(
        r["outputs"]["b_out"],
        serde_json::json!([[1000, 2000, 3000, 4000]]),
        "{}",
        text(&o)
    );
    assert_eq!(
        env.records("completed", "e").len(),
        8,
        "a recorded reply was run again"
    );
}

#[test]
fn a_recorded_wasm_controller_sends_its_recorded_events_again_and_the_target_replays_them() {
    // A gate after the controller: when the run pauses, `each` (journaled, a WASM node)
    // has its result on disk with the three events it sent. Approved, the run goes on
    // in a new process that carries that result out instead of running `each`: the
    // recorded events go to `shout` again, which replays its recorded replies, so its
    // values reach `shouted` without running again.
    let env = StoreDir::with_control_nodes();
    let graph = std::fs::read_to_string(env.path().join("g.json"))
        .unwrap()
        .replace(
            r#"{"id": "words", "type": "heddle.output"},"#,
            r#"{"id": "words", "type": "heddle.output"},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "ship"}},"#,
        )
        .replace(
            r#"{"source": "each", "sourceHandle": "words", "target": "words", "targetHandle": "value"}"#,
            r#"{"source": "each", "sourceHandle": "words", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "words", "targetHandle": "value"}"#,
        );
    std::fs::write(env.path().join("g.json"), graph).unwrap();
    let o = env.heddle(&["run", "--durable", "g.json"]);
    expect(&o, PAUSED);
    let id = support::store::run_id(&o);
    assert_eq!(env.records("completed", "each").len(), 1, "{}", text(&o));
    assert_eq!(env.records("completed", "shout").len(), 3);
    let o = env.heddle(&["runs", "approve", &id, "ship", "--json"]);
    expect(&o, OK);
    let r = report(&o);
    let want = serde_json::json!(["HELLO?", "CONTROLLED?", "NODES?"]);
    assert_eq!(
        r["outputs"]["words"],
        serde_json::json!([want]),
        "{}",
        text(&o)
    );
    assert_eq!(r["outputs"]["shouted"], want, "{}", text(&o));
    assert_eq!(env.records("started", "shout").len(), 3, "shout ran again");
    assert_eq!(env.records("completed", "shout").len(), 3);
}

/// A fan-out of a WASM controller (`demo.each_word` declares 16 invocations at once)
/// driving a WASM target through an instance pool of four slots. A controller holds its
/// slot while it waits for replies, so if the controller's invocations took every slot
/// the target could never run: the run hung for good before controllers got a leave of
/// their own (at most half the pool for controllers whose targets control nothing).
/// `[run] node_timeout_ms` turns a regression into a failure instead of a hang.
#[test]
fn a_fan_out_of_wasm_controllers_wider_than_the_pool_still_gets_its_replies() {
    const ITEMS: usize = 12;
    let sentences: Vec<String> = (0..ITEMS).map(|i| format!("a{i} b{i} c{i}")).collect();
    let graph = serde_json::json!({"format": "heddle.graph", "version": 1,
    "nodes": [
        {"id": "list", "type": "heddle.constant", "properties": {"value": sentences}},
        {"id": "fe", "type": "heddle.foreach"},
        {"id": "each", "type": "demo.each_word"},
        {"id": "shout", "type": "demo.shout"},
        {"id": "col", "type": "heddle.collect"},
        {"id": "words", "type": "heddle.output"}
    ],
    "edges": [
        {"source": "list", "sourceHandle": "value", "target": "fe", "targetHandle": "list"},
        {"source": "fe", "sourceHandle": "item", "target": "each", "targetHandle": "sentence"},
        {"source": "each", "sourceHandle": "__control__", "target": "shout",
         "targetHandle": "__control__", "edge_type": "control"},
        {"source": "each", "sourceHandle": "words", "target": "col", "targetHandle": "item"},
        {"source": "col", "sourceHandle": "list", "target": "words", "targetHandle": "value"}
    ]});
    let env = StoreDir::with_control_nodes()
        .with_config("\n[wasm]\npool_instances = 4\n\n[run]\nnode_timeout_ms = 60000\n");
    write(env.path(), "fan.json", &graph.to_string());
    let o = env.heddle(&["run", "--json", "fan.json"]);
    expect(&o, OK);
    let want: Vec<Vec<String>> = (0..ITEMS)
        .map(|i| vec![format!("A{i}!"), format!("B{i}!"), format!("C{i}!")])
        .collect();
    assert_eq!(
        report(&o)["outputs"]["words"],
        serde_json::json!([want]),
        "{}",
        text(&o)
    );
}

// ----- controllers and controlled nodes in Python, JavaScript and C ----------------

/// The three SDK examples built as a user builds them (`heddle package build`, against
/// `heddle:node@0.2.0`), once per test process; their package folders.
fn sdk_examples() -> &'static [std::path::PathBuf] {
    static DIRS: std::sync::OnceLock<Vec<std::path::PathBuf>> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        [
            "sdk/python/examples/textstats",
            "sdk/js/examples/jsonkit",
            "sdk/c/examples/cstrings",
        ]
        .into_iter()
        .map(|rel| {
            let src = support::root().join(rel);
            let out = support::root()
                .join("target/heddle-test-cache/control-languages")
                .join(src.file_name().unwrap());
            let o = support::heddle(&[
                "package",
                "build",
                src.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ]);
            expect(&o, OK);
            out
        })
        .collect()
    })
}

/// A directory with the three SDK examples installed and `examples/control-languages`
/// as `g.json`, changed by `edit`.
fn with_sdk_examples(edit: impl Fn(String) -> String) -> StoreDir {
    let graph =
        std::fs::read_to_string(support::root().join("examples/control-languages/graph.json"))
            .unwrap();
    let dists: Vec<&std::path::Path> = sdk_examples().iter().map(|d| d.as_path()).collect();
    StoreDir::with_packages(&edit(graph), &dists)
}

#[test]
fn python_javascript_and_c_controllers_drive_controlled_nodes_of_another_language_in_order() {
    let env = with_sdk_examples(|g| g);
    // `heddle nodes` shows which node types are controlled.
    for (prefix, controlled, controller) in [
        ("textstats.", "textstats.title_case", "textstats.each_word"),
        ("jsonkit.", "jsonkit.wrap", "jsonkit.each_item"),
        ("cstrings.", "cstrings.pad", "cstrings.each_word"),
    ] {
        let o = env.heddle(&["nodes", prefix]);
        expect(&o, OK);
        let listing = support::stdout(&o);
        let line = |ty: &str| {
            listing
                .lines()
                .find(|l| l.starts_with(&format!("{ty} ")) || l == &ty)
                .unwrap_or_else(|| panic!("{ty} not listed:\n{listing}"))
                .to_string()
        };
        assert!(line(controlled).contains("controlled"), "{listing}");
        assert!(!line(controller).contains("controlled"), "{listing}");
    }
    let o = env.heddle(&["run", "--json", "g.json"]);
    expect(&o, OK);
    let r = report(&o);
    assert_eq!(
        r["outputs"]["padded"],
        serde_json::json!([["hello...", "controlled", "nodes..."]]),
        "{}",
        text(&o)
    );
    assert_eq!(
        r["outputs"]["titled"],
        serde_json::json!([["Hello...!", "Controlled!", "Nodes...!"]])
    );
    assert_eq!(
        r["outputs"]["wrapped"],
        serde_json::json!([[{"word": "hello"}, {"word": "controlled"}, {"word": "nodes"}]])
    );
    // Eight events in flight at once per controller, every reply where its event was.
    let words = "one two three four five six seven eight";
    let o = env.heddle(&[
        "run",
        "--json",
        "g.json",
        "--input",
        &format!("sentence={words}"),
    ]);
    expect(&o, OK);
    let r = report(&o);
    let padded: Vec<String> = words.split(' ').map(|w| format!("{w:.<8}")).collect();
    assert_eq!(
        r["outputs"]["padded"],
        serde_json::json!([padded]),
        "{}",
        text(&o)
    );
    let titled: Vec<String> = padded
        .iter()
        .map(|p| format!("{}{}!", p[..1].to_uppercase(), &p[1..]))
        .collect();
    assert_eq!(r["outputs"]["titled"], serde_json::json!([titled]));
    let wrapped: Vec<serde_json::Value> = words
        .split(' ')
        .map(|w| serde_json::json!({"word": w}))
        .collect();
    assert_eq!(r["outputs"]["wrapped"], serde_json::json!([wrapped]));
    for target in ["pad", "title", "wrap"] {
        assert_eq!(r["nodes"][target]["invocations"], 8, "{target}: {r:#}");
    }
}

#[test]
fn a_bad_control_event_from_an_sdk_controller_fails_it_naming_node_handle_and_property() {
    // Each SDK's refusal path: the host's message reaches the run's error unchanged.
    // Python: a value of the wrong type for the C node's `width`.
    let env = with_sdk_examples(|g| {
        g.replace(
            r#""type": "textstats.each_word", "properties": {"property": "text"}"#,
            r#""type": "textstats.each_word", "properties": {"property": "width"}"#,
        )
    });
    let o = env.heddle(&["run", "g.json"]);
    expect(&o, support::FAILED);
    let err = text(&o);
    assert!(
        err.contains("node py") && err.contains("`__control__`") && err.contains("`width`"),
        "{err}"
    );
    // JavaScript: a property the Python node does not have.
    let env = with_sdk_examples(|g| {
        g.replace(
            r#""type": "jsonkit.each_item", "properties": {"property": "text"}"#,
            r#""type": "jsonkit.each_item", "properties": {"property": "colour"}"#,
        )
    });
    let o = env.heddle(&["run", "g.json"]);
    expect(&o, support::FAILED);
    let err = text(&o);
    assert!(
        err.contains("node js")
            && err.contains("node title")
            && err.contains("`__control__`")
            && err.contains("`colour`"),
        "{err}"
    );
    // A controlled node that fails answers its event with the failure: the Python
    // controller's reply raises it, naming both nodes. One word, so one event: with
    // several in flight, the target may fail on the first before the controller sends
    // the next, which is then refused ("has already ended"), as rightly but not this case.
    let env = with_sdk_examples(|g| g.replace(r#""width": 8"#, r#""width": 5000"#));
    let o = env.heddle(&["run", "g.json", "--input", "sentence=hello"]);
    expect(&o, support::FAILED);
    let err = text(&o);
    assert!(
        err.contains("node py: control event to node pad failed")
            && err.contains("width must be an integer from 0 to 4096")
            && err.contains("control:failed"),
        "{err}"
    );
    // C: a node no control edge from it reaches.
    let env = with_sdk_examples(|g| {
        g.replace(
            r#""output": "object"}"#,
            r#""output": "object", "target": "pad"}"#,
        )
    });
    let o = env.heddle(&["run", "g.json"]);
    expect(&o, support::FAILED);
    let err = text(&o);
    assert!(
        err.contains(
            "node c sent a control event to node pad, which no control edge from it reaches"
        ),
        "{err}"
    );
}

#[test]
fn a_c_controller_reads_its_targets_ids_from_the_control_context_json() {
    // `heddle_control_target` parses the context's keys without a JSON library: an id
    // with a quote, a brace, a backslash and a non-ASCII letter comes out whole, and
    // with two targets the C example refuses to guess (it found the second key after
    // skipping the whole first value).
    let graph = r#"{"format": "heddle.graph", "version": 1,
 "nodes": [
  {"id": "s", "type": "heddle.constant", "properties": {"value": "a b"}},
  {"id": "c", "type": "cstrings.each_word", "properties": {"property": "value", "output": "object"}},
  {"id": "w\"1}é\\", "type": "jsonkit.wrap", "properties": {"key": "x{\"}"}},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "s", "sourceHandle": "value", "target": "c", "targetHandle": "text"},
  {"source": "c", "sourceHandle": "__control__", "target": "w\"1}é\\", "targetHandle": "__control__", "edge_type": "control"},
  {"source": "c", "sourceHandle": "words", "target": "out", "targetHandle": "value"}]}"#;
    let env = with_sdk_examples(|_| graph.to_string());
    let o = env.heddle(&["run", "--json", "g.json"]);
    expect(&o, OK);
    assert_eq!(
        report(&o)["outputs"]["out"],
        serde_json::json!([[{"x{\"}": "a"}, {"x{\"}": "b"}]]),
        "{}",
        text(&o)
    );
    let two = graph
        .replace(
            r#"{"id": "out", "type": "heddle.output"}],"#,
            r#"{"id": "out", "type": "heddle.output"},
  {"id": "w2", "type": "jsonkit.wrap"}],"#,
        )
        .replace(
            r#"{"source": "c", "sourceHandle": "words""#,
            r#"{"source": "c", "sourceHandle": "__control__", "target": "w2", "targetHandle": "__control__", "edge_type": "control"},
  {"source": "c", "sourceHandle": "words""#,
        );
    std::fs::write(env.path().join("g.json"), two).unwrap();
    let o = env.heddle(&["run", "g.json"]);
    expect(&o, support::FAILED);
    assert!(
        text(&o).contains("wire exactly one controlled node"),
        "{}",
        text(&o)
    );
}
