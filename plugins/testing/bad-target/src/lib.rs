//! A declaration whose capability target carries a newline and a terminal escape: what
//! the operator's grant is matched against would not be the text they read, so the
//! package is refused, as a type or port name holding one is.

use heddle_sdk::{Capability, Decl, Error, Inputs, Node, Outputs};

pub struct BadTarget;

impl Node for BadTarget {
    const TYPE: &'static str = "bad_target.node";
    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .output::<i64>("out", "")
            .capability(Capability::env("HOME\n  granted\x1b[2J", "reads HOME"))
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::one("out", 1i64))
    }
}

heddle_sdk::export_nodes!(BadTarget);
