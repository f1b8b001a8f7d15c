//! The `heddle` command line as a library: each command is a function over the library
//! crates, so the binary stays a thin `main` and the pieces (flags, the progress
//! view, exit codes) can be tested on their own.

pub mod app;
pub mod cli;
pub mod commands;
pub mod console;
pub mod execute;
pub mod exit;
pub mod progress;
