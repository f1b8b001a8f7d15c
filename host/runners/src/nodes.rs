//! The code nodes: `code.python`, `code.javascript`, `code.bash` and `code.shell`.
//!
//! Conventions (also in the README):
//! - every input (edge or property not listed below) becomes a variable: a native value
//!   in Python/JavaScript, an environment variable in Bash/shell (strings as-is, other
//!   values as JSON text); every language also gets `HEDDLE_IN_<name>` holding the JSON;
//! - `result` is what the code passes to `set_result(...)` (last call wins); without a
//!   call, the last non-blank stdout line, parsed as JSON when it is JSON, else as text;
//!   with no output at all, null;
//! - `stdout` / `stderr` emit one string per line while the code runs.

// `NodeError` is the kernel's error type at the executor seam; boxing it here would only
// move the allocation, since every error ends up as one.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use heddle_core::graph::AccessLevel;
use heddle_core::{
    LogLevel, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl, PortType, Value,
};
use heddle_kernel::{
    BoxFuture, Call, ErrorKind, Executor, NodeCtx, NodeError, NodeProvider, NodeSpec, Outputs,
};

use crate::config::RunnersConfig;
use crate::error::RunnerError;
use tokio_util::task::TaskTracker;

use crate::runner::{Exit, Mode, RunSpec, Runner, Stream};
use crate::sandbox::{MIB, Sandbox, Workspace};

/// Prefix of the stdout line through which `set_result` hands the result to the host.
/// It starts with an ASCII record separator so ordinary output never matches it.
pub const RESULT_MARKER: &str = "\u{1e}heddle-result ";

/// Largest single argument or environment string the kernel's `execve` accepts
/// (MAX_ARG_STRLEN, 128 KiB, including the terminating NUL).
const MAX_ARG: usize = 128 * 1024 - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    Python,
    JavaScript,
    Bash,
    /// A shell command (`sh -c`).
    Shell,
}

impl Language {
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::JavaScript,
        Language::Bash,
        Language::Shell,
    ];

    pub fn type_name(self) -> &'static str {
        match self {
            Language::Python => "code.python",
            Language::JavaScript => "code.javascript",
            Language::Bash => "code.bash",
            Language::Shell => "code.shell",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::JavaScript => "JavaScript",
            Language::Bash => "Bash",
            Language::Shell => "shell",
        }
    }

    /// The property holding the source text.
    fn code_property(self) -> &'static str {
        match self {
            Language::Shell => "command",
            _ => "code",
        }
    }

    fn default_image(self, c: &RunnersConfig) -> &str {
        match self {
            Language::Python => &c.images.python,
            Language::JavaScript => &c.images.javascript,
            Language::Bash | Language::Shell => &c.images.bash,
        }
    }

    fn from_type(t: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.type_name() == t)
    }

    /// The command line. The user's code travels in `HEDDLE_CODE` for Python and
    /// JavaScript (so no interpreter option parsing can touch it) and after a one-line
    /// prelude for the shells (so line numbers in their errors stay right).
    fn argv(self, code: &str) -> (Vec<String>, Option<String>) {
        match self {
            Language::Python => (
                vec![
                    "python3".into(),
                    "-u".into(),
                    "-c".into(),
                    PY_PRELUDE.into(),
                ],
                Some(code.into()),
            ),
            Language::JavaScript => (
                vec!["node".into(), "-e".into(), JS_PRELUDE.into()],
                Some(code.into()),
            ),
            Language::Bash => (
                vec!["bash".into(), "-c".into(), format!("{SH_PRELUDE}{code}")],
                None,
            ),
            Language::Shell => (
                vec!["sh".into(), "-c".into(), format!("{SH_PRELUDE}{code}")],
                None,
            ),
        }
    }
}

const PY_PRELUDE: &str = r#"import json as _hj, os as _ho, sys as _hs
inputs = {_k[10:]: _hj.loads(_v) for _k, _v in _ho.environ.items() if _k.startswith("HEDDLE_IN_")}
def set_result(value):
    _hs.stdout.write("\x1eheddle-result " + _hj.dumps(value) + "\n")
    _hs.stdout.flush()
_hcode = _ho.environ.pop("HEDDLE_CODE", "")
globals().update(inputs)
exec(compile(_hcode, "<code>", "exec"), globals())
"#;

