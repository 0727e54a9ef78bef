//! Dependency cycles, found in time linear in what is reachable.
//!
//! Both doors check for cycles: `todo_write` before a write lands, the authority after a
//! merge. A walk per task (with a copied path per step) costs about the cube of a
//! chain's length: a peer that uploaded 2,000 tasks each blocked by the one before held
//! the hub's task for over a minute. Here every task is visited once per check
//! (iterative Tarjan), whatever the shape of the graph.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The dependency cycles among the tasks reachable from `starts` through `deps` (a
/// task's dependencies that are tasks, itself excluded), one per strongly connected
/// component of two tasks or more, each as a path from its least task id back to it;
/// and how many tasks the walk visited. Each task is visited once, so the cost is
/// linear in the tasks and edges reachable from `starts` — at most the list
/// (`LIST_TASKS_MAX` tasks of `BLOCKED_BY_COUNT_MAX` dependencies each).
pub(crate) fn cycles<'a>(
    starts: impl IntoIterator<Item = &'a str>,
    deps: impl Fn(&str) -> Vec<&'a str>,
) -> (Vec<Vec<String>>, usize) {
    // Tarjan's algorithm, iteratively: `order` numbers tasks as first visited, `low` is
    // the least number reachable, `stack` holds the current candidates, `frames` the
    // walk (a task and its dependencies not yet looked at).
    let mut order: BTreeMap<&str, usize> = BTreeMap::new();
    let mut low: BTreeMap<&str, usize> = BTreeMap::new();
    let mut on_stack: BTreeSet<&str> = BTreeSet::new();
    let mut stack: Vec<&str> = Vec::new();
    let mut components: Vec<Vec<&str>> = Vec::new();
    for start in starts {
        if order.contains_key(start) {
            continue;
        }
        let mut frames: Vec<(&str, Vec<&str>)> = Vec::new();
        let mut entering = Some(start);
        loop {
            if let Some(t) = entering.take() {
                let n = order.len();
                order.insert(t, n);
                low.insert(t, n);
                stack.push(t);
                on_stack.insert(t);
                let mut next = deps(t);
                next.reverse();
                frames.push((t, next));
            }
            let Some((t, next)) = frames.last_mut() else {
                break;
            };
            let t = *t;
            if let Some(d) = next.pop() {
                match order.get(d) {
                    None => entering = Some(d),
                    Some(&n) if on_stack.contains(d) => {
                        let l = low.get(t).copied().unwrap_or(n).min(n);
                        low.insert(t, l);
                    }
                    Some(_) => {}
                }
                continue;
            }
            frames.pop();
            let l = low.get(t).copied().unwrap_or_default();
            if let Some((parent, _)) = frames.last() {
                let pl = low.get(parent).copied().unwrap_or(l).min(l);
                low.insert(parent, pl);
            }
            if order.get(t) == Some(&l) {
                let mut component = Vec::new();
                while let Some(m) = stack.pop() {
                    on_stack.remove(m);
                    component.push(m);
                    if m == t {
                        break;
                    }
                }
                if component.len() > 1 {
                    components.push(component);
                }
            }
        }
    }
    let cycles = components
        .iter()
        .filter_map(|c| cycle_in(c, &deps))
        .collect();
    (cycles, order.len())
}

/// A cycle inside one strongly connected component: the shortest path (breadth first,
/// within the component) from its least task back to it.
fn cycle_in<'a>(
    component: &[&'a str],
    deps: &impl Fn(&str) -> Vec<&'a str>,
) -> Option<Vec<String>> {
    let members: BTreeSet<&str> = component.iter().copied().collect();
    let first = *members.first()?;
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([first]);
    while let Some(t) = queue.pop_front() {
        for d in deps(t) {
            if !members.contains(d) {
                continue;
            }
            if d == first {
                let mut path = vec![first.to_owned()];
                let mut at = t;
                while at != first {
                    path.push(at.to_owned());
                    at = came_from.get(at).copied()?;
                }
                path.push(first.to_owned());
                path.reverse();
                return Some(path);
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(d) {
                e.insert(t);
                queue.push_back(d);
            }
        }
    }
    None
}
