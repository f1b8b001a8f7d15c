//! Finds the guest-language toolchains, installing them from the package registries
//! (PyPI, npm, Debian) with `scripts/install-guest-toolchains` when allowed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{BuildError, Language};

/// The installer, embedded so a `heddle` binary outside the repository can run it.
const INSTALLER: &str = include_str!("../../../scripts/install-guest-toolchains");

/// Pinned versions: they are part of the build cache key.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";

#[derive(Clone, Debug)]
pub struct Toolchains {
    /// `$HEDDLE_TOOLCHAINS` or `~/.cache/heddle/toolchains`.
    pub root: PathBuf,
    /// Run the installer when a toolchain is missing (else fail with a hint).
    pub install_missing: bool,
}

impl Default for Toolchains {
    fn default() -> Self {
        let root = std::env::var_os("HEDDLE_TOOLCHAINS")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::home_dir().join(".cache/heddle/toolchains"));
        Toolchains {
            root,
            install_missing: true,
        }
    }
}

impl Toolchains {
    pub fn componentize_py(&self) -> Result<PathBuf, BuildError> {
        self.tool(
            Language::Python,
            self.root.join("python/bin/componentize-py"),
            "componentize-py",
        )
    }

    pub fn componentize_js(&self) -> Result<PathBuf, BuildError> {
        self.tool(
            Language::JavaScript,
            self.root.join("js/node_modules/.bin/componentize-js"),
            "componentize-js",
        )
    }

    /// Makes sure clang and wasi-libc are there (C builds call `clang` from PATH).
    pub fn ensure_c(&self) -> Result<(), BuildError> {
        if c_present() {
            return Ok(());
        }
        if self.install_missing {
            self.install(Language::C)?;
        }
        if c_present() {
            Ok(())
        } else {
            Err(BuildError::MissingTool {
                tool: "clang + wasm-ld + wasi-libc".into(),
                hint: "apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32, or run scripts/install-guest-toolchains c".into(),
            })
        }
    }

    /// What goes into the cache key for a language's toolchain.
    pub fn version_tag(&self, language: Language) -> String {
        match language {
            Language::Python => format!("componentize-py {COMPONENTIZE_PY_VERSION}"),
            Language::JavaScript => format!("componentize-js {COMPONENTIZE_JS_VERSION}"),
            Language::C => "clang wasm32-wasi + wit-bindgen-c 0.60 + adapter 48".into(),
            Language::Rust => "cargo wasm32-wasip2".into(),
        }
    }

    fn tool(&self, language: Language, path: PathBuf, name: &str) -> Result<PathBuf, BuildError> {
        if !path.is_file() && self.install_missing {
            self.install(language)?;
        }
        if path.is_file() {
            Ok(path)
        } else {
            let by_hand = match language {
                Language::Python => format!(
                    "python3 -m venv {0}/python && {0}/python/bin/pip install componentize-py=={COMPONENTIZE_PY_VERSION} (needs python3 with venv)",
                    self.root.display()
                ),
                Language::JavaScript => format!(
                    "mkdir -p {0}/js && cd {0}/js && npm install @bytecodealliance/componentize-js@{COMPONENTIZE_JS_VERSION} (needs node and npm)",
                    self.root.display()
                ),
                Language::C | Language::Rust => "scripts/install-guest-toolchains".into(),
            };
            Err(BuildError::MissingTool {
                tool: name.into(),
                hint: format!(
                    "expected at {}; `heddle package build` installs it when run without --no-install, or by hand: {by_hand}",
                    path.display(),
                ),
            })
        }
    }

    /// Runs the embedded installer for one language.
    pub fn install(&self, language: Language) -> Result<(), BuildError> {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(INSTALLER)
            .arg("install-guest-toolchains")
            .arg(installer_arg(language))
            .env("HEDDLE_TOOLCHAINS", &self.root);
        crate::run_tool("install-guest-toolchains", cmd, &self.root)
    }
}

fn installer_arg(language: Language) -> &'static str {
    match language {
        Language::Python => "python",
        Language::JavaScript => "js",
        Language::C | Language::Rust => "c",
    }
}

fn c_present() -> bool {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    on_path("clang") && on_path("wasm-ld") && Path::new("/usr/lib/wasm32-wasi/libc.a").is_file()
}
