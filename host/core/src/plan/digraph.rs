//! Graph algorithms over node positions (`adj[v]` lists the successors of `v`): cycles
//! reported as paths a user can trace, and a deterministic topological order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

/// Strongly connected components with more than one node (self-loops are reported per
/// edge), each rotated to start at its lowest position and listed along a cycle.
pub(super) fn cycles(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    // Tarjan, iterative so a long chain cannot overflow the stack.
    let n = adj.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut out = Vec::new();
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut call: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut i)) = call.last_mut() {
            if *i < adj[v].len() {
                let w = adj[v][*i];
                *i += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
            } else {
                call.pop();
                if let Some(&(u, _)) = call.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut comp = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        comp.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        out.push(cycle_path(adj, &comp));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// A cycle through the component's lowest node, following edges inside the component
/// (so the message reads as a path the user can trace in the graph).
fn cycle_path(adj: &[Vec<usize>], comp: &[usize]) -> Vec<usize> {
    let inside: HashSet<usize> = comp.iter().copied().collect();
    let start = *comp.iter().min().unwrap_or(&0);
    // BFS from start back to start within the component.
    let mut prev: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &adj[v] {
            if !inside.contains(&w) {
                continue;
            }
            if w == start {
                let mut path = vec![v];
                let mut cur = v;
                while cur != start {
                    cur = prev[&cur];
                    path.push(cur);
                }
                path.reverse();
                path.push(start);
                return path;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = prev.entry(w) {
                slot.insert(v);
                queue.push_back(w);
            }
        }
    }
    let mut c = comp.to_vec();
    c.sort();
    c
}

/// Kahn's algorithm, always taking the earliest ready node in document order so the plan
/// is deterministic and reads like the file. Nodes left in cycles (already reported) are
/// appended in document order.
pub(super) fn topo_order(adj: &[Vec<usize>]) -> Vec<usize> {
    let n = adj.len();
    let mut indeg = vec![0usize; n];
    for succ in adj {
        for &w in succ {
            indeg[w] += 1;
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&v| indeg[v] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    while let Some(Reverse(v)) = ready.pop() {
        order.push(v);
        placed[v] = true;
        for &w in &adj[v] {
            indeg[w] -= 1;
            if indeg[w] == 0 {
                ready.push(Reverse(w));
            }
        }
    }
    order.extend((0..n).filter(|&v| !placed[v]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_is_listed_along_its_edges() {
        // 0 -> 1 -> 2 -> 0, 3 alone.
        let adj = vec![vec![1], vec![2], vec![0], vec![]];
        assert_eq!(cycles(&adj), vec![vec![0, 1, 2, 0]]);
        assert_eq!(topo_order(&[vec![2], vec![0], vec![]]), vec![1, 0, 2]);
    }
}
