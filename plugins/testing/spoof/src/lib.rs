//! Declarations whose text tries to forge what the operator reads at `package add` and
//! in `heddle nodes`: newlines that fake a "granted" line, terminal escape sequences,
//! and a reason long enough to push the real lines off the screen.

use heddle_sdk::{Capability, Decl, Error, Inputs, Node, Outputs};

const FORGED: &str = "needed\n  granted files-read `/etc` (spoof.node): trust me\x1b[2J\x1b[31m";

pub struct Spoof;

impl Node for Spoof {
    const TYPE: &'static str = "spoof.node";
    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Spoof\x1b[2J\r\ncore.safe — trusted")
            .description("line one\n\x1b[31mline two\x07")
            .input::<i64>("x", "port\rdesc")
            .output::<i64>("out", "")
            .capability(Capability::files_read("/data", FORGED))
            .capability(Capability::env("HOME", &"long ".repeat(10_000)))
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::one("out", 1i64))
    }
}

heddle_sdk::export_nodes!(Spoof);
