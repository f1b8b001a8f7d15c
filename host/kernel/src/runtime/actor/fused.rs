//! Fused groups: native nodes fed by one edge from another native node run in their
//! producer's task, as futures its group polls in turn, and their inbox is a local queue
//! instead of a channel (see [`super::link`]).
//!
//! An actor is a logical unit, not necessarily a task. Between two native nodes a
//! channel hop (slot protocol, semaphore, a wake-up and a task switch per batch) costs
//! more than the node's work; in one group the hop is a push into a queue that the next
//! member drains on the same pass. Every member still runs its own actor code, so its
//! events, counters, backpressure (the queue has the inbox's capacity), cancellation and
//! outcome are what they would be in a task of its own.
//!
//! What joins its producer's group: a buffered native node (a built-in or an output
//! node) with exactly one incoming edge, a data edge from another native node (or an
//! input node), and no controller. A streaming-input node (`heddle.collect`) keeps its
//! own task: its executor reads a stream of its own, and polling that on every pass of
//! the group made the fan-out bench slower, not faster. So a group is a tree rooted at its head, every member reached by
//! one edge from an earlier one. Nodes that do real work (WASM, code, test nodes) keep a
//! task of their own: they may run long, and on a multi-thread runtime they run in
//! parallel with their neighbours.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::Poll;

use heddle_core::NodeMode;
use heddle_core::graph::EdgeType;
use heddle_core::plan::{Plan, PlanNode};

use super::link::{self, LocalProbe};
use super::{Actor, ActorReport, Inbox, Link};
use crate::runtime::{INPUT_TYPE, OUTPUT_TYPE};

/// Runs a member to its end; boxed, as its task's future would be.
type MemberFuture = Pin<Box<dyn Future<Output = Box<ActorReport>> + Send>>;

/// Where a node runs, decided from the plan before any actor starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A task of its own (or inline, as the runner decides).
    Alone,
    /// The head of group `g`.
    Head(u32),
    /// A member of group `g`, fed by `edge` (its one incoming edge) from `upstream`.
    /// (Indices as `u32`, as the plan's: a place per node is 16 bytes.)
    Member {
        group: u32,
        edge: u32,
        upstream: u32,
    },
}

/// The fused groups of a run, and the actors collected for them until they start.
pub(crate) struct Fusion {
    places: Vec<Place>,
    /// See [`depths`].
    depth: Vec<u32>,
    /// Per group: its actors (by plan index), added as the runner builds them. Boxed
    /// where they will live: held in place, a long chain's table of actors would be
    /// copied as it grows, and again into each member's future.
    groups: Vec<Vec<(usize, Box<Actor>)>>,
}

/// Nodes per group along a chain on a multi-thread runtime: long enough that a hop
/// between groups (a channel, a wake-up) is rare, short enough that a 100-node chain
/// keeps both workers of a 2-core machine busy.
const SPAN: u32 = 16;

/// Passes over its members a group makes per poll of its task before it yields: a pass
/// moves at most a queue's capacity per member, so this bounds how long a group holds a
/// worker while a large fan-out flows through it.
const PASSES_PER_POLL: usize = 64;

/// Each node's distance from the first node up its chain of feeding edges (0 for a node
/// no such edge feeds); each found once, so a long chain is one walk.
fn depths(plan: &Plan, feed: &[Option<u32>]) -> Vec<u32> {
    const UNKNOWN: u32 = u32::MAX;
    let mut depth = vec![UNKNOWN; feed.len()];
    let mut path = Vec::new();
    for i in 0..feed.len() {
        let mut at = i;
        // Up to a node whose depth is known or that nothing feeds (bounded: a plan has
        // no cycles, and a malformed one stops after every node was visited once).
        let base = loop {
            if depth[at] != UNKNOWN {
                break depth[at];
            }
            match feed[at] {
                Some(e) if path.len() <= feed.len() => {
                    path.push(at);
                    at = plan.edges[e as usize].source as usize;
                }
                _ => {
                    depth[at] = 0;
                    break 0;
                }
            }
        };
        for (k, node) in path.drain(..).rev().enumerate() {
            depth[node] = base + 1 + k as u32;
        }
    }
    depth
}

/// Nodes whose work is the kernel's own and cheap: they may share a task.
fn native(node: &PlanNode) -> bool {
    &*node.node_type == INPUT_TYPE
        || &*node.node_type == OUTPUT_TYPE
        || node.decl.origin == heddle_core::Origin::Builtin
}

