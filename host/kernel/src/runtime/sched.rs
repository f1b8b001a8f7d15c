//! The correlated scheduler of a buffered node: per lineage key, which input
//! values are waiting and when a key is ready to fire.
//!
//! Owned by the node's actor task, so it needs no lock. Pure data: no tokio, unit-tested
//! on its own.
//!
//! Readiness of a key: every connected handle has a value for it, or can never get a
//! fresh one (its upstreams closed, the key's scope closed, or the key was dropped
//! upstream), and at least one handle brought a fresh value. Per handle class:
//! - `Max` (scope = invocation scope): a FIFO of fresh values per key; a firing takes one
//!   fresh value from every handle that has one. A handle without a fresh value reuses
//!   its last value for the key when it is closed, or when another handle is the node's
//!   repeating driver (so a driver fires once per envelope against sticky partners);
//! - `Prefix`: the latest value per parent key (sticky side input);
//! - `Empty`: one latest value (sticky, last wins);
//! - accumulating list handles (several edges into a list input) wait until they close,
//!   then deliver everything that arrived as one list.
//!
//! A handle with nothing to give at firing time is left out, so the node sees the
//! declared default (partial input fires with defaults).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use heddle_core::Value;
use heddle_core::plan::{HandleClass, RootIdx, RootInfo};
use smallvec::SmallVec;

use super::lineage::{Key, Lineage};

/// A connected data input handle as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct SchedHandle {
    /// The handle's name.
    pub name: Arc<str>,
    /// How it is bucketed (per key, sticky per parent key, one sticky value).
    pub class: HandleClass,
    /// The scope of its values.
    pub scope: Vec<RootIdx>,
    /// Its values accumulate into a list, ready when the handle closes.
    pub accumulates: bool,
    /// No more values will arrive on any of its edges.
    pub closed: bool,
    /// Data edges feeding it: more than one on a plain input only for a join of condition
    /// branches, where a key is done on the handle once every edge said so.
    pub edges: u32,
}

#[derive(Default, Debug)]
struct Slot {
    fresh: VecDeque<Value>,
    last: Option<Value>,
    /// Edges that dropped the key upstream on this handle (lineage_done).
    dones: u32,
    /// Positions in `fresh` (counted from the front) of entries a condition ruled out:
    /// placeholders that pair with the other handles' values like any message, and make
    /// the firing they end up in a veto. Empty unless an edge into the handle has a
    /// condition.
    ruled: SmallVec<[usize; 1]>,
    /// Messages (values and drops) received for the key: a handle fed by several edges
    /// keeps its bucket until each edge has spoken, so a late drop does not open a new
    /// one that waits forever.
    seen: u32,
}

#[derive(Debug)]
struct Bucket {
    slots: SmallVec<[Slot; 2]>,
    /// Set when a scope at this depth of the invocation scope closed over the key:
    /// handles whose scope reaches that depth get nothing more for it.
    closed_depth: Option<usize>,
    fired: bool,
}

/// Values for one firing: `(handle index, value)`; missing handles take their default.
pub type Firing = SmallVec<[(usize, Value); 2]>;

/// An inbox safety limit was exceeded; the run aborts with this message.
#[derive(Debug, Clone, PartialEq)]
pub struct Overflow(pub String);

/// An inbox's safety limits.
pub struct Limits {
    /// Lineage keys waiting to fire at once.
    pub max_pending_keys: usize,
    /// Messages waiting for one key.
    pub max_pending_messages_per_key: usize,
}

/// A buffered node's inbox: values bucketed per lineage key until every handle has
/// what the next firing needs.
pub struct Scheduler {
    node_id: Arc<str>,
    /// Its connected data input handles.
    pub handles: Vec<SchedHandle>,
    scope: Vec<RootIdx>,
    driver: Option<usize>,
    /// Keep fired buckets (their last values) until their scope closes: needed when a
    /// handle may bring several values per key.
    keep_fired: bool,
    buckets: HashMap<Key, Bucket>,
    /// Sticky values of `Prefix`/`Empty` handles, per handle, by projected key.
    sticky: Vec<HashMap<Key, Value>>,
    /// Sticky values a condition ruled out, per handle, by projected key.
    sticky_ruled: Vec<HashSet<Key>>,
    limits: Limits,
    roots: Arc<[RootInfo]>,
}

