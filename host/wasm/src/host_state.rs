//! The host state of one wasmtime store: the WASI context (with exactly the node's
//! grant), the resource limiter, captured stdio, and the host imports a running node
//! calls.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use heddle_core::{LogLevel, PortType};
use heddle_kernel::{InputStream, NodeCtx, NodeError};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::heddle::node::{host, types};
use crate::bindings::{WitLogLevel, WitValue};
use crate::boundary::{Via, check_output, label, output_type};
use crate::budget::{self, HostBudget};
use crate::config::SecretsConfig;
use crate::deadline::{Deadline, Interrupt, WaitClock, until};
use crate::error::PackageError;
use crate::grants::NodeGrant;
use crate::net::{NetShared, Outgoing};
use crate::quota::WriteQuota;
use crate::text;
use crate::value::{to_wit, wit_size};

/// Linear memory / table limits of one store, recording what happened so a failed grow
/// is reported as "memory limit exceeded" rather than as the guest's abort that follows.
pub(crate) struct Limiter {
    pub memory_limit: usize,
    pub peak_memory: usize,
    pub memory_exceeded: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_exceeded = true;
            return Ok(false);
        }
        self.peak_memory = self.peak_memory.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        200
    }

    fn tables(&self) -> usize {
        64
    }

    fn memories(&self) -> usize {
        32
    }
}

/// Guest log output of one invocation: the `log` import plus stdout and stderr, capped.
#[derive(Default)]
pub(crate) struct LogBuf {
    pub cap: usize,
    pub used: usize,
    pub dropped: usize,
    /// Complete lines waiting to become events, and the unfinished tail of each stream.
    pub lines: Vec<(LogLevel, String)>,
    partial: [Vec<u8>; 2],
}

impl LogBuf {
    pub fn new(cap: usize) -> Self {
        LogBuf {
            cap,
            ..Default::default()
        }
    }

    fn admit(&mut self, len: usize) -> bool {
        if self.used + len > self.cap {
            self.dropped += len;
            false
        } else {
            self.used += len;
            true
        }
    }

    pub fn push_line(&mut self, level: LogLevel, line: String) {
        if self.admit(line.len()) {
            self.lines.push((level, line));
        }
    }

    /// A line the host writes about the guest (not counted against the guest's cap).
    pub fn push_host_line(&mut self, level: LogLevel, line: String) {
        self.lines.push((level, line));
    }

    fn push_bytes(&mut self, stream: usize, bytes: &[u8]) {
        let level = if stream == 0 {
            LogLevel::Info
        } else {
            LogLevel::Warn
        };
        if !self.admit(bytes.len()) {
            return;
        }
        let mut buf = std::mem::take(&mut self.partial[stream]);
        buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = text::line(
                &String::from_utf8_lossy(&buf[start..start + nl]),
                usize::MAX,
            );
            self.lines.push((level, line));
            start += nl + 1;
        }
        self.partial[stream] = buf[start..].to_vec();
    }

    /// Moves everything collected so far out, flushing unfinished lines and adding the
    /// truncation marker once.
    pub fn drain(&mut self) -> Vec<(LogLevel, String)> {
        for (stream, level) in [(0, LogLevel::Info), (1, LogLevel::Warn)] {
            let p = std::mem::take(&mut self.partial[stream]);
            if !p.is_empty() {
                self.lines
                    .push((level, text::line(&String::from_utf8_lossy(&p), usize::MAX)));
            }
        }
        let mut out = std::mem::take(&mut self.lines);
        if self.dropped > 0 {
            out.push((
                LogLevel::Warn,
                format!(
                    "[guest log output truncated: {} bytes dropped over the {}-byte cap]",
                    self.dropped, self.cap
                ),
            ));
            self.dropped = 0;
        }
        self.used = 0;
        out
    }

    /// The last lines written to stderr (a panic message), for trap reports.
    pub fn stderr_tail(&self) -> String {
        let mut v: Vec<String> = self
            .lines
            .iter()
            .filter(|(l, _)| *l == LogLevel::Warn)
            .map(|(_, s)| s.clone())
            // Advice to the guest's developer, meaningless to whoever reads the failure.
            .filter(|s| !s.starts_with("note: run with `RUST_BACKTRACE"))
            .collect();
        if !self.partial[1].is_empty() {
            v.push(text::line(
                &String::from_utf8_lossy(&self.partial[1]),
                usize::MAX,
            ));
        }
        let n = v.len().saturating_sub(3);
        v[n..].join(" | ")
    }
}

/// A guest stdout/stderr that accepts every write (a chatty guest must never block or
/// trap on its logging) and keeps what fits under the cap.
#[derive(Clone)]
struct CaptureStream {
    buf: Arc<Mutex<LogBuf>>,
    stream: usize,
}

