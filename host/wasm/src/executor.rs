//! The executor adapter: `WasmProvider` offers every loaded package's node types to the
//! kernel; `WasmExecutor` runs one node's invocations in fresh (or, when the node opts
//! in, warm) sandboxed instances.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heddle_core::{LogLevel, NodeDecl, Value};
use heddle_kernel::{
    BoxFuture, Call, ErrorKind, Executor, InputStream, NodeCtx, NodeError, NodeProvider, NodeSpec,
    Outputs,
};
use wasmtime::{AsContextMut, Store, Trap, UpdateDeadline};

use crate::bindings::{NodePackage, WitNodeError, WitValue};
use crate::boundary::{Via, check_output, output_type};
use crate::config::{Sandbox, SecretsConfig, WasmConfig};
use crate::deadline::{Deadline, Interrupt, race};
use crate::engine::WasmHost;
use crate::error::PackageError;
use crate::failure::{self, Failure};
use crate::package::{TypeInfo, WasmPackage};
use crate::sandbox::{Invocation, State, from_wit, to_wit};
use crate::text;

/// A warm instance is recycled after this many invocations, bounding how much state a
/// reuse-safe node can accumulate.
const WARM_MAX_USES: u32 = 128;
/// Warm instances kept per node (one per concurrent invocation, up to this many).
const WARM_POOL: usize = 4;
/// Bytes a guest may hand the host in one import call.
const HOSTCALL_FUEL: usize = 16 << 20;

/// Bytes a guest may hand the host in one call (and in one set of returned outputs).
pub(crate) fn hostcall_limit(settings: &crate::config::EngineSettings) -> usize {
    HOSTCALL_FUEL.max(2 * settings.max_value_bytes)
}

/// Creates a store with the node's limits and the epoch policy: every tick the guest
/// yields to tokio, and is stopped at once when its deadline passes or the run is
/// cancelled.
pub(crate) fn new_store(host: &WasmHost, sandbox: &Sandbox) -> Result<Store<State>, NodeError> {
    let state = State::new(sandbox, host.settings().log_cap_bytes).map_err(NodeError::host)?;
    let mut store = Store::new(host.engine(), state);
    store.limiter(|s| &mut s.limiter);
    // Bounds what one host call (log, emit) may make the host copy out of the guest;
    // the default is 128 MiB.
    store.set_hostcall_fuel(hostcall_limit(host.settings()));
    store.epoch_deadline_callback(|mut cx| {
        check_host_call_fuel(&mut cx)?;
        if cx.data_mut().should_interrupt() {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    store.set_epoch_deadline(1);
    Ok(store)
}

/// Traps as out of fuel once the fuel charged for host calls exceeds what the guest has
/// left. (The charge is kept beside the fuel counter rather than subtracted from it: a
/// running guest caches its counter and would overwrite a change made from an epoch
/// callback.)
fn check_host_call_fuel(cx: &mut wasmtime::StoreContextMut<'_, State>) -> wasmtime::Result<()> {
    let charged = cx.data().budget.charged();
    // `get_fuel` fails only when fuel is off: then host calls are free like the rest.
    match cx.get_fuel() {
        Ok(left) if charged > left => Err(Trap::OutOfFuel.into()),
        _ => Ok(()),
    }
}

/// The provider of every WASM node type loaded into this host.
pub struct WasmProvider {
    host: WasmHost,
    config: Arc<WasmConfig>,
    secrets: Arc<SecretsConfig>,
    packages: Vec<Arc<WasmPackage>>,
    types: HashMap<String, usize>,
}

impl WasmProvider {
    pub fn new(host: WasmHost, config: WasmConfig) -> Self {
        let secrets = Arc::new(config.secrets.clone());
        WasmProvider {
            host,
            config: Arc::new(config),
            secrets,
            packages: Vec::new(),
            types: HashMap::new(),
        }
    }

    pub fn host(&self) -> &WasmHost {
        &self.host
    }

    /// Adds a loaded package; refused whole if one of its node types is already offered
    /// by another package of this provider (clashes with other providers are refused by
    /// the kernel's registry).
    pub fn add(&mut self, pkg: WasmPackage) -> Result<(), PackageError> {
        for d in pkg.declarations() {
            if let Some(&i) = self.types.get(&d.type_name) {
                return Err(PackageError::BadDecl {
                    path: pkg.dir.clone(),
                    type_name: d.type_name.clone(),
                    message: format!(
                        "already defined by package `{}`; a package may not redefine an existing node type",
                        self.packages[i].name()
                    ),
                });
            }
        }
        let idx = self.packages.len();
        for d in pkg.declarations() {
            self.types.insert(d.type_name.clone(), idx);
        }
        self.packages.push(Arc::new(pkg));
        Ok(())
    }

    /// Loads the first-party packages built with this host (`std`, `files`).
    pub async fn add_first_party(&mut self) -> Result<(), PackageError> {
        for dir in crate::first_party_package_dirs()? {
            let pkg = WasmPackage::load_dir(&self.host, &dir).await?;
            self.add(pkg)?;
        }
        Ok(())
    }

    /// The provider a command line uses: an engine from `config`, the first-party
    /// packages, then every package installed in the store at `store_dir` (each checked
    /// against its lockfile pin). Missing first-party packages only warn (a host built
    /// with `HEDDLE_SKIP_PLUGIN_BUILD=1` has none).
    pub async fn load(
        config: WasmConfig,
        store_dir: Option<&std::path::Path>,
    ) -> Result<Self, PackageError> {
        let host = WasmHost::new(config.wasm.clone())?;
        let mut p = WasmProvider::new(host, config);
        match crate::first_party_package_dirs() {
            Ok(_) => p.add_first_party().await?,
            Err(e) => tracing::warn!("first-party packages unavailable: {e}"),
        }
        if let Some(dir) = store_dir {
            let store = crate::store::PackageStore::open(dir);
            for pkg in store.load_all(&p.host).await? {
                p.add(pkg)?;
            }
        }
        Ok(p)
    }

    pub fn packages(&self) -> &[Arc<WasmPackage>] {
        &self.packages
    }
}

impl NodeProvider for WasmProvider {
    fn name(&self) -> &str {
        "wasm"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        self.packages
            .iter()
            .flat_map(|p| p.declarations().iter().cloned())
            .collect()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        let type_name = &spec.decl.type_name;
        let Some(&idx) = self.types.get(type_name) else {
            return Err(NodeError::host(format!(
                "node {}: no WASM package provides `{type_name}`",
                spec.id
            )));
        };
        let pkg = self.packages[idx].clone();
        // `info` and `types` are filled together when the package is added.
        let info = pkg.info[type_name].clone();
        let grant = self.config.grant(pkg.name());
        let sandbox = Sandbox::new(&grant, &self.config.wasm, spec.limits);
        let properties = spec
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), to_wit(v)))
            .collect();
        Ok(Arc::new(
            WasmExecutor {
                node_id: spec.id.to_string(),
                type_name: type_name.clone(),
                pkg,
                info,
                sandbox,
                secrets: Arc::new(self.secrets.as_ref().clone()),
                granted_secrets: Arc::new(BTreeSet::new()),
                properties,
                warm: Mutex::new(Vec::new()),
            }
            .with_secrets(),
        ))
    }
}

