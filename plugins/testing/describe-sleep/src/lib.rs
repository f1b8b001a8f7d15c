//! A package whose `describe()` waits in a WASI clock sleep: loading it must end at the
//! describe deadline, never hang the host.

use heddle_sdk::{Decl, Error, Inputs, Node, Outputs};

pub struct Sleepy;

impl Node for Sleepy {
    const TYPE: &'static str = "describe_sleep.node";
    fn declare() -> Decl {
        std::thread::sleep(std::time::Duration::from_secs(3600));
        Decl::new(Self::TYPE).output::<i64>("out", "")
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::one("out", 1i64))
    }
}

heddle_sdk::export_nodes!(Sleepy);
