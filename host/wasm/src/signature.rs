//! The failure signatures the WASM host gives the failures it detects around a guest,
//! all in the `wasm` family (the grammar every signature keeps:
//! `heddle_core::supervise::signatures`). A guest's own declared signature is checked
//! against that grammar where it arrives (`executor.rs`).

pub(crate) const UNKNOWN_OUTPUT: &str = "wasm:unknown-output";
pub(crate) const OUTPUT_TOO_LARGE: &str = "wasm:output-too-large";
pub(crate) const BAD_OUTPUT: &str = "wasm:bad-output";
pub(crate) const OUTPUT_TYPE: &str = "wasm:output-type";
pub(crate) const DUPLICATE_OUTPUT: &str = "wasm:duplicate-output";
pub(crate) const DEADLINE: &str = "wasm:deadline";
pub(crate) const MEMORY_LIMIT: &str = "wasm:memory-limit";
pub(crate) const FUEL: &str = "wasm:fuel";
pub(crate) const EXIT: &str = "wasm:exit";
pub(crate) const HOST: &str = "wasm:host";
pub(crate) const BAD_CALL: &str = "wasm:bad-call";
pub(crate) const HOST_LIMIT: &str = "wasm:host-limit";

/// The guest trapped; `kind` is [`crate::failure::trap_name`]'s (`wasm:trap:unreachable`).
pub(crate) fn trap(kind: &str) -> String {
    format!("wasm:trap:{kind}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Trap;

    #[test]
    fn every_wasm_host_signature_keeps_the_signature_grammar() {
        let traps = [
            Trap::StackOverflow,
            Trap::MemoryOutOfBounds,
            Trap::HeapMisaligned,
            Trap::TableOutOfBounds,
            Trap::IndirectCallToNull,
            Trap::BadSignature,
            Trap::IntegerOverflow,
            Trap::IntegerDivisionByZero,
            Trap::BadConversionToInteger,
            Trap::UnreachableCodeReached,
            Trap::Interrupt,
            Trap::OutOfFuel,
        ];
        let made = [
            UNKNOWN_OUTPUT,
            OUTPUT_TOO_LARGE,
            BAD_OUTPUT,
            OUTPUT_TYPE,
            DUPLICATE_OUTPUT,
            DEADLINE,
            MEMORY_LIMIT,
            FUEL,
            EXIT,
            HOST,
            BAD_CALL,
            HOST_LIMIT,
        ]
        .map(str::to_string)
        .into_iter()
        .chain(traps.map(|t| trap(&crate::failure::trap_name(t))));
        for sig in made {
            heddle_core::supervise::signatures::check_declared(&sig)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
