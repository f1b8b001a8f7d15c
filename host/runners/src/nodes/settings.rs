//! A code node's properties read into its [`Settings`]: the code, the mode, the image
//! and the [`Sandbox`], each checked for type and range. Also the operator's rules the
//! properties must obey (subprocess mode allowed, workspace inside `workspace_roots`)
//! and the author's `access` (alias `limits.files`). Every problem is collected, so planning reports
//! them all at once and creation refuses exactly what planning reported.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use heddle_core::graph::AccessLevel;
use heddle_core::{ConfigProblem, NodeSpec, Value};

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

// Ranges of the numeric settings: wide enough for any real workload, narrow enough that
// turning them into bytes, nano-CPUs and durations cannot overflow (an overflow would
// panic, or in a release build wrap and silently drop the limit).

/// Time limit in seconds: up to a week.
const TIMEOUT_S: RangeInclusive<f64> = 0.001..=604_800.0;
/// Memory in MiB: Docker refuses less than 6 MiB; up to 1 TiB.
const MEMORY_MB: RangeInclusive<i64> = 6..=1_048_576;
/// Docker's smallest CPU quota is 0.01; 1024 CPUs is beyond any host.
const CPUS: RangeInclusive<f64> = 0.01..=1024.0;
/// Linux's largest pid_max.
const PIDS_LIMIT: RangeInclusive<i64> = 1..=4_194_304;
/// The /tmp tmpfs in MiB: up to 1 TiB.
const TMP_SIZE_MB: RangeInclusive<i64> = 1..=1_048_576;
/// Output forwarded in bytes: up to 1 GiB.
const OUTPUT_LIMIT_BYTES: RangeInclusive<i64> = 0..=1 << 30;
/// SIGTERM → SIGKILL delay in ms: up to 10 minutes.
const KILL_GRACE_MS: RangeInclusive<i64> = 0..=600_000;

/// Longest piece of a user's value echoed in a problem: the rest is elided, so a huge
/// value cannot make a huge error.
const ECHO_MAX: usize = 80;

/// Reads properties with their type and range checked, collecting every problem and
/// answering the default for a bad value so the reading goes on.
struct Props<'a> {
    map: &'a BTreeMap<String, Value>,
    problems: Vec<ConfigProblem>,
}

