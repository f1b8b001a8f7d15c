//! `WasmExecutor` runs one graph node's invocations in fresh (or, when the node opts in,
//! warm) instances, each in a store holding exactly the node's grant.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heddle_core::{LogLevel, Value};
use heddle_kernel::{
    BoxFuture, Call, ErrorKind, Executor, InputStream, NodeCtx, NodeError, Outputs,
};
use wasmtime::{AsContextMut, Store, Trap};

use crate::bindings::{Instance, WitNodeError, WitValue};
use crate::boundary::{Via, check_output};
use crate::config::SecretsConfig;
use crate::deadline::{Deadline, Interrupt, race};
use crate::engine::{check_host_call_fuel, hostcall_limit};
use crate::error::chain;
use crate::failure::{self, Failure};
use crate::grants::NodeGrant;
use crate::host_state::{Invocation, State};
use crate::net::Caller;
use crate::package::{TypeInfo, WasmPackage};
use crate::text;
use crate::value::{from_wit, to_wit};

/// A warm instance is recycled after this many invocations, bounding how long state a
/// reuse-safe node accumulates can live (its size is bounded by the memory grant, and a
/// node that outgrows it traps and is dropped). Sized so recycling costs ≤ 1% of a warm
/// call for the costliest guests: a fresh Python instance costs ~35 warm calls
/// (1.76 ms vs 50 µs, sdk/README.md), so 35/4096 < 1%; every 128 uses cost it 27%.
const WARM_MAX_USES: u32 = 4096;
/// Warm instances kept per node (one per concurrent invocation, up to this many).
const WARM_POOL: usize = 4;
pub(crate) struct Warm {
    store: Store<State>,
    instance: Instance,
    uses: u32,
    /// The pool slot the instance occupies, held while it waits idle (so running and
    /// idle instances together never exceed the pool) and handed to the invocation that
    /// takes it up. `None` without the pooling allocator.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Runs one graph node's invocations.
pub struct WasmExecutor {
    node_id: String,
    type_name: String,
    pkg: Arc<WasmPackage>,
    info: TypeInfo,
    grant: Arc<NodeGrant>,
    secrets: Arc<SecretsConfig>,
    properties: Vec<(String, WitValue)>,
    /// Registered with the host, which may drop an idle one when the pool is full.
    warm: Arc<crate::engine::WarmPool>,
    /// Who makes this node's outgoing requests, for their log lines.
    caller: Arc<Caller>,
}

impl WasmExecutor {
    pub(crate) fn new(
        node_id: String,
        type_name: String,
        pkg: Arc<WasmPackage>,
        grant: NodeGrant,
        secrets: Arc<SecretsConfig>,
        properties: Vec<(String, WitValue)>,
    ) -> Self {
        // `info` and the provider's type index are filled together when the package is
        // added, so a type the provider routed here is in `info`.
        let info = pkg.info[&type_name].clone();
        let caller = Arc::new(Caller {
            package: pkg.name().to_string(),
            node_id: node_id.clone(),
            node_type: type_name.clone(),
        });
        let warm = Arc::new(Mutex::new(Vec::new()));
        pkg.host.register_warm(&warm);
        WasmExecutor {
            caller,
            node_id,
            type_name,
            pkg,
            info,
            grant: Arc::new(grant),
            secrets,
            properties,
            warm,
        }
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
        let budget = self.grant.fuel;
        // The engine's default applies only to packages without their own timeout.
        let default = match self.grant.timeout_ms {
            Some(_) => None,
            None => Some(Duration::from_millis(host.settings().default_timeout_ms)),
        };
        let hard = earliest(
            ctx.deadline(),
            self.grant
                .timeout_ms
                .map(|t| Instant::now() + Duration::from_millis(t)),
        );
        if ctx.is_cancelled() {
            return Err(NodeError::cancelled());
        }

        // Warm only when the node's declaration allows it and the operator did not
        // narrow that away; a streaming-input invocation holds its stream in the store.
        let reuse = self.info.reuse_instance && !self.grant.fresh_instances && input.is_none();
        // A controller takes its level's leave before any slot (a warm instance holds
        // one too), so controllers waiting for replies never hold the slots their
        // targets need; dropped when the invocation ends, after the store.
        let _leave = match ctx.controls() {
            Some(c) => tokio::select! {
                leave = host.controller_slot(c.height()) => leave,
                _ = ctx.cancel_token().cancelled() => return Err(NodeError::cancelled()),
            },
            None => None,
        };
        let warm = if reuse {
            self.warm.lock().unwrap_or_else(|e| e.into_inner()).pop()
        } else {
            None
        };
        // A pool slot, held until the invocation is done, then by the warm instance it
        // leaves if any: a warm instance brings its own. Declared before the store, so
        // it is released after the store (and the pool slot it holds) is dropped.
        let mut slot;
        let (mut store, instance, uses) = match warm {
            Some(w) => {
                slot = w.slot;
                (w.store, Some(w.instance), w.uses)
            }
            None => {
                slot = host.instance_slot().await;
                let store = host
                    .new_store(&self.grant)
                    .map_err(|e| NodeError::host(format!("{}: {}", self.label(), chain(&e))))?;
                (store, None, 0)
            }
        };
        // Made once the store is at hand: it counts waits on the store's own clock.
        let deadline = Deadline::on(hard, default, &store.data().waits);
        {
            let st = store.data_mut();
            st.interrupt = None;
            st.limiter.memory_exceeded = false;
            st.budget = Default::default();
            if let Some(q) = &st.quota {
                q.reset();
            }
            let meter = st.budget.http.clone();
            st.net.start(
                self.caller.clone(),
                ctx.cancel_token(),
                deadline.at(),
                meter,
                self.secrets.clone(),
                ctx.secrets().clone(),
            );
            st.inv = Some(Invocation {
                ctx: ctx.clone(),
                streaming: self.info.streaming_output || self.info.streaming_input,
                outputs: self.info.outputs.clone(),
                input,
                deadline: deadline.clone(),
                grant: self.grant.clone(),
                secret_source: self.secrets.clone(),
                max_value_bytes: host.settings().max_value_bytes,
                replies: Vec::new(),
            });
        }
        if fuel_on {
            store
                .set_fuel(budget)
                .map_err(|e| NodeError::host(e.to_string()))?;
        }
        store.set_epoch_deadline(1);

        // Pinned here and raced by reference, so the call's future is not copied again.
        let raced = {
            let call = std::pin::pin!(async {
                let instance = match instance {
                    Some(i) => i,
                    None => self.pkg.pre.instantiate_async(&mut store).await?,
                };
                let r = instance
                    .call_invoke(&mut store, &self.type_name, &inputs, &self.properties)
                    .await?;
                Ok::<_, wasmtime::Error>((instance, r))
            });
            // Raced so a guest waiting in WASI (where no epoch check runs) is stopped too.
            race(call, &deadline, Some(ctx.cancel_token())).await
        };
        let result = match raced {
            Ok(r) => r,
            Err(i) => {
                store.data_mut().interrupt = Some(i);
                Err(wasmtime::Error::msg("interrupted while waiting"))
            }
        };
        // A guest that failed after a request of its was aborted under it by the cancel
        // or the deadline (it saw a lost connection) was stopped, not at fault.
        let guest_ok = matches!(result, Ok((_, Ok(_))));
        if !guest_ok && store.data().interrupt.is_none() && store.data().budget.http.aborted() {
            if ctx.is_cancelled() {
                store.data_mut().interrupt = Some(Interrupt::Cancelled);
            } else if deadline.passed() {
                store.data_mut().interrupt = Some(Interrupt::Deadline);
            }
        }
        // Whatever the guest left in flight ends with the invocation; what its requests
        // moved up to now is paid for below with the other host calls.
        store.data_mut().net.finish();
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
        let http = &store.data().budget.http;
        ctx.record_http(http.requests(), http.bytes());
        // Only a host-side failure reports the guest's last stderr lines.
        let host_failed = result.is_err() || unpaid.is_some() || store.data().interrupt.is_some();
        let (lines, stderr_tail) = {
            let mut log = store.data().log.lock().unwrap_or_else(|e| e.into_inner());
            let tail = if host_failed {
                log.stderr_tail()
            } else {
                String::new()
            };
            (log.drain(), tail)
        };
        for (level, line) in lines {
            ctx.log(level, line);
        }
        // No clock read of its own: the kernel times every invocation already.
        tracing::trace!(node = %self.node_id, "wasm invocation");

        // A guest stopped while waiting in a host call (emit, next-input) returns normally;
        // the interrupt still decides the outcome, as does a host limit it broke.
        if let Some(e) = store.data().budget.violation.clone() {
            return Err(e);
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
                            slot: slot.take(),
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
        let label = || self.label();
        let mut out = Outputs::new();
        for (handle, v) in outputs {
            // Outputs are few: a scan beats building a set on every invocation.
            if out.get(&handle).is_some() {
                return Err(NodeError::msg(format!(
                    "{} returned output `{}` twice; each output holds one value per invocation",
                    self.label(),
                    text::line(&handle, text::SHORT)
                ))
                .with_signature(crate::signature::DUPLICATE_OUTPUT));
            }
            let declared = self.info.outputs.iter().find(|(h, _)| **h == *handle);
            let v = check_output(
                &label,
                &handle,
                declared.map(|(_, t)| t),
                v,
                max,
                Via::Returned,
            )?;
            // The declared name's `Arc`, not a new allocation per value.
            match declared {
                Some((h, _)) => out.push(h.clone(), v),
                None => out.push(handle, v),
            }
        }
        Ok(out)
    }

    /// The node's own error, escaped and bounded (the guest wrote it; the kernel names
    /// the node when it reports it).
    fn guest_error(&self, ctx: &NodeCtx, e: WitNodeError) -> NodeError {
        let mut err = NodeError::msg(text::line(&e.message, text::MESSAGE));
        err.signature = e.signature.filter(|sig| {
            match heddle_core::supervise::signatures::check_declared(sig) {
                Ok(()) => true,
                Err(why) => {
                    // The supervisor would ignore it: say so instead of losing it quietly.
                    ctx.log(
                        LogLevel::Warn,
                        format!(
                            "{}: ignored {} (see sdk/README.md, \"Failure signatures\")",
                            self.label(),
                            why.trim_start_matches("invalid ")
                        ),
                    );
                    false
                }
            }
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
                .with_signature(crate::signature::DEADLINE),
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
                    self.grant.memory_bytes >> 20
                ),
            )
            .with_signature(crate::signature::MEMORY_LIMIT);
        }
        if trap == Some(Trap::OutOfFuel) {
            return NodeError::new(
                ErrorKind::FuelExhausted,
                format!("{label}: fuel exhausted (used the whole budget of {budget} units)"),
            )
            .with_signature(crate::signature::FUEL);
        }
        let failure = failure::classify(&e);
        let message = format!(
            "{label}: {}",
            failure.message(hostcall_limit(self.pkg.host.settings()), stderr_tail)
        );
        match failure {
            Failure::Exit(_) => NodeError::msg(message).with_signature(crate::signature::EXIT),
            Failure::TooMuchData => NodeError::new(
                ErrorKind::OutputTooLarge,
                format!(
                    "{message}; {}",
                    crate::config::value_limit_hint(self.pkg.host.settings().max_value_bytes)
                ),
            )
            .with_signature(crate::signature::OUTPUT_TOO_LARGE),
            Failure::Trap(t) => {
                let kind = failure::trap_name(t);
                NodeError::new(ErrorKind::Trap { trap: kind.clone() }, message)
                    .with_signature(crate::signature::trap(&kind))
            }
            Failure::Other(_) => NodeError::host(message).with_signature(crate::signature::HOST),
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Executor for WasmExecutor {
    // Inputs are converted before the future is made, and `run`'s future is the boxed one
    // itself rather than nested in another: every level of nesting is one more copy of
    // the whole (large) future per call.
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        // The map is ours: its keys move into the call instead of being copied.
        let inputs = call
            .inputs
            .into_iter()
            .map(|(k, v)| (k, to_wit(&v)))
            .collect();
        Box::pin(self.run(call.ctx, inputs, None))
    }

    fn run_stream(
        &self,
        input: InputStream,
        ctx: NodeCtx,
    ) -> BoxFuture<'_, Result<Outputs, NodeError>> {
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
        Box::pin(self.run(ctx, inputs, Some(input)))
    }

    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.warm.lock().unwrap_or_else(|e| e.into_inner()).clear();
        })
    }

    /// The store has no sockets and no process of its own (see `State::new`): without a
    /// network grant what a guest does stays on this machine, so a lost attempt spent
    /// nothing a durable run must account. A node that may call out may have spent (a
    /// paid API), so its retry-safe starts are recorded too.
    fn spends_outside(&self) -> bool {
        !self.grant.network.allowed.is_empty()
    }
}
