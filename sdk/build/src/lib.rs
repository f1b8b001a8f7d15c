//! Builds a Heddle node package from a source folder in Rust, Python, JavaScript or C.
//!
//! One entry point, [`build_package`], so `scripts/package-build DIR` and the CLI's
//! `heddle package build DIR` give the same layout: an output folder holding the
//! manifest (`heddle-package.toml`) and the component, ready for `heddle package add`.
//!
//! Python and JavaScript builds take 30–70 s (the interpreter is snapshotted into the
//! component), so finished components are cached by a hash of everything that goes
//! into them: the sources, the WIT, the SDK helper layer and the toolchain version.

mod c;
mod cache;
mod js;
mod python;
mod rust;
mod sdkfiles;
mod toolchains;
mod wasi_http;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use c::generate_bindings as generate_c_bindings;
pub use toolchains::Toolchains;

/// The manifest file name shared with `heddle-wasm`.
pub const MANIFEST_FILE: &str = "heddle-package.toml";

/// A language we can build a package from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Language {
    Rust,
    Python,
    JavaScript,
    C,
}

impl Language {
    /// The name used in manifests, cache keys and messages.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::C => "c",
        }
    }

    /// What a build that misses the cache is about to do and roughly how long it takes
    /// on a 2-core machine, so a silent minute is never a surprise.
    pub fn build_hint(self) -> &'static str {
        match self {
            Language::Rust => {
                "cargo build --release --target wasm32-wasip2, 20-40 s the first time"
            }
            Language::Python => "componentize-py snapshots CPython with your module, 10-40 s",
            Language::JavaScript => {
                "componentize-js snapshots SpiderMonkey with your module, 15-60 s"
            }
            Language::C => "clang + wasm-ld, about a second",
        }
    }

    fn parse(s: &str) -> Option<Language> {
        match s.to_ascii_lowercase().as_str() {
            "rust" | "rs" => Some(Language::Rust),
            "python" | "py" => Some(Language::Python),
            "javascript" | "js" => Some(Language::JavaScript),
            "c" => Some(Language::C),
            _ => None,
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can go wrong building a package; each names the file or folder to fix.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error(
        "{dir}: cannot tell the language of this package ({reason}); set `language` under [build] in {MANIFEST_FILE}"
    )]
    UnknownLanguage { dir: PathBuf, reason: String },
    #[error("{dir}: no entry point: expected {expected}")]
    NoEntry { dir: PathBuf, expected: String },
    #[error("WIT in {dir}: {message}")]
    Wit { dir: PathBuf, message: String },
    #[error("{tool} is not installed ({hint})")]
    MissingTool { tool: String, hint: String },
    #[error("{tool} failed building {dir}:\n{output}")]
    Tool {
        tool: String,
        dir: PathBuf,
        output: String,
    },
}

impl BuildError {
    /// Whether the folder or the machine must be fixed before a build can work (a
    /// manifest, a language, an entry point, a toolchain to install), as opposed to a
    /// build that ran and failed.
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            BuildError::Manifest { .. }
                | BuildError::UnknownLanguage { .. }
                | BuildError::NoEntry { .. }
                | BuildError::Wit { .. }
                | BuildError::MissingTool { .. }
        )
    }

    fn io(path: &Path, source: std::io::Error) -> BuildError {
        BuildError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The WIT package and world a guest is built against.
#[derive(Clone, Debug)]
pub struct Wit {
    pub dir: PathBuf,
    pub world: String,
}

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The `heddle:node` WIT folder. Default: the one this crate was built with.
    pub wit: Option<Wit>,
    /// Where the package folder is written. Default: `<src>/dist`.
    pub out_dir: Option<PathBuf>,
    /// Cache of built components keyed by source hash; `None` disables it.
    pub cache_dir: Option<PathBuf>,
    /// Where the Python/JS toolchains live, and whether to install missing ones.
    pub toolchains: Toolchains,
    /// Run heavy builds at lower CPU priority (`nice -n 10`), so a shared machine stays usable.
    pub nice: bool,
    /// Told what a build is about to do when it misses the cache (the CLI prints it).
    pub progress: Option<fn(&str)>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            wit: None,
            out_dir: None,
            cache_dir: Some(default_cache_dir()),
            toolchains: Toolchains::default(),
            nice: true,
            progress: None,
        }
    }
}

/// `$HEDDLE_BUILD_CACHE` or `~/.cache/heddle/builds`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HEDDLE_BUILD_CACHE") {
        return PathBuf::from(dir);
    }
    home_dir().join(".cache/heddle/builds")
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The outcome of a build.
#[derive(Clone, Debug)]
pub struct BuiltPackage {
    /// The package folder (what `heddle package add` takes).
    pub dir: PathBuf,
    pub manifest: PathBuf,
    pub component: PathBuf,
    pub language: Language,
    pub name: String,
    /// Served from the cache: nothing was compiled.
    pub cached: bool,
    pub elapsed: Duration,
}