struct Warm {
    store: Store<State>,
    instance: NodePackage,
    uses: u32,
}

/// Runs one graph node's invocations.
pub struct WasmExecutor {
    node_id: String,
    type_name: String,
    pkg: Arc<WasmPackage>,
    info: TypeInfo,
    sandbox: Sandbox,
    secrets: Arc<SecretsConfig>,
    granted_secrets: Arc<BTreeSet<String>>,
    properties: Vec<(String, WitValue)>,
    warm: Mutex<Vec<Warm>>,
}

impl WasmExecutor {
    fn with_secrets(mut self) -> Self {
        self.granted_secrets = Arc::new(self.sandbox.secrets.clone());
        self
    }

    fn label(&self) -> String {
        crate::boundary::label(&self.node_id, &self.type_name)
    }

    async fn run(
        &self,
        ctx: NodeCtx,
        inputs: Vec<(String, WitValue)>,
        input: Option<InputStream>,
    ) -> Result<Outputs, NodeError> {
        let host = &self.pkg.host;
        let fuel_on = host.settings().fuel;
        let budget = self.sandbox.fuel;
        // The engine's default applies only to packages without their own timeout.
        let default = match self.sandbox.timeout_ms {
            Some(_) => None,
            None => Some(Duration::from_millis(host.settings().default_timeout_ms)),
        };
        let deadline = Deadline::new(
            earliest(
                ctx.deadline(),
                self.sandbox
                    .timeout_ms
                    .map(|t| Instant::now() + Duration::from_millis(t)),
            ),
            default,
        );
        if ctx.is_cancelled() {
            return Err(NodeError::cancelled());
        }

        let reuse = self.info.reuse_instance && input.is_none();
        let warm = if reuse {
            self.warm.lock().unwrap_or_else(|e| e.into_inner()).pop()
        } else {
            None
        };
        let started = Instant::now();
        let (mut store, instance, uses) = match warm {
            Some(w) => (w.store, Some(w.instance), w.uses),
            None => (new_store(host, &self.sandbox)?, None, 0),
        };
        {
            let st = store.data_mut();
            st.interrupt = None;
            st.limiter.memory_exceeded = false;
            st.budget = Default::default();
            st.inv = Some(Invocation {
                ctx: ctx.clone(),
                streaming: self.info.streaming_output || self.info.streaming_input,
                outputs: self.info.outputs.clone(),
                input,
                deadline: deadline.clone(),
                secrets: self.granted_secrets.clone(),
                secret_source: self.secrets.clone(),
                max_value_bytes: host.settings().max_value_bytes,
            });
        }
        if fuel_on {
            store
                .set_fuel(budget)
                .map_err(|e| NodeError::host(e.to_string()))?;
        }
        store.set_epoch_deadline(1);

        let call = async {
            let instance = match instance {
                Some(i) => i,
                None => self.pkg.pre.instantiate_async(&mut store).await?,
            };
            let r = instance
                .heddle_node_node()
                .call_invoke(&mut store, &self.type_name, &inputs, &self.properties)
                .await?;
            Ok::<_, wasmtime::Error>((instance, r))
        };
        // Raced so a guest waiting in WASI (where no epoch check runs) is stopped too.
        let result = match race(call, &deadline, Some(ctx.cancel_token())).await {
            Ok(r) => r,
            Err(i) => {
                store.data_mut().interrupt = Some(i);
                Err(wasmtime::Error::msg("interrupted while waiting"))
            }
        };
        // Host calls made since the last epoch tick are paid for too.
        let unpaid = check_host_call_fuel(&mut store.as_context_mut()).err();

        let fuel_used = if fuel_on {
            let guest = budget.saturating_sub(store.get_fuel().unwrap_or(0));
            Some(
                guest
                    .saturating_add(store.data().budget.charged())
                    .min(budget),
            )
        } else {
            None
        };
        let peak = store.data().limiter.peak_memory as u64;
        ctx.record_usage(fuel_used, Some(peak));
        let lines = {
            let mut log = store.data().log.lock().unwrap_or_else(|e| e.into_inner());
            let tail = log.stderr_tail();
            (log.drain(), tail)
        };
        for (level, line) in lines.0 {
            ctx.log(level, line);
        }
        let stderr_tail = lines.1;
        tracing::trace!(node = %self.node_id, us = started.elapsed().as_micros() as u64, "wasm invocation");

        // A guest stopped while waiting in a host call (emit, next-input) returns normally;
        // the interrupt still decides the outcome, as does a host limit it broke.
        if let Some(v) = store.data().budget.violation.clone() {
            return Err(NodeError::msg(format!("{}: {}", self.label(), v.message))
                .with_signature(v.signature));
        }
        if store.data().interrupt.is_some() {
            let e = wasmtime::Error::msg("interrupted in a host call");
            return Err(self.host_failure(&store, e, budget, &stderr_tail, &deadline));
        }
        if let Some(e) = unpaid {
            return Err(self.host_failure(&store, e, budget, &stderr_tail, &deadline));
        }
        match result {
            Ok((instance, Ok(outputs))) => {
                let outputs = self.convert_outputs(outputs);
                if reuse && uses + 1 < WARM_MAX_USES && outputs.is_ok() {
                    store.data_mut().inv = None;
                    let mut pool = self.warm.lock().unwrap_or_else(|e| e.into_inner());
                    if pool.len() < WARM_POOL {
                        pool.push(Warm {
                            store,
                            instance,
                            uses: uses + 1,
                        });
                    }
                }
                outputs
            }
            Ok((_, Err(e))) => Err(self.guest_error(&ctx, e)),
            // The instance is dropped with the store: a trapped instance is never reused.
            Err(e) => Err(self.host_failure(&store, e, budget, &stderr_tail, &deadline)),
        }
    }