/// What a `lineage_done` led to.
#[derive(Debug, PartialEq)]
pub enum DoneEffect {
    /// Nothing to do yet.
    Wait,
    /// The key can fire now (partial input).
    Ready(Key),
    /// The key will never fire: the actor forwards the drop downstream.
    Dropped(Key),
}

impl Scheduler {
    /// The inbox of node `node_id` with these handles, invoked at `scope`.
    pub fn new(
        node_id: Arc<str>,
        handles: Vec<SchedHandle>,
        scope: Vec<RootIdx>,
        driver: Option<usize>,
        keep_fired: bool,
        limits: Limits,
        roots: Arc<[RootInfo]>,
    ) -> Self {
        let n = handles.len();
        Scheduler {
            node_id,
            handles,
            scope,
            driver,
            keep_fired: keep_fired || driver.is_some(),
            buckets: HashMap::new(),
            sticky: (0..n).map(|_| HashMap::new()).collect(),
            sticky_ruled: (0..n).map(|_| HashSet::new()).collect(),
            limits,
            roots,
        }
    }

    /// The scope the node is invoked at.
    pub fn scope(&self) -> &[RootIdx] {
        &self.scope
    }

    /// Keys waiting to fire.
    pub fn pending_keys(&self) -> usize {
        self.buckets.len()
    }

    fn key_text(&self, key: &Key) -> String {
        let l = Lineage::from_key(&self.scope[..key.len().min(self.scope.len())], key);
        let t = l.canonical(&self.roots);
        if t.is_empty() { "(root)".into() } else { t }
    }

    fn new_bucket(&self, h: usize) -> Result<Bucket, Overflow> {
        if self.buckets.len() >= self.limits.max_pending_keys {
            return Err(Overflow(format!(
                "Inbox for node \"{}\" exceeded max_pending_keys ({}) on handle \"{}\". Likely missing upstream close: a scope that never closes, or a join whose other input never arrives",
                self.node_id, self.limits.max_pending_keys, self.handles[h].name
            )));
        }
        Ok(Bucket {
            slots: (0..self.handles.len()).map(|_| Slot::default()).collect(),
            closed_depth: None,
            fired: false,
        })
    }

    /// Records a value arriving on handle `h`. Returns the key to re-check, or `None`
    /// when every pending key must be re-checked (a sticky value arrived).
    pub fn push(
        &mut self,
        h: usize,
        value: Value,
        lineage: &Lineage,
    ) -> Result<Option<Key>, Overflow> {
        match self.handles[h].class {
            HandleClass::Max => {
                let key = lineage.key(&self.scope);
                if !self.buckets.contains_key(&key) {
                    let b = self.new_bucket(h)?;
                    self.buckets.insert(key.clone(), b);
                }
                let limit = self.limits.max_pending_messages_per_key;
                // Inserted just above when missing.
                let slot = &mut self.buckets.get_mut(&key).expect("bucket exists").slots[h];
                if slot.fresh.len() >= limit {
                    return Err(Overflow(format!(
                        "Inbox for node \"{}\" exceeded max_pending_messages_per_key ({}) on handle \"{}\" for key \"{}\"",
                        self.node_id,
                        limit,
                        self.handles[h].name,
                        self.key_text(&key)
                    )));
                }
                slot.fresh.push_back(value);
                slot.seen += 1;
                Ok(Some(key))
            }
            HandleClass::Prefix | HandleClass::Empty => {
                let key = lineage.key(&self.handles[h].scope);
                self.sticky_ruled[h].remove(&key);
                self.sticky[h].insert(key, value);
                Ok(None)
            }
        }
    }

    fn handle_closed_for(&self, h: usize, b: &Bucket) -> bool {
        let hd = &self.handles[h];
        hd.closed || self.slot_done(h, b) || b.closed_depth.is_some_and(|d| hd.scope.len() > d)
    }

    /// Every edge of every handle fed by several edges has delivered or dropped the key.
    fn heard_all(&self, b: &Bucket) -> bool {
        self.handles
            .iter()
            .zip(&b.slots)
            .all(|(h, s)| h.edges <= 1 || h.class != HandleClass::Max || s.seen >= h.edges)
    }

