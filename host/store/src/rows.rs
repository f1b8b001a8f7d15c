//! How a run's records are laid out in rows of the `events` table.
//!
//! Since schema 5 the records of one group commit share a row: a row per record cost a
//! b-tree insert, six bound parameters and a row header each, which was most of what the
//! log writer spent per record once results were binary. Two kinds of row:
//!
//! - **single**: one record. `seq` is its sequence number, `kind` its kind, `body` its
//!   body ([`codec`]: JSON text, or a result's binary form) and `crc` its checksum
//!   ([`checksum`]). Every row of a version 4 store is one; so is every lifecycle record
//!   ([`crate::status::LIFECYCLE`]), which a listing reads by the `kind` column alone,
//!   and a record that committed with no company.
//! - **packed** (`kind` = [`PACKED`], `body` a blob): records `a..=b`, keyed by `seq` =
//!   `b`, the last one, so `seq >= from` still finds every row holding a record from
//!   `from` on and `max(seq)` is still the log's last record. The body is a header
//!   (layout byte, record count as u32 LE) and one frame per record: kind, form, body and
//!   the record's own checksum, computed exactly as a single row's. `crc` covers the
//!   header, so a damaged count cannot move records onto other numbers; each record is
//!   still verified on its own, so a row cut short keeps the records before the cut and
//!   a torn tail is found record by record.

use std::ops::Range;

use heddle_core::Record;
use rusqlite::types::ValueRef;

use crate::codec::{self, Form};
use crate::{LogRead, StoreError, Stored};

/// The `kind` column of a packed row. No record kind is spelled like it (a debug
/// assertion in [`lay_out`] says so).
pub(crate) const PACKED: &str = "packed";

/// The first byte of a packed body: the layout of what follows.
const PACKED_LAYOUT: u8 = 1;

/// Header bytes of a packed body: the layout byte and the record count.
const HEADER: usize = 5;

/// A packed row is closed once its body reaches this size, so a reader never holds
/// more than about this much of one row at a time (values over the run's inline limit
/// are artifacts already, so a record is rarely near it).
const ROW_BYTES: usize = 1 << 20;

/// The checksum of one stored record: covers the run, the position and the bytes, so a
/// record copied to another place or cut short does not verify. `base` is a hasher that
/// has seen the run id ([`run_hasher`]).
fn checksum(base: &crc32fast::Hasher, seq: u64, kind: &str, body: &[u8]) -> u32 {
    let mut h = base.clone();
    h.update(&seq.to_le_bytes());
    h.update(kind.as_bytes());
    h.update(body);
    h.finalize()
}

fn run_hasher(run: &str) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    h.update(run.as_bytes());
    h
}

/// Records encoded for the log, in order from [`Frames::first`]: each one the frame a
/// packed row holds (kind, form, body length, body, checksum), laid end to end in one
/// buffer. A run log encodes each record here as it is appended, on the thread that
/// appends it, so no record crosses to the writer's thread: handing records over cost the
/// writer most of its time in freeing memory another thread allocated (the records'
/// strings and lists), and the writer only copies bytes into rows.
pub struct Frames {
    run: Box<str>,
    /// A hasher that has seen the run id ([`run_hasher`]).
    base: crc32fast::Hasher,
    first: u64,
    buf: Vec<u8>,
    at: Vec<At>,
    /// A node whose record in this batch is where the armed `mid-commit` fault fires.
    crash: Option<String>,
}

/// Where one frame lies in [`Frames::buf`]: from `start` to `body.end` + 4 (its checksum).
struct At {
    start: usize,
    body: Range<usize>,
    kind: &'static str,
    form: Form,
}

impl Frames {
    /// No records yet; the first pushed will be `run`'s record `first`.
    pub fn new(run: &str, first: u64) -> Frames {
        Frames {
            run: run.into(),
            base: run_hasher(run),
            first,
            buf: Vec::new(),
            at: Vec::new(),
            crash: None,
        }
    }

    /// `records` encoded as `run`'s records from `first` on.
    pub fn of(run: &str, first: u64, records: &[Record]) -> Result<Frames, StoreError> {
        let mut frames = Frames::new(run, first);
        for r in records {
            frames.push(r)?;
        }
        Ok(frames)
    }

