//! Known secret values never reach the durable store. One rule for node values, one for
//! text:
//!
//! - **A node value** (an output or an emitted value, inline or spilled to an artifact)
//!   that holds a known secret is refused: its node fails with `KNOWN_SECRET` and nothing
//!   of the value is written. Recovery and resume feed recorded values downstream as
//!   they are, so a masked copy would silently run the rest of the graph on
//!   `«redacted»`; a run passes secrets by name (grants), never along an edge.
//! - **Text** a record carries (an error message, an escalation, a verdict's note, a
//!   pause or ending reason) is masked as the event feed masks it: it describes what
//!   happened and is never fed to a node, so `«redacted»` in it loses nothing.
//!
//! Both look at the values structurally (strings, object keys, bytes), not at their
//! JSON text, where a secret holding a quote or a backslash would be escaped.

use heddle_core::supervise::Redactor;
use heddle_core::{PauseReason, Record, RecordedVerdict, Value};

/// The masking of `secrets` (empty ones are ignored), or `None` when there is nothing
/// to mask. What the run log and the store's other writes mask records with.
pub fn redactor(secrets: &[String]) -> Option<Redactor> {
    secrets.iter().any(|s| !s.is_empty()).then(|| {
        Redactor::new(
            secrets.to_vec(),
            heddle_core::supervise::RedactLimits::default(),
        )
    })
}

/// Whether `v` holds one of `secrets` (empty ones are ignored) anywhere in it.
pub fn holds(v: &Value, secrets: &[String]) -> bool {
    let has = |hay: &[u8]| {
        secrets
            .iter()
            .any(|s| !s.is_empty() && hay.windows(s.len()).any(|w| w == s.as_bytes()))
    };
    match v {
        Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) => false,
        Value::Str(s) => has(s.as_bytes()),
        Value::Bytes(b) => has(b),
        Value::List(items) => items.iter().any(|x| holds(x, secrets)),
        Value::Object(m) => m
            .iter()
            .any(|(k, x)| has(k.as_bytes()) || holds(x, secrets)),
    }
}

/// Masks every string and object key of `v`, in place.
pub fn mask_json(r: &Redactor, v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => {
            let m = r.mask(s);
            if m != *s {
                *s = m;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|i| mask_json(r, i)),
        serde_json::Value::Object(map) => {
            if map.keys().any(|k| r.mask(k) != *k) {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    mask_json(r, &mut v);
                    map.insert(r.mask(&k), v);
                }
            } else {
                map.values_mut().for_each(|v| mask_json(r, v));
            }
        }
        _ => {}
    }
}

/// `v` with every string and key masked (bytes holding a secret become a note of their
/// size: there is no partial masking of arbitrary bytes).
fn mask_value(r: &Redactor, v: &Value) -> Value {
    match v {
        Value::Str(s) => Value::str(r.mask(s)),
        Value::Bytes(b) if r.mask(&String::from_utf8_lossy(b)) != String::from_utf8_lossy(b) => {
            Value::str(format!("«{} bytes, redacted»", b.len()))
        }
        Value::List(items) => Value::list(items.iter().map(|x| mask_value(r, x)).collect()),
        Value::Object(m) => Value::object(
            m.iter()
                .map(|(k, x)| (r.mask(k), mask_value(r, x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `record` with its text masked. A result's values are masked too, as the last line
/// of defence: the journal refuses a value holding a secret before it gets here
/// ([`crate::spill::spill`]), so a masked value is never what recovery replays.
pub fn mask_record(r: &Redactor, record: Record) -> Record {
    let text = |s: String| {
        let m = r.mask(&s);
        if m == s { s } else { m }
    };
    match record {
        Record::Completed {
            occurrence,
            outputs,
            emitted,
            metrics,
        } => {
            let values = |vs: Vec<(String, Value)>| {
                vs.into_iter()
                    .map(|(h, v)| (h, mask_value(r, &v)))
                    .collect()
            };
            Record::Completed {
                occurrence,
                outputs: values(outputs),
                emitted: values(emitted),
                metrics,
            }
        }
        Record::Failed {
            occurrence,
            error,
            metrics,
        } => Record::Failed {
            occurrence,
            error: text(error),
            metrics,
        },
        Record::Escalated {
            occurrence,
            mut escalation,
        } => {
            mask_json(r, &mut escalation);
            Record::Escalated {
                occurrence,
                escalation,
            }
        }
        Record::Verdict {
            occurrence,
            verdict,
            decided_by,
        } => Record::Verdict {
            occurrence,
            verdict: RecordedVerdict {
                error: verdict.error.map(text),
                note: verdict.note.map(text),
                ..verdict
            },
            decided_by,
        },
        Record::Reconciled {
            occurrence,
            answer,
            by,
            note,
        } => Record::Reconciled {
            occurrence,
            answer,
            by: text(by),
            note: text(note),
        },
        Record::Paused {
            pause: PauseReason::Suspend { node, reason },
        } => Record::Paused {
            pause: PauseReason::Suspend {
                node,
                reason: text(reason),
            },
        },
        Record::Paused {
            pause: PauseReason::Budget { detail },
        } => Record::Paused {
            pause: PauseReason::Budget {
                detail: text(detail),
            },
        },
        Record::Finished { status, error } => Record::Finished {
            status,
            error: error.map(text),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::supervise::RedactLimits;
    use heddle_core::{Decider, InvocationMetrics, Occurrence, RecordedAction, RunStatus};

    #[test]
    fn values_are_checked_and_text_masked_structurally() {
        let secrets = vec!["s3cr\"et".to_string(), String::new()];
        let mut m = heddle_core::Map::new();
        m.insert(
            "plain".into(),
            Value::list(vec![Value::str("a s3cr\"et b")]),
        );
        assert!(holds(&Value::object(m), &secrets));
        assert!(holds(
            &Value::Bytes(b"xs3cr\"etx".to_vec().into()),
            &secrets
        ));
        assert!(
            !holds(&Value::str("s3cr\\\"et"), &secrets),
            "JSON text is not the value"
        );
        assert!(!holds(&Value::str("anything"), &[String::new()]));

        let r = Redactor::new(secrets, RedactLimits::default());
        let occurrence = Occurrence::new("n", "", 0);
        let failed = mask_record(
            &r,
            Record::Failed {
                occurrence: occurrence.clone(),
                error: "upstream said s3cr\"et".into(),
                metrics: InvocationMetrics::default(),
            },
        );
        assert!(
            matches!(&failed, Record::Failed { error, .. } if error == "upstream said «redacted»")
        );
        let verdict = mask_record(
            &r,
            Record::Verdict {
                occurrence,
                verdict: RecordedVerdict::new(RecordedAction::Skip)
                    .with_error("upstream said s3cr\"et")
                    .with_note(Some("key s3cr\"et".into())),
                decided_by: Decider::Supervisor,
            },
        );
        let text = serde_json::to_string(&verdict).unwrap();
        assert!(!text.contains("s3cr"), "{text}");
        let ended = mask_record(
            &r,
            Record::Finished {
                status: RunStatus::Failed,
                error: Some("s3cr\"et".into()),
            },
        );
        assert!(!serde_json::to_string(&ended).unwrap().contains("s3cr"));
    }
}