/// The one-line summary both `heddle package build` and `heddle-package-build` print.
impl fmt::Display for BuiltPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "built {} ({}) -> {}{}  [{:.1} s]",
            self.name,
            self.language,
            self.dir.display(),
            if self.cached { " (cached)" } else { "" },
            self.elapsed.as_secs_f64()
        )
    }
}

/// The WIT folder of this repository's current contract, `heddle:node@0.2.0` (for
/// tools run from a checkout). `wit/node.wit`, one level up, is 0.1.
pub fn repo_wit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit/v0.2")
}

/// The `heddle:node` WIT this crate builds Python, JavaScript and C packages against,
/// embedded so a build needs no checkout: written once to a folder named by its hash
/// (in the temp dir) and read from there. It is the current contract, 0.2 (controlled
/// nodes and controllers), the one the Rust SDK builds against too; a host loads 0.1
/// packages built before beside it. `--wit` builds against another copy (the Python,
/// JavaScript and C helpers also build against 0.1, for hosts older than 0.2, their
/// control calls then failing with `control:unsupported`).
const NODE_WIT: &str = include_str!("../../../wit/v0.2/node.wit");

/// The world to build against when the options name none: the embedded WIT.
pub fn default_wit() -> Result<Wit, BuildError> {
    use sha2::{Digest, Sha256};
    let hash: String = Sha256::digest(NODE_WIT.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("heddle-wit-{hash}"));
    let file = dir.join("node.wit");
    if std::fs::read_to_string(&file).ok().as_deref() != Some(NODE_WIT) {
        std::fs::create_dir_all(&dir).map_err(|e| BuildError::io(&dir, e))?;
        // Through a unique temporary name, so a build running at once never reads half.
        let tmp = dir.join(format!(".node.wit.{}", std::process::id()));
        std::fs::write(&tmp, NODE_WIT).map_err(|e| BuildError::io(&tmp, e))?;
        std::fs::rename(&tmp, &file).map_err(|e| BuildError::io(&file, e))?;
    }
    wit_in(&dir)
}

/// Reads the world to build against: the only world of the main package in `dir`.
pub fn wit_in(dir: &Path) -> Result<Wit, BuildError> {
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve.push_dir(dir).map_err(|e| BuildError::Wit {
        dir: dir.to_path_buf(),
        message: format!("{e:#}"),
    })?;
    let worlds: Vec<&str> = resolve.packages[pkg]
        .worlds
        .keys()
        .map(String::as_str)
        .collect();
    match worlds.as_slice() {
        [one] => Ok(Wit {
            dir: dir.to_path_buf(),
            world: (*one).to_string(),
        }),
        _ => Err(BuildError::Wit {
            dir: dir.to_path_buf(),
            message: format!("expected exactly one world, found {worlds:?}"),
        }),
    }
}

/// The version of the `heddle:node` package `wit` declares (`0.2.0`).
fn wit_version(wit: &Wit) -> Result<String, BuildError> {
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve.push_dir(&wit.dir).map_err(|e| BuildError::Wit {
        dir: wit.dir.clone(),
        message: format!("{e:#}"),
    })?;
    resolve.packages[pkg]
        .name
        .version
        .as_ref()
        .map(ToString::to_string)
        .ok_or_else(|| BuildError::Wit {
            dir: wit.dir.clone(),
            message: "the package declares no version (expected `package heddle:node@0.2.0;`)"
                .into(),
        })
}

