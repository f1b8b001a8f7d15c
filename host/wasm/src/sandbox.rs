//! Per-store state: the WASI context (built from the node's grants), the resource
//! limiter, captured stdio, and the host imports a running node calls.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use heddle_core::{LogLevel, Value};
use heddle_kernel::{InputStream, NodeCtx};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::bindings::heddle::node::{host, types};
use crate::bindings::{WitLogLevel, WitValue};
use crate::config::{DirMode, Sandbox, SecretsConfig};

/// Why the epoch callback stopped the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interrupt {
    Deadline,
    Cancelled,
}

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
            let line = String::from_utf8_lossy(&buf[start..start + nl]).into_owned();
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
                    .push((level, String::from_utf8_lossy(&p).into_owned()));
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
            .collect();
        if !self.partial[1].is_empty() {
            v.push(String::from_utf8_lossy(&self.partial[1]).into_owned());
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
    pub outputs: Arc<[String]>,
    pub input: Option<InputStream>,
    pub deadline: Option<Instant>,
    pub secrets: Arc<BTreeSet<String>>,
    pub secret_source: Arc<SecretsConfig>,
    pub max_value_bytes: usize,
}

pub(crate) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: Limiter,
    pub log: Arc<Mutex<LogBuf>>,
    pub inv: Option<Invocation>,
    pub interrupt: Option<Interrupt>,
    /// Deadline of a call made outside any invocation (`describe` at load).
    pub describe_deadline: Option<Instant>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl State {
    /// A store state with exactly the authority in `sandbox`: no network, no inherited
    /// stdio, only the granted directories and env vars.
    pub fn new(sandbox: &Sandbox, log_cap: usize) -> Result<State, String> {
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
        for d in &sandbox.dirs {
            let perms = match d.mode {
                DirMode::Ro => FsPerms::ReadOnly,
                DirMode::Rw => FsPerms::ReadWrite,
            };
            b.preopened_dir(&d.host, &d.guest, perms).map_err(|e| {
                format!(
                    "granting directory {} as {}: {e}",
                    d.host.display(),
                    d.guest
                )
            })?;
        }
        for name in &sandbox.env {
            if let Ok(v) = std::env::var(name) {
                b.env(name, v);
            }
        }
        // WASI limits are opt-in (CVE-2026-27204): cap what a guest can make the host
        // allocate on its behalf.
        b.max_random_size(1 << 20);
        let mut table = ResourceTable::new();
        table.set_max_capacity(10_000);
        Ok(State {
            wasi: b.build(),
            table,
            limiter: Limiter {
                memory_limit: sandbox.memory_bytes,
                peak_memory: 0,
                memory_exceeded: false,
            },
            log,
            inv: None,
            interrupt: None,
            describe_deadline: None,
        })
    }

    fn inv(&self) -> Option<&Invocation> {
        self.inv.as_ref()
    }

    /// Checked by the epoch callback on every tick.
    pub fn should_interrupt(&mut self) -> bool {
        let Some(inv) = &self.inv else {
            if self.describe_deadline.is_some_and(|d| Instant::now() >= d) {
                self.interrupt = Some(Interrupt::Deadline);
                return true;
            }
            return false;
        };
        if inv.deadline.is_some_and(|d| Instant::now() >= d) {
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

// ----- value conversion -----------------------------------------------------------

pub(crate) fn to_wit(v: &Value) -> WitValue {
    match v {
        Value::Null => WitValue::Null,
        Value::Bool(b) => WitValue::Boolean(*b),
        Value::Int(i) => WitValue::S64(*i),
        Value::Float(f) => WitValue::F64(*f),
        Value::Str(s) => WitValue::String(s.to_string()),
        Value::Bytes(b) => WitValue::Bytes(b.to_vec()),
        Value::List(_) | Value::Object(_) => WitValue::Json(v.to_json().to_string()),
    }
}

pub(crate) fn from_wit(v: WitValue) -> Result<Value, String> {
    Ok(match v {
        WitValue::Null => Value::Null,
        WitValue::Boolean(b) => Value::Bool(b),
        WitValue::S64(i) => Value::Int(i),
        WitValue::F64(f) => Value::Float(f),
        WitValue::String(s) => Value::Str(s.into()),
        WitValue::Bytes(b) => Value::Bytes(b.into()),
        WitValue::Json(text) => {
            let j: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("malformed json value: {e}"))?;
            Value::from_json(j)
        }
    })
}

/// The size the value cap is checked against (JSON text is counted as sent).
pub(crate) fn wit_size(v: &WitValue) -> usize {
    match v {
        WitValue::String(s) | WitValue::Json(s) => s.len(),
        WitValue::Bytes(b) => b.len(),
        _ => 8,
    }
}

/// Resolves at `deadline`, never without one: a guest waiting in a host call is bound by
/// the same deadline as one computing.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
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

impl types::Host for State {}

impl host::Host for State {
    async fn log(&mut self, lvl: WitLogLevel, message: String) {
        let mut m = message;
        if m.len() > 16 << 10 {
            let mut cut = 16 << 10;
            while !m.is_char_boundary(cut) {
                cut -= 1;
            }
            m.truncate(cut);
            m.push_str(" …[line truncated]");
        }
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_line(level(lvl), m);
    }

    async fn emit(&mut self, handle: String, value: WitValue) -> Result<(), String> {
        let Some(inv) = self.inv() else {
            return Err("emit is only possible during an invocation".into());
        };
        if !inv.streaming {
            return Err(format!(
                "node {} is not a streaming node; return outputs instead",
                inv.ctx.node_id()
            ));
        }
        if !inv.outputs.contains(&handle) {
            return Err(format!(
                "node {} has no output `{handle}`",
                inv.ctx.node_id()
            ));
        }
        if wit_size(&value) > inv.max_value_bytes {
            return Err(format!(
                "value emitted on `{handle}` is {} bytes, over the {}-byte limit",
                wit_size(&value),
                inv.max_value_bytes
            ));
        }
        let v = from_wit(value)?;
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline;
        tokio::select! {
            r = ctx.emit(&handle, v) => r.map_err(|e| e.message),
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                Err("cancelled".into())
            }
            _ = until(deadline) => {
                self.interrupt = Some(Interrupt::Deadline);
                Err("deadline exceeded".into())
            }
        }
    }

    async fn next_input(&mut self) -> Option<(String, WitValue)> {
        let inv = self.inv.as_mut()?;
        let ctx = inv.ctx.clone();
        let deadline = inv.deadline;
        let input = inv.input.as_mut()?;
        let item = tokio::select! {
            i = input.next() => i?,
            _ = ctx.cancel_token().cancelled() => {
                self.interrupt = Some(Interrupt::Cancelled);
                return None;
            }
            _ = until(deadline) => {
                self.interrupt = Some(Interrupt::Deadline);
                return None;
            }
        };
        Some((item.handle.to_string(), to_wit(&item.value)))
    }

    async fn report_cost(&mut self, usd: f64) {
        if let Some(inv) = self.inv() {
            inv.ctx.report_cost(usd);
        }
    }

    async fn record_asset(&mut self, id: String) {
        if let Some(inv) = self.inv() {
            inv.ctx.record_asset(id);
        }
    }

    async fn cancelled(&mut self) -> bool {
        match self.inv() {
            Some(inv) => {
                inv.ctx.is_cancelled() || inv.deadline.is_some_and(|d| Instant::now() >= d)
            }
            None => false,
        }
    }

    async fn deadline_ms(&mut self) -> Option<u64> {
        let d = self.inv()?.deadline?;
        Some(d.saturating_duration_since(Instant::now()).as_millis() as u64)
    }

    async fn get_secret(&mut self, name: String) -> Option<String> {
        let inv = self.inv()?;
        if !inv.secrets.contains(&name) {
            inv.ctx.log(
                LogLevel::Warn,
                format!("secret `{name}` was requested but is not granted to this node"),
            );
            return None;
        }
        let v = inv.secret_source.lookup(&name)?;
        inv.ctx.secrets().register(&v);
        Some(v)
    }
}