const JS_PRELUDE: &str = r#"const inputs = {};
for (const [k, v] of Object.entries(process.env)) if (k.startsWith("HEDDLE_IN_")) inputs[k.slice(10)] = JSON.parse(v);
const set_result = (v) => { process.stdout.write("\x1eheddle-result " + JSON.stringify(v === undefined ? null : v) + "\n"); };
const code = process.env.HEDDLE_CODE || ""; delete process.env.HEDDLE_CODE;
const names = Object.keys(inputs).filter((n) => /^[A-Za-z_$][\w$]*$/.test(n));
const AsyncFunction = (async () => {}).constructor;
let fn;
try { fn = new AsyncFunction("inputs", "set_result", "setResult", "require", ...names, code); }
catch (e) { console.error(String(e && e.stack || e)); process.exit(1); }
fn(inputs, set_result, set_result, require, ...names.map((n) => inputs[n]))
  .catch((e) => { console.error(String(e && e.stack || e)); process.exitCode = 1; });
"#;

const SH_PRELUDE: &str = r#"set_result() { printf '\036heddle-result %s\n' "$1"; }; "#;

/// Sandbox properties that only a container can enforce.
const DOCKER_ONLY: [&str; 12] = [
    "image",
    "memory_mb",
    "cpus",
    "pids_limit",
    "network",
    "ipc_mode",
    "cap_drop",
    "no_new_privileges",
    "user",
    "read_only_root",
    "tmp_size_mb",
    "workspace_read_only",
];

/// Provider of the code node types. One per host: it holds the operator's
/// configuration and the (lazily connected) Docker client shared by all code nodes.
pub struct CodeNodes {
    config: Arc<RunnersConfig>,
    runner: Runner,
}

impl CodeNodes {
    pub fn new(config: RunnersConfig) -> Self {
        let runner = Runner::new(config.docker_host.clone());
        CodeNodes {
            config: Arc::new(config),
            runner,
        }
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    fn decl(&self, lang: Language) -> NodeDecl {
        let d = Sandbox::default();
        let mut decl = NodeDecl::new(lang.type_name());
        decl.title = format!("{} code", lang.label());
        decl.description = format!(
            "Runs {} code in a sandbox (Docker by default). Inputs become variables; \
             `result` is the value given to set_result (else the last stdout line, as JSON \
             when it parses); stdout/stderr stream one line per value. Not retry-safe: \
             whether a re-run is harmless depends on the sandbox a node chooses.",
            lang.label()
        );
        decl.mode = NodeMode::StreamingOutput;
        // Declared per type, while network and writable mounts are per node: a type
        // cannot promise that every node of it is hermetic.
        decl.retry_safe = false;
        decl.dynamic_inputs = true;
        decl.origin = "code".into();
        decl.inputs = vec![
            PortDecl::new("input", PortType::Any)
                .describe("Available to the code as the variable `input`"),
        ];
        decl.outputs = vec![
            OutputDecl::new("result", PortType::Any)
                .describe("The value passed to set_result, else the last stdout line"),
            OutputDecl::new("stdout", PortType::Str)
                .correlated(OutputCorrelation::Chunk)
                .describe("One value per line of standard output"),
            OutputDecl::new("stderr", PortType::Str)
                .correlated(OutputCorrelation::Chunk)
                .describe("One value per line of standard error"),
        ];
        let code_desc = match lang {
            Language::Shell => "Shell command line, run with `sh -c`",
            _ => "Source code",
        };
        decl.properties = vec![
            PortDecl::new(lang.code_property(), PortType::Str)
                .required()
                .describe(code_desc),
            PortDecl::new("mode", PortType::Str)
                .with_default("docker")
                .describe(
                    "`docker` (sandboxed) or `subprocess` (host process; operator must allow)",
                ),
            PortDecl::new("image", PortType::Str)
                .with_default(lang.default_image(&self.config))
                .describe("Container image"),
            PortDecl::new("timeout_s", PortType::Number)
                .with_default(d.timeout.as_secs_f64())
                .describe("Time limit; the code is killed when it is reached"),
            PortDecl::new("memory_mb", PortType::Int)
                .with_default(d.memory_bytes / MIB)
                .describe("Memory limit (no swap beyond it)"),
            PortDecl::new("cpus", PortType::Number).with_default(1.0),
            PortDecl::new("pids_limit", PortType::Int).with_default(d.pids_limit),
            PortDecl::new("network", PortType::Bool)
                .with_default(false)
                .describe("Give the container a network (off by default)"),
            PortDecl::new("ipc_mode", PortType::Str).with_default(d.ipc_mode.as_str()),
            PortDecl::new("cap_drop", PortType::list_of(PortType::Str))
                .with_default(Value::list(vec![Value::str("ALL")])),
            PortDecl::new("no_new_privileges", PortType::Bool).with_default(true),
            PortDecl::new("user", PortType::Str)
                .with_default("1000:1000")
                .describe("uid:gid in the container; empty keeps the image's user"),
            PortDecl::new("read_only_root", PortType::Bool)
                .with_default(false)
                .describe("Read-only root filesystem with a writable tmpfs on /tmp"),
            PortDecl::new("tmp_size_mb", PortType::Int).with_default(d.tmp_bytes / MIB),
            PortDecl::new("workspace", PortType::Str).describe(
                "Host directory mounted at /workspace (must lie in the operator's workspace_roots)",
            ),
            PortDecl::new("workspace_read_only", PortType::Bool).with_default(false),
            PortDecl::new("output_limit_bytes", PortType::Int)
                .with_default(d.output_limit as i64)
                .describe("stdout+stderr forwarded before the rest is dropped"),
            PortDecl::new("kill_grace_ms", PortType::Int)
                .with_default(d.kill_grace.as_millis() as i64)
                .describe("Subprocess mode: SIGTERM to SIGKILL delay when stopping"),
        ];
        decl
    }
}

impl NodeProvider for CodeNodes {
    fn name(&self) -> &str {
        "code"
    }

