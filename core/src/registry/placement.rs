//! Where the copies of record of an object go: a pure rule, so the registry, its tests and the
//! simulator agree on it.
//!
//! Greedy, one target at a time: a node in a failure domain no copy (or chosen target) is in
//! yet comes first; then the node with the most free memory (a node that never reported it
//! counts as empty, the usual case of a node that never held a copy of record), compared to
//! two significant bits ([`free_memory_class`]: nodes in one class, within a factor of 1.5 of
//! each other, are equal); ties are broken by a stable mix of the object and the node, so
//! objects spread over equal nodes without randomness. Compared exactly, a node that reported
//! a few bytes more than the others would take every copy until it filled, and the others'
//! reports, only as recent as their last copy, would never change: the copies of a put would
//! always land on the same nodes (on a local cluster, the head's own among them, whose loop
//! then serves the directory and makes a copy in turn). A node whose reported free memory
//! cannot take the object is not chosen by [`choose_targets`].
//!
//! When that leaves too few, [`choose_retry_targets`] asks the rest: a report is only as recent
//! as the node's last replicated publication (it may have freed memory since), and a target
//! given up on may have failed for a passing reason. Nodes never given up on come first, then
//! the ones given up on longest ago, so that retries go round every node rather than back to
//! the one that failed last.

use std::collections::BTreeSet;

use crate::ids::{NodeId, ObjectId};
use crate::time::Instant;

/// A node that may receive a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The node.
    pub node: NodeId,
    /// Its failure domain (empty: a domain of its own).
    pub failure_domain: String,
    /// Free bytes of its store as it last reported them, if it did.
    pub free_bytes: Option<u64>,
}

/// The domain `node` counts in: its own when it names none.
pub fn domain_key(node: NodeId, failure_domain: &str) -> String {
    if failure_domain.is_empty() {
        format!("\0{node}")
    } else {
        failure_domain.to_string()
    }
}

/// Chooses up to `count` targets among `candidates` for `id` of `object_bytes`, given the
/// domains its copies are in already (as [`domain_key`]s). Fewer when fewer nodes fit.
pub fn choose_targets(
    id: &ObjectId,
    object_bytes: u64,
    candidates: &[Candidate],
    used_domains: &BTreeSet<String>,
    count: usize,
) -> Vec<NodeId> {
    let left: Vec<(&Candidate, ())> = candidates
        .iter()
        .filter(|c| c.free_bytes.is_none_or(|free| free >= object_bytes))
        .map(|c| (c, ()))
        .collect();
    choose_greedily(id, left, used_domains, count)
}

/// Chooses up to `count` targets among `candidates` when [`choose_targets`] found too few:
/// whatever free memory each reported, the nodes never given up on (`None`) first, then those
/// given up on longest ago; then as [`choose_targets`] (domains, free memory, spread).
pub fn choose_retry_targets(
    id: &ObjectId,
    candidates: &[(Candidate, Option<Instant>)],
    used_domains: &BTreeSet<String>,
    count: usize,
) -> Vec<NodeId> {
    let left: Vec<(&Candidate, Option<Instant>)> = candidates
        .iter()
        .map(|(c, given_up)| (c, *given_up))
        .collect();
    choose_greedily(id, left, used_domains, count)
}

/// Greedy, one target at a time, by `first` (each candidate's own key), then an unused
/// domain, then the most free memory, then the stable spread.
fn choose_greedily<K: Ord + Copy>(
    id: &ObjectId,
    mut left: Vec<(&Candidate, K)>,
    used_domains: &BTreeSet<String>,
    count: usize,
) -> Vec<NodeId> {
    let mut used = used_domains.clone();
    let mut chosen = Vec::with_capacity(count.min(left.len()));
    while chosen.len() < count && !left.is_empty() {
        let (at, best) = left
            .iter()
            .enumerate()
            .min_by_key(|(_, (c, first))| {
                let domain_used = used.contains(&domain_key(c.node, &c.failure_domain));
                let free = free_memory_class(c.free_bytes.unwrap_or(u64::MAX));
                (
                    *first,
                    domain_used,
                    std::cmp::Reverse(free),
                    crate::node::spread_key(id, c.node),
                )
            })
            .map(|(at, (c, _))| (at, *c))
            .expect("left is not empty");
        used.insert(domain_key(best.node, &best.failure_domain));
        chosen.push(best.node);
        left.swap_remove(at);
    }
    chosen
}

