//! The nodes' own consistency ([`Node::check_invariants`]: a scan of the node's store, its
//! location cache, transfers, leases and replicas) as a run goes on.
//!
//! An input pays for a scan of [`NODE_SCAN_PER_INPUT`] entries (objects and cached locations):
//! a node of `size` entries is checked once every `size / NODE_SCAN_PER_INPUT` of its inputs,
//! after every input while it holds up to [`NODE_SCAN_PER_INPUT`], so an input costs the same
//! whatever the node holds and however large the cluster is. Nothing escapes: a node is checked
//! before a crash drops it and at the end of every run (settled or not) if it had an input since
//! its last check, so a broken bookkeeping is found, only a few inputs later than it broke.
//! (It was 16 entries an input: at 1,000 nodes the checks took a tenth of the run; 4 still
//! took 4%.)

use skyriver_core::{Node, NodeId};

use super::Cluster;

/// Entries (objects and cached locations) a node's check scans, per input of the node.
pub(super) const NODE_SCAN_PER_INPUT: usize = 2;

/// Each node's inputs since its last check.
#[derive(Debug, Default)]
pub(super) struct NodeChecks {
    inputs_since_check: Vec<usize>,
    /// Checks made, all nodes together.
    checks: u64,
}

impl NodeChecks {
    /// `node` (node `n`, whose location cache holds at most `cache_entries`) took an input:
    /// checks it if due.
    pub(super) fn after_input(&mut self, n: NodeId, node: &Node, cache_entries: usize) {
        let since = self.since(n);
        *since += 1;
        let size = node.store().object_count() + cache_entries;
        if *since * NODE_SCAN_PER_INPUT >= size {
            *since = 0;
            self.check(node);
        }
    }

    /// Checks `node` (node `n`) if it took an input since its last check: before a crash drops
    /// it, at the end of a run.
    pub(super) fn settle(&mut self, n: NodeId, node: &Node) {
        let since = self.since(n);
        if *since > 0 {
            *since = 0;
            self.check(node);
        }
    }

    fn since(&mut self, n: NodeId) -> &mut usize {
        let at = n.0 as usize;
        if at >= self.inputs_since_check.len() {
            self.inputs_since_check.resize(at + 1, 0);
        }
        &mut self.inputs_since_check[at]
    }

    fn check(&mut self, node: &Node) {
        self.checks += 1;
        node.check_invariants();
    }
}

impl Cluster {
    /// How many times a node's own consistency was checked so far, all nodes together.
    pub fn node_invariant_checks(&self) -> u64 {
        self.node_checks.checks
    }

    /// How many live nodes took an input since their last check.
    pub fn nodes_unchecked(&self) -> usize {
        let since = &self.node_checks.inputs_since_check;
        (self.nodes.iter().enumerate())
            .filter(|(i, n)| n.node.is_some() && since.get(*i).is_some_and(|&s| s > 0))
            .count()
    }

    /// Checks every live node that took an input since its last check.
    pub(super) fn settle_node_checks(&mut self) {
        for (i, sim_node) in self.nodes.iter().enumerate() {
            if let Some(node) = &sim_node.node {
                self.node_checks.settle(NodeId(i as u32), node);
            }
        }
    }
}
