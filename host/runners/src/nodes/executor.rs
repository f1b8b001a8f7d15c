//! The code node executor: one invocation builds a [`RunSpec`] from the node's
//! settings and its inputs, starts it, streams its lines as `stdout` / `stderr`
//! values, and turns its [`Exit`] into the `result` output or an error naming the node.

// `NodeError` is the kernel's error type at the executor seam; boxing it here would only
// move the allocation, since every error ends up as one.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use heddle_core::{LogLevel, Value};
use heddle_kernel::{BoxFuture, Call, ErrorKind, Executor, NodeCtx, NodeError, Outputs};
use tokio_util::task::TaskTracker;

use super::language::{Language, RESULT_MARKER};
use super::settings::{Settings, property_names};
use crate::error::RunnerError;
use crate::runner::Runner;
use crate::sandbox::MIB;
use crate::spec::{Exit, Mode, RunSpec, Stream};

/// The failure signatures of code nodes, all in the `code` family (the grammar every
/// signature keeps: `heddle_core::supervise::signatures`).
pub(super) mod signature {
    pub const DEADLINE: &str = "code:deadline";
    pub const NO_ENGINE: &str = "code:no-engine";
    pub const MISSING_IMAGE: &str = "code:missing-image";
    pub const SPAWN: &str = "code:spawn";
    pub const HOST: &str = "code:host";
    pub const TIMEOUT: &str = "code:timeout";
    pub const OOM: &str = "code:oom";
    pub const BAD_RESULT: &str = "code:bad-result";
    /// A server (`code.server`) did not answer within its wait.
    pub const SERVER_UNREADY: &str = "code:server-unready";
    /// A server exited before it answered.
    pub const SERVER_EXITED: &str = "code:server-exited";
    #[cfg(test)]
    pub const ALL: &[&str] = &[
        SERVER_UNREADY,
        SERVER_EXITED,
        DEADLINE,
        NO_ENGINE,
        MISSING_IMAGE,
        SPAWN,
        HOST,
        TIMEOUT,
        OOM,
        BAD_RESULT,
    ];

    /// The code exited with this status (`code:exit:1`): one signature per status, so a
    /// policy can tell `code:exit:2` (a usage error) from the rest with `code:exit:*`.
    pub fn exit(code: i64) -> String {
        format!("code:exit:{code}")
    }

    /// The code was killed by this signal (`code:signal:9`).
    pub fn signal(sig: i32) -> String {
        format!("code:signal:{sig}")
    }
}

/// Largest single argument or environment string the kernel's `execve` accepts
/// (MAX_ARG_STRLEN, 128 KiB, including the terminating NUL).
const MAX_ARG: usize = 128 * 1024 - 1;

pub(super) struct CodeExecutor {
    pub(super) node_id: String,
    lang: Language,
    pub(super) settings: Settings,
    /// Names that are configuration, not inputs.
    props: Vec<&'static str>,
    pub(super) runner: Runner,
    /// The driver tasks of this node's runs. The kernel drops an invocation's future on
    /// cancel; the driver then still stops and removes the container (or kills the
    /// process group), and `finalize` waits for it, so a finished run leaves nothing.
    pub(super) drivers: TaskTracker,
}

