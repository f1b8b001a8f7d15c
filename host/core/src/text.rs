//! Bounding user text echoed back in messages.
//!
//! Node ids, handles, input lines and file names come from the user and can be any size;
//! an error that quotes a 10 MB node id whole is a 10 MB error. Every message that
//! quotes user text quotes it through [`clip`].

use std::borrow::Cow;

/// Characters of one piece of user text an error quotes, by default.
pub const ECHO_MAX_CHARS: usize = 120;

/// Characters of a whole message shown to a person (it may quote several ids).
pub const MESSAGE_MAX_CHARS: usize = 1000;

/// `text` unchanged when it has at most `max` characters; otherwise its first `max`
/// characters followed by a marker saying how much was left out.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}…(+{} bytes)", &text[..cut], text.len() - cut)),
    }
}

/// Longest line of an error shown to a person. Errors quote what the user wrote (node
/// ids, handles, values); a 10 MB id must not make a 10 MB error, whichever library
/// wrote it.
pub const ERROR_LINE_MAX_CHARS: usize = 2000;

/// `text` with every line clipped to [`ERROR_LINE_MAX_CHARS`].
pub fn bounded(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(1 << 16));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&clip(line, ERROR_LINE_MAX_CHARS));
    }
    out
}

/// An error and its causes on one line, joined by `: ` (as `anyhow` shows them with
/// `{:#}`): what a person reads of an error that crossed a process or an API.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_on_char_boundaries_and_says_how_much() {
        assert_eq!(clip("short", 10), "short");
        assert!(matches!(clip("short", 5), Cow::Borrowed(_)));
        assert_eq!(clip("abcdef", 3), "abc…(+3 bytes)");
        // Multi-byte characters are never split.
        assert_eq!(clip("ééé", 2), "éé…(+2 bytes)");
        let huge = "x".repeat(10 << 20);
        assert!(clip(&huge, ECHO_MAX_CHARS).len() < 200);
    }

    #[test]
    fn a_planning_issue_about_a_huge_id_stays_small() {
        let id = "n".repeat(10 << 20);
        let issue = crate::plan::Issue {
            kind: crate::plan::IssueKind::UnknownNodeType,
            node: Some(id.clone()),
            edge: Some(id.clone()),
            handle: Some(id.clone()),
            message: format!("unknown node type `{id}`"),
        };
        let shown = issue.to_string();
        assert!(shown.len() < 2000, "{} bytes", shown.len());
        assert!(shown.starts_with("node nnn"), "{}", &shown[..40]);
    }
}
