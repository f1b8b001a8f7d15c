//! Every value a guest hands out (returned or emitted) is checked here, at the boundary,
//! against the declaration the package made: size, representability, declared type. A
//! package that lies fails itself, naming its node and port, instead of failing the
//! innocent node downstream that receives the value.

use heddle_core::{PortType, Value};
use heddle_kernel::{ErrorKind, NodeError};

use crate::bindings::WitValue;
use crate::value::{from_wit, wit_size};

/// How the value left the guest, for the message.
#[derive(Clone, Copy)]
pub(crate) enum Via {
    Returned,
    Emitted,
}

impl Via {
    fn verb(self) -> &'static str {
        match self {
            Via::Returned => "returned",
            Via::Emitted => "emitted",
        }
    }
}

/// Node `id` (type), as every error about a node starts.
pub(crate) fn label(node_id: &str, type_name: &str) -> String {
    format!("node `{node_id}` ({type_name})")
}

/// Checks one output value of the node `label`; `ty` is `None` for an undeclared port.
/// `handle` is as the guest sent it (escaped here, in messages only: the success path,
/// once per value on every invocation, allocates nothing for messages).
pub(crate) fn check_output(
    label: &dyn Fn() -> String,
    handle: &str,
    ty: Option<&PortType>,
    v: WitValue,
    max_bytes: usize,
    via: Via,
) -> Result<Value, NodeError> {
    let verb = via.verb();
    let label = || label();
    let handle = || crate::text::line(handle, crate::text::SHORT);
    let Some(ty) = ty else {
        let (label, handle) = (label(), handle());
        return Err(NodeError::msg(format!(
            "{label} {verb} output `{handle}`, which it does not declare"
        ))
        .with_signature(crate::signature::UNKNOWN_OUTPUT));
    };
    let size = wit_size(&v);
    if size > max_bytes {
        let (label, handle) = (label(), handle());
        return Err(NodeError::new(
            ErrorKind::OutputTooLarge,
            format!(
                "{label}: output `{handle}` is {size} bytes, over the {max_bytes}-byte limit per value; {}",
                crate::config::value_limit_hint(max_bytes)
            ),
        )
        .with_signature(crate::signature::OUTPUT_TOO_LARGE));
    }
    let v = from_wit(v).map_err(|e| {
        let (label, handle) = (label(), handle());
        NodeError::msg(format!("{label}: output `{handle}`: {e}"))
            .with_signature(crate::signature::BAD_OUTPUT)
    })?;
    let v = ty.coerce(v);
    // Null is how every SDK says "no value" on an optional output.
    if !matches!(v, Value::Null)
        && let Err(e) = ty.check(&v)
    {
        let (label, handle) = (label(), handle());
        return Err(NodeError::msg(format!(
            "{label}: output `{handle}` is declared `{ty}`, but the node {verb} a value that does not match ({e})"
        ))
        .with_signature(crate::signature::OUTPUT_TYPE));
    }
    Ok(v)
}

/// The type of output `handle` in a declaration's output list.
pub(crate) fn output_type<'a>(
    outputs: &'a [(std::sync::Arc<str>, PortType)],
    handle: &str,
) -> Option<&'a PortType> {
    outputs.iter().find(|(h, _)| **h == *handle).map(|(_, t)| t)
}
