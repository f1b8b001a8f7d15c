//! Lineage: which item of which iteration a value belongs to.
//!
//! A lineage is an ordered list of `(root, item index)` pairs, outermost root first, in
//! the static scope order computed by planning. It travels in every message, so it is one
//! word, and a message a data value plus 16 bytes:
//!
//! - at root scope (most values) it is a null word: no allocation, free to clone;
//! - one level deep (an item of one fan-out, the commonest non-root case) it is the pair
//!   itself, packed into the word: no allocation when an iterator mints it, and no
//!   reference count touched as it is cloned from hop to hop (on the fan-out bench,
//!   shared counts were three quarters of the time routing a value took);
//! - deeper, it is shared (`Arc`), so routing a value to N edges costs N reference-count
//!   bumps, never N maps, and it carries its canonical text once someone asked for it.

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use heddle_core::plan::{RootIdx, RootInfo};
use smallvec::SmallVec;

/// The item indices of a lineage projected onto a scope: the bucket key of the buffered
/// scheduler. Small and inline for the common depths (0–4).
pub type Key = SmallVec<[u32; 4]>;

/// Where a value sits in the graph's iterations: for each lineage root it descends from,
/// the index of its item. One word, cheap to clone, empty at root scope.
///
/// The word is null at root scope; odd for one entry packed in place (`index << 32 |
/// root << 1 | 1`, for a root below 2³¹ on a 64-bit target); otherwise a pointer from
/// [`Arc::into_raw`] to the shared entries (aligned, so even), which this value holds one
/// count of.
pub struct Lineage(*const Shared);

#[derive(Debug)]
struct Shared {
    items: SmallVec<[(RootIdx, u32); 2]>,
    /// The canonical text (see [`Lineage::text`]), written the first time it is read.
    text: OnceLock<Arc<str>>,
}

// SAFETY: a `Lineage` is either plain data (null, or a packed pair) or one count of an
// `Arc<Shared>`, and `Shared` is `Send + Sync` (a small vector of integers and a
// `OnceLock<Arc<str>>`): it is as thread-safe as the `Arc<Shared>` it stands for.
unsafe impl Send for Lineage {}
// SAFETY: as above; `&Lineage` only reads the word and, through it, a `&Shared`.
unsafe impl Sync for Lineage {}

/// What the word holds, decoded.
enum Repr<'a> {
    Root,
    One(RootIdx, u32),
    Many(&'a Shared),
}

/// The entries of a lineage, as a slice (see [`Lineage::entries`]).
pub enum Entries<'a> {
    /// Borrowed from the shared entries, or empty.
    Slice(&'a [(RootIdx, u32)]),
    /// The one packed entry, unpacked.
    One([(RootIdx, u32); 1]),
}

impl Deref for Entries<'_> {
    type Target = [(RootIdx, u32)];
    fn deref(&self) -> &[(RootIdx, u32)] {
        match self {
            Entries::Slice(s) => s,
            Entries::One(one) => one,
        }
    }
}

/// The packed word of one entry, when it fits in one.
fn pack(root: RootIdx, index: u32) -> Option<usize> {
    if cfg!(target_pointer_width = "64") && root < (1 << 31) {
        // On a 64-bit target `usize` holds the index shifted by 32 (the shift is
        // written as two, so a 32-bit build, which never gets here, still compiles).
        Some((((index as usize) << 16) << 16) | ((root as usize) << 1) | 1)
    } else {
        None
    }
}

impl Lineage {
    /// The lineage of values at root scope.
    pub const ROOT: Lineage = Lineage(std::ptr::null());

    /// Whether the word is a pointer to shared entries (neither null nor packed).
    #[inline(always)]
    fn is_shared(&self) -> bool {
        let bits = self.0.addr();
        bits != 0 && bits & 1 == 0
    }