    /// Empties the batch (keeping its memory); the next record pushed is number `first`.
    pub fn clear(&mut self, first: u64) {
        self.first = first;
        self.buf.clear();
        self.at.clear();
        self.crash = None;
    }

    pub fn run(&self) -> &str {
        &self.run
    }

    /// The sequence number of the first record.
    pub fn first(&self) -> u64 {
        self.first
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Encodes `record` as the next record of the batch. On error nothing is added.
    pub fn push(&mut self, record: &Record) -> Result<(), StoreError> {
        let seq = self.first + self.at.len() as u64;
        let kind = record.kind();
        debug_assert_ne!(kind, PACKED, "a record kind spelled like a packed row");
        let start = self.buf.len();
        put_str(&mut self.buf, kind);
        let form_at = self.buf.len();
        self.buf.extend_from_slice(&[0; 5]);
        let body_at = self.buf.len();
        let encoded = codec::encode(record, &mut self.buf)
            .map_err(|source| StoreError::Encode {
                run: self.run.to_string(),
                seq,
                source,
            })
            .and_then(|form| {
                let len =
                    u32::try_from(self.buf.len() - body_at).map_err(|_| StoreError::Corrupt {
                        run: self.run.to_string(),
                        seq,
                        detail: "a record body over 4 GiB".into(),
                    })?;
                Ok((form, len))
            });
        let (form, len) = match encoded {
            Ok(f) => f,
            Err(e) => {
                self.buf.truncate(start);
                return Err(e);
            }
        };
        let body_end = self.buf.len();
        self.buf[form_at] = form_byte(form);
        self.buf[form_at + 1..body_at].copy_from_slice(&len.to_le_bytes());
        let crc = checksum(&self.base, seq, kind, &self.buf[body_at..]);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.at.push(At {
            start,
            body: body_at..body_end,
            kind,
            form,
        });
        if crate::fault::is_armed()
            && let Some(o) = record.occurrence()
            && crate::fault::hits(crate::fault::Boundary::MidCommit, &o.node)
        {
            self.crash.get_or_insert_with(|| o.node.clone());
        }
        Ok(())
    }

    /// The node whose record makes the armed `mid-commit` fault fire in this batch.
    pub(crate) fn crash(&self) -> Option<&str> {
        self.crash.as_deref()
    }

    fn crc(&self, a: &At) -> u32 {
        let b = &self.buf[a.body.end..a.body.end + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// One row to insert; its body is `body` of the [`Layout`]'s buffer.
pub(crate) struct Row {
    pub seq: u64,
    pub kind: &'static str,
    pub form: Form,
    pub body: Range<usize>,
    pub crc: u32,
}

/// The rows of one append, their bodies in one buffer (reused from batch to batch).
#[derive(Default)]
pub(crate) struct Layout {
    pub buf: Vec<u8>,
    pub rows: Vec<Row>,
}

fn alone(kind: &str) -> bool {
    crate::status::LIFECYCLE.contains(&kind)
}

/// Lays `frames` out as rows: a lifecycle record or a lone one as a single row, every
/// other stretch packed (a packed body is a header and the stretch's frames as they are).
pub(crate) fn lay_out(frames: &Frames, out: &mut Layout) {
    out.buf.clear();
    out.rows.clear();
    let at = &frames.at;
    let mut i = 0;
    while i < at.len() {
        let seq = frames.first + i as u64;
        let packable = at[i..]
            .iter()
            .take_while(|a| !alone(a.kind))
            .take(u32::MAX as usize)
            .count();
        if packable < 2 {
            let a = &at[i];
            let start = out.buf.len();
            out.buf.extend_from_slice(&frames.buf[a.body.clone()]);
            out.rows.push(Row {
                seq,
                kind: a.kind,
                form: a.form,
                body: start..out.buf.len(),
                crc: frames.crc(a),
            });
            i += 1;
            continue;
        }
        // Up to the frame that takes the body to [`ROW_BYTES`].
        let from = at[i].start;
        let n = at[i..i + packable]
            .iter()
            .position(|a| a.body.end + 4 - from + HEADER >= ROW_BYTES)
            .map_or(packable, |p| p + 1);
        let last = seq + n as u64 - 1;
        let start = out.buf.len();
        out.buf.push(PACKED_LAYOUT);
        // At most u32::MAX records (the `take` above).
        out.buf.extend_from_slice(&(n as u32).to_le_bytes());
        let to = at[i + n - 1].body.end + 4;
        out.buf.extend_from_slice(&frames.buf[from..to]);
        out.rows.push(Row {
            seq: last,
            kind: PACKED,
            form: Form::Binary,
            body: start..out.buf.len(),
            crc: checksum(&frames.base, last, PACKED, &out.buf[start..start + HEADER]),
        });
        i += n;
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    // Record kinds are short names; a longer one is cut at 255 bytes and then fails
    // its checksum, so it cannot be misread.
    let b = &s.as_bytes()[..s.len().min(255)];
    buf.push(b.len() as u8);
    buf.extend_from_slice(b);
}

fn form_byte(f: Form) -> u8 {
    match f {
        Form::Json => 0,
        Form::Binary => 1,
    }
}

/// One record of a row whose checksum verified, body not decoded yet.
pub(crate) struct Frame<'a> {
    pub seq: u64,
    kind: &'a str,
    form: Form,
    body: &'a [u8],
}

impl Frame<'_> {
    /// The record, read back; a verified body that does not decode is corruption.
    pub(crate) fn stored(&self, run: &str, at_ms: u64) -> Result<Stored, StoreError> {
        let record = codec::decode(self.kind, self.form, self.body).map_err(|detail| {
            StoreError::Corrupt {
                run: run.to_string(),
                seq: self.seq,
                detail,
            }
        })?;
        Ok(Stored {
            seq: self.seq,
            at_ms,
            record,
        })
    }
}

/// A row, checked record by record.
pub(crate) struct Checked<'a> {
    /// The first sequence number the row holds; `None` when its header does not
    /// verify (nothing in it can be placed, so nothing in it counts).
    pub first: Option<u64>,
    /// The last sequence number it holds (its key).
    pub last: u64,
    pub at_ms: u64,
    /// Its records from `from` on that verified, in order, up to `unverified`.
    pub frames: Vec<Frame<'a>>,
    /// From this sequence number to `last` nothing verifies: a write torn by a crash if
    /// this is the log's last row, corruption anywhere else.
    pub unverified: Option<u64>,
    /// For a packed row: the body bytes of its header and of every record before
    /// `unverified`, what a repair keeps.
    pub kept: usize,
    pub body: &'a [u8],
}

/// One stored row as the database gave it, before anything is trusted: a column that
/// is missing or of the wrong type is `None` (the row then verifies as nothing). The
/// SQLite store reads its columns by type (a text body is JSON, a blob binary); the
/// PostgreSQL store keeps the form in a column of its own.
pub(crate) struct RawRow<'a> {
    pub seq: Option<i64>,
    pub at_ms: Option<i64>,
    pub kind: Option<&'a [u8]>,
    pub body: Option<(Form, &'a [u8])>,
    pub crc: Option<i64>,
}

/// The row `seq, at_ms, kind, body, crc` of an SQLite query, as a [`RawRow`].
pub(crate) fn raw<'a>(row: &'a rusqlite::Row<'_>) -> Result<RawRow<'a>, StoreError> {
    let col = |i| {
        row.get_ref(i)
            .map_err(StoreError::sql("reading a run's log"))
    };
    let (seq, at_ms, kind, body, crc) = (col(0)?, col(1)?, col(2)?, col(3)?, col(4)?);
    let int = |v: ValueRef<'_>| match v {
        ValueRef::Integer(i) => Some(i),
        _ => None,
    };
    Ok(RawRow {
        seq: int(seq),
        at_ms: int(at_ms),
        kind: match kind {
            ValueRef::Text(k) => Some(k),
            _ => None,
        },
        body: match body {
            ValueRef::Text(t) => Some((Form::Json, t)),
            ValueRef::Blob(b) => Some((Form::Binary, b)),
            _ => None,
        },
        crc: int(crc),
    })
}

/// Checks one row of `run`'s log, keeping the records from `from` on. A record that
/// fails its checksum with a verified one after it in the same row was altered, not
/// torn: that is [`StoreError::Corrupt`] at once.
pub(crate) fn check_raw<'a>(
    run: &str,
    row: RawRow<'a>,
    from: u64,
) -> Result<Checked<'a>, StoreError> {
    // A key that is not an integer cannot be a row of the table (it is the primary key,
    // a NOT NULL integer); read it as anything at all to name the place.
    let last = row.seq.unwrap_or(0) as u64;
    let at_ms = row.at_ms.unwrap_or(0) as u64;
    let unverifiable = |body: &'a [u8]| Checked {
        first: None,
        last,
        at_ms,
        frames: Vec::new(),
        unverified: Some(last),
        kept: 0,
        body,
    };
    let (Some(_), Some(kind), Some(crc)) = (row.seq, row.kind, row.crc) else {
        return Ok(unverifiable(&[]));
    };
    let Some((form, body)) = row.body else {
        return Ok(unverifiable(&[]));
    };
    let Ok(kind) = std::str::from_utf8(kind) else {
        return Ok(unverifiable(body));
    };
    let base = run_hasher(run);
    if kind != PACKED || form != Form::Binary {
        let ok = checksum(&base, last, kind, body) == crc as u32;
        return Ok(Checked {
            first: Some(last),
            last,
            at_ms,
            frames: if ok && last >= from {
                vec![Frame {
                    seq: last,
                    kind,
                    form,
                    body,
                }]
            } else {
                Vec::new()
            },
            unverified: (!ok).then_some(last),
            kept: body.len(),
            body,
        });
    }
    let header_ok = body.len() >= HEADER
        && body[0] == PACKED_LAYOUT
        && checksum(&base, last, kind, &body[..HEADER]) == crc as u32;
    if !header_ok {
        return Ok(unverifiable(body));
    }
    let n = u32::from_le_bytes([body[1], body[2], body[3], body[4]]) as u64;
    let Some(first) = (last + 1).checked_sub(n).filter(|_| n > 0) else {
        return Ok(unverifiable(body));
    };
    let mut c = Checked {
        first: Some(first),
        last,
        at_ms,
        frames: Vec::new(),
        unverified: None,
        kept: HEADER,
        body,
    };
    let mut at = HEADER;
    for seq in first..=last {
        let Some((frame, next)) = parse_frame(body, at) else {
            // Cut short: nothing from here on can verify.
            c.unverified.get_or_insert(seq);
            return Ok(c);
        };
        at = next;
        let ok = checksum(&base, seq, frame.kind, frame.body) == frame.crc;
        match (ok, c.unverified) {
            (true, Some(bad)) => {
                return Err(StoreError::Corrupt {
                    run: run.to_string(),
                    seq: bad,
                    detail: "checksum mismatch".into(),
                });
            }
            (true, None) => {
                c.kept = at;
                if seq >= from {
                    c.frames.push(Frame {
                        seq,
                        kind: frame.kind,
                        form: frame.form,
                        body: frame.body,
                    });
                }
            }
            (false, _) => {
                c.unverified.get_or_insert(seq);
            }
        }
    }
    if at != body.len() && c.unverified.is_none() {
        return Err(StoreError::Corrupt {
            run: run.to_string(),
            seq: last,
            detail: format!("{} bytes after the last record of its row", body.len() - at),
        });
    }
    Ok(c)
}

