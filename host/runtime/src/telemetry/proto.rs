//! OTLP's trace messages (`opentelemetry/proto/trace/v1`, `…/collector/trace/v1`)
//! written as protobuf straight from borrowed parts: a node span's attribute keys are
//! `&'static str`, its values the run's own texts, and nothing is built in between.
//!
//! Why by hand: the SDK's path (a `SpanData` of owned `KeyValue`s, converted by
//! `opentelemetry-otlp` into `opentelemetry-proto` structs, grouped by resource and
//! scope in a map, then encoded by `prost`) made every attribute key and value a new
//! `String` twice over, some twenty allocations per span: most of what a traced run
//! paid per invocation beyond the plain one. Here a span costs its bytes in a buffer
//! that is reused; the exporter sends the spans' bytes as they are, behind a resource
//! and scope written once per process.
//!
//! Only what Heddle sends is written (strings, integers, doubles and booleans as
//! attribute values; no links, no trace state). Field numbers are the OTLP v1 ones;
//! `opentelemetry-proto` decodes the result in the tests, as a collector does.

// The wire format's primitives are prost's (what its generated code calls); only the
// messages' layout is written here.
use prost::encoding::WireType::{
    self, LengthDelimited as LEN, SixtyFourBit as I64, ThirtyTwoBit as I32, Varint as VARINT,
};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint};

/// `Span.kind`: `SPAN_KIND_INTERNAL`.
const KIND_INTERNAL: u64 = 1;
/// `Span.flags`: the W3C trace flags in the low byte, then "whether the parent is
/// remote is known" and "it is".
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;
/// `Status.code`.
pub(crate) const STATUS_ERROR: u64 = 2;

/// A varint; the one-byte case (every key, most lengths) without prost's loop.
#[inline]
fn varint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else {
        encode_varint(v, out);
    }
}

fn varint_len(v: u64) -> usize {
    encoded_len_varint(v)
}

#[inline]
fn key(out: &mut Vec<u8>, field: u32, wire: WireType) {
    if field < 16 {
        // The tag fits one byte: (field << 3) | wire type.
        out.push(((field as u8) << 3) | wire as u8);
    } else {
        encode_key(field, wire, out);
    }
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, I64);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    key(out, field, I32);
    out.extend_from_slice(&v.to_le_bytes());
}

fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, VARINT);
    varint(out, v);
}

/// An attribute's value, borrowed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Attr<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    F64(f64),
}

impl<'a> From<&'a str> for Attr<'a> {
    fn from(s: &'a str) -> Attr<'a> {
        Attr::Str(s)
    }
}

impl From<i64> for Attr<'_> {
    fn from(v: i64) -> Self {
        Attr::Int(v)
    }
}

impl From<bool> for Attr<'_> {
    fn from(v: bool) -> Self {
        Attr::Bool(v)
    }
}

impl From<f64> for Attr<'_> {
    fn from(v: f64) -> Self {
        Attr::F64(v)
    }
}

impl Attr<'_> {
    /// The encoded length of the `AnyValue` holding it.
    #[inline]
    fn any_len(&self) -> usize {
        match self {
            Attr::Str(s) => 1 + varint_len(s.len() as u64) + s.len(),
            Attr::Int(i) => 1 + varint_len(*i as u64),
            Attr::Bool(_) => 2,
            Attr::F64(_) => 9,
        }
    }

    #[inline]
    fn write_any(&self, out: &mut Vec<u8>) {
        match self {
            Attr::Str(s) => bytes(out, 1, s.as_bytes()),
            Attr::Bool(b) => uint(out, 2, u64::from(*b)),
            // int64: two's complement as a 64-bit varint.
            Attr::Int(i) => uint(out, 3, *i as u64),
            Attr::F64(f) => fixed64(out, 4, f.to_bits()),
        }
    }
}

/// `(field) KeyValue { key = 1; AnyValue value = 2 }`.
#[inline]
pub(crate) fn attribute(out: &mut Vec<u8>, field: u32, k: &str, v: Attr<'_>) {
    let any = v.any_len();
    let len = 1 + varint_len(k.len() as u64) + k.len() + 1 + varint_len(any as u64) + any;
    key(out, field, LEN);
    varint(out, len as u64);
    bytes(out, 1, k.as_bytes());
    key(out, 2, LEN);
    varint(out, any as u64);
    v.write_any(out);
}

