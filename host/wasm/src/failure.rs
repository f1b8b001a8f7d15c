//! A guest failure the host did not decide itself (a trap, `exit()`, a limit wasmtime
//! enforces) as one line for the operator. wasmtime attaches a wasm backtrace to these
//! errors; it means nothing to someone running a graph and would be printed in full, so
//! only the cause is kept.

use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

/// How wasmtime 48 reports a guest handing the host more than the per-call copy limit
/// (`Store::set_hostcall_fuel`). It has no trap code or public type for it: the error is
/// a private unit struct, `HostcallFuelExhausted`, raised while lifting arguments or
/// results. Its `Debug` output is the type's name, so that is checked first (it does not
/// change when the wording does), then the message. The hostile test
/// `output_over_the_host_call_limit_is_output_too_large` fails if a wasmtime upgrade
/// changes both.
const TOO_MUCH_DATA_TYPE: &str = "HostcallFuelExhausted";
const TOO_MUCH_DATA: &str = "too much data is being copied between the host and the guest";

fn is_too_much_data(e: &(dyn std::error::Error + 'static)) -> bool {
    format!("{e:?}") == TOO_MUCH_DATA_TYPE || e.to_string().contains(TOO_MUCH_DATA)
}

pub(crate) enum Failure {
    /// The guest called `exit(code)` instead of returning.
    Exit(i32),
    /// The guest handed the host more bytes in one call than the host accepts.
    TooMuchData,
    Trap(Trap),
    /// Anything else: the root cause's first line.
    Other(String),
}

pub(crate) fn classify(e: &wasmtime::Error) -> Failure {
    if let Some(x) = e.downcast_ref::<I32Exit>() {
        return Failure::Exit(x.0);
    }
    if let Some(t) = e.downcast_ref::<Trap>() {
        return Failure::Trap(*t);
    }
    if e.chain().any(is_too_much_data) {
        return Failure::TooMuchData;
    }
    let root = e.root_cause().to_string();
    Failure::Other(root.lines().next().unwrap_or_default().to_string())
}

/// `; guest stderr: …` when the guest wrote something before failing (a panic message).
pub(crate) fn stderr_detail(stderr_tail: &str) -> String {
    if stderr_tail.is_empty() {
        String::new()
    } else {
        format!("; guest stderr: {stderr_tail}")
    }
}

pub(crate) fn trap_name(t: Trap) -> String {
    match t {
        Trap::UnreachableCodeReached => "unreachable".into(),
        Trap::StackOverflow => "stack-overflow".into(),
        Trap::MemoryOutOfBounds => "memory-out-of-bounds".into(),
        Trap::IntegerDivisionByZero => "division-by-zero".into(),
        Trap::Interrupt => "interrupt".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

impl Failure {
    /// The sentence after the node or package label.
    pub fn message(&self, max_copy_bytes: usize, stderr_tail: &str) -> String {
        match self {
            Failure::Exit(code) => format!(
                "the guest called exit({code}) instead of returning{}",
                stderr_detail(stderr_tail)
            ),
            Failure::TooMuchData => format!(
                "the guest handed the host more than {max_copy_bytes} bytes in one call (the limit per host call and per set of returned outputs)"
            ),
            Failure::Trap(Trap::StackOverflow) => format!(
                "guest exhausted its call stack (limit {} KiB of wasm stack){}",
                crate::engine::MAX_WASM_STACK >> 10,
                stderr_detail(stderr_tail)
            ),
            Failure::Trap(t) => format!("guest trapped ({t}){}", stderr_detail(stderr_tail)),
            Failure::Other(m) => m.clone(),
        }
    }
}