struct RawFrame<'a> {
    kind: &'a str,
    form: Form,
    body: &'a [u8],
    crc: u32,
}

/// The frame at `at` of a packed body and where the next begins; `None` when the body
/// ends (or holds nonsense) before the frame does.
fn parse_frame(body: &[u8], at: usize) -> Option<(RawFrame<'_>, usize)> {
    let take = |at: usize, n: usize| body.get(at..at.checked_add(n)?);
    let klen = *body.get(at)? as usize;
    let kind = std::str::from_utf8(take(at + 1, klen)?).ok()?;
    let mut p = at + 1 + klen;
    let form = match *body.get(p)? {
        0 => Form::Json,
        1 => Form::Binary,
        _ => return None,
    };
    let len = u32::from_le_bytes(take(p + 1, 4)?.try_into().ok()?) as usize;
    p += 5;
    let b = take(p, len)?;
    p += len;
    let crc = u32::from_le_bytes(take(p, 4)?.try_into().ok()?);
    Some((
        RawFrame {
            kind,
            form,
            body: b,
            crc,
        },
        p + 4,
    ))
}

/// A packed body holding only the first `kept` bytes of `body` (header included) and
/// `count` records: what a repair writes back in place of a row with a torn tail.
fn truncated(body: &[u8], kept: usize, count: u32) -> Vec<u8> {
    let mut b = body[..kept].to_vec();
    b[1..HEADER].copy_from_slice(&count.to_le_bytes());
    b
}