/// At most 80 characters of `text`, for an error message.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl CodeExecutor {
    pub(super) fn new(node_id: &str, lang: Language, settings: Settings, runner: Runner) -> Self {
        CodeExecutor {
            node_id: node_id.to_string(),
            lang,
            settings,
            props: property_names(lang).collect(),
            runner,
            drivers: TaskTracker::new(),
        }
    }

    /// Names that are the node's configuration, not inputs, besides the code node's
    /// own (a server's `port`, …).
    pub(super) fn also_properties(mut self, names: &[&'static str]) -> Self {
        self.props.extend_from_slice(names);
        self
    }

    pub(super) fn fail(&self, msg: String) -> NodeError {
        NodeError::msg(format!("node {}: {msg}", self.node_id))
    }

    pub(super) fn spec(&self, inputs: &BTreeMap<String, Value>) -> Result<RunSpec, NodeError> {
        let (argv, code_env) = self.lang.argv(&self.settings.code);
        if let Some(long) = argv.iter().find(|a| a.len() > MAX_ARG) {
            return Err(self.fail(format!(
                "the {} is {} bytes; at most {MAX_ARG} fit on a command line",
                self.lang.code_property(),
                long.len()
            )));
        }
        let mut env = Vec::new();
        if let Some(code) = code_env {
            if code.len() > MAX_ARG {
                return Err(self.fail(format!(
                    "the code is {} bytes; at most {MAX_ARG} are accepted",
                    code.len()
                )));
            }
            env.push(("HEDDLE_CODE".to_string(), code));
        }
        env.push(("HEDDLE_NODE_ID".to_string(), self.node_id.clone()));
        let mut names = Vec::new();
        for (name, value) in inputs {
            if self.props.contains(&name.as_str()) {
                continue;
            }
            if !is_identifier(name) || name.starts_with("HEDDLE_") {
                return Err(self.fail(format!(
                    "input `{name}` cannot be a variable name (letters, digits and _, not \
                     starting with a digit or HEDDLE_)"
                )));
            }
            let json = value.to_json().to_string();
            let plain = match value {
                Value::Str(s) => s.to_string(),
                Value::Null => String::new(),
                _ => json.clone(),
            };
            for text in [&json, &plain] {
                if text.len() + name.len() + 11 > MAX_ARG {
                    return Err(self.fail(format!(
                        "input `{name}` is {} bytes once encoded; a code node takes at most \
                         {MAX_ARG} bytes per input (pass larger data through the workspace)",
                        text.len()
                    )));
                }
                if text.contains('\0') {
                    return Err(self.fail(format!(
                        "input `{name}` contains a NUL character, which cannot be passed to a program"
                    )));
                }
            }
            if matches!(self.lang, Language::Bash | Language::Shell) {
                env.push((name.clone(), plain));
            }
            env.push((format!("HEDDLE_IN_{name}"), json));
            names.push(name.as_str());
        }
        // For languages that cannot list their environment (Lua).
        env.push(("HEDDLE_INPUTS".to_string(), names.join(" ")));
        let mut argv = argv;
        if self.settings.mode == Mode::Subprocess && self.lang == Language::Shell {
            // The host's sh; same as in the image.
            argv[0] = "sh".into();
        }
        Ok(RunSpec {
            mode: self.settings.mode,
            image: self.settings.image.clone(),
            argv,
            env,
            sandbox: self.settings.sandbox.clone(),
            labels: vec![(crate::LABEL_NODE.to_string(), self.node_id.clone())],
            result_marker: Some(RESULT_MARKER.to_string()),
            name_hint: self.node_id.clone(),
        })
    }

    async fn run(&self, call: Call) -> Result<Outputs, NodeError> {
        let ctx = call.ctx;
        for n in &self.settings.notes {
            ctx.log(LogLevel::Warn, n.clone());
        }
        let mut spec = self.spec(&call.inputs)?;
        spec.label_run(&ctx);
        if let Some(parent) = ctx.traceparent() {
            // Last, over an input of the same name: the code's own spans join the run's
            // trace under this attempt's span (W3C Trace Context, as OTel SDKs read it).
            spec.env
                .push(("TRACEPARENT".to_string(), parent.to_string()));
        }
        // The run's own deadline (a node timeout set by the workflow) can only shorten ours.
        if let Some(deadline) = ctx.deadline() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            spec.sandbox.timeout = spec.sandbox.timeout.min(left);
        }
        if ctx.is_cancelled() {
            return Err(self.cancelled(&ctx));
        }
        let mut running = self
            .runner
            .start_tracked(spec, &self.drivers)
            .await
            .map_err(|e| self.start_error(e))?;
        for w in &running.warnings {
            ctx.log(LogLevel::Warn, format!("Docker engine: {w}"));
        }
        let cancel = ctx.cancel_token().clone();
        let mut emit_failed = None;
        loop {
            let line = tokio::select! {
                biased;
                _ = cancel.cancelled() => { running.stop(); break; }
                line = running.next_line() => line,
            };
            let Some(line) = line else { break };
            let handle = match line.stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            let sent = tokio::select! {
                biased;
                _ = cancel.cancelled() => { running.stop(); break; }
                r = ctx.emit(handle, Value::str(line.text)) => r,
            };
            if let Err(e) = sent {
                running.stop();
                emit_failed = Some(e);
                break;
            }
        }
        let exit = running.wait().await.map_err(|e| self.start_error(e))?;
        if let Some(e) = emit_failed {
            return Err(e);
        }
        if ctx.is_cancelled() {
            return Err(self.cancelled(&ctx));
        }
        if exit.truncated {
            ctx.log(
                LogLevel::Warn,
                format!(
                    "output passed the limit of {} bytes; the rest was dropped",
                    self.settings.sandbox.output_limit
                ),
            );
        }
        self.outcome(exit)
    }

    pub(super) fn cancelled(&self, ctx: &NodeCtx) -> NodeError {
        match ctx.deadline() {
            Some(d) if std::time::Instant::now() >= d => NodeError::new(
                ErrorKind::Deadline,
                format!(
                    "node {}: the node's time limit passed; the code was stopped",
                    self.node_id
                ),
            )
            .with_signature(signature::DEADLINE),
            _ => NodeError::cancelled(),
        }
    }

    pub(super) fn start_error(&self, e: RunnerError) -> NodeError {
        let sig = match &e {
            RunnerError::NoEngine { .. } => signature::NO_ENGINE,
            RunnerError::MissingImage { .. } => signature::MISSING_IMAGE,
            RunnerError::Spawn { .. } => signature::SPAWN,
            _ => signature::HOST,
        };
        NodeError::host(format!("node {}: {e}", self.node_id)).with_signature(sig)
    }

    fn outcome(&self, exit: Exit) -> Result<Outputs, NodeError> {
        let tail = if exit.stderr_tail.trim().is_empty() {
            String::from("(no stderr)")
        } else {
            format!("stderr (last lines):\n{}", exit.stderr_tail.trim_end())
        };
        let lang = self.lang.label();
        if exit.timed_out {
            return Err(NodeError::new(
                ErrorKind::Deadline,
                format!(
                    "node {}: {lang} code ran past its time limit of {:?} and was killed; {tail}",
                    self.node_id, self.settings.sandbox.timeout
                ),
            )
            .with_signature(signature::TIMEOUT));
        }
        if exit.oom_killed {
            return Err(NodeError::new(
                ErrorKind::MemoryLimit,
                format!(
                    "node {}: {lang} code went over its memory limit of {} MiB and was killed; {tail}",
                    self.node_id,
                    self.settings.sandbox.memory_bytes / MIB
                ),
            )
            .with_signature(signature::OOM));
        }
        if exit.stopped {
            return Err(NodeError::cancelled());
        }
        match (exit.code, exit.signal) {
            (Some(0), _) => {}
            (Some(code), _) => {
                return Err(self
                    .fail(format!("{lang} code exited with code {code}; {tail}"))
                    .with_signature(signature::exit(code)));
            }
            (None, Some(sig)) => {
                return Err(self
                    .fail(format!("{lang} code was killed by signal {sig}; {tail}"))
                    .with_signature(signature::signal(sig)));
            }
            (None, None) => {
                return Err(NodeError::host(format!(
                    "node {}: the {lang} code's exit status could not be read; {tail}",
                    self.node_id
                )));
            }
        }
        let value = match (exit.result, exit.last_stdout) {
            // What set_result was given must be JSON: `NaN` or `Infinity` (Python's
            // json.dumps writes them) would otherwise become a string nobody asked for.
            (Some(r), _) => match serde_json::from_str::<serde_json::Value>(r.trim()) {
                Ok(j) => Value::from_json(j),
                Err(e) => {
                    return Err(self
                        .fail(format!(
                            "set_result was given `{}`, which is not JSON ({e}); NaN and \
                             Infinity have no JSON form",
                            shorten(r.trim())
                        ))
                        .with_signature(signature::BAD_RESULT));
                }
            },
            // The last line is text the code printed: JSON when it parses, else a string.
            (None, Some(t)) => match serde_json::from_str::<serde_json::Value>(t.trim()) {
                Ok(j) => Value::from_json(j),
                Err(_) => Value::str(t),
            },
            (None, None) => Value::Null,
        };
        Ok(Outputs::one("result", value))
    }
}

