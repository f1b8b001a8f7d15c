//! `heddle images build`: the code runners' images, built locally without a registry.

use heddle_runners::{BuildOptions, ImageOutcome, build_images};

use crate::cli::{ImagesArgs, ImagesCommand};
use crate::exit::Exit;

pub fn run(args: ImagesArgs) -> anyhow::Result<Exit> {
    let settings = args.env.settings()?;
    let ImagesCommand::Build { force } = args.command;
    let rt = heddle_runtime::tokio_runtime(None)?;
    let opts = BuildOptions { force };
    let progress = |line: &str| eprintln!("{line}");
    let outcomes = rt.block_on(build_images(&settings.runners, &opts, &progress))?;
    for o in outcomes {
        match o {
            ImageOutcome::Present { image } => println!("{image}: present"),
            ImageOutcome::Built { image, took, .. } => {
                println!("{image}: built in {:.0}s", took.as_secs_f64())
            }
        }
    }
    Ok(Exit::Ok)
}
