//! The run result's per-node reports ([`NodeReports`]), by node id.
//!
//! A run of a large graph reports on every node: the 100,000-node wide graph builds
//! 100,000 reports in the time bare tokio spawns as many tasks. A `BTreeMap<String, _>`
//! made that a copied id (an allocation) per node and the reports moved through the
//! tree's nodes on the way in; here the reports sit in one list sorted by id, their ids
//! shared with the plan's nodes, built in one pass in the plan's id order. It reads (and
//! serializes, as a JSON object) like the map it replaces.

use std::fmt;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::event::NodeReport;

/// One report per node, by node id: looked up by id (a binary search), iterated in id
/// order. Serialized as a JSON object keyed by node id, as a map would be.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeReports {
    /// Strictly increasing by id: one entry per id.
    entries: Vec<(Arc<str>, NodeReport)>,
}

impl NodeReports {
    /// No reports.
    pub fn new() -> Self {
        NodeReports::default()
    }

    /// From entries already in increasing id order (what a plan's id order gives): kept
    /// as they are, one pass to check the order. Entries out of order are sorted, and of
    /// several with one id the last is kept, as a map collected from them would.
    pub fn from_sorted(entries: Vec<(Arc<str>, NodeReport)>) -> Self {
        if entries.windows(2).all(|w| w[0].0 < w[1].0) {
            return NodeReports { entries };
        }
        Self::sort(entries)
    }

    /// Sorts `entries` by id (stable), keeping the last of several with one id.
    fn sort(mut entries: Vec<(Arc<str>, NodeReport)>) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        // `dedup_by` keeps the first of a run; reversed, the first is the last given.
        entries.reverse();
        entries.dedup_by(|a, b| a.0 == b.0);
        entries.reverse();
        NodeReports { entries }
    }

    /// How many nodes are reported on.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node is reported on.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, id: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| (**k).cmp(id))
    }

    /// Node `id`'s report.
    pub fn get(&self, id: &str) -> Option<&NodeReport> {
        self.position(id).ok().map(|i| &self.entries[i].1)
    }

    /// Node `id`'s report, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut NodeReport> {
        self.position(id).ok().map(|i| &mut self.entries[i].1)
    }

    /// Whether node `id` is reported on.
    pub fn contains_key(&self, id: &str) -> bool {
        self.position(id).is_ok()
    }

    /// Sets node `id`'s report, returning the one it replaces.
    pub fn insert(&mut self, id: impl Into<Arc<str>>, report: NodeReport) -> Option<NodeReport> {
        let id = id.into();
        match self.position(&id) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, report)),
            Err(i) => {
                self.entries.insert(i, (id, report));
                None
            }
        }
    }

    /// `(id, report)` in id order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.entries.iter())
    }

    /// The ids, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| &**k)
    }

    /// The reports, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &NodeReport> + ExactSizeIterator {
        self.entries.iter().map(|(_, r)| r)
    }

    /// The reports, in id order, to change.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut NodeReport> + ExactSizeIterator {
        self.entries.iter_mut().map(|(_, r)| r)
    }
}

/// `(id, report)` pairs of [`NodeReports`], in id order.
#[derive(Clone, Debug)]
pub struct Iter<'a>(std::slice::Iter<'a, (Arc<str>, NodeReport)>);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a NodeReport);
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, r)| (&**k, r))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, r)| (&**k, r))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a NodeReports {
    type Item = (&'a str, &'a NodeReport);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for NodeReports {
    type Item = (Arc<str>, NodeReport);
    type IntoIter = std::vec::IntoIter<(Arc<str>, NodeReport)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<K: Into<Arc<str>>> FromIterator<(K, NodeReport)> for NodeReports {
    fn from_iter<I: IntoIterator<Item = (K, NodeReport)>>(iter: I) -> Self {
        NodeReports::from_sorted(iter.into_iter().map(|(k, r)| (k.into(), r)).collect())
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
        let mut map = s.serialize_map(Some(self.entries.len()))?;
        for (k, r) in &self.entries {
            map.serialize_entry(&**k, r)?;
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
    #[should_panic(expected = "no report on node `x`")]
    fn indexing_a_node_without_a_report_panics_like_a_map() {
        let _ = &NodeReports::new()["x"];
    }
}
