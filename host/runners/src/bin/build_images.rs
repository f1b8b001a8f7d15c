//! `heddle-build-images [--force]`: builds the runner images with the default
//! configuration (what `heddle images build` does with the operator's heddle.toml).
//! Used by `scripts/build-images` and `scripts/test` before the CLI exists in a build.

use heddle_runners::{BuildOptions, RunnersConfig, build_images};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut opts = BuildOptions::default();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--force" => opts.force = true,
            "-h" | "--help" => {
                println!("usage: heddle-build-images [--force]");
                return;
            }
            other => {
                eprintln!("heddle-build-images: unknown argument `{other}` (try --help)");
                std::process::exit(2);
            }
        }
    }
    let progress = |line: &str| println!("{line}");
    if let Err(e) = build_images(&RunnersConfig::default(), &opts, &progress).await {
        eprintln!("heddle-build-images: {e}");
        std::process::exit(1);
    }
}
