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
    /// The destinations the config grants (`network`), whatever the package asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_granted: Vec<String>,
    /// The headers the host adds per destination (`network_auth`): names, never values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_auth: Vec<AuthLine>,
    /// What the operator's config says about this package.
    pub grant: GrantState,
    /// What a re-add changed against the installed version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// A header the host injects for a destination, from a secret.
#[derive(Debug, Serialize)]
pub struct AuthLine {
    pub destination: String,
    pub header: String,
    pub secret: String,
}

/// What re-adding a package changes: shown before it takes effect.
#[derive(Debug, Serialize)]
pub struct Change {
    pub name: String,
    pub version: (String, String),
    pub sha256: (String, String),
    pub signer: (Option<String>, Option<String>),
    pub node_types_added: Vec<String>,
    pub node_types_removed: Vec<String>,
    pub capabilities_added: Vec<String>,
    pub capabilities_removed: Vec<String>,
    pub description: String,
}

/// A package's capability requests as `kind `target``, one each.
fn requests(pkg: &WasmPackage) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for c in &pkg.manifest.capabilities {
        out.insert(format!("{} `{}`", kind_name(c.kind), c.target));
    }
    for d in pkg.declarations() {
        for c in &d.capabilities {
            out.insert(format!("{} `{}`", kind_name(c.kind), c.target));
        }
    }
    out
}

impl Change {
    /// `old` is the installed package (`None` when it no longer loads: then everything
    /// the new one asks for counts as added).
    fn between(
        old: Option<&WasmPackage>,
        old_entry: &heddle_wasm::LockEntry,
        new: &WasmPackage,
        origin: Option<&PackageSource>,
    ) -> Change {
        let old_types: std::collections::BTreeSet<String> =
            old_entry.node_types.iter().cloned().collect();
        let new_types: std::collections::BTreeSet<String> = new
            .declarations()
            .iter()
            .map(|d| d.type_name.clone())
            .collect();
        let old_caps = old.map(requests).unwrap_or_default();
        let new_caps = requests(new);
        Change {
            name: new.name().to_string(),
            version: (old_entry.version.clone(), new.manifest.version.clone()),
            sha256: (old_entry.sha256.clone(), new.digest.clone()),
            signer: (
                old_entry.source.as_ref().and_then(|s| s.signer.clone()),
                origin.and_then(|s| s.signer.clone()),
            ),
            node_types_added: new_types.difference(&old_types).cloned().collect(),
            node_types_removed: old_types.difference(&new_types).cloned().collect(),
            capabilities_added: new_caps.difference(&old_caps).cloned().collect(),
            capabilities_removed: old_caps.difference(&new_caps).cloned().collect(),
            description: new.manifest.description.clone(),
        }
    }

    fn print(&self) {
        let same = |a: &str, b: &str| {
            if a == b {
                format!("{a} (unchanged)")
            } else {
                format!("{a} -> {b}")
            }
        };
        let signer = |s: &Option<String>| s.clone().unwrap_or_else(|| "unsigned".into());
        println!("update of {} already installed:", self.name);
        println!("  version {}", same(&self.version.0, &self.version.1));
        println!("  sha256 {}", same(&self.sha256.0, &self.sha256.1));
        println!(
            "  signer {}",
            same(&signer(&self.signer.0), &signer(&self.signer.1))
        );
        if !self.description.is_empty() {
            println!("  description: {}", self.description);
        }
        for (what, list) in [
            ("node types added", &self.node_types_added),
            ("node types removed", &self.node_types_removed),
            ("capabilities added", &self.capabilities_added),
            ("capabilities removed", &self.capabilities_removed),
        ] {
            if !list.is_empty() {
                println!("  {what}: {}", list.join(", "));
            }
        }
    }
}

/// The operator's grant of a package, as the review shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum GrantState {
    /// No `[packages.NAME]` section: nothing is granted.
    None,
    /// A section without `sha256`: any package of that name receives it.
    Unpinned,
    /// A section pinned to these bytes.
    Pinned,
    /// A section pinned to other bytes: nothing is granted to these.
    PinMismatch { pinned: String },
}

/// What the config grants the package `name` whose component is `digest`, and how.
fn grant_of(settings: &Settings, name: &str, digest: &str) -> (PackageGrant, GrantState) {
    let Some(g) = settings.wasm.packages.get(name) else {
        return (PackageGrant::default(), GrantState::None);
    };
    match &g.sha256 {
        None => (g.clone(), GrantState::Unpinned),
        Some(p) if p.eq_ignore_ascii_case(digest) => (g.clone(), GrantState::Pinned),
        Some(p) => (
            PackageGrant::default(),
            GrantState::PinMismatch { pinned: p.clone() },
        ),
    }
}

/// A package's review: what it asks for against what `settings` grants it.
fn review(settings: &Settings, pkg: &WasmPackage, sha256: &str) -> PackageInfo {
    let (grant, state) = grant_of(settings, pkg.name(), sha256);
    let mut info = describe(pkg, sha256, &grant);
    info.grant = state;
    info
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
        network_granted: grant.network.iter().map(ToString::to_string).collect(),
        network_auth: grant
            .network_auth
            .iter()
            .map(|(d, a)| AuthLine {
                destination: d.to_string(),
                header: a.header.clone(),
                secret: a.secret.get_ref().clone(),
            })
            .collect(),
        grant: GrantState::None,
        change: None,
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
                    c.print();
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
        let source = PackageSource {
            reference: o.reference.clone(),
            registry: o.registry.clone(),
            repository: o.repository.clone(),
            manifest_digest: o.manifest_digest.clone(),
            layer_digest: o.layer_digest.clone(),
            signer: o.signer.clone(),
        };
        eprintln!(
            "run {run} uses package {name}, not installed here: fetching {} (manifest {})",
            o.reference, o.manifest_digest
        );
        rt.block_on(async {
            let fetched =
                heddle_registry::fetch_pinned(&source, &registry, &opts, store.root()).await?;
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