/// The header checksum of a packed row of `run` keyed `last`.
fn packed_crc(run: &str, last: u64, body: &[u8]) -> u32 {
    checksum(&run_hasher(run), last, PACKED, &body[..HEADER])
}

/// What repairs a torn tail ([`Checked::unverified`] in the log's last row): the row
/// keyed `key` goes, and a packed row that verified up to the tear comes back holding
/// only the records before it (`keep`: its key, body, header checksum and time).
pub(crate) struct Repair {
    pub key: u64,
    pub keep: Option<(u64, Vec<u8>, u32, u64)>,
}

/// The repair of `checked` (the log's last row of `run`), or `None` when it verified.
pub(crate) fn torn_repair(run: &str, checked: &Checked<'_>) -> Option<Repair> {
    let torn = checked.unverified?;
    let keep = match checked.first {
        Some(first) if first < torn => {
            let last = torn - 1;
            let body = truncated(checked.body, checked.kept, (torn - first) as u32);
            let crc = packed_crc(run, last, &body);
            Some((last, body, crc, checked.at_ms))
        }
        _ => None,
    };
    Some(Repair {
        key: checked.last,
        keep,
    })
}

/// Reads a run's log row by row in key order ([`crate::RunStore::read`] of either store):
/// places each row after the one before, verifies every record, and tells a torn tail
/// (failed records at the very end) from corruption (a failed record with anything
/// after it) and from a gap.
pub(crate) struct LogReader<'r> {
    run: &'r str,
    from: u64,
    expected: u64,
    /// Records that failed their checksum: a torn tail only if nothing follows.
    bad: Option<u64>,
    first_row: bool,
    out: LogRead,
}

