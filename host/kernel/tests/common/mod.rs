//! Test-only node types (provider `test`) and graph helpers shared by the runtime tests.
#![allow(dead_code)]
// NodeError is the seam's error type; its size is by design (it carries a candidate).
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use heddle_core::{NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl, PortType, Value};
use heddle_kernel::{
    BoxFuture, Call, Executor, InputStream, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs,
    Registry,
};
use tokio::sync::Notify;

/// Observations the test nodes share with the test.
#[derive(Default)]
pub struct Probe {
    /// Invocation futures of `test.hang` currently alive (decremented on drop).
    pub live: AtomicUsize,
    /// `finalize` calls.
    pub finalized: AtomicUsize,
    /// `test.hang` invocations started.
    pub hang_started: Notify,
    /// `test.probe` received a value.
    pub probed: Notify,
    pub probe_count: AtomicUsize,
    /// `test.flaky` invocations so far (every attempt).
    pub flaky_calls: AtomicUsize,
    /// `test.half` invocations so far.
    pub half_calls: AtomicUsize,
    /// `test.overlap*` invocations running now, and the most that ever ran at once.
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
}

struct LiveGuard(Arc<Probe>);
impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct TestNodes {
    pub probe: Arc<Probe>,
}

fn t(s: &str) -> PortType {
    s.parse().unwrap()
}

fn d(name: &str, inputs: Vec<PortDecl>, outputs: Vec<OutputDecl>) -> NodeDecl {
    NodeDecl {
        inputs,
        outputs,
        origin: "test".into(),
        ..NodeDecl::new(name)
    }
}

