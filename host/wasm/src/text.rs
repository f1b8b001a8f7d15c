//! Text a package supplies (titles, descriptions, capability reasons, error messages, log
//! lines) ends up on an operator's terminal and in reports. A package is untrusted, so its
//! text is escaped and bounded once, where it enters the host: a newline cannot forge a
//! line of `package add` output, an escape sequence cannot drive the terminal, and a
//! megabyte reason cannot push the real lines off the screen.

/// Longest title, capability target or port name shown.
pub(crate) const SHORT: usize = 256;
/// Longest capability reason or port description.
pub(crate) const REASON: usize = 512;
/// Longest node description.
pub(crate) const DESCRIPTION: usize = 4096;
/// Longest error message a guest may report (the host's own context comes on top).
pub(crate) const MESSAGE: usize = 8 << 10;

/// Characters that reorder or hide text without being ASCII controls (bidirectional
/// overrides and isolates, zero-width marks): they can make a line read differently
/// from what it says.
pub(crate) fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

fn escape_into(out: &mut String, c: char) {
    if c.is_control() {
        out.extend(c.escape_debug());
    } else if is_invisible_format(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

/// One line: every control character (newlines included) made visible as an escape,
/// cut to `max` bytes with a marker saying how much was dropped.
pub(crate) fn line(s: &str, max: usize) -> String {
    escape(s, max, false)
}

/// Like [`line`] but keeping newlines (multi-line descriptions printed indented).
pub(crate) fn block(s: &str, max: usize) -> String {
    escape(s, max, true)
}

fn escape(s: &str, max: usize, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 32);
    for (i, c) in s.char_indices() {
        if out.len() >= max {
            out.push_str(&format!(" …[{} bytes truncated]", s.len() - i));
            return out;
        }
        if keep_newlines && c == '\n' {
            out.push('\n');
        } else {
            escape_into(&mut out, c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_visible_and_length_is_bounded() {
        let s = line("ok\n  granted x\x1b[2J\u{202e}", 100);
        assert_eq!(s, "ok\\n  granted x\\u{1b}[2J\\u{202e}");
        assert_eq!(block("a\nb\r", 100), "a\nb\\r");
        let long = line(&"é".repeat(1000), 10);
        assert!(long.starts_with("ééééé …"), "{long}");
        assert!(long.contains("truncated"), "{long}");
        assert!(long.len() < 60, "{long}");
        assert_eq!(line("plain text", 100), "plain text");
    }
}
