//! Failure signatures: stable categorical codes for failures (`http:429`, `limit:fuel`,
//! `code:exit:1`), so a sticky verdict applies to later failures of the same kind and a
//! policy rule can name them.
//!
//! One grammar for every signature, whoever makes it (the host, a code node, a guest);
//! node authors read it in `sdk/README.md` ("Failure signatures"), and each SDK checks
//! the same rule where an author writes one:
//!
//! ```text
//! family:code      json:parse  http:429  code:exit:1  wasm:trap:unreachable  validation:/items/*/id
//! family           a lowercase letter, then at most 23 of  a-z 0-9 _ -
//! code             1 to 64 of  A-Z a-z 0-9 _ . - / * [ ] $ :  (a ':' only between two parts)
//! ```
//!
//! A signature comes from structure, never from text: the failure's kind names what the
//! host detected (`limit:*` and `trap:*`, families no node may claim, and `input:type`),
//! otherwise the signature the failing executor set on its error (a guest's declared one, a code
//! node's `code:exit:N`). Message text is never read: it carries the node's own output
//! (an echoed item, a traceback), so a status code found in it would name the data, not
//! the failure, and a plain error simply has no signature (stickiness is off for it).

use std::sync::LazyLock;

use regex::Regex;

use super::escalation::FailureKind;

/// Longest family of a signature (the part before `:`). A signature names a category that
/// policy rules and sticky verdicts match on, not a message, so [`check`] refuses longer.
pub const FAMILY_MAX: usize = 24;
/// Longest code of a signature (the part after `:`), for the same reason.
pub const CODE_MAX: usize = 64;

/// Families only the host names, from a failure's kind: a node cannot declare one (a
/// guest claiming `limit:fuel` would borrow a policy rule meant for the host's own limit).
/// `input:type` is not among them: an SDK's typed getter reports the same failure, a value
/// that does not fit its input, under the same name.
pub const HOST_FAMILIES: &[&str] = &["limit", "trap"];

/// The signature of a value that did not fit the declared type of the input it arrived on.
pub const INPUT_TYPE: &str = "input:type";

fn family_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

