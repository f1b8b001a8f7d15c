//! Nodes that attack the host, for the sandbox tests. Each one does exactly one bad
//! thing so a test failure points at one defence.

use heddle_sdk::{Decl, Error, Inputs, Node, Outputs, Value, node};

mod files;
mod lies;
mod net;
mod waits;

pub use files::*;
pub use lies::*;
pub use net::*;
pub use waits::*;

node! {
    /// Loop forever without checking for cancellation.
    #[node("hostile.spin")]
    pub fn spin(seed: i64 = 1i64) -> out: i64 {
        let mut x = seed as u64;
        loop {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if x == 42 {
                break;
            }
        }
        Ok(x as i64)
    }
}

node! {
    /// Allocate memory until something gives.
    #[node("hostile.alloc")]
    pub fn alloc(mb: i64 = 4096i64) -> out: i64 {
        let mut keep: Vec<Vec<u8>> = Vec::new();
        for _ in 0..mb {
            let mut v = vec![0u8; 1 << 20];
            v[0] = 1;
            keep.push(v);
        }
        Ok(keep.len() as i64)
    }
}

node! {
    /// Read a file.
    #[node("hostile.read")]
    pub fn read(path: String) -> text: String {
        std::fs::read_to_string(&path).map_err(|e| Error::new(format!("read {path}: {e}")).signature("files:denied"))
    }
}

node! {
    /// Write a file.
    #[node("hostile.write")]
    pub fn write(path: String, text: String = "pwned") -> ok: bool {
        std::fs::write(&path, text).map_err(|e| Error::new(format!("write {path}: {e}")).signature("files:denied"))?;
        Ok(true)
    }
}

node! {
    /// Read the environment.
    #[node("hostile.env")]
    pub fn env(name: String) -> value: Option<String> {
        Ok(std::env::var(&name).ok())
    }
}

node! {
    /// Return a huge string.
    #[node("hostile.huge")]
    pub fn huge(bytes: i64 = 8_000_000i64) -> out: String {
        Ok("x".repeat(bytes as usize))
    }
}

node! {
    /// Panic on request, otherwise answer.
    #[node("hostile.panic")]
    pub fn panic(panic: bool = true) -> out: String {
        if panic {
            panic!("hostile guest panicked on purpose");
        }
        Ok("alive".into())
    }
}

node! {
    /// Ask for a secret by name.
    #[node("hostile.secret")]
    pub fn secret(name: String) -> value: Option<String> {
        Ok(heddle_sdk::secret(&name))
    }
}

node! {
    /// Print a lot to stdout.
    #[node("hostile.chatty")]
    pub fn chatty(lines: i64 = 100_000i64) -> out: i64 {
        for i in 0..lines {
            println!("line {i} of noise that fills the log");
        }
        heddle_sdk::log::info("done talking");
        Ok(lines)
    }
}

node! {
    /// Return the input (trivial node for overhead benchmarks).
    #[node("hostile.echo", retry_safe)]
    pub fn echo(value: Value) -> value: Value {
        Ok(value)
    }
}

node! {
    /// Return the input, reusing a warm instance.
    #[node("hostile.echo_warm", retry_safe, reuse_instance)]
    pub fn echo_warm(value: Value) -> value: Value {
        Ok(value)
    }
}

node! {
    /// A tight integer loop of `n` iterations (fuel overhead benchmark).
    #[node("hostile.compute", retry_safe)]
    pub fn compute(n: i64 = 1_000_000i64) -> out: i64 {
        let mut h: u64 = 1469598103934665603;
        for i in 0..n as u64 {
            h = (h ^ i).wrapping_mul(1099511628211);
        }
        Ok(h as i64)
    }
}

static mut CALLS: i64 = 0;

fn count_call(fail: bool) -> Result<i64, Error> {
    // SAFETY: a component instance is single-threaded; the counter exists to reveal
    // whether the host reused this instance.
    let n = unsafe {
        CALLS += 1;
        CALLS
    };
    if fail {
        panic!("counter asked to fail");
    }
    Ok(n)
}

node! {
    /// Count calls seen by this instance (warm reuse opted in).
    #[node("hostile.counter_warm", reuse_instance)]
    pub fn counter_warm(fail: bool = false) -> calls: i64 {
        count_call(fail)
    }
}

