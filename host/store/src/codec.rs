//! How a record's body is stored. Results (`completed`, one per journaled invocation) are
//! the log's hot records: they are written in a compact binary form, because encoding
//! them as JSON and storing the text was most of the log writer's cost per invocation.
//! Every other record stays JSON text, readable with any SQLite shell. Either way the
//! body is a byte string under the record's checksum, so a torn or altered body never
//! decodes.
//!
//! The binary form keeps what JSON loses: integers stay distinct from floats, bytes stay
//! bytes, a non-finite float stays itself, and an object that merely looks like the JSON
//! bytes marker stays an object.

use heddle_core::{InvocationMetrics, Map, Occurrence, Record, Value};

/// The first byte of a binary body: the version of the layout below. A body with
/// another first byte was written by a newer heddle (the schema version refuses such a
/// file before it is read; this is the second line of defence).
const LAYOUT: u8 = 1;

/// Nesting the decoder follows before it calls a body corrupt: deeper than any value
/// that crossed a node boundary (those are parsed from JSON, whose parser stops at
/// 128), shallow enough that a corrupt body cannot exhaust the stack.
const MAX_DEPTH: u32 = 512;

/// A stored body: JSON text, or the binary form of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Json,
    Binary,
}

/// Appends `record`'s body to `out` and says which form it took.
pub(crate) fn encode(record: &Record, out: &mut Vec<u8>) -> Result<Form, serde_json::Error> {
    match record {
        Record::Completed {
            occurrence,
            outputs,
            emitted,
            metrics,
        } => {
            out.push(LAYOUT);
            put_occurrence(out, occurrence);
            put_pairs(out, outputs);
            put_pairs(out, emitted);
            put_metrics(out, metrics);
            Ok(Form::Binary)
        }
        _ => {
            serde_json::to_writer(&mut *out, record)?;
            Ok(Form::Json)
        }
    }
}

/// Reads a body back. `kind` is the record kind stored beside it; a binary body is a
/// result's.
pub(crate) fn decode(kind: &str, form: Form, body: &[u8]) -> Result<Record, String> {
    match form {
        Form::Json => serde_json::from_slice(body)
            .map_err(|e| format!("record kind `{kind}` is not one this heddle knows: {e}")),
        Form::Binary if kind == "completed" => decode_completed(body),
        Form::Binary => Err(format!("a binary body for record kind `{kind}`")),
    }
}

fn decode_completed(body: &[u8]) -> Result<Record, String> {
    let mut r = Reader { buf: body, at: 0 };
    let layout = r.byte()?;
    if layout != LAYOUT {
        return Err(format!(
            "result layout {layout} is not one this heddle knows (it writes {LAYOUT})"
        ));
    }
    let occurrence = r.occurrence()?;
    let outputs = r.pairs()?;
    let emitted = r.pairs()?;
    let metrics = r.metrics()?;
    if r.at != body.len() {
        return Err(format!("{} bytes after the result", body.len() - r.at));
    }
    Ok(Record::Completed {
        occurrence,
        outputs,
        emitted,
        metrics,
    })
}

// Value tags.
const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const FLOAT: u8 = 4;
const STR: u8 = 5;
const BYTES: u8 = 6;
const LIST: u8 = 7;
const OBJECT: u8 = 8;

fn put_uvarint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uvarint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_occurrence(out: &mut Vec<u8>, o: &Occurrence) {
    // Destructured so a field added to an occurrence fails to compile here rather than
    // going unrecorded.
    let Occurrence { node, key, n } = o;
    put_str(out, node);
    put_str(out, key);
    put_uvarint(out, u64::from(*n));
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(String, Value)]) {
    put_uvarint(out, pairs.len() as u64);
    for (h, v) in pairs {
        put_str(out, h);
        put_value(out, v);
    }
}

fn put_option(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => out.push(0),
        Some(n) => {
            out.push(1);
            put_uvarint(out, n);
        }
    }
}

