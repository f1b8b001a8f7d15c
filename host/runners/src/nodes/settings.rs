//! A code node's properties read into its [`Settings`]: the code, the mode, the image
//! and the [`Sandbox`], each checked for type and range, with errors naming the node
//! and the property. Also the operator's rules the properties must obey (subprocess
//! mode allowed, workspace inside `workspace_roots`) and the author's `limits.files`.

#![allow(clippy::result_large_err)] // NodeError is the seam's error; reading settings is cold.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use heddle_core::Value;
use heddle_core::graph::AccessLevel;
use heddle_kernel::{NodeError, NodeSpec};

use super::language::Language;
use crate::config::RunnersConfig;
use crate::sandbox::{MIB, Sandbox, Workspace};
use crate::spec::Mode;

/// What a node's properties configure.
pub(super) struct Settings {
    pub code: String,
    pub mode: Mode,
    pub image: String,
    pub sandbox: Sandbox,
    /// Warnings logged at every invocation (loosened sandbox, subprocess mode).
    pub notes: Vec<String>,
}

/// Sandbox properties that only a container can enforce.
pub(super) const DOCKER_ONLY: [&str; 12] = [
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

pub(super) fn property_names(lang: Language) -> impl Iterator<Item = &'static str> {
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

pub(super) fn read(
    lang: Language,
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
) -> Result<Settings, NodeError> {
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
    let cpus = p.positive("cpus", d.nano_cpus as f64 / 1e9)?;
    let user = match p.str("user")? {
        None => d.user.clone(),
        Some(u) if u.is_empty() => None,
        Some(u) => Some(u),
    };
    let workspace = match p.str("workspace")? {
        None => None,
        Some(path) => Some(Workspace {
            host_path: allowed_workspace(spec.id, &path, config)?,
            read_only: p.bool("workspace_read_only", Workspace::READ_ONLY_BY_DEFAULT)?,
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
        network: p.bool("network", d.network)?,
        ipc_mode: p.str("ipc_mode")?.unwrap_or(d.ipc_mode.clone()),
        cap_drop: p.str_list("cap_drop", d.cap_drop.clone())?,
        no_new_privileges: p.bool("no_new_privileges", d.no_new_privileges)?,
        user,
        read_only_root: p.bool("read_only_root", d.read_only_root)?,
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
    Ok(Settings {
        code,
        mode,
        image,
        sandbox,
        notes,
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