    fn declarations(&self) -> Vec<Arc<NodeDecl>> {
        Language::ALL
            .into_iter()
            .map(|l| Arc::new(self.decl(l)))
            .collect()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        let lang = Language::from_type(&spec.decl.type_name).ok_or_else(|| {
            NodeError::host(format!(
                "node {}: `{}` is not a code node type",
                spec.id, spec.decl.type_name
            ))
        })?;
        let exec = configure(lang, spec, &self.config, self.runner.clone())?;
        Ok(Arc::new(exec))
    }
}

/// Reads one property with its type checked; errors name the node and the property.
struct Props<'a> {
    node: &'a str,
    map: &'a BTreeMap<String, Value>,
}

impl Props<'_> {
    fn err(&self, name: &str, want: &str, got: &Value) -> NodeError {
        NodeError::msg(format!(
            "node {}: property `{name}` must be {want}, got {} `{got}`",
            self.node,
            got.kind()
        ))
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn str(&self, name: &str) -> Result<Option<String>, NodeError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s.to_string())),
            Some(v) => Err(self.err(name, "a string", v)),
        }
    }

    fn bool(&self, name: &str, default: bool) -> Result<bool, NodeError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(name, "true or false", v)),
        }
    }

    fn positive(&self, name: &str, default: f64) -> Result<f64, NodeError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(f) if f.is_finite() && f > 0.0 => Ok(f),
                _ => Err(self.err(name, "a positive number", v)),
            },
        }
    }

    fn int(&self, name: &str, default: i64, min: i64) -> Result<i64, NodeError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.as_i64() {
                Some(i) if i >= min => Ok(i),
                _ => Err(self.err(name, &format!("an integer ≥ {min}"), v)),
            },
        }
    }

    fn str_list(&self, name: &str, default: Vec<String>) -> Result<Vec<String>, NodeError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::List(items)) => items
                .iter()
                .map(|i| match i {
                    Value::Str(s) => Ok(s.to_string()),
                    other => Err(self.err(name, "a list of strings", other)),
                })
                .collect(),
            Some(v) => Err(self.err(name, "a list of strings", v)),
        }
    }
}

fn property_names(lang: Language) -> impl Iterator<Item = &'static str> {
    [
        lang.code_property(),
        "mode",
        "timeout_s",
        "workspace",
        "output_limit_bytes",
        "kill_grace_ms",
    ]
    .into_iter()
    .chain(DOCKER_ONLY)
}

