//! Values for a run's inputs given as text: one value read by its input's type
//! ([`interpret`]), and a streaming input fed line by line from a reader while the run
//! is live ([`feed_streams`]; `heddle run --stream NAME` feeds standard input).

use heddle_core::plan::InputError;
use heddle_core::{PortType, Value};
use heddle_kernel::KernelError;
use heddle_kernel::runtime::RunHandle;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _};
use tokio::sync::watch;

/// A line of a streamed input the run could not take; the run is stopped.
#[derive(Debug, thiserror::Error)]
#[error("--stream {name}: line {line}: {problem}; the run was stopped")]
pub struct StreamLineError {
    /// The streaming input.
    pub name: String,
    /// The line (from 1).
    pub line: u64,
    /// What is wrong with it.
    pub problem: String,
}

/// Turns the text of one value into a [`Value`]: text for a `str` input (so `007` stays
/// `"007"`), else JSON when it parses, else the text itself.
pub fn interpret(text: &str, ty: &PortType, from_file: bool) -> Value {
    // A file's final newline ends its last line; it is not part of the value (as with
    // the shell's `$(cat file)`).
    let text = if from_file {
        text.strip_suffix('\n')
            .map(|t| t.strip_suffix('\r').unwrap_or(t))
            .unwrap_or(text)
    } else {
        text
    };
    if *ty == PortType::Str {
        // A JSON string literal on the command line (`name='"x"'`) still means `x`.
        if !from_file && let Ok(serde_json::Value::String(s)) = serde_json::from_str(text) {
            return Value::str(s);
        }
        return Value::str(text);
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(j) => Value::from_json(j),
        Err(_) => Value::str(text),
    }
}

/// Streaming inputs stay open while the run is live. The one `from` names is fed from its
/// reader line by line (`heddle run --stream NAME` reads standard input); every other one
/// is closed at once (after any value the run was started with, which the kernel already
/// pushed), so the run can finish. Feeding stops when `ended` turns true (the run ended).
///
/// A line that is not UTF-8 or does not fit the input's type is never dropped: the
/// stream stops there and the error names the line, so a total computed from half the
/// input cannot pass for the real one.
pub async fn feed_streams<R: AsyncBufRead + Unpin>(
    handle: &RunHandle,
    from: Option<(&str, R)>,
    mut ended: watch::Receiver<bool>,
) -> Result<(), StreamLineError> {
    let plan = handle.plan();
    for s in plan.inputs().iter().filter(|s| s.streaming) {
        if from.as_ref().is_some_and(|(name, _)| *name == &*s.name) {
            continue;
        }
        let _ = handle.finish_input(&s.name).await;
    }
    let Some((name, mut lines)) = from else {
        return Ok(());
    };
    let ty = plan.input(name).map(|s| s.ty.clone()).unwrap_or_default();
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let outcome = loop {
        buf.clear();
        let read = tokio::select! {
            r = lines.read_until(b'\n', &mut buf) => r,
            _ = ended.wait_for(|e| *e) => break Ok(()),
        };
        match read {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => {
                break Err(StreamLineError {
                    name: name.to_string(),
                    line: line_no + 1,
                    problem: format!("standard input could not be read: {e}"),
                });
            }
        }
        line_no += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let fail = |problem: String| StreamLineError {
            name: name.to_string(),
            line: line_no,
            problem,
        };
        let Ok(text) = std::str::from_utf8(line) else {
            break Err(fail("the line is not valid UTF-8".into()));
        };
        let v = interpret(text, &ty, false);
        match handle.push_input(name, v).await {
            Ok(()) => {}
            Err(KernelError::Input(InputError::Type { reason, .. })) => {
                break Err(fail(format!(
                    "`{}` does not fit the input's type {ty}: {reason}",
                    heddle_core::text::clip(text, heddle_core::text::ECHO_MAX_CHARS)
                )));
            }
            // The run is over (completed, failed or cancelled): nobody reads further.
            Err(_) => break Ok(()),
        }
    };
    // A bad line must not end the stream normally: downstream would take what came
    // before it for the whole input. The caller cancels the run instead.
    if outcome.is_ok() {
        let _ = handle.finish_input(name).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::interpret;
    use heddle_core::{PortType, Value};

    #[test]
    fn values_are_json_else_text() {
        let any = PortType::Any;
        assert_eq!(interpret("42", &any, false), Value::Int(42));
        assert_eq!(interpret("[1,2]", &any, false).kind(), "list");
        assert_eq!(
            interpret("hello world", &any, false),
            Value::str("hello world")
        );
        assert_eq!(interpret("007", &PortType::Str, false), Value::str("007"));
        assert_eq!(interpret("\"q\"", &PortType::Str, false), Value::str("q"));
        assert_eq!(interpret("text\n", &any, true), Value::str("text"));
        assert_eq!(
            interpret("a\nb\n\n", &PortType::Str, true),
            Value::str("a\nb\n")
        );
    }
}
