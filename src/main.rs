use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = heddle::cli::Cli::parse();
    if cli.verbose && std::env::var_os("RUST_BACKTRACE").is_none() {
        // SAFETY: the process's first thread, before any other exists (the tokio
        // runtimes are built by the commands, after this), so no one reads the
        // environment concurrently.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "1") };
    }
    heddle::console::install();
    heddle::app::main(cli)
}
