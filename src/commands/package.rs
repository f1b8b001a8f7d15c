//! `heddle package add|build|push|list|verify|remove`: the package store of
//! heddle-wasm, with what each package asks for next to what the operator's config
//! grants it; packages fetched from and pushed to OCI registries (heddle-registry);
//! source folders built with heddle-package-build.

use std::path::{Path, PathBuf};

use heddle_core::CapabilityKind;
use heddle_registry::RegistrySettings;
use heddle_wasm::{PackageGrant, PackageSource, WasmPackage};
use serde::Serialize;

use crate::cli::{PackageArgs, PackageCommand};
use crate::exit::Exit;
use heddle_runtime::Settings;

/// One capability request and whether the config grants it.
#[derive(Debug, Serialize)]
pub struct CapabilityLine {
    pub kind: CapabilityKind,
    pub target: String,
    pub reason: String,
    /// Who asks: the package manifest, or a node type.
    pub requested_by: String,
    pub granted: bool,
}

#[derive(Debug, Serialize)]
pub struct PackageInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub sha256: String,
    /// Where it was fetched from, for a package added from a registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<PackageSource>,
    pub node_types: Vec<String>,
    pub capabilities: Vec<CapabilityLine>,
}

pub fn describe(pkg: &WasmPackage, sha256: &str, grant: &PackageGrant) -> PackageInfo {
    let mut caps = Vec::new();
    for c in &pkg.manifest.capabilities {
        caps.push(CapabilityLine {
            kind: c.kind,
            target: c.target.clone(),
            reason: c.reason.clone(),
            requested_by: "manifest".into(),
            granted: grant.covers(c.kind, &c.target),
        });
    }
    for d in pkg.declarations() {
        for c in &d.capabilities {
            caps.push(CapabilityLine {
                kind: c.kind,
                target: c.target.clone(),
                reason: c.reason.clone(),
                requested_by: d.type_name.clone(),
                granted: grant.covers(c.kind, &c.target),
            });
        }
    }
    PackageInfo {
        name: pkg.name().to_string(),
        version: pkg.manifest.version.clone(),
        description: pkg.manifest.description.clone(),
        sha256: sha256.to_string(),
        source: None,
        node_types: pkg
            .declarations()
            .iter()
            .map(|d| d.type_name.clone())
            .collect(),
        capabilities: caps,
    }
}

fn kind_name(k: CapabilityKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn print_info(info: &PackageInfo, config: &str) {
    println!("{}@{}  sha256 {}", info.name, info.version, info.sha256);
    if !info.description.is_empty() {
        println!("  {}", info.description);
    }
    if let Some(s) = &info.source {
        println!(
            "  from {} (manifest {}){}",
            s.reference,
            s.manifest_digest,
            s.signer
                .as_deref()
                .map(|k| format!(", signed by {k}"))
                .unwrap_or_default()
        );
    }
    println!("  node types: {}", info.node_types.join(", "));
    if info.capabilities.is_empty() {
        println!("  requests no capabilities");
    }
    for c in &info.capabilities {
        println!(
            "  {} {} `{}` ({}): {}",
            if c.granted {
                "granted    "
            } else {
                "NOT granted"
            },
            kind_name(c.kind),
            c.target,
            c.requested_by,
            c.reason
        );
    }
    if info.capabilities.iter().any(|c| !c.granted) {
        println!(
            "  to grant: add [packages.{}] to {config} (see README, \"Packages and capability grants\")",
            info.name
        );
    }
}

/// What the config grants `pkg`: nothing when its grant is pinned to other bytes (said
/// on stderr, since it is why every capability shows as not granted).
fn grant_of(settings: &Settings, pkg: &WasmPackage) -> PackageGrant {
    settings
        .wasm
        .grant_for(pkg.name(), &pkg.digest)
        .unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            PackageGrant::default()
        })
}

