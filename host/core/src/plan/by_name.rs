//! [`ByName`]: a plan's per-node table of handles, sized to what the node has.
//!
//! A plan keeps one input table and one output table per node, and a node has a handful
//! of handles (one or two on most). A `BTreeMap` allocates a whole leaf (room for 11
//! entries, over 600 bytes here) for the first one, which made these tables about 1.2 KB
//! of every node's memory on a large graph. The tables are built once and then only
//! read, so a sorted boxed slice with a binary search by name gives the same lookups and
//! the same name order in exactly the space the entries need.

use std::collections::BTreeMap;
use std::ops::Index;
use std::sync::Arc;

/// Entries sorted by handle name, unique names; read-only once built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByName<V>(Box<[(Arc<str>, V)]>);

impl<V> Default for ByName<V> {
    fn default() -> Self {
        Self(Box::default())
    }
}

impl<V> ByName<V> {
    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.position(name).map(|i| &self.0[i].1)
    }

    /// Whether `name` is in the map.
    pub fn contains_key(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// Index of `name` in name order (the order of [`ByName::iter`]).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(name)).ok()
    }

    /// Entries in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&Arc<str>, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The names, in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &Arc<str>> {
        self.0.iter().map(|(k, _)| k)
    }

    /// The values, in the order of their names.
    pub fn values(&self) -> impl ExactSizeIterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    /// How many entries it has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The map's order and uniqueness carry over as they are.
impl<V> From<BTreeMap<Arc<str>, V>> for ByName<V> {
    fn from(m: BTreeMap<Arc<str>, V>) -> Self {
        Self(m.into_iter().collect())
    }
}

/// Like collecting into a map: sorted by name, and a later entry for a name replaces an
/// earlier one.
impl<V> FromIterator<(Arc<str>, V)> for ByName<V> {
    fn from_iter<I: IntoIterator<Item = (Arc<str>, V)>>(it: I) -> Self {
        it.into_iter().collect::<BTreeMap<_, _>>().into()
    }
}

impl<V> Index<&str> for ByName<V> {
    type Output = V;

    /// Panics when there is no entry for `name`, like a map's index.
    fn index(&self, name: &str) -> &V {
        match self.get(name) {
            Some(v) => v,
            None => panic!("no handle {name:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_order_match_a_map() {
        let t: ByName<u32> = [("b", 2), ("a", 1), ("c", 3), ("a", 4)]
            .into_iter()
            .map(|(k, v)| (Arc::from(k), v))
            .collect();
        assert_eq!(t.len(), 3);
        assert_eq!(t.keys().map(|k| &**k).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(
            t.get("a"),
            Some(&4),
            "a later entry replaces an earlier one"
        );
        assert_eq!(t["c"], 3);
        assert_eq!(t.position("b"), Some(1));
        assert!(!t.contains_key("d"));
        assert!(ByName::<u32>::default().is_empty());
    }
}