node! {
    /// Count calls seen by this instance (default lifecycle: fresh every time).
    #[node("hostile.counter")]
    pub fn counter(fail: bool = false) -> calls: i64 {
        count_call(fail)
    }
}

/// What `hostile.residue` writes at the start of a page it dirties.
const RESIDUE: u64 = 0x5eed_0f_1a57_1e55;
/// Where this instance's residue region starts (0: not grown yet).
static mut RESIDUE_BASE: usize = 0;

/// Grows linear memory by `mb` MiB the first time (the pages `memory.grow` adds must
/// read as zero), counts the 4 KiB pages of that region that hold `RESIDUE`, then
/// writes it into every `stride`-th page. A fresh instance grows memory from the same
/// initial size, so its region is where the instance before it in the pool slot wrote;
/// a warm one reads its own earlier writes, which shows the probe sees what is there.
fn residue_probe(mb: i64, stride: i64) -> Result<(i64, i64), Error> {
    const PAGE: usize = 4096;
    const WASM_PAGE: usize = 65536;
    let len = (mb.max(1) as usize) << 20;
    // SAFETY: a component instance is single-threaded.
    let base = unsafe {
        if RESIDUE_BASE == 0 {
            let old = core::arch::wasm32::memory_grow(0, len / WASM_PAGE);
            if old == usize::MAX {
                return Err(Error::new("memory.grow refused"));
            }
            RESIDUE_BASE = old * WASM_PAGE;
        }
        RESIDUE_BASE
    };
    let mut found = 0;
    let mut written = 0;
    for (i, at) in (base..base + len).step_by(PAGE).enumerate() {
        let at = at as *mut u64;
        // SAFETY: `at` lies in the region grown above, which nothing else uses;
        // volatile so neither the read nor the write is folded or elided.
        unsafe {
            if std::ptr::read_volatile(at) == RESIDUE {
                found += 1;
            }
            if i % stride.max(1) as usize == 0 {
                std::ptr::write_volatile(at, RESIDUE);
                written += 1;
            }
        }
    }
    Ok((found, written))
}

node! {
    /// Counts the pages of `mb` MiB of fresh linear memory that still hold what an
    /// earlier instance wrote there, then dirties every `stride`-th page: many separate
    /// dirty runs, more bytes than a pool slot keeps resident.
    #[node("hostile.residue")]
    pub fn residue(mb: i64 = 6i64, stride: i64 = 2i64) -> (found: i64, written: i64) {
        residue_probe(mb, stride)
    }
}

node! {
    /// `hostile.residue` in a reused instance: finds its own earlier writes.
    #[node("hostile.residue_warm", reuse_instance)]
    pub fn residue_warm(mb: i64 = 6i64, stride: i64 = 2i64) -> (found: i64, written: i64) {
        residue_probe(mb, stride)
    }
}

/// Emits on an undeclared handle, then returns an undeclared output.
pub struct Liar;

impl Node for Liar {
    const TYPE: &'static str = "hostile.liar";
    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .output::<String>("out", "")
            .streaming_output()
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        if heddle_sdk::emit("secret_channel", "x".to_string()).is_ok() {
            return Err(Error::new("host accepted an undeclared handle"));
        }
        Ok(Outputs::one("not_declared", "x".to_string()))
    }
}

heddle_sdk::export_nodes!(
    spin,
    grow,
    write_at,
    alloc,
    read,
    write,
    env,
    huge,
    panic,
    secret,
    chatty,
    echo,
    echo_warm,
    compute,
    counter,
    counter_warm,
    residue,
    residue_warm,
    Liar,
    sleep,
    sleep_in_loop,
    poll_cancelled,
    secret_flood,
    asset_flood,
    log_flood,
    ReEmit,
    SayIntGiveStr,
    SayIntsGiveMixed,
    EmitStrOnInt,
    SameHandleTwice,
    not_a_number,
    infinity,
    exit,
    recurse,
    big_error,
    spoofed_error,
    spoofed_log,
    bad_cost,
    http_burst,
    http_leak,
    http_upload
);