    #[inline(always)]
    fn repr(&self) -> Repr<'_> {
        let bits = self.0.addr();
        if bits == 0 {
            Repr::Root
        } else if bits & 1 == 1 {
            Repr::One(((bits as u32) >> 1) as RootIdx, ((bits >> 16) >> 16) as u32)
        } else {
            // SAFETY: an even non-null word is a pointer from `Arc::into_raw` whose count
            // this value holds (see the type's doc), so the `Shared` lives while `self`
            // does.
            Repr::Many(unsafe { &*self.0 })
        }
    }

    /// Its (root, item index) pairs, outermost first.
    pub fn entries(&self) -> Entries<'_> {
        match self.repr() {
            Repr::Root => Entries::Slice(&[]),
            Repr::One(root, index) => Entries::One([(root, index)]),
            Repr::Many(s) => Entries::Slice(&s.items),
        }
    }

    /// How many roots it descends from.
    #[inline(always)]
    pub fn len(&self) -> usize {
        match self.repr() {
            Repr::Root => 0,
            Repr::One(..) => 1,
            Repr::Many(s) => s.items.len(),
        }
    }

    /// Whether it is the root scope's.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.0.is_null()
    }

    /// The lineage of these (root, item index) pairs.
    pub fn from_entries(entries: &[(RootIdx, u32)]) -> Lineage {
        if let [(root, index)] = entries
            && let Some(bits) = pack(*root, *index)
        {
            return Lineage(std::ptr::without_provenance(bits));
        }
        if entries.is_empty() {
            return Lineage::ROOT;
        }
        Lineage(Arc::into_raw(Arc::new(Shared {
            items: SmallVec::from_slice(entries),
            text: OnceLock::new(),
        })))
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
    #[inline(always)]
    pub fn truncate(&self, n: usize) -> Lineage {
        if self.is_empty() || n >= self.len() {
            self.clone()
        } else {
            Lineage::from_entries(&self.entries()[..n])
        }
    }

    /// [`Lineage::truncate`] of a lineage the caller is done with: moved, not cloned,
    /// when it is short enough already (no reference count touched).
    #[inline(always)]
    pub fn into_truncated(self, n: usize) -> Lineage {
        if self.is_empty() || n >= self.len() {
            self
        } else {
            self.truncate(n)
        }
    }

    /// This lineage with one more (innermost) entry: the lineage of a minted child.
    pub fn child(&self, root: RootIdx, index: u32) -> Lineage {
        if self.is_empty() {
            return Lineage::from_entries(&[(root, index)]);
        }
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

    /// [`Lineage::canonical`], shared: written once per lineage of two or more entries,
    /// whichever node asks first (a one-entry lineage has nowhere to keep it: its text,
    /// a few bytes, is written per call). `roots` must be the run's (a lineage never
    /// leaves its run).
    pub fn text(&self, roots: &[RootInfo]) -> Arc<str> {
        match self.repr() {
            Repr::Root => Arc::from(""),
            Repr::One(..) => Arc::from(self.canonical(roots)),
            Repr::Many(s) => s
                .text
                .get_or_init(|| Arc::from(self.canonical(roots)))
                .clone(),
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

impl Clone for Lineage {
    #[inline(always)]
    fn clone(&self) -> Lineage {
        if self.is_shared() {
            // SAFETY: the word is a live `Arc::into_raw` pointer (see `repr`); the new
            // count is the clone's, given back by its `drop`.
            unsafe { Arc::increment_strong_count(self.0) };
        }
        Lineage(self.0)
    }
}

impl Drop for Lineage {
    #[inline(always)]
    fn drop(&mut self) {
        if self.is_shared() {
            // SAFETY: the word is an `Arc::into_raw` pointer whose count this value holds
            // and gives back here, once.
            drop(unsafe { Arc::from_raw(self.0) });
        }
    }
}

impl Default for Lineage {
    fn default() -> Lineage {
        Lineage::ROOT
    }
}

impl std::fmt::Debug for Lineage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lineage").field(&&*self.entries()).finish()
    }
}

impl PartialEq for Lineage {
    fn eq(&self, other: &Self) -> bool {
        *self.entries() == *other.entries()
    }
}

impl Eq for Lineage {}

impl Hash for Lineage {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.entries()[..].hash(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn hash(l: &Lineage) -> u64 {
        let mut h = DefaultHasher::new();
        l.hash(&mut h);
        h.finish()
    }

    #[test]
    fn root_lineage_is_free_and_empty() {
        assert!(Lineage::ROOT.is_empty());
        assert_eq!(Lineage::ROOT.len(), 0);
        assert_eq!(Lineage::ROOT.key(&[]).len(), 0);
        assert_eq!(Lineage::from_entries(&[]), Lineage::ROOT);
        assert_eq!(Lineage::default(), Lineage::ROOT);
        assert_eq!(std::mem::size_of::<Lineage>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn child_truncate_and_key() {
        let a = Lineage::ROOT.child(0, 3).child(1, 7);
        assert_eq!(*a.entries(), [(0, 3), (1, 7)]);
        assert_eq!(*a.truncate(1).entries(), [(0, 3)]);
        assert_eq!(a.truncate(5), a);
        assert_eq!(a.key(&[0, 1]).as_slice(), &[3, 7]);
        assert_eq!(a.key(&[0]).as_slice(), &[3]);
        // Out-of-order scope falls back to lookup.
        assert_eq!(a.key(&[1]).as_slice(), &[7]);
        assert_eq!(Lineage::from_key(&[0, 1], &[3, 7]), a);
        assert_eq!(a.clone().into_truncated(1), a.truncate(1));
        assert_eq!(a.clone().into_truncated(2), a);
        assert_eq!(a.index_of(1), Some(7));
        assert_eq!(a.index_of(2), None);
    }

    /// One entry is packed into the word: every root and index that fits comes back as
    /// it went in, alike however it was made, and equal (and hashed alike) to the same
    /// entry made any other way.
    #[test]
    fn one_entry_round_trips_through_the_packed_word() {
        let roots = [0, 1, 2, 77, (1 << 31) - 1];
        let indices = [0, 1, 2, 255, 65_536, u32::MAX - 1, u32::MAX];
        for &r in &roots {
            for &i in &indices {
                let l = Lineage::ROOT.child(r, i);
                assert_eq!(*l.entries(), [(r, i)], "root {r} index {i}");
                assert_eq!(l.len(), 1);
                assert!(!l.is_empty());
                assert_eq!(l.index_of(r), Some(i));
                assert_eq!(l.key(&[r]).as_slice(), &[i]);
                let same = Lineage::from_entries(&[(r, i)]);
                assert_eq!(l, same);
                assert_eq!(hash(&l), hash(&same));
                // Truncated from a deeper (shared) lineage: equal to the packed one.
                let deep = l.child(r.wrapping_add(1), 5);
                assert_eq!(deep.len(), 2);
                assert_eq!(deep.truncate(1), l);
                assert_eq!(hash(&deep.truncate(1)), hash(&l));
                assert_eq!(*deep.truncate(1).entries(), [(r, i)]);
            }
        }
    }

    /// A root past what the word packs is still kept, shared, and equal to itself.
    #[test]
    fn a_root_too_large_to_pack_is_shared_instead() {
        for r in [1 << 31, u32::MAX] {
            let l = Lineage::ROOT.child(r, 9);
            assert_eq!(*l.entries(), [(r, 9)]);
            assert_eq!(l.clone(), l);
            assert_eq!(l.key(&[r]).as_slice(), &[9]);
        }
    }

    /// Clones and drops of a shared lineage keep its count right (the entries are freed
    /// with the last copy, never before), on any thread.
    #[test]
    fn shared_copies_count_and_cross_threads() {
        let a = Lineage::ROOT.child(0, 1).child(1, 2);
        let copies: Vec<Lineage> = (0..100).map(|_| a.clone()).collect();
        let moved = std::thread::spawn(move || {
            let total: u32 = copies.iter().map(|c| c.index_of(1).unwrap_or(0)).sum();
            drop(copies);
            total
        })
        .join()
        .expect("thread");
        assert_eq!(moved, 200);
        assert_eq!(*a.entries(), [(0, 1), (1, 2)]);
        let one = Lineage::ROOT.child(3, 4);
        let sent = std::thread::spawn(move || one).join().expect("thread");
        assert_eq!(*sent.entries(), [(3, 4)]);
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
        // A packed one writes the same text.
        assert_eq!(&*a.truncate(1).text(&roots), "each:item=2");
        assert_eq!(&*Lineage::ROOT.text(&roots), "");
        assert_eq!(format!("{:?}", a.truncate(1)), "Lineage([(0, 2)])");
    }
}