fn put_metrics(out: &mut Vec<u8>, m: &InvocationMetrics) {
    // Destructured for the same reason as the occurrence.
    let InvocationMetrics {
        wall_us,
        fuel,
        peak_memory_bytes,
        cost_usd,
        cost_reports,
        assets,
        http_requests,
        http_bytes,
    } = m;
    put_uvarint(out, *wall_us);
    put_option(out, *fuel);
    put_option(out, *peak_memory_bytes);
    out.extend_from_slice(&cost_usd.to_le_bytes());
    put_uvarint(out, u64::from(*cost_reports));
    put_uvarint(out, assets.len() as u64);
    for a in assets {
        put_str(out, a);
    }
    // An optional tail, last in the body: a result without outgoing HTTP (every result
    // written before it existed) ends above, byte for byte as before.
    if *http_requests > 0 || *http_bytes > 0 {
        put_uvarint(out, *http_requests);
        put_uvarint(out, *http_bytes);
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Int(i) => {
            out.push(INT);
            // Zig-zag, so small negative numbers stay short.
            put_uvarint(out, ((i << 1) ^ (i >> 63)) as u64);
        }
        Value::Float(f) => {
            out.push(FLOAT);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Value::Str(s) => {
            out.push(STR);
            put_str(out, s);
        }
        Value::Bytes(b) => {
            out.push(BYTES);
            put_bytes(out, b);
        }
        Value::List(l) => {
            out.push(LIST);
            put_uvarint(out, l.len() as u64);
            for x in l.iter() {
                put_value(out, x);
            }
        }
        Value::Object(m) => {
            out.push(OBJECT);
            put_uvarint(out, m.len() as u64);
            for (k, x) in m.iter() {
                put_str(out, k);
                put_value(out, x);
            }
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or_else(|| format!("the body ends early at byte {}", self.at))?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("a length of {n} at byte {} runs past the body", self.at))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn uvarint(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(format!("an overlong number before byte {}", self.at))
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.uvarint()?;
        // A count can never exceed the bytes left (every element takes at least one).
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.buf.len() - self.at)
            .ok_or_else(|| format!("a count of {n} at byte {} runs past the body", self.at))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let n = self.uvarint()?;
        u32::try_from(n).map_err(|_| format!("{n} is out of range before byte {}", self.at))
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let n = self.len()?;
        let at = self.at;
        std::str::from_utf8(self.take(n)?).map_err(|e| format!("text at byte {at}: {e}"))
    }

    fn f64(&mut self) -> Result<f64, String> {
        let b = self.take(8)?;
        // An invariant: `take(8)` returned 8 bytes.
        Ok(f64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn option(&mut self) -> Result<Option<u64>, String> {
        match self.byte()? {
            0 => Ok(None),
            1 => self.uvarint().map(Some),
            t => Err(format!("option tag {t} before byte {}", self.at)),
        }
    }

    fn occurrence(&mut self) -> Result<Occurrence, String> {
        let node = self.str()?;
        let key = self.str()?;
        let n = self.u32()?;
        Ok(Occurrence::new(node, key, n))
    }

    fn pairs(&mut self) -> Result<Vec<(String, Value)>, String> {
        let n = self.len()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let h = self.str()?.to_string();
            out.push((h, self.value(0)?));
        }
        Ok(out)
    }

    fn metrics(&mut self) -> Result<InvocationMetrics, String> {
        let wall_us = self.uvarint()?;
        let fuel = self.option()?;
        let peak_memory_bytes = self.option()?;
        let cost_usd = self.f64()?;
        let cost_reports = self.u32()?;
        let n = self.len()?;
        let mut assets = Vec::with_capacity(n);
        for _ in 0..n {
            assets.push(self.str()?.to_string());
        }
        let (http_requests, http_bytes) = if self.at < self.buf.len() {
            (self.uvarint()?, self.uvarint()?)
        } else {
            (0, 0)
        };
        Ok(InvocationMetrics {
            wall_us,
            fuel,
            peak_memory_bytes,
            cost_usd,
            cost_reports,
            assets,
            http_requests,
            http_bytes,
        })
    }

    fn value(&mut self, depth: u32) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("values nested deeper than {MAX_DEPTH}"));
        }
        let at = self.at;
        Ok(match self.byte()? {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            INT => {
                let z = self.uvarint()?;
                Value::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
            }
            FLOAT => Value::Float(self.f64()?),
            STR => Value::str(self.str()?),
            BYTES => {
                let n = self.len()?;
                Value::Bytes(self.take(n)?.into())
            }
            LIST => {
                let n = self.len()?;
                let mut l = Vec::with_capacity(n);
                for _ in 0..n {
                    l.push(self.value(depth + 1)?);
                }
                Value::list(l)
            }
            OBJECT => {
                let n = self.len()?;
                let mut m = Map::new();
                for _ in 0..n {
                    let k = self.str()?.to_string();
                    m.insert(k, self.value(depth + 1)?);
                }
                Value::object(m)
            }
            t => return Err(format!("value tag {t} at byte {at}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(outputs: Vec<(String, Value)>) -> Record {
        Record::Completed {
            occurrence: Occurrence::new("w3", "each:item=17", 2),
            outputs,
            emitted: vec![("item".into(), Value::str("x"))],
            metrics: InvocationMetrics {
                wall_us: 123,
                fuel: Some(u64::MAX),
                peak_memory_bytes: None,
                cost_usd: 0.25,
                cost_reports: 1,
                assets: vec!["file:/data/a".into()],
                ..Default::default()
            },
        }
    }

    fn round_trip(r: &Record) -> Record {
        let mut buf = Vec::new();
        let form = encode(r, &mut buf).unwrap();
        decode(r.kind(), form, &buf).unwrap()
    }

    #[test]
    fn results_keep_what_json_would_lose() {
        let mut obj = Map::new();
        // Looks like JSON's bytes marker; must stay an object.
        obj.insert("$bytes".into(), Value::str("AAE="));
        let r = completed(vec![
            ("i".into(), Value::Int(i64::MIN)),
            ("j".into(), Value::Int(-1)),
            ("k".into(), Value::Int(i64::MAX)),
            ("f".into(), Value::Float(1.0)),
            ("inf".into(), Value::Float(f64::INFINITY)),
            ("b".into(), Value::Bytes(vec![0u8, 255].into())),
            ("o".into(), Value::object(obj)),
            (
                "l".into(),
                Value::list(vec![Value::Null, Value::Bool(true), Value::str("é")]),
            ),
        ]);
        assert_eq!(round_trip(&r), r);
    }

    /// The HTTP figures are an optional tail: a result without them is byte for byte
    /// what was written before they existed, and one with them reads back whole.
    #[test]
    fn http_figures_are_an_optional_tail() {
        let plain = completed(vec![("x".into(), Value::Int(1))]);
        let mut before = Vec::new();
        encode(&plain, &mut before).unwrap();
        assert_eq!(round_trip(&plain), plain);
        let Record::Completed {
            occurrence,
            outputs,
            emitted,
            mut metrics,
        } = plain
        else {
            unreachable!()
        };
        metrics.http_requests = 2;
        metrics.http_bytes = 1 << 40;
        let with = Record::Completed {
            occurrence,
            outputs,
            emitted,
            metrics,
        };
        let mut after = Vec::new();
        encode(&with, &mut after).unwrap();
        assert!(after.starts_with(&before) && after.len() > before.len());
        assert_eq!(round_trip(&with), with);
    }

    #[test]
    fn other_records_stay_json() {
        let r = Record::Dispatched {
            occurrence: Occurrence::new("a", "", 0),
            retry_safe: false,
        };
        let mut buf = Vec::new();
        assert_eq!(encode(&r, &mut buf).unwrap(), Form::Json);
        assert!(std::str::from_utf8(&buf).unwrap().contains("dispatched"));
        assert_eq!(round_trip(&r), r);
    }

    #[test]
    fn every_cut_or_overlong_body_is_refused_not_misread() {
        let r = completed(vec![("v".into(), Value::list(vec![Value::Int(300); 3]))]);
        let mut buf = Vec::new();
        encode(&r, &mut buf).unwrap();
        for cut in 0..buf.len() {
            assert!(
                decode("completed", Form::Binary, &buf[..cut]).is_err(),
                "{cut}"
            );
        }
        let mut longer = buf.clone();
        longer.push(0);
        assert!(decode("completed", Form::Binary, &longer).is_err());
        let mut newer = buf.clone();
        newer[0] = LAYOUT + 1;
        let e = decode("completed", Form::Binary, &newer).unwrap_err();
        assert!(e.contains("layout 2"), "{e}");
        assert!(decode("started", Form::Binary, &buf).is_err());
    }

    #[test]
    fn a_corrupt_nesting_is_refused_without_exhausting_the_stack() {
        let mut buf = vec![LAYOUT];
        put_occurrence(&mut buf, &Occurrence::new("a", "", 0));
        put_uvarint(&mut buf, 1);
        put_str(&mut buf, "v");
        buf.extend(std::iter::repeat_n([LIST, 1], 100_000).flatten());
        let e = decode("completed", Form::Binary, &buf).unwrap_err();
        assert!(e.contains("nested deeper"), "{e}");
    }
}