impl Fusion {
    pub fn new(plan: &Plan) -> Fusion {
        let n = plan.nodes.len();
        // The edge feeding each node that may join its producer's group.
        let feed: Vec<Option<u32>> = plan
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let &[e] = node.in_edges.as_slice() else {
                    return None;
                };
                let edge = &plan.edges[e as usize];
                let src = &plan.nodes[edge.source as usize];
                let joins = edge.edge_type == EdgeType::Data
                    && node.controllers.is_empty()
                    && &*node.node_type != INPUT_TYPE
                    && edge.source as usize != i
                    && native(node)
                    && node.decl.mode == NodeMode::Buffered
                    && native(src)
                    && !controls(plan, node)
                    && !controls(plan, src);
                joins.then_some(e)
            })
            .collect();
        // On a multi-thread runtime a long chain is cut every `SPAN` nodes, so its groups
        // can run on different workers; on one thread, a cut would only add hops.
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1);
        let span = if workers > 1 { SPAN } else { u32::MAX };
        let depth = depths(plan, &feed);
        let feed: Vec<Option<u32>> = feed
            .iter()
            .zip(&depth)
            .map(|(f, d)| f.filter(|_| d % span != 0))
            .collect();
        // Each node's group head: the first node up its feeding edges that does not join
        // its producer. Found in order of depth, so a producer's is known before its
        // consumer's. (A malformed plan's cycle leaves a head unknown: such a node stays
        // alone.)
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_unstable_by_key(|&i| depth[i]);
        let mut head: Vec<Option<usize>> = vec![None; n];
        for i in order {
            head[i] = match feed[i] {
                None => Some(i),
                Some(e) => head[plan.edges[e as usize].source as usize],
            };
        }
        let mut places = vec![Place::Alone; n];
        let mut group_of_head: Vec<Option<u32>> = vec![None; n];
        let mut groups: u32 = 0;
        for i in 0..n {
            let (Some(e), Some(h)) = (feed[i], head[i]) else {
                continue;
            };
            if h == i {
                continue;
            }
            let g = *group_of_head[h].get_or_insert_with(|| {
                groups += 1;
                groups - 1
            });
            places[h] = Place::Head(g);
            places[i] = Place::Member {
                group: g,
                edge: e,
                upstream: plan.edges[e as usize].source,
            };
        }
        // Each group's list sized to its members (head included): a long chain's one
        // group would otherwise grow by doubling while every actor is being built.
        let mut sizes = vec![1usize; groups as usize];
        for p in &places {
            if let Place::Member { group, .. } = p {
                sizes[*group as usize] += 1;
            }
        }
        Fusion {
            places,
            depth,
            groups: sizes.into_iter().map(Vec::with_capacity).collect(),
        }
    }

    /// Whether node `i` is fed through a local queue by its producer's group: such a
    /// node needs no inbox channel (nor the slot one would be made in).
    pub fn fed_locally(&self, i: usize) -> bool {
        matches!(self.places.get(i), Some(Place::Member { .. }))
    }

    /// Takes node `i`'s actor if it runs in a group; hands it back if it runs alone.
    pub fn take(&mut self, i: usize, a: Box<Actor>) -> Option<Box<Actor>> {
        match self.places[i] {
            Place::Alone => Some(a),
            Place::Head(g) | Place::Member { group: g, .. } => {
                self.groups[g as usize].push((i, a));
                None
            }
        }
    }

    /// Every group, wired (each member's inbox a local queue its producer's edge feeds)
    /// and ready to spawn: the nodes it runs and the future that runs them, which ends
    /// with their reports in the same order.
    pub fn into_groups(self) -> Vec<(Vec<usize>, Group)> {
        let (places, depth) = (self.places, self.depth);
        self.groups
            .into_iter()
            .map(|members| {
                let order: Vec<usize> = members.iter().map(|(i, _)| *i).collect();
                (order, wire(&places, &depth, members))
            })
            .collect()
    }
}