pub fn run(args: PackageArgs) -> anyhow::Result<Exit> {
    let settings = args.env.settings()?;
    let store = settings.package_store();
    let rt = heddle_runtime::tokio_runtime(None)?;
    let config_name = match &settings.config.path {
        Some(p) => p.display().to_string(),
        None => heddle_runtime::config::DEFAULT_FILE.to_string(),
    };
    match args.command {
        PackageCommand::Add {
            source,
            json,
            allow_latest,
        } => {
            let host = settings.wasm_host()?;
            let pkg = match registry_reference(&source)? {
                None => rt.block_on(store.install(&host, Path::new(&source)))?,
                Some(reference) => {
                    let registry = registry_settings(&settings)?;
                    let opts = heddle_registry::FetchOptions {
                        allow_latest,
                        max_component_bytes: settings.wasm.wasm.max_component_bytes,
                        trust: trust(&settings)?,
                    };
                    rt.block_on(async {
                        let fetched = heddle_registry::fetch(
                            &source,
                            &reference,
                            &registry,
                            &opts,
                            store.root(),
                        )
                        .await?;
                        if !json {
                            eprintln!(
                                "fetched {source}: manifest {}, component {}",
                                fetched.source.manifest_digest, fetched.source.layer_digest
                            );
                        }
                        let origin = fetched.source.clone();
                        store
                            .install_from(&host, &fetched.dir, Some(origin))
                            .await
                            .map_err(|e| heddle_registry::RegistryError::Package {
                                reference: source.clone(),
                                source: e,
                            })
                    })?
                }
            };
            let entry = store.list()?.into_iter().find(|e| e.name == pkg.name());
            let installed = entry
                .as_ref()
                .map(|e| store.entry_dir(e))
                .unwrap_or_default();
            let mut info = describe(&pkg, &pkg.digest, &grant_of(&settings, &pkg));
            info.source = entry.and_then(|e| e.source);
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                println!(
                    "installed {}@{} into {} (pinned in {})",
                    info.name,
                    info.version,
                    installed.display(),
                    store.lockfile_path().display()
                );
                print_info(&info, &config_name);
            }
            Ok(Exit::Ok)
        }
        PackageCommand::List { json } => {
            let host = settings.wasm_host()?;
            let entries = if store.lockfile_path().is_file() {
                store.list()?
            } else {
                Vec::new()
            };
            let mut infos = Vec::new();
            for e in &entries {
                let pkg = rt.block_on(store.load(&host, &e.name))?;
                let mut info = describe(&pkg, &e.sha256, &grant_of(&settings, &pkg));
                info.source = e.source.clone();
                infos.push(info);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&infos)?);
            } else if infos.is_empty() {
                println!(
                    "no packages installed in {} (std and files are built in)",
                    settings.packages_dir.display()
                );
            } else {
                for i in &infos {
                    print_info(i, &config_name);
                }
            }
            Ok(Exit::Ok)
        }
        PackageCommand::Verify => {
            if !store.lockfile_path().is_file() {
                println!(
                    "no packages installed in {}",
                    settings.packages_dir.display()
                );
                return Ok(Exit::Ok);
            }
            let mut bad = 0;
            for r in store.verify()? {
                match r.result {
                    Ok(()) => println!("ok       {}", r.name),
                    Err(e) => {
                        bad += 1;
                        println!("CHANGED  {}: {e}", r.name);
                    }
                }
            }
            Ok(if bad == 0 { Exit::Ok } else { Exit::Failed })
        }
        PackageCommand::Build {
            dir,
            out,
            no_install,
            no_cache,
        } => build(&dir, out, no_install, no_cache),
        PackageCommand::Push {
            dir,
            reference,
            allow_latest,
            key,
        } => {
            let Some(parsed) = registry_reference(&reference)? else {
                return Err(crate::usage!(
                    "`{reference}` is not a registry reference: give oci://REGISTRY/NAMESPACE/NAME:VERSION or namespace:name@version"
                ));
            };
            let registry = registry_settings(&settings)?;
            let key = key
                .as_deref()
                .map(heddle_registry::SigningKey::read)
                .transpose()?;
            let host = settings.wasm_host()?;
            let pushed = rt.block_on(async {
                // The whole package is checked first: nothing unloadable is published.
                let pkg = WasmPackage::load_dir(&host, &dir).await?;
                anyhow::Ok(
                    heddle_registry::push(
                        &pkg,
                        &dir,
                        &reference,
                        &parsed,
                        &registry,
                        allow_latest,
                        key.as_ref(),
                    )
                    .await?,
                )
            })?;
            println!("pushed {} to {}", dir.display(), pushed.location);
            println!("  manifest {}", pushed.manifest_digest);
            println!("  component {}", pushed.layer_digest);
            if let Some(k) = &key {
                println!("  signed with key {}", k.public.fingerprint());
            }
            println!(
                "  install it with: heddle package add {}@{}",
                pushed.location.split_once('@').map_or(pushed.location.as_str(), |(l, _)| l),
                pushed.manifest_digest
            );
            Ok(Exit::Ok)
        }
        PackageCommand::Sign {
            reference,
            key,
            allow_latest,
        } => {
            let Some(parsed) = registry_reference(&reference)? else {
                return Err(crate::usage!(
                    "`{reference}` is not a registry reference: give oci://REGISTRY/NAMESPACE/NAME:VERSION or namespace:name@version"
                ));
            };
            let registry = registry_settings(&settings)?;
            let key = heddle_registry::SigningKey::read(&key)?;
            let signed = rt.block_on(heddle_registry::sign(
                &reference,
                &parsed,
                &registry,
                allow_latest,
                &key,
            ))?;
            println!(
                "signed {} (manifest {}) with key {}",
                signed.location,
                signed.manifest_digest,
                key.public.fingerprint()
            );
            Ok(Exit::Ok)
        }
        PackageCommand::Keygen { file } => keygen(&file),
        PackageCommand::Remove { name } => {
            store.remove(&name)?;
            println!("removed {name}");
            Ok(Exit::Ok)
        }
    }
}

