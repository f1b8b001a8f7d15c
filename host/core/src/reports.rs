//! The run result's per-node reports ([`NodeReports`]), by node id.
//!
//! A run of a large graph reports on every node: the 100,000-node wide graph builds
//! 100,000 reports in the time bare tokio spawns as many tasks. A `BTreeMap<String, _>`
//! made that a copied id (an allocation) per node and the reports moved through the
//! tree's nodes on the way in; here the reports sit in lists sorted by id, their ids
//! shared with the plan's nodes, built in one pass in the plan's id order. It reads (and
//! serializes, as a JSON object) like the map it replaces.
//!
//! The lists are chunks of 64 reports, not one: the reports are made as a run
//! ends, when the memory its actors and messages held has just been freed in pieces of
//! a few hundred bytes to a few KiB. One contiguous list (1.9 MB for 10,000 nodes) fits
//! in none of those holes and raised the run's peak memory by its whole size; 12 KiB
//! chunks reuse them, as the map's nodes did.

use std::fmt;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::event::NodeReport;

/// Reports per chunk: 64 × 192 bytes, 12 KiB.
const CHUNK: usize = 64;

type Entry = (Arc<str>, NodeReport);

/// One report per node, by node id: looked up by id (a binary search), iterated in id
/// order. Serialized as a JSON object keyed by node id, as a map would be.
#[derive(Clone, Default)]
pub struct NodeReports {
    /// Each chunk non-empty; ids strictly increasing within a chunk and from one chunk
    /// to the next.
    chunks: Vec<Vec<Entry>>,
    len: usize,
}

impl NodeReports {
    /// No reports.
    pub fn new() -> Self {
        NodeReports::default()
    }

    /// From entries in increasing id order (what a plan's id order gives), taken one by
    /// one into the chunks, so no list of every report is made first. Entries out of
    /// order are sorted, and of several with one id the last is kept, as a map collected
    /// from them would.
    pub fn from_sorted(entries: impl IntoIterator<Item = Entry>) -> Self {
        let mut out = NodeReports::default();
        let mut entries = entries.into_iter();
        while let Some((id, report)) = entries.next() {
            if out.last_id().is_some_and(|last| **last >= *id) {
                let mut all: Vec<Entry> = out.into_iter().collect();
                all.push((id, report));
                all.extend(entries);
                return Self::sort(all);
            }
            out.push_back(id, report);
        }
        out
    }