    fn slot_done(&self, h: usize, b: &Bucket) -> bool {
        b.slots[h].dones >= self.handles[h].edges.max(1)
    }

    fn is_ready(&self, key: &Key, b: &Bucket) -> bool {
        let mut any_fresh = false;
        for (i, h) in self.handles.iter().enumerate() {
            let closed = self.handle_closed_for(i, b);
            match h.class {
                HandleClass::Max => {
                    let s = &b.slots[i];
                    if h.accumulates {
                        if !closed {
                            return false;
                        }
                        any_fresh |= !s.fresh.is_empty();
                    } else if !s.fresh.is_empty() {
                        any_fresh = true;
                    } else if !(closed || (s.last.is_some() && self.driver.is_some_and(|d| d != i)))
                    {
                        return false;
                    }
                }
                HandleClass::Prefix => {
                    let pk: Key = key[..h.scope.len().min(key.len())]
                        .iter()
                        .copied()
                        .collect();
                    if !(closed || self.sticky[i].contains_key(&pk)) {
                        return false;
                    }
                }
                HandleClass::Empty => {
                    if !(closed || self.sticky[i].contains_key(&Key::new())) {
                        return false;
                    }
                }
            }
        }
        any_fresh
    }

    /// Takes one firing for `key` if it is ready.
    pub fn take(&mut self, key: &Key) -> Option<Firing> {
        self.take_ruled(key).map(|(f, _)| f)
    }

    /// Takes one firing for `key` if it is ready, and whether a condition vetoed it
    /// (the node must not run for it).
    pub fn take_ruled(&mut self, key: &Key) -> Option<(Firing, bool)> {
        let b = self.buckets.get(key)?;
        if !self.is_ready(key, b) {
            return None;
        }
        let mut vetoed = false;
        let mut firing = Firing::new();
        let b = self.buckets.get_mut(key)?;
        b.fired = true;
        for (i, h) in self.handles.iter().enumerate() {
            match h.class {
                HandleClass::Max => {
                    let s = &mut b.slots[i];
                    if h.accumulates {
                        vetoed |= !s.ruled.is_empty();
                        s.ruled.clear();
                        let all: Vec<Value> = s.fresh.drain(..).collect();
                        firing.push((i, Value::list(all)));
                    } else if let Some(v) = s.fresh.pop_front() {
                        if s.ruled.first() == Some(&0) {
                            s.ruled.remove(0);
                            vetoed = true;
                        } else {
                            s.last = Some(v.clone());
                        }
                        for r in s.ruled.iter_mut() {
                            *r -= 1;
                        }
                        firing.push((i, v));
                    } else if let Some(v) = &s.last {
                        firing.push((i, v.clone()));
                    }
                }
                HandleClass::Prefix => {
                    let pk: Key = key[..h.scope.len().min(key.len())]
                        .iter()
                        .copied()
                        .collect();
                    vetoed |= self.sticky_ruled[i].contains(&pk);
                    if let Some(v) = self.sticky[i].get(&pk) {
                        firing.push((i, v.clone()));
                    }
                }
                HandleClass::Empty => {
                    vetoed |= self.sticky_ruled[i].contains(&Key::new());
                    if let Some(v) = self.sticky[i].get(&Key::new()) {
                        firing.push((i, v.clone()));
                    }
                }
            }
        }
        let b = &self.buckets[key];
        let empty = b.slots.iter().all(|s| s.fresh.is_empty());
        if empty && !key.is_empty() && !self.keep_fired && self.heard_all(b) {
            self.buckets.remove(key);
        }
        Some((firing, vetoed))
    }

