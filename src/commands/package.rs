//! `heddle package add|build|push|list|verify|remove`: the package store of
//! heddle-wasm, with what each package asks for next to what the operator's config
//! grants it; packages fetched from and pushed to OCI registries (heddle-registry);
//! source folders built with heddle-package-build.

use std::path::{Path, PathBuf};

use heddle_registry::RegistrySettings;
use heddle_runtime::Settings;
use heddle_runtime::package_review::{Change, GrantState, PackageInfo, kind_name, review};
use heddle_wasm::WasmPackage;

use crate::cli::{PackageArgs, PackageCommand};
use crate::exit::Exit;

/// Prints what re-adding a package changes, before it takes effect.
fn print_change(c: &Change) {
    let same = |a: &str, b: &str| {
        if a == b {
            format!("{a} (unchanged)")
        } else {
            format!("{a} -> {b}")
        }
    };
    let signer = |s: &Option<String>| s.clone().unwrap_or_else(|| "unsigned".into());
    println!("update of {} already installed:", c.name);
    println!("  version {}", same(&c.version.0, &c.version.1));
    println!("  sha256 {}", same(&c.sha256.0, &c.sha256.1));
    println!(
        "  signer {}",
        same(&signer(&c.signer.0), &signer(&c.signer.1))
    );
    if !c.description.is_empty() {
        println!("  description: {}", c.description);
    }
    for (what, list) in [
        ("node types added", &c.node_types_added),
        ("node types removed", &c.node_types_removed),
        ("capabilities added", &c.capabilities_added),
        ("capabilities removed", &c.capabilities_removed),
    ] {
        if !list.is_empty() {
            println!("  {what}: {}", list.join(", "));
        }
    }
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
    if !info.network_granted.is_empty() {
        println!("  network granted: {}", info.network_granted.join(", "));
    }
    for a in &info.network_auth {
        println!(
            "  header `{}` added to requests to {} from secret `{}` (the package never sees it)",
            a.header, a.destination, a.secret
        );
    }
    match &info.grant {
        GrantState::PinMismatch { pinned } => println!(
            "  [packages.{}] in {config} is pinned to sha256 {pinned}, not to these bytes ({}): nothing is granted; review the package and update the pin",
            info.name, info.sha256
        ),
        GrantState::Unpinned => println!(
            "  warning: [packages.{0}] in {config} is not pinned by digest: any package named {0} receives it; add sha256 = \"{1}\" to grant it to these reviewed bytes only",
            info.name, info.sha256
        ),
        GrantState::None if info.capabilities.iter().any(|c| !c.granted) => println!(
            "  to grant: add [packages.{}] to {config} (see README, \"Packages and capability grants\")",
            info.name
        ),
        GrantState::None | GrantState::Pinned => {}
    }
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
            yes,
        } => {
            let host = settings.wasm_host()?;
            // The package staged: the directory itself, or a fetch (kept until the end).
            let fetched = match registry_reference(&source)? {
                None => None,
                Some(reference) => {
                    let registry = registry_settings(&settings)?;
                    let opts = heddle_registry::FetchOptions {
                        allow_latest,
                        max_component_bytes: settings.wasm.wasm.max_component_bytes,
                        trust: trust(&settings)?,
                    };
                    let f = rt.block_on(heddle_registry::fetch(
                        &source,
                        &reference,
                        &registry,
                        &opts,
                        store.root(),
                    ))?;
                    if !json {
                        eprintln!(
                            "fetched {source}: manifest {}, component {}",
                            f.source.manifest_digest, f.source.layer_digest
                        );
                    }
                    Some(f)
                }
            };
            let (dir, origin) = match &fetched {
                Some(f) => (f.dir.clone(), Some(f.source.clone())),
                None => (PathBuf::from(&source), None),
            };
            let in_registry = |e: heddle_wasm::PackageError| -> anyhow::Error {
                match &fetched {
                    Some(_) => heddle_registry::RegistryError::Package {
                        reference: source.clone(),
                        source: Box::new(e),
                    }
                    .into(),
                    None => e.into(),
                }
            };
            // An update is shown before it takes effect; more capabilities need --yes.
            let candidate = rt
                .block_on(WasmPackage::load_dir(&host, &dir))
                .map_err(in_registry)?;
            let previous = store
                .list()
                .ok()
                .and_then(|l| l.into_iter().find(|e| e.name == candidate.name()));
            let mut change = None;
            if let Some(old_entry) = previous {
                let old = rt.block_on(store.load(&host, &old_entry.name)).ok();
                let c = Change::between(old.as_ref(), &old_entry, &candidate, origin.as_ref());
                if !json {
                    print_change(&c);
                }
                if !c.capabilities_added.is_empty() && !yes {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&c)?);
                    }
                    return Err(crate::usage!(
                        "package {}: the update asks for capabilities the installed version did not ({}); nothing was changed; add it again with --yes to accept",
                        candidate.name(),
                        c.capabilities_added.join(", ")
                    ));
                }
                change = Some(c);
            }
            drop(candidate);
            let pkg = rt
                .block_on(store.install_from(&host, &dir, origin))
                .map_err(in_registry)?;
            drop(fetched);
            let entry = store.list()?.into_iter().find(|e| e.name == pkg.name());
            let installed = entry
                .as_ref()
                .map(|e| store.entry_dir(e))
                .unwrap_or_default();
            let mut info = review(&settings, &pkg, &pkg.digest);
            info.source = entry.and_then(|e| e.source);
            info.change = change;
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
                let mut info = review(&settings, &pkg, &e.sha256);
                info.source = e.source.clone();
                infos.push(info);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&infos)?);
            } else if infos.is_empty() {
                println!(
                    "no packages installed in {} ({} are built in)",
                    settings.packages_dir.display(),
                    heddle_wasm::FIRST_PARTY.join(", ")
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
                pushed
                    .location
                    .split_once('@')
                    .map_or(pushed.location.as_str(), |(l, _)| l),
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
            if settings.wasm.packages.contains_key(&name) {
                println!(
                    "  the grant [packages.{name}] in {config_name} stays: any package named {name} added later receives it{}; delete the section if none should",
                    if settings.wasm.packages[&name].sha256.is_some() {
                        " if its bytes match the pinned sha256"
                    } else {
                        ""
                    }
                );
            }
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
fn build(
    dir: &Path,
    out: Option<PathBuf>,
    no_install: bool,
    no_cache: bool,
) -> anyhow::Result<Exit> {
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
    println!("{p}");
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
            return Err(crate::usage!(
                "{} exists; not overwriting a key",
                p.display()
            ));
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
    println!(
        "public key  {} ({})",
        public_path.display(),
        public.fingerprint()
    );
    println!(
        "to trust it, in heddle.toml:\n  [trust.keys]\n  NAME = \"{}\"",
        public_path.display()
    );
    Ok(Exit::Ok)
}

/// Installs, from their registries, the packages `run` recorded that the package store
/// lacks: exactly the manifest digest recorded (whose layer must be the recorded
/// component), checked against `[trust]` as any add is. Packages added from a directory
/// are left to the refusal at load, which says what to add.
pub(crate) fn fetch_missing(
    settings: &Settings,
    run: &str,
    recorded: &std::collections::BTreeMap<String, heddle_store::PackagePin>,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    let store = settings.package_store();
    let installed: std::collections::BTreeSet<String> = if store.lockfile_path().is_file() {
        store.list()?.into_iter().map(|e| e.name).collect()
    } else {
        Default::default()
    };
    let missing: Vec<_> = recorded
        .iter()
        .filter(|(name, pin)| !installed.contains(*name) && pin.source.is_some())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let registry = registry_settings(settings)?;
    let opts = heddle_registry::FetchOptions {
        allow_latest: false,
        max_component_bytes: settings.wasm.wasm.max_component_bytes,
        trust: trust(settings)?,
    };
    let host = settings.wasm_host()?;
    for (name, pin) in missing {
        // Invariant: filtered on `source.is_some()` above.
        let o = pin.source.as_ref().expect("filtered");
        eprintln!(
            "run {run} uses package {name}, not installed here: fetching {} (manifest {})",
            o.reference, o.manifest_digest
        );
        rt.block_on(async {
            let fetched =
                heddle_registry::fetch_pinned(o, &registry, &opts, store.root()).await?;
            let pkg = store
                .install_from(&host, &fetched.dir, Some(fetched.source.clone()))
                .await
                .map_err(|e| heddle_registry::RegistryError::Package {
                    reference: o.reference.clone(),
                    source: Box::new(e),
                })?;
            if pkg.digest != pin.sha256 {
                anyhow::bail!(
                    "run {run}: package {name} fetched from {} is sha256 {}, not the {} the run recorded",
                    o.reference,
                    pkg.digest,
                    pin.sha256
                );
            }
            anyhow::Ok(())
        })?;
    }
    Ok(())
}
