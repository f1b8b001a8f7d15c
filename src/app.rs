//! Dispatch and the error edge: every command returns `anyhow::Result<Exit>`, and an
//! error is printed once here and turned into an exit code by [`crate::exit::classify`].

use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::commands;
use crate::exit::{Exit, bounded, classify};

pub fn main(cli: Cli) -> ExitCode {
    let verbose = cli.verbose;
    match dispatch(cli.command) {
        Ok(exit) => exit.into(),
        Err(err) => {
            print_error(&err, verbose);
            classify(&err).into()
        }
    }
}

pub fn dispatch(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Run(a) => commands::run::run(a),
        Command::Validate(a) => commands::validate::run(a),
        Command::Nodes(a) => commands::nodes::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Package(a) => commands::package::run(a),
        Command::Images(a) => commands::images::run(a),
        Command::Runs(a) => commands::runs::run(a),
        Command::Worker(a) => commands::worker::run(a),
        Command::Serve(a) => commands::serve::run(a),
    }
}

/// One message, causes joined; the debug form (with causes listed and a backtrace when
/// one was captured) only on `--verbose`. `RUST_BACKTRACE` is not asked: a shell set up
/// for Rust work exports it, and a user's mistake (a bad graph, a missing input) is not
/// a program fault to trace.
fn print_error(err: &anyhow::Error, verbose: bool) {
    let text = if verbose {
        format!("{err:?}")
    } else {
        format!("{err:#}")
    };
    crate::console::error(&bounded(&text));
}
