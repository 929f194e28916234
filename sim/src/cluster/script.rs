//! The scripting interface of a [`Cluster`]: what a scenario test or the CLI calls to set up
//! work, inject faults by hand, run the event queue and check the end state.

use super::*;

impl Cluster {
    /// The parameters of this run.
    pub fn params(&self) -> &SimParams {
        &self.params
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The trace's kept lines.
    pub fn trace_text(&self) -> String {
        self.trace.text()
    }

    /// Hash of every trace line.
    pub fn trace_hash(&self) -> u64 {
        self.trace.hash()
    }

    /// Invariant violations found so far.
    pub fn violations(&self) -> &[String] {
        self.checker.violations()
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        let mut stats = self.stats.clone();
        stats.directory = self.directory_stats();
        stats.spill_writes = self.spill.stats.writes;
        stats.spill_write_failures = self.spill.stats.no_space + self.spill.stats.io_errors;
        stats.spill_restores = self.spill.stats.restores;
        stats.spill_lost = self.spill.stats.lost;
        stats.spill_read_errors = self.spill.stats.read_errors;
        stats.spill_evictions = self.spill.stats.evictions;
        stats.replication = self.replication_stats();
        for sim_node in &self.nodes {
            if let Some(node) = &sim_node.node {
                stats.absorb(node);
            }
        }
        stats
    }

    /// A node, if it is up.
    pub fn node(&self, node: u32) -> Option<&Node> {
        self.nodes[node as usize].node.as_ref()
    }

    /// READs posted and not yet completed.
    pub fn reads_in_flight(&self) -> u64 {
        self.reads_in_flight
    }

    /// Records a free-form line in the trace (scenario markers).
    pub fn note(&mut self, text: &str) {
        self.trace.record(self.now, &format!("-- {text}"));
    }

    /// Client 1 of `node` creates, writes and seals object `n` of `data_size` bytes.
    pub fn put(&mut self, node: u32, n: u64, data_size: u64) -> ObjectId {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        self.client_put(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            id,
            sizes,
            None,
        );
        self.drive_until(|c| c.known_objects.contains(&id) || !c.creating(id));
        id
    }

    /// Client 1 of `node` puts object `n` of `data_size` bytes in one request (inline).
    pub fn put_inline(&mut self, node: u32, n: u64, data_size: u64) -> ObjectId {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        self.client_put_inline(NodeId(node), ClientId(WORKLOAD_CLIENT_BASE), id, sizes);
        self.drive_until(|c| c.known_objects.contains(&id) || !c.creating(id));
        id
    }

    /// Client 1 of `node` creates object `n` of `data_size` bytes and holds it for `hold`.
    pub fn put_and_hold(&mut self, node: u32, n: u64, data_size: u64, hold: Duration) -> ObjectId {
        let id = ObjectId::from_u64(n);
        let sizes = ObjectSizes {
            data_size,
            metadata_size: 0,
        };
        let client = ClientId(WORKLOAD_CLIENT_BASE);
        let hold_us = hold.as_micros() as u64;
        self.client_put(NodeId(node), client, id, sizes, Some(hold_us));
        self.drive_until(|c| c.known_objects.contains(&id) || !c.creating(id));
        id
    }

    /// Whether a client is still creating or sealing `id`.
    pub(super) fn creating(&self, id: ObjectId) -> bool {
        self.sessions.values().flat_map(|s| s.awaited()).any(|(_, call)| {
            matches!(
                call,
                Call::Create { id: i, .. } | Call::Seal { id: i, .. } | Call::Put { id: i, .. }
                    if *i == id
            )
        }) || self.queue.iter().any(|Reverse(s)| {
            matches!(&*s.event, Event::ClientSend { call: Call::Seal { id: i, .. }, .. } if *i == id)
        })
    }

    /// Client 1 of `node` fetches objects `ns` with a timeout, waiting for a publication of
    /// objects nobody holds yet.
    pub fn fetch(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        let ids = ns.iter().map(|&n| ObjectId::from_u64(n)).collect();
        self.client_fetch(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            ids,
            timeout,
            true,
        );
    }

    /// [`Cluster::fetch`] that does not wait for a publication: an object nobody holds fails
    /// after the node's publication grace.
    pub fn fetch_without_waiting(&mut self, node: u32, ns: &[u64], timeout: Duration) {
        let ids = ns.iter().map(|&n| ObjectId::from_u64(n)).collect();
        self.client_fetch(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            ids,
            timeout,
            false,
        );
    }

    /// Client 1 of `node` drops a reference to object `n` (held or not), as a dropped buffer
    /// does: a release without a reply (and a flush once a few went out).
    pub fn release(&mut self, node: u32, n: u64) {
        self.client_release(
            NodeId(node),
            ClientId(WORKLOAD_CLIENT_BASE),
            ObjectId::from_u64(n),
        );
    }

    /// Client 1 of `node` flushes its releases: every one must have succeeded.
    pub fn flush(&mut self, node: u32) {
        self.client_flush(NodeId(node), ClientId(WORKLOAD_CLIENT_BASE));
    }

    /// Crashes a node now (its memory is lost).
    pub fn crash(&mut self, node: u32) {
        self.crash_node(NodeId(node));
    }

    /// Restarts a crashed node now: with an empty store, or in persistent mode with every
    /// object it had sealed.
    pub fn restart(&mut self, node: u32) {
        self.restart_node(NodeId(node));
    }

    /// Turns persistent mode on or off for later crashes (scripted scenarios).
    pub fn set_persistent(&mut self, persistent: bool) {
        self.params.persistent = persistent;
    }

    /// The next `count` READs that `requester` posts fail with a QP error.
    pub fn fail_next_reads(&mut self, requester: u32, count: u32) {
        *self.failing_reads.entry(NodeId(requester)).or_default() += count;
    }

    /// The directory head crashes and loses its registry; `silent`: the nodes' connections
    /// do not reset, they find out by heartbeat.
    pub fn crash_head(&mut self, silent: bool) {
        self.handle(Event::Directory(DirEvent::Head { up: false, silent }));
    }

    /// The directory head comes back, with an empty registry.
    pub fn restart_head(&mut self) {
        self.handle(Event::Directory(DirEvent::Head {
            up: true,
            silent: false,
        }));
    }

    /// Cuts `node` off from the directory head (`on`) or heals the cut.
    pub fn partition_from_head(&mut self, node: u32, on: bool) {
        let node = NodeId(node);
        self.handle(Event::Directory(DirEvent::HeadPartition { node, on }));
    }

    /// Cuts the network between two nodes (`on`) or heals the cut; once healed, the higher
    /// id dials the lower again.
    pub fn partition(&mut self, a: u32, b: u32, on: bool) {
        let (a, b) = (NodeId(a), NodeId(b));
        self.handle(Event::Partition { a, b, on });
    }

    /// The simulated directory (head and sessions), for assertions.
    pub fn directory(&self) -> &SimDirectory {
        &self.directory
    }

    /// Shard `shard` of a sharded directory (0 is [`Cluster::directory`]).
    pub fn directory_shard(&self, shard: usize) -> Option<&SimDirectory> {
        self.all_shards().nth(shard)
    }

    /// Runs events until virtual time `until` (heartbeats included), whatever is pending.
    pub fn run_until(&mut self, until: Instant) {
        while self
            .queue
            .peek()
            .is_some_and(|Reverse(next)| next.at <= until)
        {
            self.step();
        }
        self.now = self.now.max(until);
        self.settle_node_checks();
        self.directory.settle_registry_checks();
        for shard in &mut self.shards {
            shard.settle_registry_checks();
        }
    }

    /// Runs the next event; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse(scheduled)) = self.queue.pop() else {
            return false;
        };
        debug_assert!(scheduled.at >= self.now, "time went back");
        self.now = scheduled.at;
        self.stats.events += 1;
        if !scheduled.background {
            self.foreground -= 1;
        }
        self.handle(*scheduled.event);
        for violation in self.directory.check(self.now) {
            self.checker.violation(self.now, violation);
        }
        for i in 0..self.shards.len() {
            for violation in self.shards[i].check(self.now) {
                self.checker
                    .violation(self.now, format!("shard {}: {violation}", i + 1));
            }
        }
        true
    }

    /// Runs until no event is left but heartbeats.
    pub fn drive(&mut self) {
        while self.foreground > 0 && self.step() {}
    }

    /// Runs until `done` holds (checked after each event) or nothing is left but heartbeats;
    /// true if it held.
    pub fn drive_until(&mut self, mut done: impl FnMut(&Cluster) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.foreground == 0 || !self.step() {
                return false;
            }
        }
    }

    /// Runs until nothing is left but heartbeats or the budget (events, or virtual time
    /// `until`) runs out. `Err` lists everything still pending, with the reason each gives.
    pub fn drive_bounded(&mut self, max_events: u64, until: Instant) -> Result<(), Vec<String>> {
        let mut events = 0;
        while let Some(Reverse(next)) = self.queue.peek() {
            if self.foreground == 0 {
                break;
            }
            if events >= max_events || next.at > until {
                let mut pending = vec![format!(
                    "budget ran out at {} after {events} events with {} events queued (next at {})",
                    self.now,
                    self.queue.len(),
                    next.at
                )];
                pending.extend(self.pending_work());
                return Err(pending);
            }
            self.step();
            events += 1;
        }
        Ok(())
    }

    /// What every live node and the checker still wait for.
    pub fn pending_work(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (i, sim_node) in self.nodes.iter().enumerate() {
            if let Some(node) = &sim_node.node {
                for line in node.pending_work() {
                    lines.push(format!("node-{i}: {line}"));
                }
            }
        }
        for ((node, inc, client, request), op) in &self.checker.pending {
            if self.alive(*node, *inc) {
                lines.push(format!(
                    "{client}@{node} {} {request} of {:?} issued at {} (deadline {}) has no reply",
                    op.kind, op.ids, op.issued, op.deadline
                ));
            }
        }
        lines
    }

    /// End-of-run checks, once faults stopped and the cluster settled: liveness (nothing
    /// pending) and balance (no reference, pin, lease, exposure or unsealed object left).
    pub fn check_quiescence(&mut self) {
        self.settle_directory();
        self.settle_replicas();
        self.check_copies_fetchable();
        for shard in self.all_shards() {
            if let Some(registry) = shard.registry() {
                registry.check_invariants();
            }
        }
        self.settle_node_checks();
        self.check_listed_contents();
        let now = self.now;
        for line in self.pending_work() {
            self.checker.violation(
                now,
                format!("liveness: still pending after faults stopped: {line}"),
            );
        }
        for i in 0..self.nodes.len() {
            let sim_node = &self.nodes[i];
            let Some(node) = &sim_node.node else { continue };
            if node.bytes_in_flight() != 0 {
                let what = format!(
                    "node-{i}: {} bytes still in flight at the end",
                    node.bytes_in_flight()
                );
                self.checker.violation(now, what);
            }
            self.checker.check_quiescent_store(
                now,
                NodeId(i as u32),
                node.store(),
                &sim_node.memory,
                |id| node.is_copy_of_record(id),
            );
        }
        self.check_spilled_records();
        self.finished = true;
    }
}
