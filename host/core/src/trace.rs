//! A run's place in a distributed trace (W3C Trace Context): the ids its spans carry,
//! what a durable run records of them so that every process that drives it continues
//! the same trace, and the ids the kernel gives each invocation attempt, so a code node
//! can be handed its own `TRACEPARENT` before it starts and the span built when it ends
//! carries the same id.
//!
//! Only ids live here (no exporter, no clock): the kernel mints them, the store records
//! them, and `heddle-runtime`'s telemetry turns a run's events into spans around them.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A trace's id: 16 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// Why a `traceparent` was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid traceparent {text:?}: {problem}")]
pub struct TraceParentError {
    /// The text, clipped.
    pub text: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

fn hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for b in bytes {
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

/// `text` as `N` bytes of lowercase hex (W3C takes no uppercase), not all zero.
fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let t = text.as_bytes();
    if t.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(t[2 * i])? << 4 | digit(t[2 * i + 1])?;
    }
    (out != [0u8; N]).then_some(out)
}

macro_rules! hex_id {
    ($t:ident, $n:literal, $what:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                hex(&self.0, f)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                hex(&self.0, f)
            }
        }

        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                unhex::<$n>(s).map($t).ok_or_else(|| {
                    format!(
                        concat!("a ", $what, " is {} lowercase hex digits, not all zero"),
                        2 * $n
                    )
                })
            }
        }

        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

hex_id!(TraceId, 16, "trace id");
hex_id!(SpanId, 8, "span id");

impl SpanId {
    /// The id as one number (for a cheap comparison or map key).
    pub fn to_u64(self) -> u64 {
        u64::from_be_bytes(self.0)
    }
}

/// A W3C `traceparent`: the caller's span, under which a run's span goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace it belongs to.
    pub trace_id: TraceId,
    /// The caller's span.
    pub span_id: SpanId,
    /// The caller's sampling decision (flag 01): a run under an unsampled parent sends
    /// no spans, as every other service in that trace does.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` header value as W3C Trace Context level 1 reads it:
    /// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, ids not all zero; a later version
    /// (not `ff`) is read by its first four fields.
    pub fn parse(text: &str) -> Result<TraceParent, TraceParentError> {
        let bad = |problem| TraceParentError {
            text: crate::text::clip(text, 80).into_owned(),
            problem,
        };
        let t = text.trim();
        let mut parts = t.splitn(5, '-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("expected version-traceid-spanid-flags"));
        };
        let rest = parts.next();
        let version = unhex::<1>(version)
            .map(|v| v[0])
            .or((version == "00").then_some(0))
            .ok_or_else(|| bad("the version is not two hex digits"))?;
        if version == 0xff {
            return Err(bad("version ff is invalid"));
        }
        if version == 0 && rest.is_some() {
            return Err(bad("version 00 has exactly four fields"));
        }
        let trace_id = unhex::<16>(trace)
            .map(TraceId)
            .ok_or_else(|| bad("the trace id is not 32 lowercase hex digits, not all zero"))?;
        let span_id = unhex::<8>(span)
            .map(SpanId)
            .ok_or_else(|| bad("the parent id is not 16 lowercase hex digits, not all zero"))?;
        let flags = match unhex::<1>(flags) {
            Some([f]) => f,
            None if flags == "00" => 0,
            None => return Err(bad("the flags are not two hex digits")),
        };
        Ok(TraceParent {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = if self.sampled { "01" } else { "00" };
        write!(f, "00-{}-{}-{flags}", self.trace_id, self.span_id)
    }
}

/// What a durable run records of its trace (with the `opened` record that first carries
/// one): every process that drives the run later continues it, so a resumed or adopted
/// run is one trace under one run span, never a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTrace {
    /// The trace.
    pub trace_id: TraceId,
    /// The caller's span the run's span is a child of (a `traceparent` it was started
    /// with); none for a run that started its own trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<SpanId>,
    /// The run's own span (`heddle.run`), the parent of every invocation's span.
    pub span: SpanId,
    /// Whether its spans are sent (the caller's sampling decision).
    #[serde(default = "sampled")]
    pub sampled: bool,
}

fn sampled() -> bool {
    true
}

impl RunTrace {
    /// The `traceparent` of the run's own span.
    pub fn traceparent(&self) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            span_id: self.span,
            sampled: self.sampled,
        }
    }
}

/// A run traced in this process: its recorded trace, and the span ids this process
/// gives its invocation attempts. An id is minted when an attempt starts (a code node
/// is handed it as `TRACEPARENT`) and carried by the attempt's `invocation` event.
#[derive(Debug)]
pub struct Traced {
    /// The run's trace.
    pub run: RunTrace,
    salt: u64,
    next: AtomicU64,
}

impl Traced {
    /// `run`'s trace, minting span ids from `salt` (random per process: two processes
    /// driving one run never mint the same id).
    pub fn new(run: RunTrace, salt: u64) -> Traced {
        Traced {
            run,
            salt,
            next: AtomicU64::new(0),
        }
    }

    /// A span id no other attempt of this run in this process has: splitmix64 of a
    /// counter stepped by an odd constant, a bijection, so ids repeat only after 2^64.
    pub fn mint(&self) -> SpanId {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let mut z = self
                .salt
                .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return SpanId(z.to_be_bytes());
            }
        }
    }

    /// The `traceparent` an attempt with span `span` hands its code.
    pub fn traceparent(&self, span: SpanId) -> TraceParent {
        TraceParent {
            trace_id: self.run.trace_id,
            span_id: span,
            sampled: self.run.sampled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_and_bad_ones_say_why() {
        let p = TraceParent::parse(GOOD).unwrap();
        assert!(p.sampled);
        assert_eq!(p.to_string(), GOOD);
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
        // A later version is read by its first four fields.
        let later = TraceParent::parse(&format!("cc{}-what-comes-next", &GOOD[2..])).unwrap();
        assert_eq!(later.trace_id, p.trace_id);
        for (text, problem) in [
            ("", "expected"),
            ("00-abc", "expected"),
            (&GOOD.replace("4bf9", "4BF9"), "trace id"),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent id",
            ),
            (&GOOD.replace("00-", "ff-"), "version ff"),
            (&format!("{GOOD}-extra"), "exactly four"),
            (&GOOD.replace("-01", "-zz"), "flags"),
        ] {
            let e = TraceParent::parse(text).unwrap_err();
            assert!(e.to_string().contains(problem), "{text}: {e}");
        }
    }

    #[test]
    fn minted_ids_are_distinct_and_a_run_trace_reads_back() {
        let run = RunTrace {
            trace_id: TraceParent::parse(GOOD).unwrap().trace_id,
            parent: None,
            span: SpanId([1; 8]),
            sampled: true,
        };
        let t = Traced::new(run, 42);
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| t.mint()).collect();
        assert_eq!(ids.len(), 10_000);
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(
            json,
            r#"{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span":"0101010101010101","sampled":true}"#
        );
        assert_eq!(serde_json::from_str::<RunTrace>(&json).unwrap(), run);
    }
}
