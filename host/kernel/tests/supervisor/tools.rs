//! What a supervisor's read-only tools see of the run: every ancestor of the failing
//! item, `heddle.input` nodes included (their value fed it like any node's output).

use super::*;

/// The digest, and `read_node_output("in")` for the failing item.
type Seen = (serde_json::Value, Result<BTreeMap<String, Value>, String>);

/// Reads the run state the way the LLM agent's tools do, then fails.
#[derive(Default)]
struct Peek {
    saw: Mutex<Vec<Seen>>,
}

impl Supervisor for Peek {
    fn name(&self) -> &str {
        "peek"
    }
    fn wants_run_state(&self) -> bool {
        true
    }
    fn decide<'a>(
        &'a self,
        e: &'a Escalation,
        ctx: &'a DecideCtx,
    ) -> BoxFuture<'a, Result<Decision, SupervisorError>> {
        let state = ctx.state.as_ref().expect("a run hands its state");
        let read = state
            .read_output("in", &e.lineage)
            .map_err(|err| err.to_string());
        self.saw.lock().unwrap().push((state.digest(), read));
        Box::pin(async { Ok(Decision::fail("seen", DecidedBy::Agent)) })
    }
}

#[tokio::test]
async fn an_input_node_is_an_ancestor_the_tools_can_read() {
    let (doc, mut opts) = chain("sup.flaky_unsafe", json!({}), Value::Int(5));
    let peek = Arc::new(Peek::default());
    opts.supervisor = Some(peek.clone());
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let saw = peek.saw.lock().unwrap();
    let (digest, read) = &saw[0];
    assert_eq!(digest["nodes"]["in"]["status"], "ran", "{digest:#}");
    assert_eq!(digest["nodes"]["in"]["invocations"], 1, "{digest:#}");
    assert_eq!(
        read.as_ref().unwrap().get("value"),
        Some(&Value::Int(5)),
        "{read:?}"
    );
}

#[tokio::test]
async fn an_input_feeding_a_fan_out_is_an_ancestor_of_every_item() {
    let doc = graph(
        &[
            ("in", "heddle.input", json!({"name": "xs"})),
            ("each", "heddle.foreach", json!({})),
            ("bad", "sup.fail_on", json!({"bad": 3})),
            ("gather", "heddle.collect", json!({})),
            ("out", "heddle.output", json!({"name": "out"})),
        ],
        &[
            ("in", "value", "each", "list"),
            ("each", "item", "bad", "value"),
            ("bad", "value", "gather", "item"),
            ("gather", "list", "out", "value"),
        ],
    );
    let xs = Value::list(vec![Value::Int(1), Value::Int(3)]);
    let mut opts = RunOptions::default();
    opts.inputs.insert("xs".into(), xs.clone());
    let peek = Arc::new(Peek::default());
    opts.supervisor = Some(peek.clone());
    let r = run(&doc, opts).await;
    assert_eq!(r.status, RunStatus::Failed);
    let saw = peek.saw.lock().unwrap();
    assert_eq!(saw[0].1.as_ref().unwrap().get("value"), Some(&xs));
}