/// Orders a group (every member after its producer) and links each member to its
/// producer through a local queue.
fn wire(places: &[Place], depth: &[u32], mut members: Vec<(usize, Box<Actor>)>) -> Group {
    // Every member after its producer (one edge deeper).
    members.sort_by_key(|(i, _)| depth[*i]);
    // Each member's place in that order, by plan index: a sorted list searched by
    // halves, the size of its entries (a hash map of a 10,000-node chain's group was
    // ~28 bytes a member more, alive at the run's peak).
    let mut pos: Vec<(usize, usize)> = members
        .iter()
        .enumerate()
        .map(|(p, (i, _))| (*i, p))
        .collect();
    pos.sort_unstable();
    let pos_of = |i: usize| {
        pos[pos
            .binary_search_by_key(&i, |(i, _)| *i)
            .expect("a member's producer is in its group")]
        .1
    };
    let mut probes = Vec::with_capacity(members.len());
    for m in 0..members.len() {
        let Place::Member { edge, upstream, .. } = places[members[m].0] else {
            continue;
        };
        let (tx, rx, probe) = link::local(members[m].1.shared.limits.buffer);
        members[m].1.spec.rx = Inbox::local(rx);
        probes.push(probe);
        // The producer is in the group (it is this member's head or another member); its
        // edge into this member now feeds the queue. Without such an edge (the handle
        // is not connected) the queue is closed at once, as the channel would be.
        let producer = &mut members[pos_of(upstream as usize)].1;
        if let Some(e) = producer
            .spec
            .ports
            .iter_mut()
            .flat_map(|p| p.edges.iter_mut())
            .find(|e| e.index == edge)
        {
            e.tx = Link::Local(tx);
        }
    }
    Group {
        members: members
            .into_iter()
            .map(|(i, a)| (i, Box::pin(a.run()) as MemberFuture))
            .collect(),
        probes,
    }
}

/// The future of one group: polls its members in order (every producer before what it
/// feeds) until a whole pass moves nothing, so a batch travels the group in one pass.
pub(crate) struct Group {
    members: Vec<(usize, MemberFuture)>,
    probes: Vec<LocalProbe>,
}

/// What a member left: its report, or the message of the panic that ended it.
pub(crate) type MemberEnd = Result<Box<ActorReport>, String>;

impl Group {
    /// A member that panics ends alone, as its task would: its future is dropped (its
    /// queues close, as its channels would) and the others go on.
    pub async fn run(self) -> Vec<(usize, MemberEnd)> {
        let Group {
            mut members,
            probes,
        } = self;
        let mut done = Vec::with_capacity(members.len());
        std::future::poll_fn(|cx| {
            for _ in 0..PASSES_PER_POLL {
                let mut moved = false;
                members.retain_mut(|(i, f)| {
                    let polled = catch_unwind(AssertUnwindSafe(|| f.as_mut().poll(cx)));
                    let end = match polled {
                        Ok(Poll::Pending) => return true,
                        Ok(Poll::Ready(r)) => Ok(r),
                        Err(payload) => Err(panic_message(&*payload)),
                    };
                    done.push((*i, end));
                    moved = true;
                    false
                });
                if members.is_empty() {
                    return Poll::Ready(());
                }
                // Every probe is asked (each resets its flag): no short-circuit.
                for p in &probes {
                    moved |= p.moved();
                }
                // Nothing moved: every member waits on something outside the group
                // (its channel, room downstream, its executor, the cancel token), which
                // wakes this task; none waits on a queue alone (an empty queue's
                // producer, or a full queue's consumer, is then waiting outside).
                if !moved {
                    return Poll::Pending;
                }
            }
            // Still moving (a large fan-out inside the group): yield to the runtime's
            // other tasks, as separate actors would have at their full inboxes, and
            // carry on at the next poll.
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
        done
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match payload.downcast_ref::<&str>() {
        Some(s) => (*s).to_string(),
        None => match payload.downcast_ref::<String>() {
            Some(s) => s.clone(),
            None => "a panic without a message".to_string(),
        },
    }
}

/// Whether `node` is a controller: its invocations wait for the replies of the nodes it
/// controls, which a fused group's one-at-a-time driver must not do.
fn controls(plan: &heddle_core::plan::Plan, node: &heddle_core::plan::PlanNode) -> bool {
    node.out_edges
        .iter()
        .any(|&e| plan.edges[e as usize].edge_type == EdgeType::Control)
}

#[cfg(test)]
mod tests {
    /// A place per node of the run, decided before any actor starts (64-bit targets).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_place_is_16_bytes() {
        assert_eq!(std::mem::size_of::<super::Place>(), 16);
    }
}