impl Props<'_> {
    fn problem(&mut self, name: &str, message: String) {
        self.problems.push(ConfigProblem {
            property: Some(name.to_string()),
            message: format!("property `{name}` {message}"),
        });
    }

    fn wrong(&mut self, name: &str, want: &str, got: &Value) {
        let msg = format!("must be {want}, got {} `{}`", got.kind(), echo(got));
        self.problem(name, msg);
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn str(&mut self, name: &str) -> Option<String> {
        match self.get(name)? {
            Value::Str(s) => Some(s.to_string()),
            v => {
                let v = v.clone();
                self.wrong(name, "a string", &v);
                None
            }
        }
    }

    fn bool(&mut self, name: &str, default: bool) -> bool {
        match self.get(name) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                let v = v.clone();
                self.wrong(name, "true or false", &v);
                default
            }
        }
    }

    fn number(&mut self, name: &str, default: f64, range: RangeInclusive<f64>) -> f64 {
        self.ranged(name, default, range, "a number", Value::as_f64)
    }

    fn int(&mut self, name: &str, default: i64, range: RangeInclusive<i64>) -> i64 {
        self.ranged(name, default, range, "an integer", Value::as_i64)
    }

    /// A number read by `read` (`what` it must be) within `range`.
    fn ranged<T: PartialOrd + std::fmt::Display>(
        &mut self,
        name: &str,
        default: T,
        range: RangeInclusive<T>,
        what: &str,
        read: fn(&Value) -> Option<T>,
    ) -> T {
        let Some(v) = self.get(name) else {
            return default;
        };
        match read(v) {
            Some(n) if range.contains(&n) => n,
            _ => {
                let v = v.clone();
                let want = format!("{what} from {} to {}", range.start(), range.end());
                self.wrong(name, &want, &v);
                default
            }
        }
    }

    fn str_list(&mut self, name: &str, default: Vec<String>) -> Vec<String> {
        let strings = match self.get(name) {
            None => return default,
            Some(Value::List(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>(),
            Some(_) => None,
        };
        strings.unwrap_or_else(|| {
            // Present, since `None` returned above.
            let v = self.map[name].clone();
            self.wrong(name, "a list of strings", &v);
            default
        })
    }
}

/// A user's value as it appears in a problem, cut at [`ECHO_MAX`] characters.
fn echo(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(ECHO_MAX) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text,
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

/// Reads the node's settings; `Err` lists every problem found.
pub(super) fn read(
    lang: Language,
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
) -> Result<Settings, Vec<ConfigProblem>> {
    read_as(
        lang,
        lang.code_property(),
        &Sandbox::default(),
        spec,
        config,
    )
}

/// [`read`] with the code in property `code_prop` and `base` as the defaults (and the
/// baseline the loosened settings are listed against): a server's differ.
pub(super) fn read_as(
    lang: Language,
    code_prop: &str,
    base: &Sandbox,
    spec: &NodeSpec<'_>,
    config: &RunnersConfig,
) -> Result<Settings, Vec<ConfigProblem>> {
    let mut p = Props {
        map: spec.properties,
        problems: Vec::new(),
    };
    let code = p.str(code_prop);
    if code.is_none() && p.get(code_prop).is_none() {
        let what = match lang {
            Language::Shell => "command line",
            _ => "code",
        };
        p.problem(
            code_prop,
            format!("is required (the {what} to run, as a property: an edge cannot supply it)"),
        );
    }
    let mode = match p.str("mode") {
        None => Mode::default(),
        Some(text) => Mode::parse(&text).unwrap_or_else(|| {
            let msg = format!(
                "is `{}`; expected `docker` or `subprocess`",
                echo(&Value::str(text))
            );
            p.problem("mode", msg);
            Mode::default()
        }),
    };
    if mode == Mode::Subprocess {
        if !config.allow_subprocess {
            p.problem(
                "mode",
                ": `subprocess` runs the code unsandboxed on the host and is disabled; the \
                 operator can allow it with `[runners] allow_subprocess = true` in heddle.toml"
                    .into(),
            );
        }
        // Presence, not difference from the default, is what counts: an author who
        // writes `network: false` here expects an isolation this mode cannot give.
        let present: Vec<&str> = DOCKER_ONLY
            .into_iter()
            .filter(|n| p.get(n).is_some())
            .collect();
        for name in present {
            p.problem(
                name,
                "needs a container and cannot be enforced in mode `subprocess`; remove it \
                 or use mode `docker`"
                    .into(),
            );
        }
    }

    let d = base.clone();
    let timeout = p.number("timeout_s", d.timeout.as_secs_f64(), TIMEOUT_S);
    let cpus = p.number("cpus", d.nano_cpus as f64 / 1e9, CPUS);
    let user = match p.str("user") {
        None => d.user.clone(),
        Some(u) if u.is_empty() => None,
        Some(u) => Some(u),
    };
    let read_only = p.bool("workspace_read_only", Workspace::READ_ONLY_BY_DEFAULT);
    let workspace = p
        .str("workspace")
        .and_then(|path| match allowed_workspace(&path, config) {
            Ok(host_path) => Some(Workspace {
                host_path,
                read_only,
            }),
            Err(msg) => {
                p.problem("workspace", format!(": {msg}"));
                None
            }
        });
    // The workflow author's `access` narrows the workspace, never widens it. A host
    // process can touch whatever the host user can: nothing withholds the files from it,
    // so a narrower level is refused rather than run with a boundary it does not have.
    let access = spec.limits.and_then(|l| l.files);
    if mode == Mode::Subprocess
        && let Some(level @ (AccessLevel::None | AccessLevel::Read)) = access
    {
        p.problem(
            "mode",
            format!(
                ": access `{}` cannot be enforced by executor `{}` in mode `subprocess` (the \
                 code runs as the host user with no filesystem isolation); use mode `docker`, \
                 which withholds or mounts the workspace read-only, or remove `access`",
                level.as_str(),
                lang.type_name()
            ),
        );
    }
    let workspace = match (access, workspace) {
        (Some(AccessLevel::None), Some(_)) => {
            p.problem(
                "workspace",
                "asks for a mount but the node's `access` is `none`; remove one of them".into(),
            );
            None
        }
        (Some(AccessLevel::Read), Some(w)) => Some(Workspace {
            read_only: true,
            ..w
        }),
        (_, w) => w,
    };
    let sandbox = Sandbox {
        // In range, so neither conversion can overflow.
        timeout: Duration::from_secs_f64(timeout),
        memory_bytes: p.int("memory_mb", d.memory_bytes / MIB, MEMORY_MB) * MIB,
        nano_cpus: (cpus * 1e9) as i64,
        pids_limit: p.int("pids_limit", d.pids_limit, PIDS_LIMIT),
        network: p.bool("network", d.network),
        ipc_mode: p.str("ipc_mode").unwrap_or(d.ipc_mode.clone()),
        cap_drop: p.str_list("cap_drop", d.cap_drop.clone()),
        no_new_privileges: p.bool("no_new_privileges", d.no_new_privileges),
        user,
        read_only_root: p.bool("read_only_root", d.read_only_root),
        tmp_bytes: p.int("tmp_size_mb", d.tmp_bytes / MIB, TMP_SIZE_MB) * MIB,
        workspace,
        output_limit: p.int(
            "output_limit_bytes",
            d.output_limit as i64,
            OUTPUT_LIMIT_BYTES,
        ) as usize,
        max_line: d.max_line,
        publish: None,
        kill_grace: Duration::from_millis(p.int(
            "kill_grace_ms",
            d.kill_grace.as_millis() as i64,
            KILL_GRACE_MS,
        ) as u64),
    };
    let image = p
        .str("image")
        .unwrap_or_else(|| lang.default_image(config).to_string());
    let (Some(code), true) = (code, p.problems.is_empty()) else {
        return Err(p.problems);
    };
    let mut notes = Vec::new();
    if mode == Mode::Subprocess {
        notes.push(
            "subprocess mode: the code runs on the host as the host user, with no memory, \
             network or filesystem isolation (time limit, output cap and process-group kill apply)"
                .to_string(),
        );
    } else {
        let w = sandbox.weakenings_from(base);
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

/// The canonical host path of a workspace the operator allows, or why it is refused.
fn allowed_workspace(path: &str, config: &RunnersConfig) -> Result<PathBuf, String> {
    let shown = echo(&Value::str(path));
    let canon = std::fs::canonicalize(path).map_err(|e| format!("`{shown}`: {e}"))?;
    if !canon.is_dir() {
        return Err(format!("`{shown}` is not a directory"));
    }
    let inside = config
        .workspace_roots
        .iter()
        .any(|root| std::fs::canonicalize(root).is_ok_and(|r| canon.starts_with(r)));
    if !inside {
        return Err(format!(
            "`{shown}` is not inside any directory the operator allows \
             (`[runners] workspace_roots` in heddle.toml: {:?})",
            config.workspace_roots
        ));
    }
    Ok(canon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_when_echoed() {
        let long = Value::str("x".repeat(10_000));
        let shown = echo(&long);
        assert!(shown.len() < 200, "{shown}");
        assert!(shown.ends_with("(10000 bytes)"), "{shown}");
        assert_eq!(echo(&Value::str("short")), "short");
    }
}