/// `v` as an attribute value (an array, which Heddle never sets, as its text).
pub(crate) fn with_value<R>(v: &opentelemetry::Value, f: impl FnOnce(Attr<'_>) -> R) -> R {
    match v {
        opentelemetry::Value::Bool(b) => f(Attr::Bool(*b)),
        opentelemetry::Value::I64(i) => f(Attr::Int(*i)),
        opentelemetry::Value::F64(x) => f(Attr::F64(*x)),
        opentelemetry::Value::String(s) => f(Attr::Str(s.as_str())),
        other => f(Attr::Str(&other.as_str())),
    }
}

/// Nanoseconds since the epoch, as spans and events carry times.
pub(crate) fn nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// What opens a span: ids, name, times.
pub(crate) struct Head<'a> {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    /// Whether the parent is the caller's (the run span under a `traceparent`).
    pub remote_parent: bool,
    pub sampled: bool,
    pub name: &'a str,
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
}

/// The fields every node span of a run has alike (trace, parent, name, kind, flags),
/// encoded once per run: [`SpanWriter::templated`] starts a span from it.
pub(crate) fn head_template(
    trace_id: [u8; 16],
    parent: [u8; 8],
    name: &str,
    sampled: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    bytes(&mut out, 1, &trace_id);
    bytes(&mut out, 4, &parent);
    bytes(&mut out, 5, name.as_bytes());
    uint(&mut out, 6, KIND_INTERNAL);
    fixed32(&mut out, 16, u32::from(sampled) | FLAG_HAS_IS_REMOTE);
    out
}

/// Writes one `Span` at the end of a batch, as `ScopeSpans.spans` (field 2), which the
/// exporter puts behind its scope. The span's length, known only once it is written,
/// goes in two bytes kept for it before its body (a span of 128 bytes to 16 KiB, as
/// node spans are: nothing is copied), else the body is moved to fit it.
pub(crate) struct SpanWriter<'a> {
    span: &'a mut Vec<u8>,
    /// Where the body starts in the batch.
    body: usize,
}

impl<'a> SpanWriter<'a> {
    /// Starts a span at the end of `batch`.
    pub fn new(batch: &'a mut Vec<u8>, h: &Head<'_>) -> SpanWriter<'a> {
        let w = SpanWriter::open(batch);
        let out = &mut *w.span;
        bytes(out, 1, &h.trace_id);
        bytes(out, 2, &h.span_id);
        if let Some(p) = h.parent {
            bytes(out, 4, &p);
        }
        bytes(out, 5, h.name.as_bytes());
        uint(out, 6, KIND_INTERNAL);
        let start = nanos(h.start);
        fixed64(out, 7, start);
        fixed64(out, 8, nanos(h.end).max(start));
        let mut flags = u32::from(h.sampled) | FLAG_HAS_IS_REMOTE;
        if h.remote_parent {
            flags |= FLAG_IS_REMOTE;
        }
        fixed32(out, 16, flags);
        w
    }

    /// Starts a span at the end of `batch` from a [`head_template`], with its own id
    /// and times (nanoseconds since the epoch).
    pub fn templated(
        batch: &'a mut Vec<u8>,
        template: &[u8],
        span_id: [u8; 8],
        start: u64,
        end: u64,
    ) -> SpanWriter<'a> {
        let w = SpanWriter::open(batch);
        let out = &mut *w.span;
        out.extend_from_slice(template);
        bytes(out, 2, &span_id);
        fixed64(out, 7, start);
        fixed64(out, 8, end.max(start));
        w
    }

    fn open(batch: &'a mut Vec<u8>) -> SpanWriter<'a> {
        key(batch, 2, LEN);
        batch.extend_from_slice(&[0, 0]);
        let body = batch.len();
        SpanWriter { span: batch, body }
    }

    /// Fields already encoded (attributes a [`attribute`] wrote, field 9), appended.
    pub fn raw(&mut self, encoded: &[u8]) {
        self.span.extend_from_slice(encoded);
    }

    /// An attribute (`Span.attributes`, field 9).
    pub fn attr<'v>(&mut self, k: &str, v: impl Into<Attr<'v>>) {
        attribute(self.span, 9, k, v.into());
    }

    /// An event (`Span.events`, field 11) with `attributes`.
    pub fn event(&mut self, e: &opentelemetry::trace::Event) {
        let mut body = Vec::with_capacity(64);
        fixed64(&mut body, 1, nanos(e.timestamp));
        bytes(&mut body, 2, e.name.as_bytes());
        for kv in &e.attributes {
            with_value(&kv.value, |v| attribute(&mut body, 3, kv.key.as_str(), v));
        }
        bytes(self.span, 11, &body);
    }

    /// The status (`Span.status`, field 15): `code` (0 unset, 2 error) and a message.
    pub fn status(&mut self, code: u64, message: &str) {
        if code == 0 && message.is_empty() {
            return;
        }
        let mut len = 0;
        if !message.is_empty() {
            len += 1 + varint_len(message.len() as u64) + message.len();
        }
        if code != 0 {
            len += 1 + varint_len(code);
        }
        key(self.span, 15, LEN);
        varint(self.span, len as u64);
        if !message.is_empty() {
            bytes(self.span, 2, message.as_bytes());
        }
        if code != 0 {
            uint(self.span, 3, code);
        }
    }

    /// Ends the span: writes its length before it.
    pub fn finish(self) {
        let len = self.span.len() - self.body;
        if (0x80..0x4000).contains(&len) {
            self.span[self.body - 2] = (len as u8 & 0x7f) | 0x80;
            self.span[self.body - 1] = (len >> 7) as u8;
        } else {
            let mut prefix = Vec::with_capacity(10);
            varint(&mut prefix, len as u64);
            self.span.splice(self.body - 2..self.body, prefix);
        }
    }
}

