//! Nodes that hold the host without computing: waiting in WASI, calling cheap host
//! functions in a loop, or handing the host many large strings.

use heddle_sdk::{Error, node};

node! {
    /// Sleep in a WASI clock wait (no guest code runs while it waits).
    #[node("hostile.sleep")]
    pub fn sleep(ms: i64 = 3_600_000i64) -> out: i64 {
        std::thread::sleep(std::time::Duration::from_millis(ms as u64));
        Ok(ms)
    }
}

node! {
    /// Sleep a millisecond at a time, forever, ignoring cancellation.
    #[node("hostile.sleep_in_loop")]
    pub fn sleep_in_loop(seed: i64 = 0i64) -> out: i64 {
        let mut n = seed;
        loop {
            std::thread::sleep(std::time::Duration::from_millis(1));
            n = n.wrapping_add(1);
            if n == i64::MIN {
                return Ok(n);
            }
        }
    }
}

node! {
    /// Call the cheapest host function forever, ignoring its answer.
    #[node("hostile.poll_cancelled")]
    pub fn poll_cancelled(seed: i64 = 0i64) -> calls: i64 {
        let mut n = seed;
        loop {
            if heddle_sdk::cancelled() {
                n = n.wrapping_add(1);
            }
            n = n.wrapping_add(1);
            if n == i64::MIN {
                return Ok(n);
            }
        }
    }
}

fn name(i: i64, bytes: i64) -> String {
    let mut s = format!("{i}-");
    s.push_str(&"n".repeat(bytes.max(0) as usize));
    s
}

node! {
    /// Ask for `count` ungranted secrets with names of `bytes` bytes (each refusal is
    /// logged by the host).
    #[node("hostile.secret_flood")]
    pub fn secret_flood(count: i64 = 1000i64, bytes: i64 = 1_000_000i64) -> asked: i64 {
        let big = name(0, bytes);
        for i in 0..count {
            let mut n = big.clone();
            n.replace_range(0..1, &(i % 10).to_string());
            let _ = heddle_sdk::secret(&n);
        }
        Ok(count)
    }
}

node! {
    /// Record `count` assets with ids of `bytes` bytes.
    #[node("hostile.asset_flood")]
    pub fn asset_flood(count: i64 = 1000i64, bytes: i64 = 1_000_000i64) -> recorded: i64 {
        let big = name(0, bytes);
        for _ in 0..count {
            heddle_sdk::record_asset(&big);
        }
        Ok(count)
    }
}

node! {
    /// Log `count` lines of `bytes` bytes through the log import.
    #[node("hostile.log_flood")]
    pub fn log_flood(count: i64 = 1000i64, bytes: i64 = 1_000_000i64) -> logged: i64 {
        let big = name(0, bytes);
        for _ in 0..count {
            heddle_sdk::log::info(&big);
        }
        Ok(count)
    }
}

/// Emits one buffer of `bytes` bytes `count` times (streaming output).
pub struct ReEmit;

impl heddle_sdk::Node for ReEmit {
    const TYPE: &'static str = "hostile.re_emit";
    fn declare() -> heddle_sdk::Decl {
        heddle_sdk::Decl::new(Self::TYPE)
            .input_default::<i64>("count", 1000, "")
            .input_default::<i64>("bytes", 1 << 20, "")
            .output_with::<String>("out", heddle_sdk::Correlation::Chunk, "")
            .streaming_output()
    }
    fn run(i: &mut heddle_sdk::Inputs) -> Result<heddle_sdk::Outputs, Error> {
        let count = i.get_or::<i64>("count", 1000)?;
        let bytes = i.get_or::<i64>("bytes", 1 << 20)?;
        let big = "x".repeat(bytes.max(0) as usize);
        for _ in 0..count {
            heddle_sdk::emit("out", big.clone())?;
        }
        Ok(heddle_sdk::Outputs::new())
    }
}