    fn convert_outputs(&self, outputs: Vec<(String, WitValue)>) -> Result<Outputs, NodeError> {
        let max = self.pkg.host.settings().max_value_bytes;
        let label = self.label();
        let mut seen = HashSet::new();
        let mut out = Outputs::new();
        for (handle, v) in outputs {
            if !seen.insert(handle.clone()) {
                return Err(NodeError::msg(format!(
                    "{label} returned output `{}` twice; each output holds one value per invocation",
                    text::line(&handle, text::SHORT)
                ))
                .with_signature("wasm:duplicate-output"));
            }
            let ty = output_type(&self.info.outputs, &handle);
            let shown = text::line(&handle, text::SHORT);
            let v = check_output(&label, &shown, ty, v, max, Via::Returned)?;
            out.push(handle, v);
        }
        Ok(out)
    }

    /// The node's own error, escaped and bounded (the guest wrote it; the kernel names
    /// the node when it reports it).
    fn guest_error(&self, ctx: &NodeCtx, e: WitNodeError) -> NodeError {
        let mut err = NodeError::msg(text::line(&e.message, text::MESSAGE));
        err.signature = e.signature.filter(|sig| {
            let ok = declared_signature_recognised(sig);
            if !ok {
                // The supervisor would ignore it: say so instead of losing it quietly.
                ctx.log(
                    LogLevel::Warn,
                    format!(
                        "{}: ignored failure signature {sig:?}: a signature is family:code, \
                         the family a lowercase letter then at most 23 of a-z 0-9 _ -, \
                         the code 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $ \
                         (see sdk/README.md, \"Failure signatures\")",
                        self.label()
                    ),
                );
            }
            ok
        });
        if let Some(c) = e.candidate {
            let cand: Option<Outputs> = c
                .into_iter()
                .map(|(h, v)| from_wit(v).ok().map(|v| (h, v)))
                .collect::<Option<Vec<(String, Value)>>>()
                .map(|v| v.into_iter().collect());
            err.candidate = cand;
        }
        err
    }

