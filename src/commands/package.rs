//! `heddle package add|list|verify|remove`: the package store of heddle-wasm, with what
//! each package asks for next to what the operator's config grants it.

use std::path::Path;

use heddle_core::CapabilityKind;
use heddle_wasm::{PackageGrant, WasmPackage};
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
    pub sha256: String,
    pub node_types: Vec<String>,
    pub capabilities: Vec<CapabilityLine>,
    /// The destinations the config grants (`network`), whatever the package asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_granted: Vec<String>,
    /// The headers the host adds per destination (`network_auth`): names, never values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_auth: Vec<AuthLine>,
}

/// A header the host injects for a destination, from a secret.
#[derive(Debug, Serialize)]
pub struct AuthLine {
    pub destination: String,
    pub header: String,
    pub secret: String,
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
        sha256: sha256.to_string(),
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
        PackageCommand::Add { dir, json } => {
            let host = settings.wasm_host()?;
            let pkg = rt.block_on(store.install(&host, Path::new(&dir)))?;
            let installed = store
                .list()?
                .into_iter()
                .find(|e| e.name == pkg.name())
                .map(|e| store.entry_dir(&e))
                .unwrap_or_default();
            let info = describe(&pkg, &pkg.digest, &grant_of(&settings, &pkg));
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
                infos.push(describe(&pkg, &e.sha256, &grant_of(&settings, &pkg)));
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
        PackageCommand::Remove { name } => {
            store.remove(&name)?;
            println!("removed {name}");
            Ok(Exit::Ok)
        }
    }
}
