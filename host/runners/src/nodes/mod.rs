//! The code nodes: `code.python`, `code.javascript`, `code.bash`, `code.shell`,
//! `code.ruby` and `code.lua`.
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

mod executor;
mod language;
mod server;
mod settings;

use std::sync::Arc;

use heddle_core::{
    ConfigProblem, NodeDecl, NodeMode, OutputCorrelation, OutputDecl, PortDecl, PortType, Value,
};
use heddle_kernel::{Executor, NodeError, NodeProvider, NodeSpec};

pub use language::{Language, RESULT_MARKER};

use crate::config::RunnersConfig;
use crate::runner::Runner;
use crate::sandbox::{MIB, Sandbox, Workspace};
use executor::CodeExecutor;

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
        decl.origin = heddle_core::Origin::Code;
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
            PortDecl::new("cpus", PortType::Number).with_default(d.nano_cpus as f64 / 1e9),
            PortDecl::new("pids_limit", PortType::Int).with_default(d.pids_limit),
            PortDecl::new("network", PortType::Bool)
                .with_default(d.network)
                .describe("Give the container a network (off by default)"),
            PortDecl::new("ipc_mode", PortType::Str).with_default(d.ipc_mode.as_str()),
            PortDecl::new("cap_drop", PortType::list_of(PortType::Str))
                .with_default(Value::list(vec![Value::str("ALL")])),
            PortDecl::new("no_new_privileges", PortType::Bool).with_default(d.no_new_privileges),
            PortDecl::new("user", PortType::Str)
                .with_default(d.user.as_deref().unwrap_or(""))
                .describe("uid:gid in the container; empty keeps the image's user"),
            PortDecl::new("read_only_root", PortType::Bool)
                .with_default(d.read_only_root)
                .describe("Read-only root filesystem with a writable tmpfs on /tmp"),
            PortDecl::new("tmp_size_mb", PortType::Int).with_default(d.tmp_bytes / MIB),
            PortDecl::new("workspace", PortType::Str).describe(
                "Host directory mounted at /workspace (must lie in the operator's workspace_roots)",
            ),
            PortDecl::new("workspace_read_only", PortType::Bool)
                .with_default(Workspace::READ_ONLY_BY_DEFAULT),
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
            .chain([Arc::new(server::decl())])
            .collect()
    }

    fn create(&self, spec: &NodeSpec<'_>) -> Result<Arc<dyn Executor>, NodeError> {
        if spec.decl.type_name == server::TYPE {
            return Ok(Arc::new(server::create(
                spec,
                &self.config,
                self.runner.clone(),
            )?));
        }
        let lang = Language::from_type(&spec.decl.type_name).ok_or_else(|| {
            NodeError::host(format!(
                "node {}: `{}` is not a code node type",
                spec.id, spec.decl.type_name
            ))
        })?;
        let settings = settings::read(lang, spec, &self.config).map_err(|problems| {
            let all: Vec<String> = problems.into_iter().map(|p| p.message).collect();
            NodeError::msg(format!("node {}: {}", spec.id, all.join("; ")))
        })?;
        Ok(Arc::new(CodeExecutor::new(
            spec.id,
            lang,
            settings,
            self.runner.clone(),
        )))
    }

    fn check(&self, spec: &NodeSpec<'_>) -> Vec<ConfigProblem> {
        if spec.decl.type_name == server::TYPE {
            return server::check(spec, &self.config);
        }
        match Language::from_type(&spec.decl.type_name) {
            Some(lang) => settings::read(lang, spec, &self.config)
                .err()
                .unwrap_or_default(),
            None => Vec::new(),
        }
    }
}