impl IsTerminal for CaptureStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CaptureStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for CaptureStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.buf
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_bytes(self.stream, data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What the host imports need to know about the invocation in flight.
pub(crate) struct Invocation {
    pub ctx: NodeCtx,
    pub streaming: bool,
    pub outputs: Arc<[(Arc<str>, PortType)]>,
    pub input: Option<InputStream>,
    pub deadline: Deadline,
    pub grant: Arc<NodeGrant>,
    pub secret_source: Arc<SecretsConfig>,
    pub max_value_bytes: usize,
    /// A controller's events awaiting their reply, by ticket (0.2 `control-send`).
    pub replies: Vec<Option<heddle_kernel::runtime::ControlReply>>,
}

pub(crate) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: Limiter,
    pub log: Arc<Mutex<LogBuf>>,
    pub inv: Option<Invocation>,
    pub interrupt: Option<Interrupt>,
    /// Deadline of a call made outside any invocation (`describe` at load).
    pub describe_deadline: Option<Deadline>,
    /// Lent to the deadline of each invocation in turn (see [`WaitClock`]).
    pub waits: WaitClock,
    pub budget: HostBudget,
    /// The grant's write quota, when it has one (charged by `quota`'s functions).
    pub quota: Option<Arc<WriteQuota>>,
    http: WasiHttpCtx,
    /// Outgoing HTTP under the node's network grant (`net`).
    pub net: Outgoing,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for State {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.net,
        }
    }
}

impl State {
    /// A store state with exactly the authority in `grant`: no sockets, no inherited
    /// stdio, only the granted directories and env vars, and HTTP only to the granted
    /// destinations (`net`).
    pub fn new(
        grant: &NodeGrant,
        log_cap: usize,
        net_shared: Arc<NetShared>,
    ) -> Result<State, PackageError> {
        let log = Arc::new(Mutex::new(LogBuf::new(log_cap)));
        let mut b = WasiCtxBuilder::new();
        b.stdout(CaptureStream {
            buf: log.clone(),
            stream: 0,
        });
        b.stderr(CaptureStream {
            buf: log.clone(),
            stream: 1,
        });
        grant.apply_to(&mut b)?;
        // WASI limits are opt-in (CVE-2026-27204): cap what a guest can make the host
        // allocate on its behalf.
        b.max_random_size(1 << 20);
        let mut table = ResourceTable::new();
        table.set_max_capacity(10_000);
        let net = Outgoing::new(net_shared, grant.network.clone(), log.clone());
        Ok(State {
            wasi: b.build(),
            table,
            limiter: Limiter {
                memory_limit: grant.memory_bytes,
                peak_memory: 0,
                memory_exceeded: false,
            },
            log,
            inv: None,
            interrupt: None,
            describe_deadline: None,
            waits: WaitClock::default(),
            budget: HostBudget::default(),
            quota: grant.files_write_quota.map(WriteQuota::new),
            http: WasiHttpCtx::new(),
            net,
        })
    }

    pub(crate) fn inv(&self) -> Option<&Invocation> {
        self.inv.as_ref()
    }

    /// Checked by the epoch callback on every tick.
    pub fn should_interrupt(&mut self) -> bool {
        if self.budget.violation.is_some() {
            return true;
        }
        let Some(inv) = &self.inv else {
            if self
                .describe_deadline
                .as_ref()
                .is_some_and(Deadline::passed)
            {
                self.interrupt = Some(Interrupt::Deadline);
                return true;
            }
            return false;
        };
        if inv.deadline.passed() {
            self.interrupt = Some(Interrupt::Deadline);
            return true;
        }
        if inv.ctx.is_cancelled() {
            self.interrupt = Some(Interrupt::Cancelled);
            return true;
        }
        false
    }
}

fn level(l: WitLogLevel) -> LogLevel {
    match l {
        WitLogLevel::Trace | WitLogLevel::Debug => LogLevel::Debug,
        WitLogLevel::Info => LogLevel::Info,
        WitLogLevel::Warn => LogLevel::Warn,
        WitLogLevel::Error => LogLevel::Error,
    }
}

// ----- host imports ---------------------------------------------------------------

/// The failure of a node that broke a host-side rule.
fn broke(inv: &Invocation, signature: &str, what: String) -> NodeError {
    let who = label(inv.ctx.node_id(), inv.ctx.node_type());
    NodeError::msg(format!("{who} {what}")).with_signature(signature)
}

impl types::Host for State {}

impl host::Host for State {
    async fn log(&mut self, lvl: WitLogLevel, message: String) {
        self.budget.charge(message.len());
        let m = text::line(&message, budget::MAX_LOG_LINE);
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_line(level(lvl), m);
    }