/// The `Resource` (attributes `attrs`) and `InstrumentationScope` (`name`, `version`)
/// every request carries, encoded once: what [`request`] puts before the spans.
pub(crate) struct Preamble {
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Preamble {
    pub fn new<'k>(
        attrs: impl IntoIterator<Item = (&'k str, &'k opentelemetry::Value)>,
        name: &str,
        version: &str,
    ) -> Preamble {
        let mut resource = Vec::new();
        for (k, v) in attrs {
            with_value(v, |v| attribute(&mut resource, 1, k, v));
        }
        let mut scope = Vec::new();
        bytes(&mut scope, 1, name.as_bytes());
        bytes(&mut scope, 2, version.as_bytes());
        Preamble { resource, scope }
    }

    /// An `ExportTraceServiceRequest` of the spans in `chunks` (each a run of
    /// [`SpanWriter::finish`]ed spans).
    pub fn request<B: AsRef<[u8]>>(&self, chunks: &[B]) -> Vec<u8> {
        let spans: usize = chunks.iter().map(|c| c.as_ref().len()).sum();
        let field = |len: usize| 1 + varint_len(len as u64) + len;
        let scope_spans = field(self.scope.len()) + spans;
        let resource_spans = field(self.resource.len()) + field(scope_spans);
        let mut out = Vec::with_capacity(field(resource_spans));
        key(&mut out, 1, LEN);
        varint(&mut out, resource_spans as u64);
        bytes(&mut out, 1, &self.resource);
        key(&mut out, 2, LEN);
        varint(&mut out, scope_spans as u64);
        bytes(&mut out, 1, &self.scope);
        for c in chunks {
            out.extend_from_slice(c.as_ref());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::KeyValue;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    use prost::Message as _;
    use std::time::{Duration, UNIX_EPOCH};

    /// What is written decodes, field by field, with the generated OTLP types a
    /// collector uses.
    #[test]
    fn a_request_decodes_as_otlp() {
        let service = opentelemetry::Value::from("billing");
        let pid = opentelemetry::Value::from(42i64);
        let pre = Preamble::new(
            [("service.name", &service), ("process.pid", &pid)],
            "heddle",
            "1.2.3",
        );
        let t0 = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let mut batch = Vec::new();
        let mut w = SpanWriter::new(
            &mut batch,
            &Head {
                trace_id: [7; 16],
                span_id: [8; 8],
                parent: Some([9; 8]),
                remote_parent: false,
                sampled: true,
                name: "heddle.node",
                start: t0,
                end: t0 + Duration::from_micros(15),
            },
        );
        w.attr("s", "é ünïcode");
        w.attr("neg", -5i64);
        w.attr("big", i64::MAX);
        w.attr("b", true);
        w.attr("f", 0.25f64);
        w.event(&opentelemetry::trace::Event::new(
            "heddle.escalation",
            t0,
            vec![KeyValue::new("k", "v")],
            0,
        ));
        w.status(STATUS_ERROR, "it broke");
        w.finish();
        let mut second = Vec::new();
        let w = SpanWriter::new(
            &mut second,
            &Head {
                trace_id: [7; 16],
                span_id: [1; 8],
                parent: None,
                remote_parent: false,
                sampled: true,
                name: "heddle.run",
                // An end before the start is written as the start.
                start: t0,
                end: t0 - Duration::from_secs(1),
            },
        );
        w.finish();
        // A span from a run's template: its node attributes encoded once, a short one
        // (a one-byte length) and a long one (three).
        let template = head_template([7; 16], [1; 8], "heddle.node", true);
        let mut node = Vec::new();
        attribute(&mut node, 9, "heddle.node.id", Attr::Str("n"));
        let mut third = Vec::new();
        let mut w = SpanWriter::templated(&mut third, &template, [2; 8], 10, 20);
        w.raw(&node);
        w.finish();
        let long = "x".repeat(20_000);
        let mut w = SpanWriter::templated(&mut third, &template, [3; 8], 30, 40);
        w.raw(&node);
        w.attr("long", long.as_str());
        w.finish();
        let body = pre.request(&[batch, second, third]);
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(req.resource_spans.len(), 1);
        let rs = &req.resource_spans[0];
        let res = &rs.resource.as_ref().unwrap().attributes;
        assert_eq!(res[0].key, "service.name");
        assert_eq!(res[1].value.as_ref().unwrap().value, Some(V::IntValue(42)));
        let ss = &rs.scope_spans[0];
        let scope = ss.scope.as_ref().unwrap();
        assert_eq!(
            (scope.name.as_str(), scope.version.as_str()),
            ("heddle", "1.2.3")
        );
        assert_eq!(ss.spans.len(), 4);
        let s = &ss.spans[0];
        assert_eq!(s.trace_id, [7; 16]);
        assert_eq!(s.span_id, [8; 8]);
        assert_eq!(s.parent_span_id, [9; 8]);
        assert_eq!(s.name, "heddle.node");
        assert_eq!(s.kind, 1);
        assert_eq!(s.start_time_unix_nano, 1_700_000_000_123_456_789);
        assert_eq!(s.end_time_unix_nano, 1_700_000_000_123_471_789);
        assert_eq!(s.flags, 0x101);
        let a: Vec<(&str, Option<&V>)> = s
            .attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    kv.value.as_ref().and_then(|v| v.value.as_ref()),
                )
            })
            .collect();
        assert_eq!(
            a,
            [
                ("s", Some(&V::StringValue("é ünïcode".into()))),
                ("neg", Some(&V::IntValue(-5))),
                ("big", Some(&V::IntValue(i64::MAX))),
                ("b", Some(&V::BoolValue(true))),
                ("f", Some(&V::DoubleValue(0.25))),
            ]
        );
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].name, "heddle.escalation");
        assert_eq!(s.events[0].time_unix_nano, 1_700_000_000_123_456_789);
        assert_eq!(s.events[0].attributes[0].key, "k");
        let st = s.status.as_ref().unwrap();
        assert_eq!((st.code, st.message.as_str()), (2, "it broke"));
        let r = &ss.spans[1];
        assert!(r.parent_span_id.is_empty());
        assert_eq!(r.end_time_unix_nano, r.start_time_unix_nano);
        assert!(r.status.is_none());
        for (s, id, start) in [(&ss.spans[2], [2; 8], 10), (&ss.spans[3], [3; 8], 30)] {
            assert_eq!(s.trace_id, [7; 16]);
            assert_eq!(s.span_id, id);
            assert_eq!(s.parent_span_id, [1; 8]);
            assert_eq!(
                (s.name.as_str(), s.kind, s.flags),
                ("heddle.node", 1, 0x101)
            );
            assert_eq!(
                (s.start_time_unix_nano, s.end_time_unix_nano),
                (start, start + 10)
            );
            assert_eq!(s.attributes[0].key, "heddle.node.id");
        }
        let long_value = ss.spans[3].attributes[1].value.as_ref().unwrap();
        assert_eq!(long_value.value, Some(V::StringValue(long)));
    }
}
