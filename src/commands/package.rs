//! `heddle package add|build|push|list|verify|remove`: the package store of
//! heddle-wasm, with what each package asks for next to what the operator's config
//! grants it; packages fetched from and pushed to OCI registries (heddle-registry);
//! source folders built with heddle-package-build.

use std::path::{Path, PathBuf};

use heddle_runtime::package_review::review;
use heddle_runtime::packages::{self, AddOptions, Added};
use heddle_wasm::WasmPackage;

use crate::cli::{PackageArgs, PackageCommand};
use crate::exit::Exit;

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
            let opts = AddOptions {
                allow_latest,
                accept_new_capabilities: yes,
            };
            let added = rt.block_on(packages::add(&settings, &source, opts))?;
            let fetched = match &added {
                Added::Installed { fetched, .. } | Added::NeedsConsent { fetched, .. } => fetched,
            };
            if let (Some(f), false) = (fetched, json) {
                eprintln!(
                    "fetched {source}: manifest {}, component {}",
                    f.manifest_digest, f.layer_digest
                );
            }
            match added {
                Added::NeedsConsent { name, change, .. } => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&change)?);
                    } else {
                        print!("{}", change.text());
                    }
                    Err(crate::usage!(
                        "package {name}: the update asks for capabilities the installed version did not ({}); nothing was changed; add it again with --yes to accept",
                        change.capabilities_added.join(", ")
                    ))
                }
                Added::Installed {
                    info,
                    dir,
                    lockfile,
                    ..
                } => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&info)?);
                    } else {
                        if let Some(c) = &info.change {
                            print!("{}", c.text());
                        }
                        println!(
                            "installed {}@{} into {} (pinned in {})",
                            info.name,
                            info.version,
                            dir.display(),
                            lockfile.display()
                        );
                        print!("{}", info.text(&config_name));
                    }
                    Ok(Exit::Ok)
                }
            }
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
                    print!("{}", i.text(&config_name));
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
            let Some(parsed) = packages::registry_reference(&reference)? else {
                return Err(crate::usage!(
                    "`{reference}` is not a registry reference: give oci://REGISTRY/NAMESPACE/NAME:VERSION or namespace:name@version"
                ));
            };
            let registry = settings.registry()?;
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
            let Some(parsed) = packages::registry_reference(&reference)? else {
                return Err(crate::usage!(
                    "`{reference}` is not a registry reference: give oci://REGISTRY/NAMESPACE/NAME:VERSION or namespace:name@version"
                ));
            };
            let registry = settings.registry()?;
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
        PackageCommand::Keygen { file } => {
            let (public_path, public) = heddle_registry::SigningKey::generate_files(&file)?;
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