    async fn emit(&mut self, handle: String, value: WitValue) -> Result<(), String> {
        self.budget.charge(wit_size(&value));
        let Some(inv) = self.inv() else {
            return Err("emit is only possible during an invocation".into());
        };
        if !inv.streaming {
            return Err(format!(
                "node {} is not a streaming node; return outputs instead",
                inv.ctx.node_id()
            ));
        }
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline.clone();
        let who = || label(ctx.node_id(), ctx.node_type());
        let checked = check_output(
            &who,
            &handle,
            output_type(&inv.outputs, &handle),
            value,
            inv.max_value_bytes,
            Via::Emitted,
        );
        let v = match checked {
            Ok(v) => v,
            Err(e) => {
                // The node fails whatever it does with the refusal: a lie is the
                // emitting node's failure, never the next node's.
                let reply = e.message.clone();
                self.budget.violate(e);
                return Err(reply);
            }
        };
        let _wait = deadline.waiting();
        tokio::select! {
            r = ctx.emit(&handle, v) => r.map_err(|e| e.message),
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                Err("cancelled".into())
            }
            _ = until(deadline.hard()) => {
                self.interrupt = Some(Interrupt::Deadline);
                Err("deadline exceeded".into())
            }
        }
    }

    async fn next_input(&mut self) -> Option<(String, WitValue)> {
        self.budget.charge(0);
        let inv = self.inv.as_mut()?;
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline.clone();
        let input = inv.input.as_mut()?;
        let _wait = deadline.waiting();
        let item = tokio::select! {
            i = input.next() => i?,
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                return None;
            }
            _ = until(deadline.hard()) => {
                self.interrupt = Some(Interrupt::Deadline);
                return None;
            }
        };
        Some((item.handle.to_string(), to_wit(&item.value)))
    }

    async fn report_cost(&mut self, usd: f64) {
        self.budget.charge(0);
        let Some(inv) = self.inv.as_ref() else { return };
        if !usd.is_finite() || usd < 0.0 {
            let e = broke(
                inv,
                crate::signature::BAD_CALL,
                format!("reported a cost of {usd} USD"),
            );
            self.budget.violate(e);
            return;
        }
        inv.ctx.report_cost(usd);
    }

    async fn record_asset(&mut self, id: String) {
        self.budget.charge(id.len());
        let Some(inv) = self.inv.as_ref() else { return };
        if id.len() > budget::MAX_ASSET_ID {
            let msg = format!(
                "recorded an asset id of {} bytes, over the {}-byte limit",
                id.len(),
                budget::MAX_ASSET_ID
            );
            self.budget
                .violate(broke(inv, crate::signature::HOST_LIMIT, msg));
            return;
        }
        if self.budget.assets >= budget::MAX_ASSETS {
            let msg = format!(
                "recorded more than {} asset ids in one invocation",
                budget::MAX_ASSETS
            );
            self.budget
                .violate(broke(inv, crate::signature::HOST_LIMIT, msg));
            return;
        }
        self.budget.assets += 1;
        inv.ctx.record_asset(id);
    }

    async fn cancelled(&mut self) -> bool {
        self.budget.charge(0);
        match self.inv() {
            Some(inv) => inv.ctx.is_cancelled() || inv.deadline.passed(),
            None => false,
        }
    }

    async fn deadline_ms(&mut self) -> Option<u64> {
        self.budget.charge(0);
        let d = self.inv()?.deadline.at()?;
        Some(
            d.saturating_duration_since(std::time::Instant::now())
                .as_millis() as u64,
        )
    }

    async fn get_secret(&mut self, name: String) -> Option<String> {
        self.budget.charge(name.len());
        let inv = self.inv.as_ref()?;
        if name.len() > budget::MAX_SECRET_NAME || !inv.grant.allows_secret(&name) {
            // Logged through the capped guest log, a bounded number of times, with the
            // name escaped and cut: the guest chooses it.
            self.budget.refusals += 1;
            let n = self.budget.refusals;
            let line = if n <= budget::MAX_REFUSALS_LOGGED {
                Some(format!(
                    "secret `{}` was requested but is not granted to this node",
                    text::line(&name, 64)
                ))
            } else if n == budget::MAX_REFUSALS_LOGGED + 1 {
                Some("further refused secret requests of this invocation are not logged".into())
            } else {
                None
            };
            if let Some(line) = line {
                self.log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_host_line(LogLevel::Warn, line);
            }
            return None;
        }
        let v = inv.secret_source.lookup(&name)?;
        inv.ctx.secrets().register(&v);
        Some(v)
    }
}
