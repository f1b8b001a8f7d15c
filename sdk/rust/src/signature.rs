//! The shape of a failure signature, checked where the author writes one.
//!
//! The host's supervisor only recognises `family:code` signatures (the grammar lives in
//! `heddle-core`'s `supervise::signatures`, and `sdk/README.md` documents it) and ignores
//! any other; checking here turns that into an error the author sees at once, naming the
//! signature and why.

const FAMILY_MAX: usize = 24;
const CODE_MAX: usize = 64;

/// `Err` explains why `sig` is not a signature the host accepts: `family:code`, the
/// family a lowercase letter then at most 23 of `a-z 0-9 _ -`, the code 1 to 64 of
/// `A-Z a-z 0-9 _ . - / * [ ] $ :` with a `:` only between two parts (`code:exit:1`),
/// and neither `limit` nor `trap` (the host's own).
pub fn check(sig: &str) -> Result<(), String> {
    let why = match sig.split_once(':') {
        None => "no ':' between family and code",
        Some((family, code)) => {
            let mut f = family.chars();
            if !f.next().is_some_and(|c| c.is_ascii_lowercase())
                || family.len() > FAMILY_MAX
                || !f.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
            {
                "the family before ':' must be a lowercase letter then at most 23 of a-z 0-9 _ -"
            } else if code.is_empty()
                || code.len() > CODE_MAX
                || !code.split(':').all(|part| {
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_.-/*[]$".contains(c))
                })
            {
                "the code after ':' must be 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $, with ':' only between two parts"
            } else if family == "limit" || family == "trap" {
                "the families `limit` and `trap` are reserved for failures the host detects"
            } else {
                return Ok(());
            }
        }
    };
    Err(format!(
        "invalid failure signature {sig:?}: {why} (write family:code, e.g. \"json:parse\")"
    ))
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn accepts_what_the_host_recognises() {
        for ok in [
            "json:parse",
            "a:b",
            "my-nodes_2:Empty.Text",
            "validation:/items/*/name",
            "http:5*",
            "abcdefghijklmnopqrstuvwx:$[0]",
            "code:exit:1",
            "wasm:trap:unreachable",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        assert_eq!(check(&format!("f:{}", "c".repeat(64))), Ok(()));
    }

    #[test]
    fn rejects_what_the_host_would_ignore_saying_why() {
        for (bad, why) in [
            ("mypython.wordfreq:empty-text", "family"),
            ("Json:parse", "family"),
            ("1json:parse", "family"),
            (":parse", "family"),
            ("abcdefghijklmnopqrstuvwxy:x", "family"),
            ("emit", "no ':'"),
            ("json:", "code"),
            ("json:bad code", "code"),
            ("json::b", "code"),
            ("json:a:", "code"),
            (" json:parse", "family"),
            ("limit:fuel", "reserved"),
            ("trap:unreachable", "reserved"),
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "names the signature: {e}");
        }
        assert!(check(&format!("f:{}", "c".repeat(65))).is_err());
    }

    #[test]
    fn a_malformed_signature_is_refused_at_the_call_naming_it_and_where() {
        let line = line!() + 1;
        let e = crate::Error::new("text is empty").signature("mypython.wordfreq:empty-text");
        assert_eq!(e.signature, None);
        assert!(
            e.message.starts_with("invalid failure signature \"mypython.wordfreq:empty-text\""),
            "{}",
            e.message
        );
        assert!(e.message.contains(&format!("signature.rs:{line}")), "{}", e.message);
        assert!(e.message.ends_with("the error was: text is empty"), "{}", e.message);

        let ok = crate::Error::new("text is empty").signature("wordfreq:empty-text");
        assert_eq!(ok.signature.as_deref(), Some("wordfreq:empty-text"));
        assert_eq!(ok.message, "text is empty");
    }
}