/// Free memory to two significant bits (the class [`choose_targets`] compares): `free`
/// rounded down to its highest set bit and the one below it, `[2ⁿ, 1.5·2ⁿ)` or
/// `[1.5·2ⁿ, 2ⁿ⁺¹)`, so nodes with about the same free memory are equal and share the copies.
pub fn free_memory_class(free: u64) -> u64 {
    if free < 4 {
        return free;
    }
    let shift = free.ilog2() - 1;
    (free >> shift) << shift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(node: u32, domain: &str, free: Option<u64>) -> Candidate {
        Candidate {
            node: NodeId(node),
            failure_domain: domain.into(),
            free_bytes: free,
        }
    }

    #[test]
    fn copies_go_to_distinct_domains_before_more_free_memory() {
        let candidates = [
            candidate(1, "rack-a", Some(1 << 40)),
            candidate(2, "rack-a", Some(1 << 41)),
            candidate(3, "rack-b", Some(1 << 20)),
            candidate(4, "rack-c", Some(1 << 30)),
        ];
        let used = BTreeSet::from(["rack-a".to_string()]);
        let id = ObjectId::from_u64(7);
        let chosen = choose_targets(&id, 1000, &candidates, &used, 2);
        assert_eq!(
            chosen,
            vec![NodeId(4), NodeId(3)],
            "rack-c has more free memory"
        );
        // With more copies wanted than domains, the rest goes by free memory.
        let chosen = choose_targets(&id, 1000, &candidates, &used, 4);
        assert_eq!(chosen, vec![NodeId(4), NodeId(3), NodeId(2), NodeId(1)]);
    }

    #[test]
    fn nodes_without_a_domain_are_each_their_own() {
        let candidates = [
            candidate(1, "", Some(10_000)),
            candidate(2, "", Some(5_000)),
        ];
        let used = BTreeSet::from([domain_key(NodeId(0), "")]);
        let chosen = choose_targets(&ObjectId::from_u64(1), 100, &candidates, &used, 2);
        assert_eq!(chosen, vec![NodeId(1), NodeId(2)]);
    }

    #[test]
    fn a_node_that_reported_too_little_free_memory_is_skipped() {
        let candidates = [candidate(1, "a", Some(10)), candidate(2, "a", None)];
        let chosen = choose_targets(
            &ObjectId::from_u64(1),
            100,
            &candidates,
            &BTreeSet::new(),
            2,
        );
        assert_eq!(chosen, vec![NodeId(2)]);
    }

    #[test]
    fn equal_nodes_share_the_objects() {
        let candidates: Vec<Candidate> = (1..=4).map(|n| candidate(n, "", None)).collect();
        let mut per_node = [0u32; 5];
        for n in 0..400 {
            let chosen =
                choose_targets(&ObjectId::from_u64(n), 1, &candidates, &BTreeSet::new(), 1);
            per_node[chosen[0].0 as usize] += 1;
        }
        for count in &per_node[1..] {
            assert!((50..=150).contains(count), "spread: {per_node:?}");
        }
    }

    /// Nodes whose free memory differs by a little share the copies: compared exactly, the one
    /// that reported a few bytes more took every copy.
    #[test]
    fn nodes_with_about_equal_free_memory_share_the_objects() {
        let gib = 1u64 << 30;
        let candidates = [
            candidate(1, "", Some(10 * gib)),
            candidate(2, "", Some(10 * gib - 4096)),
            candidate(3, "", Some(9 * gib)),
        ];
        let mut per_node = [0u32; 4];
        for n in 0..300 {
            let chosen =
                choose_targets(&ObjectId::from_u64(n), 1, &candidates, &BTreeSet::new(), 1);
            per_node[chosen[0].0 as usize] += 1;
        }
        for count in &per_node[1..] {
            assert!((50..=150).contains(count), "spread: {per_node:?}");
        }
        // Far more free memory still comes first.
        let candidates = [candidate(1, "", Some(4 * gib)), candidate(2, "", Some(gib))];
        for n in 0..50 {
            let chosen =
                choose_targets(&ObjectId::from_u64(n), 1, &candidates, &BTreeSet::new(), 1);
            assert_eq!(chosen, vec![NodeId(1)]);
        }
    }

    #[test]
    fn free_memory_classes_keep_two_significant_bits() {
        assert_eq!(free_memory_class(0), 0);
        assert_eq!(free_memory_class(3), 3);
        assert_eq!(free_memory_class(7), 6);
        assert_eq!(free_memory_class(1000), 768);
        assert_eq!(free_memory_class(1023), 768);
        assert_eq!(free_memory_class(1024), 1024);
        assert_eq!(free_memory_class(u64::MAX), 3 << 62);
    }

    #[test]
    fn retries_ignore_free_memory_reports_and_go_round_the_nodes_given_up_on() {
        let at = |ms: u64| Some(Instant(ms * 1_000_000));
        let id = ObjectId::from_u64(3);
        // Node 1 reported too little long ago and was never tried: it comes first, before
        // node 2's larger report.
        let candidates = [
            (candidate(1, "", Some(10)), None),
            (candidate(2, "", Some(1 << 30)), at(5)),
            (candidate(3, "", Some(1 << 20)), at(1)),
        ];
        let chosen = choose_retry_targets(&id, &candidates, &BTreeSet::new(), 3);
        assert_eq!(chosen, vec![NodeId(1), NodeId(3), NodeId(2)]);
        // Among nodes given up on, the one given up on longest ago, whatever its domain and
        // free memory.
        let candidates = [
            (candidate(2, "a", Some(1 << 30)), at(5)),
            (candidate(3, "b", Some(1 << 20)), at(1)),
        ];
        let used = BTreeSet::from(["b".to_string()]);
        let chosen = choose_retry_targets(&id, &candidates, &used, 1);
        assert_eq!(chosen, vec![NodeId(3)]);
    }
}
