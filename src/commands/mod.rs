//! One module per subcommand.

pub mod bench;
pub mod images;
pub mod nodes;
pub mod package;
pub mod run;
pub mod runs;
pub mod serve;
pub mod validate;
pub mod watch;
pub mod worker;