fn configure(
    lang: Language,
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
    runner: Runner,
) -> Result<CodeExecutor, NodeError> {
    let p = Props {
        node: spec.id,
        map: spec.properties,
    };
    let bad = |msg: String| NodeError::msg(format!("node {}: {msg}", spec.id));
    let code = p.str(lang.code_property())?.ok_or_else(|| {
        bad(format!(
            "property `{}` is required (the {} to run)",
            lang.code_property(),
            if lang == Language::Shell {
                "command line"
            } else {
                "code"
            }
        ))
    })?;
    let mode_text = p.str("mode")?.unwrap_or_else(|| "docker".into());
    let mode = Mode::parse(&mode_text).ok_or_else(|| {
        bad(format!(
            "property `mode` is `{mode_text}`; expected `docker` or `subprocess`"
        ))
    })?;
    if mode == Mode::Subprocess {
        if !config.allow_subprocess {
            return Err(bad(
                "mode `subprocess` runs the code unsandboxed on the host and is disabled; \
                 the operator can allow it with `[runners] allow_subprocess = true` in heddle.toml"
                    .into(),
            ));
        }
        // Presence, not difference from the default, is what counts: an author who
        // writes `network: false` here expects an isolation this mode cannot give.
        if let Some(name) = DOCKER_ONLY.iter().find(|n| p.get(n).is_some()) {
            return Err(bad(format!(
                "property `{name}` needs a container and cannot be enforced in mode `subprocess`; \
                 remove it or use mode `docker`"
            )));
        }
    }

    let d = Sandbox::default();
    let timeout = p.positive("timeout_s", d.timeout.as_secs_f64())?;
    let cpus = p.positive("cpus", 1.0)?;
    let user = match p.str("user")? {
        None => d.user.clone(),
        Some(u) if u.is_empty() => None,
        Some(u) => Some(u),
    };
    let workspace = match p.str("workspace")? {
        None => None,
        Some(path) => Some(Workspace {
            host_path: allowed_workspace(spec.id, &path, config)?,
            read_only: p.bool("workspace_read_only", false)?,
        }),
    };
    // The workflow author's `limits.files` narrows the workspace, never widens it.
    let workspace = match (spec.limits.and_then(|l| l.files), workspace) {
        (Some(AccessLevel::None), Some(_)) => {
            return Err(bad(
                "`limits.files` is `none` but property `workspace` asks for a mount; \
                 remove one of them"
                    .into(),
            ));
        }
        (Some(AccessLevel::Read), Some(w)) => Some(Workspace {
            read_only: true,
            ..w
        }),
        (_, w) => w,
    };
    let sandbox = Sandbox {
        timeout: Duration::from_secs_f64(timeout),
        // Docker refuses less than 6 MiB.
        memory_bytes: p.int("memory_mb", d.memory_bytes / MIB, 6)? * MIB,
        nano_cpus: (cpus * 1e9) as i64,
        pids_limit: p.int("pids_limit", d.pids_limit, 1)?,
        network: p.bool("network", false)?,
        ipc_mode: p.str("ipc_mode")?.unwrap_or(d.ipc_mode.clone()),
        cap_drop: p.str_list("cap_drop", d.cap_drop.clone())?,
        no_new_privileges: p.bool("no_new_privileges", true)?,
        user,
        read_only_root: p.bool("read_only_root", false)?,
        tmp_bytes: p.int("tmp_size_mb", d.tmp_bytes / MIB, 1)? * MIB,
        workspace,
        output_limit: p.int("output_limit_bytes", d.output_limit as i64, 0)? as usize,
        max_line: d.max_line,
        kill_grace: Duration::from_millis(p.int(
            "kill_grace_ms",
            d.kill_grace.as_millis() as i64,
            0,
        )? as u64),
    };
    let image = p
        .str("image")?
        .unwrap_or_else(|| lang.default_image(config).to_string());
    let mut notes = Vec::new();
    if mode == Mode::Subprocess {
        notes.push(
            "subprocess mode: the code runs on the host as the host user, with no memory, \
             network or filesystem isolation (time limit, output cap and process-group kill apply)"
                .to_string(),
        );
    } else {
        let w = sandbox.weakenings();
        if !w.is_empty() {
            notes.push(format!(
                "sandbox loosened by node properties: {}",
                w.join(", ")
            ));
        }
    }
    Ok(CodeExecutor {
        node_id: spec.id.to_string(),
        lang,
        code,
        mode,
        image,
        sandbox,
        notes,
        props: property_names(lang).collect(),
        runner,
        drivers: TaskTracker::new(),
    })
}

fn allowed_workspace(node: &str, path: &str, config: &RunnersConfig) -> Result<PathBuf, NodeError> {
    let bad = |msg: String| NodeError::msg(format!("node {node}: property `workspace`: {msg}"));
    let canon = std::fs::canonicalize(path).map_err(|e| bad(format!("`{path}`: {e}")))?;
    if !canon.is_dir() {
        return Err(bad(format!("`{path}` is not a directory")));
    }
    let inside = config
        .workspace_roots
        .iter()
        .any(|root| std::fs::canonicalize(root).is_ok_and(|r| canon.starts_with(r)));
    if !inside {
        return Err(bad(format!(
            "`{path}` is not inside any directory the operator allows \
             (`[runners] workspace_roots` in heddle.toml: {:?})",
            config.workspace_roots
        )));
    }
    Ok(canon)
}

