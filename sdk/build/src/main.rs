//! `heddle-package-build DIR`: builds the node package in DIR (any supported language)
//! into DIR/dist (or --out), ready for `heddle package add`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use heddle_package_build::{BuildOptions, Toolchains, build_package, wit_in};

#[derive(Parser)]
#[command(
    about = "Build a Heddle node package from a source folder (Rust, Python, JavaScript or C)"
)]
struct Args {
    /// The package source folder (holds heddle-package.toml).
    dir: PathBuf,
    /// Output folder for the package (default: DIR/dist).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The heddle:node WIT folder (default: the repository's wit/).
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
    match build_package(&args.dir, &opts) {
        Ok(p) => {
            println!(
                "built {} ({}) -> {}{}  [{:.1} s]",
                p.name,
                p.language,
                p.dir.display(),
                if p.cached { " (cached)" } else { "" },
                p.elapsed.as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
