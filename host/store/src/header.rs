//! A run's header (its graph document, plan, inputs, secret names, package digests and
//! limits) is what every resume runs by, so it is checksummed like the log's records and
//! verified whenever it is read: a flipped byte in the stored graph would run an altered
//! graph, one in the limits would raise a budget (issue 27 found both). Each field has
//! its own CRC-32 (over the run id, the field's name and its stored bytes), so a
//! mismatch names the field; the graph is also checked against its recorded sha256.
//!
//! Every store keeps the checksums of [`sums`] beside the fields, as text, and calls
//! [`verify`] before it decodes a header: what is checked is the stored bytes, before
//! anything reads them.

use crate::StoreError;

/// A run's header as stored: each field's exact stored bytes (JSON text for the
/// structured ones).
pub struct StoredHeader<'a> {
    pub run_id: &'a str,
    pub created_ms: u64,
    pub graph_name: &'a str,
    pub graph_bytes: &'a [u8],
    pub graph_sha256: &'a str,
    pub plan: &'a str,
    pub inputs: &'a str,
    pub secrets: &'a str,
    pub packages: &'a str,
    pub limits: &'a str,
}

impl StoredHeader<'_> {
    /// Each field by the name a mismatch is reported under, with its stored bytes.
    fn fields(&self) -> [(&'static str, std::borrow::Cow<'_, [u8]>); 9] {
        use std::borrow::Cow::{Borrowed, Owned};
        [
            (
                "created_ms",
                Owned(self.created_ms.to_string().into_bytes()),
            ),
            ("graph_name", Borrowed(self.graph_name.as_bytes())),
            ("graph_bytes", Borrowed(self.graph_bytes)),
            ("graph_sha256", Borrowed(self.graph_sha256.as_bytes())),
            ("plan", Borrowed(self.plan.as_bytes())),
            ("inputs", Borrowed(self.inputs.as_bytes())),
            ("secrets", Borrowed(self.secrets.as_bytes())),
            ("packages", Borrowed(self.packages.as_bytes())),
            ("limits", Borrowed(self.limits.as_bytes())),
        ]
    }
}

fn crc(run_id: &str, field: &str, bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(run_id.as_bytes());
    h.update(&[0]);
    h.update(field.as_bytes());
    h.update(&[0]);
    h.update(bytes);
    h.finalize()
}

/// The checksums to store with `h`: a JSON object of field name → CRC-32.
pub fn sums(h: &StoredHeader<'_>) -> String {
    let m: serde_json::Map<String, serde_json::Value> = h
        .fields()
        .iter()
        .map(|(name, bytes)| (name.to_string(), crc(h.run_id, name, bytes).into()))
        .collect();
    serde_json::Value::Object(m).to_string()
}

/// Checks `h` against the checksums stored with it (`None`: none stored) and its graph
/// against its sha256; refused with [`StoreError::HeaderCorrupt`] naming the run and
/// the first field that does not match.
pub fn verify(h: &StoredHeader<'_>, stored: Option<&str>) -> Result<(), StoreError> {
    let damaged = |field: &str, detail: String| StoreError::HeaderCorrupt {
        run: h.run_id.to_string(),
        field: field.to_string(),
        detail,
    };
    let sums: serde_json::Map<String, serde_json::Value> = stored
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| {
            damaged(
                "header_sums",
                "its checksums are missing or unreadable".into(),
            )
        })?;
    for (name, bytes) in h.fields() {
        let want = sums.get(name).and_then(|v| v.as_u64());
        if want != Some(u64::from(crc(h.run_id, name, &bytes))) {
            return Err(damaged(name, "it does not match its checksum".into()));
        }
    }
    let found = crate::sha256_hex(h.graph_bytes);
    if found != h.graph_sha256 {
        return Err(damaged(
            "graph_bytes",
            format!(
                "the graph document hashes to {found}, recorded {}",
                h.graph_sha256
            ),
        ));
    }
    Ok(())
}

/// The columns of a [`HeaderRow`] in both stores' `runs` table, in its field order.
pub(crate) const COLUMNS: &str =
    "created_ms, graph_name, graph_bytes, graph_sha256, plan, inputs, secrets, packages, limits";

/// A header's fields as a store keeps them (the structured ones as JSON text), owned:
/// what every store writes at [`crate::RunStore::create_run`] and reads back at
/// [`crate::RunStore::header`], so both stores checksum and verify the same bytes the
/// same way.
#[derive(Clone)]
pub(crate) struct HeaderRow {
    pub created_ms: u64,
    pub graph_name: String,
    pub graph_bytes: Vec<u8>,
    pub graph_sha256: String,
    pub plan: String,
    pub inputs: String,
    pub secrets: String,
    pub packages: String,
    pub limits: String,
}