/// `Some` when `text` is a registry reference rather than a directory (an existing
/// directory always wins).
fn registry_reference(text: &str) -> anyhow::Result<Option<heddle_registry::PackageRef>> {
    if Path::new(text).is_dir() {
        return Ok(None);
    }
    match heddle_registry::fetch::parse(text) {
        None => Ok(None),
        Some(r) => Ok(Some(r?)),
    }
}

/// `[registry]` of heddle.toml (defaults without one).
fn registry_settings(settings: &heddle_runtime::Settings) -> anyhow::Result<RegistrySettings> {
    Ok(settings
        .config
        .section::<RegistrySettings>("registry")?
        .unwrap_or_default())
}

/// `heddle package build DIR`: the builder of scripts/package-build, in the binary.
fn build(dir: &Path, out: Option<PathBuf>, no_install: bool, no_cache: bool) -> anyhow::Result<Exit> {
    use heddle_package_build::{BuildOptions, Toolchains, build_package};
    let mut opts = BuildOptions {
        out_dir: out,
        progress: Some(|line| eprintln!("{line}")),
        ..BuildOptions::default()
    };
    if no_cache {
        opts.cache_dir = None;
    }
    opts.toolchains = Toolchains {
        install_missing: !no_install,
        ..Toolchains::default()
    };
    let p = build_package(dir, &opts)?;
    println!(
        "built {} ({}) -> {}{}  [{:.1} s]",
        p.name,
        p.language,
        p.dir.display(),
        if p.cached { " (cached)" } else { "" },
        p.elapsed.as_secs_f64()
    );
    println!("  install it with: heddle package add {}", p.dir.display());
    Ok(Exit::Ok)
}

/// `[trust]` of heddle.toml, its keys read (relative paths from the file's directory).
fn trust(settings: &heddle_runtime::Settings) -> anyhow::Result<heddle_registry::Trust> {
    let section = settings
        .config
        .section::<heddle_registry::TrustSettings>("trust")?
        .unwrap_or_default();
    Ok(heddle_registry::Trust::load(
        &section,
        &settings.config.base_dir(),
    )?)
}

/// `heddle package keygen FILE`: a P-256 key pair for `package push --key` and
/// `package sign`, the public half ready for `[trust.keys]`.
fn keygen(file: &Path) -> anyhow::Result<Exit> {
    use std::io::Write as _;
    let public_path = PathBuf::from(format!("{}.pub", file.display()));
    for p in [file, public_path.as_path()] {
        if p.exists() {
            return Err(crate::usage!("{} exists; not overwriting a key", p.display()));
        }
    }
    let (private, public) =
        heddle_registry::SigningKey::generate().map_err(|e| anyhow::anyhow!("keygen: {e}"))?;
    let mut f = {
        let mut o = std::fs::File::options();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        o.open(file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
    };
    f.write_all(private.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    std::fs::write(&public_path, public.to_pem())
        .map_err(|e| anyhow::anyhow!("{}: {e}", public_path.display()))?;
    println!("private key {} (keep it secret)", file.display());
    println!("public key  {} ({})", public_path.display(), public.fingerprint());
    println!("to trust it, in heddle.toml:\n  [trust.keys]\n  NAME = \"{}\"", public_path.display());
    Ok(Exit::Ok)
}
