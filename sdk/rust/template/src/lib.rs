//! A Heddle node package. Build with `cargo build --release --target wasm32-wasip2`.

use heddle_sdk::{Correlation, Decl, Error, Inputs, Node, Outputs, emit, node};

node! {
    /// Greet someone.
    /// Says hello to `name`, `times` times over, separated by spaces.
    #[node("my.greet", retry_safe)]
    pub fn greet(name: String, times: i64 = 1i64) -> greeting: String {
        if times < 0 {
            return Err(Error::new("times must not be negative").signature("greet:times"));
        }
        heddle_sdk::log::info(&format!("greeting {name}"));
        Ok(vec![format!("Hello, {name}!"); times as usize].join(" "))
    }
}

/// A streaming node, written out by hand: emits every word as its own item.
pub struct Words;

impl Node for Words {
    const TYPE: &'static str = "my.words";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Words")
            .description("Emits each word of `text` as one item, then returns the count.")
            .input::<String>("text", "Text to split")
            .output_with::<String>("word", Correlation::Iteration, "One word")
            .output::<i64>("count", "How many words were emitted")
            .streaming_output()
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let text: String = inputs.get("text")?;
        let mut n = 0;
        for w in text.split_whitespace() {
            if heddle_sdk::cancelled() {
                return Err(Error::new("cancelled"));
            }
            emit("word", w.to_string())?;
            n += 1;
        }
        Ok(Outputs::one("count", n as i64))
    }
}

heddle_sdk::export_nodes!(greet, Words);