/// Builds the package in `src` into `opts.out_dir` (default `<src>/dist`).
pub fn build_package(src: &Path, opts: &BuildOptions) -> Result<BuiltPackage, BuildError> {
    let started = Instant::now();
    let src = src.canonicalize().map_err(|e| BuildError::io(src, e))?;
    let manifest_path = src.join(MANIFEST_FILE);
    let manifest = manifest::SourceManifest::load(&manifest_path)?;
    let language = detect_language(&src, manifest.language.as_deref(), &manifest_path)?;
    // A graph the manifest lists but the folder lacks is said before a long build.
    if let Some(g) = manifest.graphs.iter().find(|g| !src.join(g).is_file()) {
        return Err(BuildError::Manifest {
            path: manifest_path.clone(),
            message: format!(
                "`graphs` lists `{g}`, which is not a file in {}",
                src.display()
            ),
        });
    }
    let wit = match &opts.wit {
        Some(w) => w.clone(),
        None => default_wit()?,
    };
    let out_dir = opts.out_dir.clone().unwrap_or_else(|| src.join("dist"));
    std::fs::create_dir_all(&out_dir).map_err(|e| BuildError::io(&out_dir, e))?;
    let component_name = format!("{}.wasm", manifest.name);
    let component = out_dir.join(&component_name);

    let key = cache::key(language, &src, &wit.dir, &opts.toolchains)?;
    let cached_path = opts
        .cache_dir
        .as_ref()
        .map(|d| d.join(format!("{}-{key}.wasm", language.name())));
    let mut cached = false;
    if let Some(hit) = cached_path.as_ref().filter(|p| p.is_file()) {
        std::fs::copy(hit, &component).map_err(|e| BuildError::io(hit, e))?;
        cached = true;
    } else {
        if let Some(progress) = opts.progress {
            progress(&format!(
                "building {} ({}): {}",
                manifest.name,
                language.name(),
                language.build_hint()
            ));
        }
        let work = scratch_dir(&out_dir)?;
        let built = work.join("component.wasm");
        let outcome = match language {
            Language::Python => python::build(&src, &wit, &work, &built, opts),
            Language::JavaScript => js::build(&src, &wit, &work, &built, opts),
            Language::C => opts.toolchains.ensure_c().and_then(|()| {
                let sdk = sdkfiles::write_c(&work)?;
                c::build(&src, &sdk, &wit, &work, &built)
            }),
            Language::Rust => rust::build(&src, &built, opts),
        };
        if let Err(e) = outcome {
            // A failed build leaves nothing in the output folder but what was there.
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
        std::fs::copy(&built, &component).map_err(|e| BuildError::io(&built, e))?;
        if let Some(cache_file) = &cached_path {
            cache::store(&built, cache_file)?;
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    // The graphs the manifest lists go with it: the output folder is the package.
    for g in &manifest.graphs {
        let from = src.join(g);
        let to = out_dir.join(g);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| BuildError::io(parent, e))?;
        }
        std::fs::copy(&from, &to).map_err(|e| BuildError::io(&from, e))?;
    }
    let manifest_out = out_dir.join(MANIFEST_FILE);
    manifest.write_package_manifest(&manifest_path, &manifest_out, &component_name)?;
    Ok(BuiltPackage {
        dir: out_dir,
        manifest: manifest_out,
        component,
        language,
        name: manifest.name.clone(),
        cached,
        elapsed: started.elapsed(),
    })
}

/// Explicit `[build] language` wins; otherwise the files in the folder decide.
pub fn detect_language(
    src: &Path,
    declared: Option<&str>,
    manifest: &Path,
) -> Result<Language, BuildError> {
    if let Some(name) = declared {
        return Language::parse(name).ok_or_else(|| BuildError::Manifest {
            path: manifest.to_path_buf(),
            message: format!(
                "[build] language = {name:?} is not one of rust, python, javascript, c"
            ),
        });
    }
    let mut found = Vec::new();
    if src.join("Cargo.toml").is_file() {
        found.push(Language::Rust);
    }
    if !list_files(src, &["py"])?.is_empty() {
        found.push(Language::Python);
    }
    if src.join("package.json").is_file() || !list_files(src, &["js", "mjs"])?.is_empty() {
        found.push(Language::JavaScript);
    }
    if !list_files(src, &["c"])?.is_empty() {
        found.push(Language::C);
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(BuildError::UnknownLanguage {
            dir: src.to_path_buf(),
            reason: "no Cargo.toml, *.py, *.js or *.c found".into(),
        }),
        many => Err(BuildError::UnknownLanguage {
            dir: src.to_path_buf(),
            reason: format!(
                "sources of several languages: {}",
                many.iter().map(|l| l.name()).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// Files directly in `dir` with one of `exts`, sorted (builds must not depend on
/// directory order).
fn list_files(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>, BuildError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| BuildError::io(dir, e))? {
        let path = entry.map_err(|e| BuildError::io(dir, e))?.path();
        if path.is_file()
            && path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| exts.contains(&e))
        {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn scratch_dir(out_dir: &Path) -> Result<PathBuf, BuildError> {
    let work = out_dir.join(format!(".build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| BuildError::io(&work, e))?;
    Ok(work)
}

/// Runs a toolchain command; on failure its own output is shown, with the folder built.
fn run_tool(tool: &str, mut cmd: Command, dir: &Path) -> Result<(), BuildError> {
    let output = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => BuildError::MissingTool {
            tool: tool.to_string(),
            hint: install_hint(tool),
        },
        _ => BuildError::Tool {
            tool: tool.to_string(),
            dir: dir.to_path_buf(),
            output: e.to_string(),
        },
    })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !stdout.trim().is_empty() {
        text.push_str(&stdout);
    }
    Err(BuildError::Tool {
        tool: tool.to_string(),
        dir: dir.to_path_buf(),
        output: text.trim_end().to_string(),
    })
}

/// What to install when `tool` is not found.
fn install_hint(tool: &str) -> String {
    match tool {
        "cargo" => "Rust packages need Rust: install it with rustup (https://rustup.rs), then `rustup target add wasm32-wasip2`".into(),
        "clang" => "C packages need clang and wasi-libc: `apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32`".into(),
        "install-guest-toolchains" => "installing a toolchain needs bash".into(),
        other => format!(
            "`heddle package build` installs {other} unless --no-install is given; or install it yourself with scripts/install-guest-toolchains"
        ),
    }
}

/// A command, lowered in priority when asked so heavy builds don't starve others.
fn command(program: &Path, nice: bool) -> Command {
    if nice && Path::new("/usr/bin/nice").exists() {
        let mut c = Command::new("/usr/bin/nice");
        c.args(["-n", "10"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

mod manifest;
