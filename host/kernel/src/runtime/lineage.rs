//! Lineage: which item of which iteration a value belongs to.
//!
//! A lineage is an ordered list of `(root, item index)` pairs, outermost root first, in
//! the static scope order computed by planning. Most values travel at root scope, so the
//! empty lineage is a `None` (no allocation, free to clone); a non-empty one is shared,
//! so routing a value to N edges costs N reference-count bumps, never N maps. It carries
//! its canonical text once someone asked for it: every node an item passes through names
//! its invocation by it, and it is written once per item, not once per node.

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use heddle_core::plan::{RootIdx, RootInfo};
use smallvec::SmallVec;

/// The item indices of a lineage projected onto a scope: the bucket key of the buffered
/// scheduler. Small and inline for the common depths (0–4).
pub type Key = SmallVec<[u32; 4]>;

/// Where a value sits in the graph's iterations: for each lineage root it descends from,
/// the index of its item. Cheap to clone (shared), empty at root scope.
#[derive(Clone, Default, Debug)]
pub struct Lineage(Option<Arc<Entries>>);

#[derive(Debug)]
struct Entries {
    items: SmallVec<[(RootIdx, u32); 2]>,
    /// The canonical text (see [`Lineage::text`]), written the first time it is read.
    text: OnceLock<Arc<str>>,
}

impl PartialEq for Lineage {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl Eq for Lineage {}

impl Hash for Lineage {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.entries().hash(state)
    }
}

impl Lineage {
    /// The lineage of values at root scope.
    pub const ROOT: Lineage = Lineage(None);

    /// Its (root, item index) pairs, outermost first.
    pub fn entries(&self) -> &[(RootIdx, u32)] {
        match &self.0 {
            Some(e) => &e.items,
            None => &[],
        }
    }

    /// How many roots it descends from.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether it is the root scope's.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The lineage of these (root, item index) pairs.
    pub fn from_entries(entries: &[(RootIdx, u32)]) -> Lineage {
        if entries.is_empty() {
            Lineage::ROOT
        } else {
            Lineage(Some(Arc::new(Entries {
                items: SmallVec::from_slice(entries),
                text: OnceLock::new(),
            })))
        }
    }

    /// Builds the lineage of key `key` over `scope` (same length).
    pub fn from_key(scope: &[RootIdx], key: &[u32]) -> Lineage {
        if scope.is_empty() {
            return Lineage::ROOT;
        }
        let e: SmallVec<[(RootIdx, u32); 4]> =
            scope.iter().copied().zip(key.iter().copied()).collect();
        Lineage::from_entries(&e)
    }

    /// The item index it has under `root`, if it descends from it.
    pub fn index_of(&self, root: RootIdx) -> Option<u32> {
        self.entries()
            .iter()
            .find(|(r, _)| *r == root)
            .map(|(_, i)| *i)
    }

    /// The outermost `n` entries (the lineage of a value at a shorter scope).
    pub fn truncate(&self, n: usize) -> Lineage {
        let e = self.entries();
        if n >= e.len() {
            self.clone()
        } else {
            Lineage::from_entries(&e[..n])
        }
    }

    /// This lineage with one more (innermost) entry: the lineage of a minted child.
    pub fn child(&self, root: RootIdx, index: u32) -> Lineage {
        let mut e: SmallVec<[(RootIdx, u32); 4]> = self.entries().iter().copied().collect();
        e.push((root, index));
        Lineage::from_entries(&e)
    }

    /// Projects onto `scope`: the item index of each of its roots. A root the lineage
    /// does not carry projects to `u32::MAX` (cannot happen in a planned graph, where
    /// every value's lineage covers its edge's scope).
    pub fn key(&self, scope: &[RootIdx]) -> Key {
        let e = self.entries();
        // Fast path: the lineage is in scope order and covers it.
        if e.len() >= scope.len() && e.iter().zip(scope).all(|((r, _), s)| r == s) {
            return e[..scope.len()].iter().map(|(_, i)| *i).collect();
        }
        scope
            .iter()
            .map(|s| self.index_of(*s).unwrap_or(u32::MAX))
            .collect()
    }

    /// [`Lineage::canonical`], shared: written once per lineage, whichever node asks
    /// first. `roots` must be the run's (a lineage never leaves its run).
    pub fn text(&self, roots: &[RootInfo]) -> Arc<str> {
        match &self.0 {
            Some(e) => e
                .text
                .get_or_init(|| Arc::from(self.canonical(roots)))
                .clone(),
            None => Arc::from(""),
        }
    }

    /// The canonical text form `root=index,...` (the invocation key events and the
    /// supervisor show), `""` at root scope.
    pub fn canonical(&self, roots: &[RootInfo]) -> String {
        let mut s = String::new();
        for (n, (r, i)) in self.entries().iter().enumerate() {
            if n > 0 {
                s.push(',');
            }
            let name = roots.get(*r as usize).map(|r| &*r.name).unwrap_or("?");
            let _ = write!(s, "{name}={i}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_lineage_is_free_and_empty() {
        assert!(Lineage::ROOT.is_empty());
        assert_eq!(Lineage::ROOT.key(&[]).len(), 0);
        assert_eq!(Lineage::from_entries(&[]), Lineage::ROOT);
    }

    #[test]
    fn child_truncate_and_key() {
        let a = Lineage::ROOT.child(0, 3).child(1, 7);
        assert_eq!(a.entries(), &[(0, 3), (1, 7)]);
        assert_eq!(a.truncate(1).entries(), &[(0, 3)]);
        assert_eq!(a.truncate(5), a);
        assert_eq!(a.key(&[0, 1]).as_slice(), &[3, 7]);
        assert_eq!(a.key(&[0]).as_slice(), &[3]);
        // Out-of-order scope falls back to lookup.
        assert_eq!(a.key(&[1]).as_slice(), &[7]);
        assert_eq!(Lineage::from_key(&[0, 1], &[3, 7]), a);
    }

    #[test]
    fn canonical_names_roots() {
        let roots = vec![
            RootInfo {
                name: "each:item".into(),
                node: 0,
            },
            RootInfo {
                name: "inner:item".into(),
                node: 1,
            },
        ];
        let a = Lineage::ROOT.child(0, 2).child(1, 0);
        assert_eq!(a.canonical(&roots), "each:item=2,inner:item=0");
        assert_eq!(Lineage::ROOT.canonical(&roots), "");
        // The shared text is the same, written once: every copy of the lineage sees it.
        let copy = a.clone();
        assert_eq!(&*a.text(&roots), "each:item=2,inner:item=0");
        assert!(Arc::ptr_eq(&a.text(&roots), &copy.text(&roots)));
        assert_eq!(a, Lineage::ROOT.child(0, 2).child(1, 0), "equal by entries");
    }
}
