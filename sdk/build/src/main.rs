//! `heddle-package-build DIR`: builds the node package in DIR (any supported language)
//! into DIR/dist (or --out), ready for `heddle package add`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use heddle_package_build::{
    BuildOptions, Toolchains, build_package, default_wit, generate_c_bindings, wit_in,
};

#[derive(Parser)]
#[command(
    about = "Build a Heddle node package from a source folder (Rust, Python, JavaScript or C)"
)]
struct Args {
    /// The package source folder (holds heddle-package.toml).
    #[arg(required_unless_present = "c_bindings")]
    dir: Option<PathBuf>,
    /// Write the C bindings generated from the WIT into this folder and exit (for
    /// editors; builds generate their own).
    #[arg(long, value_name = "OUT")]
    c_bindings: Option<PathBuf>,
    /// Output folder for the package (default: DIR/dist).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The heddle:node WIT folder (default: the one built into this tool).
    #[arg(long)]
    wit: Option<PathBuf>,
    /// Do not use or fill the build cache.
    #[arg(long)]
    no_cache: bool,
    /// Fail instead of installing a missing toolchain.
    #[arg(long)]
    no_install: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut opts = BuildOptions {
        out_dir: args.out,
        progress: Some(|line| eprintln!("{line}")),
        ..BuildOptions::default()
    };
    if args.no_cache {
        opts.cache_dir = None;
    }
    opts.toolchains = Toolchains {
        install_missing: !args.no_install,
        ..Toolchains::default()
    };
    if let Some(dir) = args.wit {
        match wit_in(&dir) {
            Ok(w) => opts.wit = Some(w),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(out) = &args.c_bindings {
        let wit = match opts.wit.clone().map(Ok).unwrap_or_else(default_wit) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        return match generate_c_bindings(&wit, out) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // Invariant: clap requires DIR unless --c-bindings was given.
    let dir = args.dir.expect("DIR is required without --c-bindings");
    match build_package(&dir, &opts) {
        Ok(p) => {
            println!("{p}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