impl HeaderRow {
    /// `run` as it is stored, created at `created_ms`.
    pub(crate) fn new(run: &crate::NewRun, created_ms: u64) -> HeaderRow {
        use crate::sqlite::to_json;
        HeaderRow {
            created_ms,
            graph_name: run.graph_name.clone(),
            graph_bytes: run.graph_bytes.clone(),
            graph_sha256: crate::sha256_hex(&run.graph_bytes),
            plan: to_json(&run.plan),
            inputs: to_json(&run.inputs),
            secrets: to_json(&run.secrets),
            packages: to_json(&run.packages),
            limits: to_json(&run.limits),
        }
    }

    pub(crate) fn stored<'a>(&'a self, run_id: &'a str) -> StoredHeader<'a> {
        StoredHeader {
            run_id,
            created_ms: self.created_ms,
            graph_name: &self.graph_name,
            graph_bytes: &self.graph_bytes,
            graph_sha256: &self.graph_sha256,
            plan: &self.plan,
            inputs: &self.inputs,
            secrets: &self.secrets,
            packages: &self.packages,
            limits: &self.limits,
        }
    }

    /// The checksums to store beside this row ([`sums`]).
    pub(crate) fn sums(&self, run_id: &str) -> String {
        sums(&self.stored(run_id))
    }

    /// The header this row holds, once its stored bytes match `stored_sums` ([`verify`]):
    /// nothing is decoded before.
    pub(crate) fn into_header(
        self,
        run_id: &str,
        stored_sums: Option<&str>,
    ) -> Result<crate::RunHeader, StoreError> {
        use crate::sqlite::from_json;
        verify(&self.stored(run_id), stored_sums)?;
        Ok(crate::RunHeader {
            run_id: run_id.to_string(),
            created_ms: self.created_ms,
            run: crate::NewRun {
                plan: from_json(run_id, "plan", &self.plan)?,
                inputs: from_json(run_id, "inputs", &self.inputs)?,
                secrets: from_json(run_id, "secret names", &self.secrets)?,
                packages: from_json(run_id, "package digests", &self.packages)?,
                limits: from_json(run_id, "limits", &self.limits)?,
                graph_name: self.graph_name,
                graph_bytes: self.graph_bytes,
            },
            graph_sha256: self.graph_sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(graph: &'a [u8], sha: &'a str, limits: &'a str) -> StoredHeader<'a> {
        StoredHeader {
            run_id: "r1",
            created_ms: 7,
            graph_name: "g.json",
            graph_bytes: graph,
            graph_sha256: sha,
            plan: "{}",
            inputs: "{}",
            secrets: "[]",
            packages: "{}",
            limits,
        }
    }

    /// Every field's damage is caught and named; the graph also by its digest (a header
    /// checksummed at an upgrade over a graph already damaged).
    #[test]
    fn each_damaged_field_is_named() {
        let sha = crate::sha256_hex(b"{}");
        let good = header(b"{}", &sha, r#"{"max_dispatches":5}"#);
        let sums = sums(&good);
        verify(&good, Some(&sums)).unwrap();
        let field = |r: Result<(), StoreError>| match r {
            Err(StoreError::HeaderCorrupt { field, .. }) => field,
            other => panic!("expected a damaged header, got {other:?}"),
        };
        let limits = header(b"{}", &sha, r#"{"max_dispatches":9}"#);
        assert_eq!(field(verify(&limits, Some(&sums))), "limits");
        let graph = header(b"{ ", &sha, r#"{"max_dispatches":5}"#);
        assert_eq!(field(verify(&graph, Some(&sums))), "graph_bytes");
        assert_eq!(field(verify(&good, None)), "header_sums");
        assert_eq!(field(verify(&good, Some("{"))), "header_sums");
        let other_run = StoredHeader {
            run_id: "r2",
            ..header(b"{}", &sha, r#"{"max_dispatches":5}"#)
        };
        assert_eq!(field(verify(&other_run, Some(&sums))), "created_ms");
        // Checksummed over a graph that no longer matches its digest.
        let bad = header(b"{ ", &sha, "{}");
        assert_eq!(field(verify(&bad, Some(&super::sums(&bad)))), "graph_bytes");
    }
}
