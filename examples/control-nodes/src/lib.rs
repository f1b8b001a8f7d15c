//! A controller and a controlled node written with the Rust SDK (`heddle:node@0.2.0`).
//!
//! `demo.shout` is controlled: it runs once per `run` event its controller sends, with
//! the event's property overrides. `demo.each_word` is a controller: it reads which
//! node it drives from its `_control_context`, sends one event per word of its input
//! (all in flight before it awaits any reply) and collects the replies in order.

use heddle_sdk::{Decl, Error, Inputs, Node, Outputs, Value, control, node};

node! {
    /// Shout.
    /// Upper-cases `text` and appends `suffix`: run once per control event. Not
    /// declared retry-safe, so a durable run records each reply before its controller
    /// sees it (and replays it on recovery).
    #[node("demo.shout", controlled)]
    pub fn shout(text: String, suffix: String = "!") -> text: String {
        Ok(format!("{}{suffix}", text.to_uppercase()))
    }
}

/// The controller, written out by hand.
pub struct EachWord;

impl Node for EachWord {
    const TYPE: &'static str = "demo.each_word";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Each word")
            .description(
                "Controller: runs the controlled node its control edge reaches once per word of `sentence` (property `text` = the word) and collects the replies' `text`.",
            )
            .input::<String>("sentence", "Words to send, one run event each")
            .output::<Vec<String>>("words", "The replies, in word order")
            .output::<String>("target", "The node it drove (from its control context)")
            // Its only effects are its events, which the targets' journal answers
            // again on recovery; a supervisor still offers no retry when a target is
            // not retry-safe.
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let sentence: String = inputs.get("sentence")?;
        // The context names every node this one controls, with the properties each
        // `run` event may override.
        let target = match control::context(inputs) {
            Some(Value::Object(targets)) if targets.len() == 1 => {
                let (id, t) = targets.iter().next().expect("one target");
                let takes_text = ["actions", "run", "properties", "text"]
                    .iter()
                    .try_fold(t, |v, k| field(v, k))
                    .is_some();
                if !takes_text {
                    return Err(Error::new(format!("node {id} has no property `text` to set")));
                }
                id.clone()
            }
            _ => return Err(Error::new("wire exactly one controlled node to this one")),
        };
        let tickets = sentence
            .split_whitespace()
            .map(|w| control::send(&target, &[("text", Value::Str(w.to_string()))]))
            .collect::<Result<Vec<_>, Error>>()?;
        let mut words = Vec::with_capacity(tickets.len());
        for t in tickets {
            let reply = t.reply()?;
            words.push(reply.get("text").map(Value::to_text).unwrap_or_default());
        }
        Ok(Outputs::new().with("words", words).with("target", target))
    }
}

/// `v.k` when `v` is an object that has `k`.
fn field<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(k),
        _ => None,
    }
}

heddle_sdk::export_nodes!(shout, EachWord);
