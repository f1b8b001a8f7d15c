//! Nodes that lie about their outputs or try to mislead whoever reads their errors.

use heddle_sdk::{Correlation, Decl, Error, Inputs, Node, Outputs, Value, node};

/// Declares `out: int`, returns a string.
pub struct SayIntGiveStr;

impl Node for SayIntGiveStr {
    const TYPE: &'static str = "hostile.say_int_give_str";
    fn declare() -> Decl {
        Decl::new(Self::TYPE).output::<i64>("out", "")
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::one("out", "not an int".to_string()))
    }
}


/// Declares `out: list[int]`, returns `[1, "two"]`.
pub struct SayIntsGiveMixed;

impl Node for SayIntsGiveMixed {
    const TYPE: &'static str = "hostile.say_ints_give_mixed";
    fn declare() -> Decl {
        Decl::new(Self::TYPE).output::<Vec<i64>>("out", "")
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        let v = Value::List(vec![Value::Int(1), Value::Str("two".into())]);
        Ok(Outputs::one("out", v))
    }
}


/// Declares a streaming `out: int` and emits a string on it.
pub struct EmitStrOnInt;

impl Node for EmitStrOnInt {
    const TYPE: &'static str = "hostile.emit_str_on_int";
    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .output_with::<i64>("out", Correlation::Chunk, "")
            .streaming_output()
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        // The host must refuse it; the node reports what the host said.
        heddle_sdk::emit("out", "not an int".to_string())?;
        Ok(Outputs::new())
    }
}

/// Returns the same output handle twice.
pub struct SameHandleTwice;

impl Node for SameHandleTwice {
    const TYPE: &'static str = "hostile.same_handle_twice";
    fn declare() -> Decl {
        Decl::new(Self::TYPE).output::<i64>("out", "")
    }
    fn run(_i: &mut Inputs) -> Result<Outputs, Error> {
        Ok(Outputs::new().with("out", 1i64).with("out", 2i64))
    }
}

node! {
    /// Return NaN on a float port.
    #[node("hostile.not_a_number")]
    pub fn not_a_number(x: f64 = 0.0f64) -> out: f64 {
        Ok(x / x)
    }
}

node! {
    /// Return infinity on a float port.
    #[node("hostile.infinity")]
    pub fn infinity(x: f64 = 1.0f64) -> out: f64 {
        Ok(x / 0.0)
    }
}

node! {
    /// Call the process exit.
    #[node("hostile.exit")]
    pub fn exit(code: i64 = 3i64) -> out: i64 {
        std::process::exit(code as i32)
    }
}

fn deep(n: u64, pad: &mut [u8; 256]) -> u64 {
    pad[(n % 256) as usize] = n as u8;
    if n == u64::MAX {
        return 0;
    }
    deep(n + 1, pad) + pad[0] as u64
}

node! {
    /// Recurse until the stack runs out.
    #[node("hostile.recurse")]
    pub fn recurse(start: i64 = 0i64) -> out: i64 {
        let mut pad = [0u8; 256];
        Ok(deep(start as u64, &mut pad) as i64)
    }
}

node! {
    /// Fail with an error message of `bytes` bytes.
    #[node("hostile.big_error")]
    pub fn big_error(bytes: i64 = 8_000_000i64) -> out: i64 {
        Err(Error::new("E".repeat(bytes.max(0) as usize)))
    }
}

/// Text that would forge a line and recolour the terminal if printed raw.
pub const FORGED: &str = "fine\n  granted files-read `/etc` (hostile): trust me\x1b[2J\x1b[31mred\x07";

node! {
    /// Fail with a message holding newlines and terminal escape sequences.
    #[node("hostile.spoofed_error")]
    pub fn spoofed_error(x: i64 = 0i64) -> out: i64 {
        Err(Error::new(FORGED).signature("spoof"))
    }
}

node! {
    /// Log a line holding newlines and terminal escape sequences.
    #[node("hostile.spoofed_log")]
    pub fn spoofed_log(x: i64 = 0i64) -> out: i64 {
        heddle_sdk::log::warn(FORGED);
        Ok(x)
    }
}

node! {
    /// Report the cost it is given (the tests give it ones that are not costs).
    #[node("hostile.bad_cost")]
    pub fn bad_cost(usd: f64 = 0.0f64) -> out: i64 {
        heddle_sdk::report_cost(usd);
        Ok(1)
    }
}
