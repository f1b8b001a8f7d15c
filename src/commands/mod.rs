//! One module per subcommand.

pub mod bench;
pub mod images;
pub mod nodes;
pub mod package;
pub mod run;
pub mod runs;
pub mod validate;
pub mod worker;