    /// Sorts `entries` by id (stable), keeping the last of several with one id.
    fn sort(mut entries: Vec<Entry>) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        // `dedup_by` keeps the first of a run; reversed, the first is the last given.
        entries.reverse();
        entries.dedup_by(|a, b| a.0 == b.0);
        entries.reverse();
        let mut out = NodeReports::default();
        for (id, report) in entries {
            out.push_back(id, report);
        }
        out
    }

    fn last_id(&self) -> Option<&Arc<str>> {
        self.chunks.last().and_then(|c| c.last()).map(|(k, _)| k)
    }

    /// Appends an entry whose id is greater than every id held.
    fn push_back(&mut self, id: Arc<str>, report: NodeReport) {
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => c.push((id, report)),
            _ => {
                let mut c = Vec::with_capacity(CHUNK);
                c.push((id, report));
                self.chunks.push(c);
            }
        }
        self.len += 1;
    }

    /// How many nodes are reported on.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no node is reported on.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `id` if anything does (the last whose first id is at most
    /// `id`), and where in it `id` is or would go.
    fn position(&self, id: &str) -> Option<(usize, Result<usize, usize>)> {
        let after = self.chunks.partition_point(|c| &*c[0].0 <= id);
        let c = after.checked_sub(1)?;
        Some((c, self.chunks[c].binary_search_by(|(k, _)| (**k).cmp(id))))
    }

    /// Node `id`'s report.
    pub fn get(&self, id: &str) -> Option<&NodeReport> {
        match self.position(id)? {
            (c, Ok(i)) => Some(&self.chunks[c][i].1),
            _ => None,
        }
    }

    /// Node `id`'s report, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut NodeReport> {
        match self.position(id)? {
            (c, Ok(i)) => Some(&mut self.chunks[c][i].1),
            _ => None,
        }
    }

    /// Whether node `id` is reported on.
    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Sets node `id`'s report, returning the one it replaces.
    pub fn insert(&mut self, id: impl Into<Arc<str>>, report: NodeReport) -> Option<NodeReport> {
        let id = id.into();
        let (c, at) = match self.position(&id) {
            Some((c, Ok(i))) => {
                return Some(std::mem::replace(&mut self.chunks[c][i].1, report));
            }
            Some((c, Err(i))) => (c, i),
            // Before every id held: the first chunk's front, or a first chunk.
            None if self.chunks.is_empty() => {
                self.push_back(id, report);
                return None;
            }
            None => (0, 0),
        };
        let chunk = &mut self.chunks[c];
        chunk.insert(at, (id, report));
        if chunk.len() > 2 * CHUNK {
            let tail = chunk.split_off(CHUNK);
            self.chunks.insert(c + 1, tail);
        }
        self.len += 1;
        None
    }

    /// `(id, report)` in id order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            inner: self.chunks.iter().flatten(),
            left: self.len,
        }
    }

    /// The ids, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator {
        self.iter().map(|(k, _)| k)
    }

    /// The reports, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &NodeReport> + ExactSizeIterator {
        self.iter().map(|(_, r)| r)
    }

    /// The reports, in id order, to change.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut NodeReport> + ExactSizeIterator {
        ValuesMut {
            inner: self.chunks.iter_mut().flatten(),
            left: self.len,
        }
    }
}

impl PartialEq for NodeReports {
    /// The same reports under the same ids, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl fmt::Debug for NodeReports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// `(id, report)` pairs of [`NodeReports`], in id order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    inner: std::iter::Flatten<std::slice::Iter<'a, Vec<Entry>>>,
    /// Entries not yet yielded from either end.
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a NodeReport);
    fn next(&mut self) -> Option<Self::Item> {
        let (k, r) = self.inner.next()?;
        self.left -= 1;
        Some((&**k, r))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let (k, r) = self.inner.next_back()?;
        self.left -= 1;
        Some((&**k, r))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// The reports of [`NodeReports`], to change, in id order.
struct ValuesMut<'a> {
    inner: std::iter::Flatten<std::slice::IterMut<'a, Vec<Entry>>>,
    left: usize,
}

impl<'a> Iterator for ValuesMut<'a> {
    type Item = &'a mut NodeReport;
    fn next(&mut self) -> Option<Self::Item> {
        let (_, r) = self.inner.next()?;
        self.left -= 1;
        Some(r)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for ValuesMut<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let (_, r) = self.inner.next_back()?;
        self.left -= 1;
        Some(r)
    }
}

impl ExactSizeIterator for ValuesMut<'_> {}

