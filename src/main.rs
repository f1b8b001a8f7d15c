use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = heddle::cli::Cli::parse();
    heddle::app::main(cli)
}