impl Executor for CodeExecutor {
    fn invoke(&self, call: Call) -> BoxFuture<'_, Result<Outputs, NodeError>> {
        Box::pin(self.run(call))
    }

    /// Checks the engine and the image before any node of the run starts, so a graph
    /// whose code cannot run fails at once instead of after its upstream work.
    fn initialize(&self) -> BoxFuture<'_, Result<(), NodeError>> {
        Box::pin(self.check_ready())
    }

    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.wait_drivers())
    }
}

impl CodeExecutor {
    /// What [`Executor::initialize`] checks: leftovers swept, and in Docker mode the
    /// engine answering and the image present.
    pub(super) async fn check_ready(&self) -> Result<(), NodeError> {
        self.runner.sweep_orphan_processes().await;
        if self.settings.mode != Mode::Docker {
            return Ok(());
        }
        let docker = self
            .runner
            .docker()
            .await
            .map_err(|e| self.start_error(e))?;
        match docker.inspect_image(&self.settings.image).await {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Err(self.start_error(RunnerError::MissingImage {
                image: self.settings.image.clone(),
            })),
            Err(source) => Err(self.start_error(RunnerError::Docker {
                action: "looking up the image",
                source,
            })),
        }
    }

    /// Waits until every container and process this node started is gone (what
    /// [`Executor::finalize`] does).
    pub(super) async fn wait_drivers(&self) {
        self.drivers.close();
        self.drivers.wait().await;
        self.drivers.reopen();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_node_signature_keeps_the_signature_grammar() {
        let made = signature::ALL
            .iter()
            .map(|s| s.to_string())
            .chain([i64::MIN, -1, 0, 1, 255, i64::MAX].map(signature::exit))
            .chain([1, 9, 15, 64].map(signature::signal));
        for sig in made {
            heddle_core::supervise::signatures::check_declared(&sig)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("a_1"));
        assert!(is_identifier("_x"));
        assert!(!is_identifier("1a"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
    }
}
