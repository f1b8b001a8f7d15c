//! A package whose `describe()` panics: the refusal must carry the panic message.

use heddle_sdk::{Decl, Error, Inputs, Node, Outputs};

pub struct Panicky;

impl Node for Panicky {
    const TYPE: &'static str = "describe_panic.node";
    fn declare() -> Decl {
        panic!("describe panicked on purpose");
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new())
    }
}

heddle_sdk::export_nodes!(Panicky);