struct CodeExecutor {
    node_id: String,
    lang: Language,
    code: String,
    mode: Mode,
    image: String,
    sandbox: Sandbox,
    /// Warnings logged at every invocation (loosened sandbox, subprocess mode).
    notes: Vec<String>,
    /// Names that are configuration, not inputs.
    props: Vec<&'static str>,
    runner: Runner,
    /// The driver tasks of this node's runs. The kernel drops an invocation's future on
    /// cancel; the driver then still stops and removes the container (or kills the
    /// process group), and `finalize` waits for it, so a finished run leaves nothing.
    drivers: TaskTracker,
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl CodeExecutor {
    fn fail(&self, msg: String) -> NodeError {
        NodeError::msg(format!("node {}: {msg}", self.node_id))
    }

    fn spec(&self, inputs: &BTreeMap<String, Value>) -> Result<RunSpec, NodeError> {
        let (argv, code_env) = self.lang.argv(&self.code);
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
        }
        let mut argv = argv;
        if self.mode == Mode::Subprocess && self.lang == Language::Shell {
            // The host's sh; same as in the image.
            argv[0] = "sh".into();
        }
        Ok(RunSpec {
            mode: self.mode,
            image: self.image.clone(),
            argv,
            env,
            sandbox: self.sandbox.clone(),
            labels: vec![(crate::docker::LABEL_NODE.to_string(), self.node_id.clone())],
            result_marker: Some(RESULT_MARKER.to_string()),
            name_hint: self.node_id.clone(),
        })
    }

    async fn run(&self, call: Call) -> Result<Outputs, NodeError> {
        let ctx = call.ctx;
        for n in &self.notes {
            ctx.log(LogLevel::Warn, n.clone());
        }
        let mut spec = self.spec(&call.inputs)?;
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
                    self.sandbox.output_limit
                ),
            );
        }
        self.outcome(exit)
    }

    fn cancelled(&self, ctx: &NodeCtx) -> NodeError {
        match ctx.deadline() {
            Some(d) if std::time::Instant::now() >= d => NodeError::new(
                ErrorKind::Deadline,
                format!(
                    "node {}: the node's time limit passed; the code was stopped",
                    self.node_id
                ),
            )
            .with_signature("code:deadline"),
            _ => NodeError::cancelled(),
        }
    }

    fn start_error(&self, e: RunnerError) -> NodeError {
        let sig = match &e {
            RunnerError::NoEngine { .. } => "code:no-engine",
            RunnerError::MissingImage { .. } => "code:missing-image",
            RunnerError::Spawn { .. } => "code:spawn",
            _ => "code:host",
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
                    self.node_id, self.sandbox.timeout
                ),
            )
            .with_signature("code:timeout"));
        }
        if exit.oom_killed {
            return Err(NodeError::new(
                ErrorKind::MemoryLimit,
                format!(
                    "node {}: {lang} code went over its memory limit of {} MiB and was killed; {tail}",
                    self.node_id,
                    self.sandbox.memory_bytes / MIB
                ),
            )
            .with_signature("code:oom"));
        }
        if exit.stopped {
            return Err(NodeError::cancelled());
        }
        match (exit.code, exit.signal) {
            (Some(0), _) => {}
            (Some(code), _) => {
                return Err(self
                    .fail(format!("{lang} code exited with code {code}; {tail}"))
                    .with_signature(format!("code:exit:{code}")));
            }
            (None, Some(sig)) => {
                return Err(self
                    .fail(format!("{lang} code was killed by signal {sig}; {tail}"))
                    .with_signature(format!("code:signal:{sig}")));
            }
            (None, None) => {
                return Err(NodeError::host(format!(
                    "node {}: the {lang} code's exit status could not be read; {tail}",
                    self.node_id
                )));
            }
        }
        let text = exit.result.or(exit.last_stdout);
        let value = match text {
            None => Value::Null,
            Some(t) => match serde_json::from_str::<serde_json::Value>(t.trim()) {
                Ok(j) => Value::from_json(j),
                Err(_) => Value::str(t),
            },
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
        Box::pin(async {
            if self.mode != Mode::Docker {
                return Ok(());
            }
            let docker = self
                .runner
                .docker()
                .await
                .map_err(|e| self.start_error(e))?;
            match docker.inspect_image(&self.image).await {
                Ok(_) => Ok(()),
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => Err(self.start_error(RunnerError::MissingImage {
                    image: self.image.clone(),
                })),
                Err(source) => Err(self.start_error(RunnerError::Docker {
                    action: "looking up the image",
                    source,
                })),
            }
        })
    }

    fn finalize(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            self.drivers.close();
            self.drivers.wait().await;
            self.drivers.reopen();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("a_1"));
        assert!(is_identifier("_x"));
        assert!(!is_identifier("1a"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
    }
}