impl NodeProvider for TestNodes {
    fn name(&self) -> &str {
        "test"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        let any = || t("any");
        let v = vec![
            // Sleeps `(n - value) * step_ms` then passes the value on: early items finish last.
            NodeDecl {
                properties: vec![
                    PortDecl::new("step_ms", t("int")).with_default(Value::Int(2)),
                    PortDecl::new("n", t("int")).with_default(Value::Int(10)),
                ],
                ..d(
                    "test.delay",
                    vec![PortDecl::new("value", t("int"))],
                    vec![OutputDecl::new("value", t("int"))],
                )
            },
            d(
                "test.add",
                vec![
                    PortDecl::new("a", t("int")).with_default(Value::Int(0)),
                    PortDecl::new("b", t("int")).with_default(Value::Int(100)),
                ],
                vec![OutputDecl::new("sum", t("int"))],
            ),
            NodeDecl {
                properties: vec![PortDecl::new("fail_on", t("int"))],
                ..d(
                    "test.fail",
                    vec![PortDecl::new("value", any())],
                    vec![OutputDecl::new("value", any())],
                )
            },
            // Fails its first `fail_times` invocations of the run, then passes the value on.
            NodeDecl {
                retry_safe: true,
                properties: vec![PortDecl::new("fail_times", t("int")).with_default(Value::Int(1))],
                ..d(
                    "test.flaky",
                    vec![PortDecl::new("value", any())],
                    vec![OutputDecl::new("value", any())],
                )
            },
            // Initializes as its `init` says: `fail` at once, `wait` never; else at once.
            NodeDecl {
                properties: vec![PortDecl::new("init", t("str"))],
                ..d(
                    "test.init",
                    vec![PortDecl::new("value", any())],
                    vec![OutputDecl::new("value", any())],
                )
            },
            d(
                "test.suspend",
                vec![PortDecl::new("value", any())],
                vec![OutputDecl::new("value", any())],
            ),
            // Multiplies `value` by 10, yielding to the runtime a few times first;
            // fails on `fail_on`. `test.overlap` declares that 4 invocations may run at
            // once, `test.overlap_serial` nothing (one at a time).
            NodeDecl {
                concurrency: 4,
                properties: vec![PortDecl::new("fail_on", t("int"))],
                ..d(
                    "test.overlap",
                    vec![PortDecl::new("value", t("int"))],
                    vec![OutputDecl::new("value", t("int"))],
                )
            },
            NodeDecl {
                properties: vec![PortDecl::new("fail_on", t("int"))],
                ..d(
                    "test.overlap_serial",
                    vec![PortDecl::new("value", t("int"))],
                    vec![OutputDecl::new("value", t("int"))],
                )
            },
            d(
                "test.hang",
                vec![PortDecl::new("value", any())],
                vec![OutputDecl::new("value", any())],
            ),
            d(
                "test.probe",
                vec![PortDecl::new("value", any())],
                vec![OutputDecl::new("value", any())],
            ),
            NodeDecl {
                mode: NodeMode::StreamingOutput,
                ..d(
                    "test.emit",
                    vec![PortDecl::new("n", t("int"))],
                    vec![
                        OutputDecl::new("value", t("int")),
                        OutputDecl::new("done", t("bool")),
                    ],
                )
            },
            NodeDecl {
                mode: NodeMode::StreamingInput,
                ..d(
                    "test.running_sum",
                    vec![PortDecl::new("value", t("int"))],
                    vec![
                        OutputDecl::new("sum", t("int")),
                        OutputDecl::new("total", t("int")),
                    ],
                )
            },
            NodeDecl {
                mode: NodeMode::Controlled,
                ..d(
                    "test.scale",
                    vec![
                        PortDecl::new("x", t("int")),
                        PortDecl::new("factor", t("int")).with_default(Value::Int(1)),
                    ],
                    vec![OutputDecl::new("out", t("int"))],
                )
            },
            // A controller: sends one `run` event per item of `factors` (property
            // `factor`) to `target` before awaiting any reply, awaits them last first,
            // and outputs the replies' `out` in send order and its `_control_context`.
            NodeDecl {
                properties: vec![
                    PortDecl::new("target", t("str")),
                    PortDecl::new("factors", t("list[any]")),
                    PortDecl::new("property", t("str")).with_default(Value::str("factor")),
                ],
                ..d(
                    "test.drive",
                    vec![],
                    vec![
                        OutputDecl::new("replies", t("list[any]")),
                        OutputDecl::new("context", any()),
                    ],
                )
            },
            // Emits its `events` property (a list) as control events.
            NodeDecl {
                properties: vec![PortDecl::new("events", t("list[any]"))],
                ..d("test.controller", vec![], vec![])
            },
            // Routes `value` to `yes` or `no` depending on property `take`.
            NodeDecl {
                properties: vec![PortDecl::new("take", t("bool"))],
                ..d(
                    "test.branch",
                    vec![PortDecl::new("value", any())],
                    vec![OutputDecl::new("yes", any()), OutputDecl::new("no", any())],
                )
            },
            // `a / b`; both inputs required, no defaults.
            d(
                "test.div",
                vec![
                    PortDecl::new("a", t("float")).required(),
                    PortDecl::new("b", t("float")).required(),
                ],
                vec![OutputDecl::new("q", t("float"))],
            ),
            // Half of `n`, computed the way a dynamically typed guest would: a string is
            // parsed, a bool is 0 or 1 (JavaScript's `"7" / 2` is 3.5). Retry-safe.
            NodeDecl {
                retry_safe: true,
                ..d(
                    "test.half",
                    vec![PortDecl::new("n", t("int"))],
                    vec![OutputDecl::new("half", t("float"))],
                )
            },
            // The sum of a list of ints.
            d(
                "test.sum",
                vec![PortDecl::new("list", t("list[int]")).required()],
                vec![OutputDecl::new("sum", t("int"))],
            ),
            // Iterates `list` by streaming (emit per item), group "x".
            NodeDecl {
                mode: NodeMode::StreamingOutput,
                ..d(
                    "test.stream_each",
                    vec![PortDecl::new("list", t("list[any]"))],
                    vec![
                        OutputDecl::new("item", any()).correlated(OutputCorrelation::Iteration {
                            group: Some("x".into()),
                        }),
                        OutputDecl::new("index", t("int")).correlated(
                            OutputCorrelation::Iteration {
                                group: Some("x".into()),
                            },
                        ),
                    ],
                )
            },
        ];
        v.into_iter().map(Arc::new).collect()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        Ok(Arc::new(TestExec {
            ty: spec.decl.type_name.clone(),
            probe: self.probe.clone(),
            props: spec.properties.clone(),
        }))
    }
}