impl<'a> IntoIterator for &'a NodeReports {
    type Item = (&'a str, &'a NodeReport);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for NodeReports {
    type Item = (Arc<str>, NodeReport);
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<Entry>>>;
    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

impl<K: Into<Arc<str>>> FromIterator<(K, NodeReport)> for NodeReports {
    fn from_iter<I: IntoIterator<Item = (K, NodeReport)>>(iter: I) -> Self {
        NodeReports::from_sorted(iter.into_iter().map(|(k, r)| (k.into(), r)))
    }
}

impl<Q: AsRef<str> + ?Sized> std::ops::Index<&Q> for NodeReports {
    type Output = NodeReport;
    /// Node `id`'s report; panics when there is none, as a map's index does.
    fn index(&self, id: &Q) -> &NodeReport {
        let id = id.as_ref();
        self.get(id)
            .unwrap_or_else(|| panic!("no report on node `{id}`"))
    }
}

impl Serialize for NodeReports {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.len))?;
        for (k, r) in self {
            map.serialize_entry(k, r)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for NodeReports {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Reports;
        impl<'de> Visitor<'de> for Reports {
            type Value = NodeReports;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of node ids to node reports")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<NodeReports, A::Error> {
                let mut entries = Vec::with_capacity(m.size_hint().unwrap_or(0).min(4096));
                while let Some((k, r)) = m.next_entry::<String, NodeReport>()? {
                    entries.push((Arc::from(k), r));
                }
                Ok(NodeReports::from_sorted(entries))
            }
        }
        d.deserialize_map(Reports)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::event::{InvocationMetrics, NodeOutcome};

    fn report(invocations: u64) -> NodeReport {
        NodeReport {
            node_type: Arc::from("t"),
            outcome: NodeOutcome::Done,
            invocations,
            metrics: InvocationMetrics::default(),
            signature: None,
            timed_out: false,
            may_spend: false,
        }
    }

    /// The same reports as a map: what the result held before, and what its JSON is.
    fn as_map(pairs: &[(&str, u64)]) -> BTreeMap<String, NodeReport> {
        pairs
            .iter()
            .map(|&(k, n)| (k.to_string(), report(n)))
            .collect()
    }

    #[test]
    fn reads_and_serializes_like_the_map_it_replaces_whatever_order_it_is_given() {
        // Out of order, with a repeated id whose last report wins (as in a map).
        let given = [("b", 2), ("a", 1), ("c", 3), ("a", 9), ("aa", 4)];
        let reports: NodeReports = given.iter().map(|&(k, n)| (k, report(n))).collect();
        let map = as_map(&given);
        assert_eq!(reports.len(), 4);
        assert_eq!(
            reports
                .iter()
                .map(|(k, r)| (k, r.invocations))
                .collect::<Vec<_>>(),
            map.iter()
                .map(|(k, r)| (k.as_str(), r.invocations))
                .collect::<Vec<_>>()
        );
        assert_eq!(reports["a"].invocations, 9);
        assert_eq!(reports[&"aa".to_string()].invocations, 4);
        assert!(
            reports.get("ab").is_none() && !reports.contains_key("") && reports.contains_key("c")
        );
        assert_eq!(
            serde_json::to_string(&reports).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        // Back from JSON, in any key order.
        let json = serde_json::to_value(&map).unwrap();
        let back: NodeReports = serde_json::from_value(json).unwrap();
        assert_eq!(back, reports);
        let shuffled = r#"{"c":{"node_type":"t","outcome":"done","invocations":3,"metrics":{"wall_us":0}},
                          "a":{"node_type":"t","outcome":"done","invocations":1,"metrics":{"wall_us":0}}}"#;
        let back: NodeReports = serde_json::from_str(shuffled).unwrap();
        assert_eq!(back.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert!(back["a"].may_spend, "a report without the field may spend");
    }

    #[test]
    fn sorted_entries_are_kept_as_given_and_insert_keeps_the_order() {
        let sorted: Vec<(Arc<str>, NodeReport)> = ["n1", "n10", "n2"]
            .iter()
            .map(|&k| (Arc::from(k), report(1)))
            .collect();
        let ids: Vec<*const u8> = sorted.iter().map(|(k, _)| k.as_ptr()).collect();
        let mut reports = NodeReports::from_sorted(sorted);
        // The ids are the ones handed over (shared, not copied).
        assert_eq!(
            reports.iter().map(|(k, _)| k.as_ptr()).collect::<Vec<_>>(),
            ids
        );
        assert!(reports.insert("n11", report(2)).is_none());
        assert_eq!(
            reports.insert("n1", report(3)).map(|r| r.invocations),
            Some(1)
        );
        assert_eq!(
            reports.keys().collect::<Vec<_>>(),
            ["n1", "n10", "n11", "n2"]
        );
        reports.get_mut("n2").unwrap().invocations = 7;
        assert_eq!(
            reports.values().map(|r| r.invocations).collect::<Vec<_>>(),
            [3, 1, 2, 7]
        );
        assert!(NodeReports::new().is_empty());
    }

    #[test]
    fn many_reports_across_chunks_read_as_a_map_after_any_inserts() {
        // Enough for several chunks; ids whose string order is not their number order.
        let ids: Vec<String> = (0..(5 * CHUNK as u64 + 7))
            .map(|n| format!("n{n}"))
            .collect();
        let mut sorted: Vec<String> = ids.clone();
        sorted.sort();
        let mut reports = NodeReports::from_sorted(
            sorted
                .iter()
                .enumerate()
                .map(|(i, k)| (Arc::from(k.as_str()), report(i as u64))),
        );
        let mut model: BTreeMap<String, NodeReport> = sorted
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), report(i as u64)))
            .collect();
        assert!(reports.chunks.len() > 4, "the test spans chunks");
        // Before everything, inside the first chunk until it splits, past the end,
        // and replacing ids at chunk edges.
        let mut extra: Vec<String> = vec!["a".into(), "zz".into()];
        extra.extend((0..(2 * CHUNK + 3)).map(|n| format!("n0_{n:04}")));
        extra.push(sorted[CHUNK - 1].clone());
        extra.push(sorted[CHUNK].clone());
        for (i, k) in extra.iter().enumerate() {
            let r = report(10_000 + i as u64);
            assert_eq!(
                reports.insert(k.as_str(), r.clone()).map(|r| r.invocations),
                model.insert(k.clone(), r).map(|r| r.invocations),
                "{k}"
            );
        }
        assert!(
            reports
                .chunks
                .iter()
                .all(|c| !c.is_empty() && c.len() <= 2 * CHUNK)
        );
        assert_eq!(reports.len(), model.len());
        let flat: Vec<(&str, u64)> = reports.iter().map(|(k, r)| (k, r.invocations)).collect();
        let want: Vec<(&str, u64)> = model
            .iter()
            .map(|(k, r)| (k.as_str(), r.invocations))
            .collect();
        assert_eq!(flat, want);
        let back: Vec<&str> = reports.keys().rev().collect();
        let want_back: Vec<&str> = model.keys().rev().map(String::as_str).collect();
        assert_eq!(back, want_back);
        assert_eq!(reports.iter().len(), model.len());
        let mut it = reports.iter();
        it.next();
        it.next_back();
        assert_eq!(it.len(), model.len() - 2);
        // Every id held, and ids before, between and after them.
        let absent = ["", "n", "n0_", "zzz"];
        for k in model.keys().map(String::as_str).chain(absent) {
            assert_eq!(
                reports.get(k).map(|r| r.invocations),
                model.get(k).map(|r| r.invocations),
                "{k}"
            );
        }
        for r in reports.values_mut() {
            r.invocations += 1;
        }
        assert_eq!(reports.values_mut().len(), model.len());
        assert_eq!(reports["a"].invocations, 10_001);
        assert_eq!(
            serde_json::to_string(&reports).unwrap(),
            serde_json::to_string(
                &model
                    .iter()
                    .map(|(k, r)| {
                        let mut r = r.clone();
                        r.invocations += 1;
                        (k.clone(), r)
                    })
                    .collect::<BTreeMap<_, _>>()
            )
            .unwrap()
        );
        // Equal reports compare equal however they are chunked.
        let rebuilt: NodeReports = reports.clone().into_iter().collect();
        assert_eq!(rebuilt, reports);
        assert_ne!(rebuilt.chunks.len(), 0);
    }

    #[test]
    #[should_panic(expected = "no report on node `x`")]
    fn indexing_a_node_without_a_report_panics_like_a_map() {
        let _ = &NodeReports::new()["x"];
    }
}