fn code_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-/*[]$".contains(c)
}

/// `Err` says why `sig` is not a signature (the grammar above), naming it.
pub fn check(sig: &str) -> Result<(), String> {
    let why = match sig.split_once(':') {
        None => "no ':' between family and code",
        Some((family, code)) => {
            let mut f = family.chars();
            if !f.next().is_some_and(|c| c.is_ascii_lowercase())
                || family.len() > FAMILY_MAX
                || !f.all(family_char)
            {
                "the family before ':' must be a lowercase letter then at most 23 of a-z 0-9 _ -"
            } else if code.is_empty()
                || code.len() > CODE_MAX
                || !code
                    .split(':')
                    .all(|part| !part.is_empty() && part.chars().all(code_char))
            {
                "the code after ':' must be 1 to 64 of A-Z a-z 0-9 _ . - / * [ ] $, with ':' only between two parts"
            } else {
                return Ok(());
            }
        }
    };
    Err(format!(
        "invalid failure signature {sig:?}: {why} (write family:code, e.g. \"json:parse\")"
    ))
}

/// [`check`], and not one of the [`HOST_FAMILIES`]: what a node may declare.
pub fn check_declared(sig: &str) -> Result<(), String> {
    check(sig)?;
    let family = sig.split_once(':').map_or(sig, |(f, _)| f);
    if HOST_FAMILIES.contains(&family) {
        return Err(format!(
            "invalid failure signature {sig:?}: the families `limit` and `trap` are reserved for failures the host detects"
        ));
    }
    Ok(())
}

/// The signature of a failure: from its kind when the host detected it (the kind is
/// authoritative), else the one its executor declared, when that is a signature a node
/// may declare. Validation paths are normalized so every item failing at the same place
/// shares one: `validation:$.rows[7].id` is `validation:$.rows[*].id`.
pub fn signature(kind: &FailureKind, declared: Option<&str>) -> Option<String> {
    if let Some(host) = host_signature(kind) {
        return host;
    }
    let d = declared?.trim();
    check_declared(d).ok()?;
    if let Some(path) = d.strip_prefix("validation:") {
        return Some(format!("validation:{}", normalize_path(path)));
    }
    Some(d.to_string())
}

/// `Some(signature)` for a kind the host detected (`Some(None)` for a trap whose name
/// makes no signature); `None` for a node's own failure and a host fault, which take the
/// declared one.
fn host_signature(kind: &FailureKind) -> Option<Option<String>> {
    Some(match kind {
        FailureKind::FuelExhausted => Some("limit:fuel".into()),
        FailureKind::Deadline => Some("limit:deadline".into()),
        FailureKind::MemoryLimit => Some("limit:memory".into()),
        FailureKind::OutputTooLarge => Some("limit:output-size".into()),
        FailureKind::Trap { trap } => slug(trap).map(|s| format!("trap:{s}")),
        FailureKind::Input => Some(INPUT_TYPE.into()),
        FailureKind::Node | FailureKind::Host => return None,
    })
}

fn normalize_path(p: &str) -> String {
    static IDX: LazyLock<Regex> =
        // A literal pattern; compiling it cannot fail.
        LazyLock::new(|| Regex::new(r"(^|/|\[|\.)\d+").expect("static regex"));
    IDX.replace_all(p, "${1}*").into_owned()
}

fn slug(s: &str) -> Option<String> {
    let out: String = s
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let out = out.trim_matches('-').to_string();
    (!out.is_empty() && out.len() <= 48).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_admits_every_shape_heddle_produces() {
        for ok in [
            "json:parse",
            "a:b",
            "my-nodes_2:Empty.Text",
            "validation:/items/*/name",
            "http:5*",
            "abcdefghijklmnopqrstuvwx:$[0]",
            "code:exit:1",
            "code:exit:-1",
            "code:signal:9",
            "wasm:trap:unreachable",
            "output:contract",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        assert_eq!(check(&format!("f:{}", "c".repeat(64))), Ok(()));
        for (bad, why) in [
            ("mypython.wordfreq:empty-text", "family"),
            ("Json:parse", "family"),
            (":parse", "family"),
            ("abcdefghijklmnopqrstuvwxy:x", "family"),
            ("emit", "no ':'"),
            ("output_contract", "no ':'"),
            ("json:", "code"),
            ("json:bad code", "code"),
            ("json::b", "code"),
            ("json:a:", "code"),
            (" json:parse", "family"),
        ] {
            let e = check(bad).expect_err(bad);
            assert!(
                e.contains(why) && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
        assert!(check(&format!("f:{}", "c".repeat(65))).is_err());
    }

    #[test]
    fn every_kind_the_host_detects_names_a_signature_of_the_grammar() {
        let kinds = [
            FailureKind::FuelExhausted,
            FailureKind::Deadline,
            FailureKind::MemoryLimit,
            FailureKind::OutputTooLarge,
            FailureKind::Input,
            FailureKind::Trap {
                trap: "unreachable".into(),
            },
            FailureKind::Trap {
                trap: "Memory Out Of Bounds".into(),
            },
        ];
        for k in kinds {
            let sig = signature(&k, Some("json:parse")).expect("a host kind is named");
            assert_eq!(check(&sig), Ok(()), "{k:?}: {sig}");
            let family = sig.split(':').next().unwrap();
            assert!(
                HOST_FAMILIES.contains(&family) || sig == INPUT_TYPE,
                "{sig}"
            );
        }
        assert_eq!(
            signature(&FailureKind::Input, None).as_deref(),
            Some(INPUT_TYPE)
        );
        assert_eq!(
            signature(
                &FailureKind::Trap {
                    trap: "Memory Out Of Bounds".into()
                },
                None
            )
            .as_deref(),
            Some("trap:memory-out-of-bounds")
        );
    }

    #[test]
    fn a_declared_signature_is_taken_as_declared_and_host_families_are_refused() {
        let sig = |kind, d| signature(&kind, Some(d));
        assert_eq!(
            sig(FailureKind::Node, "code:exit:3").as_deref(),
            Some("code:exit:3")
        );
        assert_eq!(
            sig(FailureKind::Host, "code:no-engine").as_deref(),
            Some("code:no-engine")
        );
        assert_eq!(
            sig(FailureKind::Node, "validation:$.rows[7].id").as_deref(),
            Some("validation:$.rows[*].id")
        );
        for forged in ["limit:fuel", "trap:unreachable", "user 12 not found"] {
            assert_eq!(sig(FailureKind::Node, forged), None, "{forged}");
            assert!(check_declared(forged).is_err(), "{forged}");
        }
        // A plain error has none: no text is ever read.
        assert_eq!(signature(&FailureKind::Node, None), None);
    }
}