struct TestExec {
    ty: String,
    probe: Arc<Probe>,
    props: BTreeMap<String, Value>,
}

fn int(inputs: &BTreeMap<String, Value>, k: &str) -> Result<i64, NodeError> {
    inputs
        .get(k)
        .and_then(|v| v.as_i64())
        .ok_or_else(|| NodeError::msg(format!("input `{k}` missing or not an int")))
}

impl Executor for TestExec {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let i = &call.inputs;
            match self.ty.as_str() {
                "test.delay" => {
                    let v = int(i, "value")?;
                    let n = int(i, "n")?;
                    let step = int(i, "step_ms")?;
                    let ms = (n - v).max(0) * step;
                    tokio::time::sleep(Duration::from_millis(ms as u64)).await;
                    Ok(Outputs::one("value", Value::Int(v)))
                }
                "test.add" => Ok(Outputs::one("sum", Value::Int(int(i, "a")? + int(i, "b")?))),
                "test.div" => {
                    let f = |k: &str| {
                        i.get(k)
                            .and_then(|v| v.as_f64())
                            .ok_or_else(|| NodeError::msg(format!("input `{k}` is missing")))
                    };
                    Ok(Outputs::one("q", Value::Float(f("a")? / f("b")?)))
                }
                "test.half" => {
                    self.probe.half_calls.fetch_add(1, Ordering::SeqCst);
                    let n = match i.get("n") {
                        Some(Value::Str(s)) => s.trim().parse::<f64>().unwrap_or(f64::NAN),
                        Some(Value::Bool(b)) => f64::from(u8::from(*b)),
                        Some(v) => v.as_f64().unwrap_or(f64::NAN),
                        None => f64::NAN,
                    };
                    Ok(Outputs::one("half", Value::Float(n / 2.0)))
                }
                "test.sum" => {
                    let list = i.get("list").and_then(|l| l.as_list()).unwrap_or(&[]);
                    Ok(Outputs::one(
                        "sum",
                        Value::Int(list.iter().filter_map(|v| v.as_i64()).sum()),
                    ))
                }
                "test.init" => Ok(Outputs::one(
                    "value",
                    i.get("value").cloned().unwrap_or_default(),
                )),
                "test.fail" => {
                    let v = i.get("value").cloned().unwrap_or_default();
                    if i.get("fail_on") == Some(&v) {
                        Err(NodeError::msg(format!("boom on {v}")))
                    } else {
                        Ok(Outputs::one("value", v))
                    }
                }
                "test.flaky" => {
                    let n = self.probe.flaky_calls.fetch_add(1, Ordering::SeqCst) + 1;
                    if n as i64 <= int(i, "fail_times")? {
                        Err(NodeError::msg(format!("flaky failure {n}")))
                    } else {
                        Ok(Outputs::one(
                            "value",
                            i.get("value").cloned().unwrap_or_default(),
                        ))
                    }
                }
                "test.suspend" => Err(NodeError::suspend(
                    "needs approval",
                    i.get("value").cloned().unwrap_or_default(),
                )),
                "test.overlap" | "test.overlap_serial" => {
                    let p = &self.probe;
                    let now = p.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    p.max_in_flight.fetch_max(now, Ordering::SeqCst);
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    p.in_flight.fetch_sub(1, Ordering::SeqCst);
                    let v = int(i, "value")?;
                    if i.get("fail_on").and_then(|f| f.as_i64()) == Some(v) {
                        return Err(NodeError::msg(format!("boom on {v}")));
                    }
                    Ok(Outputs::one("value", Value::Int(v * 10)))
                }
                "test.hang" => {
                    self.probe.live.fetch_add(1, Ordering::SeqCst);
                    let _g = LiveGuard(self.probe.clone());
                    self.probe.hang_started.notify_one();
                    call.ctx.cancel_token().cancelled().await;
                    Err(NodeError::cancelled())
                }
                "test.probe" => {
                    self.probe.probe_count.fetch_add(1, Ordering::SeqCst);
                    self.probe.probed.notify_one();
                    Ok(Outputs::one(
                        "value",
                        i.get("value").cloned().unwrap_or_default(),
                    ))
                }
                "test.emit" => {
                    let n = int(i, "n")?;
                    for k in 0..n {
                        call.ctx.emit("value", Value::Int(k)).await?;
                        // Wait until the value has reached the node downstream: this only
                        // returns if emitted values are routed while the invocation runs.
                        self.probe.probed.notified().await;
                    }
                    Ok(Outputs::one("done", Value::Bool(true)))
                }
                "test.scale" => Ok(Outputs::one(
                    "out",
                    Value::Int(int(i, "x")? * int(i, "factor")?),
                )),
                "test.drive" => {
                    let target = i.get("target").and_then(|v| v.as_str()).unwrap_or("");
                    let property = i.get("property").and_then(|v| v.as_str()).unwrap_or("");
                    let factors = i
                        .get("factors")
                        .and_then(|v| v.as_list())
                        .unwrap_or(&[])
                        .to_vec();
                    let mut pending = Vec::new();
                    for f in factors {
                        let props = BTreeMap::from([(property.to_string(), f)]);
                        pending.push(call.ctx.dispatch_control(target, props).await?);
                    }
                    let mut replies = Vec::new();
                    while let Some(r) = pending.pop() {
                        let out = r.outputs().await?;
                        replies.push(out.get("out").cloned().unwrap_or_default());
                    }
                    replies.reverse();
                    let mut o = Outputs::one("replies", Value::list(replies));
                    o.push(
                        "context",
                        i.get("_control_context").cloned().unwrap_or_default(),
                    );
                    Ok(o)
                }
                "test.controller" => {
                    let mut o = Outputs::new();
                    for ev in self
                        .props
                        .get("events")
                        .and_then(|e| e.as_list())
                        .unwrap_or(&[])
                    {
                        o.push("__control__", ev.clone());
                    }
                    Ok(o)
                }
                "test.branch" => {
                    let v = i.get("value").cloned().unwrap_or_default();
                    let take = i.get("take").and_then(|v| v.as_bool()).unwrap_or(false);
                    Ok(Outputs::one(if take { "yes" } else { "no" }, v))
                }
                "test.stream_each" => {
                    let items = i
                        .get("list")
                        .and_then(|l| l.as_list())
                        .unwrap_or(&[])
                        .to_vec();
                    for (k, v) in items.into_iter().enumerate() {
                        call.ctx.emit("item", v).await?;
                        call.ctx.emit("index", Value::Int(k as i64)).await?;
                    }
                    Ok(Outputs::new())
                }
                other => Err(NodeError::msg(format!("test node {other} has no invoke"))),
            }
        })
    }

    fn run_stream(
        &self,
        mut input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let mut total = 0;
            while let Some(it) = input.next().await {
                total += it.value.as_i64().unwrap_or(0);
                ctx.emit("sum", Value::Int(total)).await?;
            }
            Ok(Outputs::one("total", Value::Int(total)))
        })
    }

    fn initialize(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        match self.props.get("init").and_then(|v| v.as_str()) {
            Some("fail") => Box::pin(std::future::ready(Err(NodeError::host("no licence")))),
            Some("wait") => Box::pin(std::future::pending()),
            _ => Box::pin(std::future::ready(Ok(()))),
        }
    }

    fn finalize(&self) -> BoxFuture<'_, ()> {
        self.probe.finalized.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {})
    }
}

pub fn registry() -> (Registry, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let mut r = Registry::with_builtins();
    r.add(Arc::new(TestNodes {
        probe: probe.clone(),
    }))
    .unwrap();
    (r, probe)
}

/// Graphs are written with the workspace's one builder.
#[allow(unused_imports)] // not every test file builds graphs with it
pub use heddle_core::builder::graph;

pub fn ints(v: &[Value]) -> Vec<i64> {
    v.iter().map(|v| v.as_i64().unwrap()).collect()
}

pub fn ilist(v: &Value) -> Vec<i64> {
    ints(v.as_list().unwrap())
}

/// Fails the test instead of hanging when the runtime deadlocks.
pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the run should not hang")
}