impl<'r> LogReader<'r> {
    pub(crate) fn new(run: &'r str, from: u64) -> LogReader<'r> {
        LogReader {
            run,
            from,
            expected: from,
            bad: None,
            first_row: true,
            out: LogRead::default(),
        }
    }

    /// The next row (rows come in key order, from the one holding `from`).
    pub(crate) fn row(&mut self, row: RawRow<'_>) -> Result<(), StoreError> {
        let run = self.run;
        if let Some(b) = self.bad {
            return Err(StoreError::Corrupt {
                run: run.to_string(),
                seq: b,
                detail: "checksum mismatch".into(),
            });
        }
        let checked = check_raw(run, row, self.from)?;
        // A row whose header does not verify holds nothing that can be placed: it
        // counts as unverified from where the log should go on.
        let first = checked.first.unwrap_or(self.expected);
        // The first row may begin before `from` (it holds `from`); every later one
        // begins where the one before ended.
        let placed = if self.first_row {
            first <= self.expected && self.expected <= checked.last
        } else {
            first == self.expected
        };
        if !placed {
            return Err(StoreError::Gap {
                run: run.to_string(),
                expected: self.expected,
                found: first,
            });
        }
        self.first_row = false;
        for f in &checked.frames {
            self.out.records.push(f.stored(run, checked.at_ms)?);
        }
        self.bad = match checked.first {
            None => Some(self.expected),
            Some(_) => checked.unverified.map(|u| u.max(self.from)),
        };
        self.expected = checked.last + 1;
        Ok(())
    }

    pub(crate) fn finish(mut self) -> LogRead {
        self.out.torn_tail = self.bad;
        self.out
    }
}

/// Adds the lifecycle row `row` of `run` to `out` ([`crate::RunStore::read_lifecycle`]):
/// lifecycle records are rows of their own; one that fails its checksum is a torn tail
/// when it is the log's last row (`last`: the log's last key), and left out as `read`
/// leaves it out, else corruption.
pub(crate) fn lifecycle_row(
    run: &str,
    row: RawRow<'_>,
    last: Option<i64>,
    out: &mut Vec<Stored>,
) -> Result<(), StoreError> {
    let checked = check_raw(run, row, 0)?;
    match checked.unverified {
        None => {
            for f in &checked.frames {
                out.push(f.stored(run, checked.at_ms)?);
            }
            Ok(())
        }
        // A torn tail, as `read` treats it: the record never happened.
        Some(_) if Some(checked.last as i64) == last => Ok(()),
        Some(seq) => Err(StoreError::Corrupt {
            run: run.to_string(),
            seq,
            detail: "checksum mismatch".into(),
        }),
    }
}