    /// Every key that is ready now, in key order (deterministic firing order).
    pub fn ready_keys(&self) -> Vec<Key> {
        let mut v: Vec<Key> = self
            .buckets
            .iter()
            .filter(|(k, b)| self.is_ready(k, b))
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// Handle `h` gets no more values (all its edges closed).
    pub fn close_handle(&mut self, h: usize) {
        self.handles[h].closed = true;
    }

    /// A scope closed: root at `depth` of the invocation scope, under parent key
    /// `parent` (the indices of the roots before it). Marks the keys under it.
    pub fn close_scope(&mut self, parent: &[u32], depth: usize) {
        for (k, b) in self.buckets.iter_mut() {
            if k.len() > depth && k[..depth] == *parent {
                b.closed_depth = Some(b.closed_depth.map_or(depth, |d| d.min(depth)));
            }
        }
    }

    /// Whether a key under the closed scope (`parent` at `depth`) still holds values
    /// that have not fired: its items wait for a side input, so the scope is not settled.
    pub fn pending_under(&self, parent: &[u32], depth: usize) -> bool {
        self.buckets.iter().any(|(k, b)| {
            k.len() > depth && k[..depth] == *parent && b.slots.iter().any(|s| !s.fresh.is_empty())
        })
    }

    /// After a scope closed and its ready keys fired: forgets what can never fire again
    /// under it (buckets without fresh values, sticky values of deeper handles).
    pub fn retire_scope(&mut self, parent: &[u32], depth: usize) {
        self.buckets.retain(|k, b| {
            !(k.len() > depth
                && k[..depth] == *parent
                && b.slots.iter().all(|s| s.fresh.is_empty()))
        });
        for (i, h) in self.handles.iter().enumerate() {
            if h.scope.len() > depth {
                self.sticky[i].retain(|k, _| !(k.len() > depth && k[..depth] == *parent));
            }
        }
    }

    /// `lineage_done` on handle `h`: no value will come for this key on it.
    pub fn done(&mut self, h: usize, lineage: &Lineage) -> Result<DoneEffect, Overflow> {
        if self.handles[h].class != HandleClass::Max {
            return Ok(DoneEffect::Wait);
        }
        let key = lineage.key(&self.scope);
        if !self.buckets.contains_key(&key) {
            let b = self.new_bucket(h)?;
            self.buckets.insert(key.clone(), b);
        }
        let b = self.buckets.get_mut(&key).expect("bucket exists");
        b.slots[h].dones += 1;
        b.slots[h].seen += 1;
        let b = &self.buckets[&key];
        if b.fired
            && !key.is_empty()
            && !self.keep_fired
            && b.slots.iter().all(|s| s.fresh.is_empty())
            && self.heard_all(b)
        {
            // The last edge of a branch join dropped a key that already fired.
            self.buckets.remove(&key);
            return Ok(DoneEffect::Wait);
        }
        let all_done = self
            .handles
            .iter()
            .enumerate()
            .filter(|(_, hd)| hd.class == HandleClass::Max)
            .all(|(i, _)| self.slot_done(i, b));
        let nothing = b
            .slots
            .iter()
            .all(|s| s.fresh.is_empty() && s.last.is_none());
        if all_done && nothing && !b.fired {
            self.buckets.remove(&key);
            return Ok(DoneEffect::Dropped(key));
        }
        let b = &self.buckets[&key];
        if self.is_ready(&key, b) {
            Ok(DoneEffect::Ready(key))
        } else {
            Ok(DoneEffect::Wait)
        }
    }

    /// An edge's condition ruled out one message on handle `h`: it takes a message's
    /// place (so it pairs with the other handles' values in arrival order), and the
    /// firing it lands in is vetoed ([`Scheduler::take`] says so). On a sticky handle
    /// the projected key stays vetoed until a value replaces it.
    pub fn rule_out(&mut self, h: usize, lineage: &Lineage) -> Result<Option<Key>, Overflow> {
        let r = self.push(h, Value::Null, lineage)?;
        match self.handles[h].class {
            HandleClass::Max => {
                let key = lineage.key(&self.scope);
                // `push` created the bucket.
                let slot = &mut self.buckets.get_mut(&key).expect("bucket exists").slots[h];
                slot.ruled.push(slot.fresh.len() - 1);
            }
            HandleClass::Prefix | HandleClass::Empty => {
                self.sticky_ruled[h].insert(lineage.key(&self.handles[h].scope));
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, class: HandleClass, scope: Vec<RootIdx>) -> SchedHandle {
        SchedHandle {
            name: name.into(),
            class,
            scope,
            accumulates: false,
            closed: false,
            edges: 1,
        }
    }

    fn roots() -> Arc<[RootInfo]> {
        vec![
            RootInfo {
                name: "each:item".into(),
                node: 0,
            },
            RootInfo {
                name: "inner:item".into(),
                node: 1,
            },
        ]
        .into()
    }

    fn limits() -> Limits {
        Limits {
            max_pending_keys: 100,
            max_pending_messages_per_key: 100,
        }
    }

    fn vals(f: &Firing) -> Vec<(usize, i64)> {
        f.iter().map(|(i, v)| (*i, v.as_i64().unwrap())).collect()
    }

    #[test]
    fn max_handles_pair_by_key_whatever_the_arrival_order() {
        let mut s = Scheduler::new(
            "join".into(),
            vec![
                h("a", HandleClass::Max, vec![0]),
                h("b", HandleClass::Max, vec![0]),
            ],
            vec![0],
            None,
            false,
            limits(),
            roots(),
        );
        let l = |i| Lineage::ROOT.child(0, i);
        let k2 = s.push(0, Value::Int(20), &l(2)).unwrap().unwrap();
        assert!(s.take(&k2).is_none());
        let k0 = s.push(1, Value::Int(100), &l(0)).unwrap().unwrap();
        assert!(s.take(&k0).is_none());
        let k2b = s.push(1, Value::Int(102), &l(2)).unwrap().unwrap();
        assert_eq!(vals(&s.take(&k2b).unwrap()), vec![(0, 20), (1, 102)]);
        assert_eq!(s.pending_keys(), 1, "fired key retired");
        s.push(0, Value::Int(0), &l(0)).unwrap();
        assert_eq!(vals(&s.take(&k0).unwrap()), vec![(0, 0), (1, 100)]);
        assert_eq!(s.pending_keys(), 0);
    }

    #[test]
    fn prefix_is_sticky_per_parent_and_empty_is_sticky_last_wins() {
        let mut s = Scheduler::new(
            "n".into(),
            vec![
                h("item", HandleClass::Max, vec![0, 1]),
                h("side", HandleClass::Prefix, vec![0]),
                h("cfg", HandleClass::Empty, vec![]),
            ],
            vec![0, 1],
            None,
            false,
            limits(),
            roots(),
        );
        let l = |a, b| Lineage::ROOT.child(0, a).child(1, b);
        let k = s.push(0, Value::Int(1), &l(0, 0)).unwrap().unwrap();
        assert!(s.take(&k).is_none());
        assert_eq!(
            s.push(1, Value::Int(10), &Lineage::ROOT.child(0, 0))
                .unwrap(),
            None
        );
        assert!(s.ready_keys().is_empty(), "cfg still missing");
        s.push(2, Value::Int(7), &Lineage::ROOT).unwrap();
        s.push(2, Value::Int(8), &Lineage::ROOT).unwrap();
        assert_eq!(s.ready_keys(), vec![k.clone()]);
        assert_eq!(vals(&s.take(&k).unwrap()), vec![(0, 1), (1, 10), (2, 8)]);
        // Same parent, another item: side input reused.
        let k2 = s.push(0, Value::Int(2), &l(0, 1)).unwrap().unwrap();
        assert_eq!(vals(&s.take(&k2).unwrap()), vec![(0, 2), (1, 10), (2, 8)]);
        // Another parent: waits for its own side value.
        let k3 = s.push(0, Value::Int(3), &l(1, 0)).unwrap().unwrap();
        assert!(s.take(&k3).is_none());
        s.push(1, Value::Int(11), &Lineage::ROOT.child(0, 1))
            .unwrap();
        assert_eq!(vals(&s.take(&k3).unwrap()), vec![(0, 3), (1, 11), (2, 8)]);
    }

    #[test]
    fn repeating_driver_fires_per_envelope_against_sticky_partner() {
        let mut s = Scheduler::new(
            "n".into(),
            vec![
                h("a", HandleClass::Max, vec![]),
                h("b", HandleClass::Max, vec![]),
            ],
            vec![],
            Some(0),
            true,
            limits(),
            roots(),
        );
        let k = s.push(1, Value::Int(100), &Lineage::ROOT).unwrap().unwrap();
        assert!(s.take(&k).is_none());
        let mut out = Vec::new();
        for i in 0..3 {
            s.push(0, Value::Int(i), &Lineage::ROOT).unwrap();
            out.push(vals(&s.take(&k).unwrap()));
        }
        assert_eq!(
            out,
            vec![
                vec![(0, 0), (1, 100)],
                vec![(0, 1), (1, 100)],
                vec![(0, 2), (1, 100)]
            ]
        );
    }

    #[test]
    fn closed_handle_lets_partial_input_fire_and_accumulating_waits_for_close() {
        let mut acc = h("xs", HandleClass::Max, vec![]);
        acc.accumulates = true;
        let mut s = Scheduler::new(
            "n".into(),
            vec![acc, h("b", HandleClass::Max, vec![])],
            vec![],
            None,
            false,
            limits(),
            roots(),
        );
        let k = s.push(0, Value::Int(1), &Lineage::ROOT).unwrap().unwrap();
        s.push(0, Value::Int(2), &Lineage::ROOT).unwrap();
        assert!(s.take(&k).is_none());
        s.close_handle(0);
        assert!(s.take(&k).is_none(), "b still open");
        s.close_handle(1);
        let f = s.take(&k).unwrap();
        assert_eq!(f.len(), 1, "b left out: default applies");
        assert_eq!(f[0].1, Value::list(vec![Value::Int(1), Value::Int(2)]));
        assert!(s.take(&k).is_none());
    }

    #[test]
    fn scope_close_fires_partial_keys_and_retires_them() {
        let mut s = Scheduler::new(
            "n".into(),
            vec![
                h("a", HandleClass::Max, vec![0]),
                h("b", HandleClass::Max, vec![0]),
            ],
            vec![0],
            None,
            false,
            limits(),
            roots(),
        );
        let k = s
            .push(0, Value::Int(5), &Lineage::ROOT.child(0, 4))
            .unwrap()
            .unwrap();
        assert!(s.take(&k).is_none());
        s.close_scope(&[], 0);
        assert_eq!(s.ready_keys(), vec![k.clone()]);
        assert_eq!(vals(&s.take(&k).unwrap()), vec![(0, 5)]);
        s.retire_scope(&[], 0);
        assert_eq!(s.pending_keys(), 0);
    }

    #[test]
    fn lineage_done_drops_or_releases_keys() {
        let mut s = Scheduler::new(
            "n".into(),
            vec![
                h("a", HandleClass::Max, vec![0]),
                h("b", HandleClass::Max, vec![0]),
            ],
            vec![0],
            None,
            false,
            limits(),
            roots(),
        );
        let l = |i| Lineage::ROOT.child(0, i);
        assert_eq!(s.done(0, &l(1)).unwrap(), DoneEffect::Wait);
        assert!(matches!(s.done(1, &l(1)).unwrap(), DoneEffect::Dropped(_)));
        s.push(0, Value::Int(3), &l(2)).unwrap();
        assert!(matches!(s.done(1, &l(2)).unwrap(), DoneEffect::Ready(_)));
    }

    #[test]
    fn limits_name_node_handle_and_key() {
        let mut s = Scheduler::new(
            "join".into(),
            vec![
                h("a", HandleClass::Max, vec![0]),
                h("b", HandleClass::Max, vec![0]),
            ],
            vec![0],
            None,
            false,
            Limits {
                max_pending_keys: 2,
                max_pending_messages_per_key: 2,
            },
            roots(),
        );
        let l = |i| Lineage::ROOT.child(0, i);
        s.push(0, Value::Int(0), &l(0)).unwrap();
        s.push(0, Value::Int(0), &l(0)).unwrap();
        let e = s.push(0, Value::Int(0), &l(0)).unwrap_err();
        assert_eq!(
            e.0,
            "Inbox for node \"join\" exceeded max_pending_messages_per_key (2) on handle \"a\" for key \"each:item=0\""
        );
        s.push(1, Value::Int(0), &l(1)).unwrap();
        let e = s.push(1, Value::Int(0), &l(2)).unwrap_err();
        assert!(
            e.0.starts_with(
                "Inbox for node \"join\" exceeded max_pending_keys (2) on handle \"b\"."
            ),
            "{}",
            e.0
        );
    }
}