    fn host_failure(
        &self,
        store: &Store<State>,
        e: wasmtime::Error,
        budget: u64,
        stderr_tail: &str,
        deadline: &Deadline,
    ) -> NodeError {
        let st = store.data();
        let label = self.label();
        let trap = e.downcast_ref::<Trap>().copied();
        if let Some(i) = st.interrupt {
            return match i {
                Interrupt::Deadline => NodeError::new(
                    ErrorKind::Deadline,
                    match deadline.default_passed() {
                        Some(d) => format!(
                            "{label}: exceeded the default deadline of {} ms for WASM invocations; the guest was stopped (set `timeout_ms` in [packages.{}] or `default_timeout_ms` in [wasm] to change it)",
                            d.as_millis(),
                            self.pkg.name()
                        ),
                        None => format!("{label}: wall-clock deadline exceeded; the guest was stopped"),
                    },
                )
                .with_signature("wasm:deadline"),
                Interrupt::Cancelled => NodeError::new(
                    ErrorKind::Cancelled,
                    format!("{label}: cancelled; the guest was stopped"),
                ),
            };
        }
        if st.limiter.memory_exceeded {
            return NodeError::new(
                ErrorKind::MemoryLimit,
                format!(
                    "{label}: memory limit exceeded (limit {} MiB)",
                    self.sandbox.memory_bytes >> 20
                ),
            )
            .with_signature("wasm:memory-limit");
        }
        if trap == Some(Trap::OutOfFuel) {
            return NodeError::new(
                ErrorKind::FuelExhausted,
                format!("{label}: fuel exhausted (used the whole budget of {budget} units)"),
            )
            .with_signature("wasm:fuel");
        }
        let failure = failure::classify(&e);
        let message = format!(
            "{label}: {}",
            failure.message(hostcall_limit(self.pkg.host.settings()), stderr_tail)
        );
        match failure {
            Failure::Exit(_) => NodeError::msg(message).with_signature("wasm:exit"),
            Failure::TooMuchData => NodeError::new(ErrorKind::OutputTooLarge, message)
                .with_signature("wasm:output-too-large"),
            Failure::Trap(t) => {
                let kind = failure::trap_name(t);
                NodeError::new(ErrorKind::Trap { trap: kind.clone() }, message)
                    .with_signature(format!("wasm:trap:{kind}"))
            }
            Failure::Other(_) => NodeError::host(message).with_signature("wasm:host"),
        }
    }
}

/// Whether the supervisor's recognizers accept `sig` as a node-declared signature. With
/// an empty message no message-based recognizer can answer, so only the declared one
/// decides: the rule stays written once, in heddle-core.
fn declared_signature_recognised(sig: &str) -> bool {
    use heddle_core::supervise::{ErrorShape, FailureKind, SignatureRegistry};
    static REGISTRY: std::sync::LazyLock<SignatureRegistry> =
        std::sync::LazyLock::new(SignatureRegistry::default);
    REGISTRY
        .signature(&ErrorShape {
            kind: &FailureKind::Node,
            message: "",
            declared: Some(sig),
        })
        .is_some()
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Executor for WasmExecutor {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let inputs = call
                .inputs
                .iter()
                .map(|(k, v)| (k.clone(), to_wit(v)))
                .collect();
            self.run(call.ctx, inputs, None).await
        })
    }

    fn run_stream(
        &self,
        input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(async move {
            let inputs = input
                .properties
                .iter()
                .map(|(k, v)| (k.clone(), to_wit(v)))
                .collect();
            if !self.info.streaming_input {
                ctx.log(
                    LogLevel::Warn,
                    format!("{} is not declared streaming-input", self.label()),
                );
            }
            self.run(ctx, inputs, Some(input)).await
        })
    }

    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.warm.lock().unwrap_or_else(|e| e.into_inner()).clear();
        })
    }
}
