//! What each scheduled event does: deliveries, READs served from the simulated arena without
//! the holder's core, timers, client operations, the disk's commits, faults.

use skyriver_core::grants::Revocation;

use super::*;

impl Cluster {
    /// Gives `to` one message from `from` (if the connection and the node still stand), without
    /// driving it; the bytes back when it was given.
    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        to_inc: u32,
        epoch: u64,
        bytes: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let connection = self.network.connection(from, to);
        if !self.alive(to, to_inc) || !connection.up || connection.epoch != epoch {
            return None;
        }
        let now = self.now;
        match wire::decode(&bytes) {
            Ok(message) => self.record_args(format_args!("{to} <- {from} {message}")),
            Err(error) => self.record_args(format_args!("{to} <- {from} undecodable: {error}")),
        }
        let bytes = self.relay_progress_flaw(bytes);
        self.note_delivery(to, from, &bytes);
        let node = self.nodes[to.0 as usize].node.as_mut().expect("alive");
        let input = NodeInput::PeerBytes {
            peer: from,
            bytes: &bytes,
        };
        if let Handled::Malformed(error) = node.handle(now, input) {
            self.checker.violation(
                now,
                format!("{to}: message from {from} does not decode: {error}"),
            );
        }
        Some(bytes)
    }

    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                to_inc,
                epoch,
                bytes,
            } => {
                let mut next = Some((from, epoch, bytes));
                let mut fed = None;
                while let Some((from, epoch, bytes)) = next.take() {
                    if let Some(bytes) = self.deliver(from, to, to_inc, epoch, bytes) {
                        fed = Some(bytes);
                    }
                    // In a crowd run, the next message of this instant joins the pass while
                    // the node has nothing queued (its fetch requests are answered together).
                    let queued = self.nodes[to.0 as usize]
                        .node
                        .as_ref()
                        .is_none_or(|node| node.outputs_queued());
                    if !queued {
                        next = match self.next_delivery_now(to, to_inc) {
                            Some(Event::Deliver {
                                from, epoch, bytes, ..
                            }) => Some((from, epoch, bytes)),
                            _ => None,
                        };
                    }
                    if next.is_none() {
                        break;
                    }
                }
                let Some(bytes) = fed else { return };
                // The outputs copy an eager payload straight from the delivered bytes.
                self.input = bytes;
                self.after_input(to);
                self.input = Vec::new();
                self.end_pass(to);
            }
            Event::ReadServe { read, remote } => self.serve_read(read, remote),
            Event::ReadComplete { read, result } => {
                let SimRead {
                    requester: node,
                    requester_inc: inc,
                    holder: peer,
                    epoch,
                    op,
                    local,
                    object,
                } = read;
                if !self.alive(node, inc) {
                    return;
                }
                self.reads_in_flight -= 1;
                let connection = self.network.connection(node, peer);
                let result = match result {
                    // The response was on the wire when the connection broke: flushed.
                    Ok(_) if connection.epoch != epoch => Err(ReadError::ConnectionLost),
                    other => other,
                };
                let now = self.now;
                let result = match result {
                    Ok(bytes) => {
                        let sim_node = &mut self.nodes[node.0 as usize];
                        let store = sim_node.node.as_ref().expect("alive").store();
                        self.checker.check_write_target(
                            now,
                            node,
                            store,
                            object,
                            local,
                            "READ data",
                        );
                        sim_node.memory.write(local, &bytes);
                        self.record(|| {
                            format!("{node} {op} done ({} bytes of {object})", bytes.len())
                        });
                        Ok(())
                    }
                    Err(error) => {
                        self.record(|| format!("{node} {op} failed: {error}"));
                        Err(error)
                    }
                };
                self.feed(node, NodeInput::ReadCompletion { op, result });
            }
            Event::Directory(event) => {
                if let DirEvent::HeadPartition { node, on } = &event {
                    // A node cut off from the directory is cut off from every shard.
                    for shard in 1..self.directory_shards() {
                        let (node, on) = (*node, *on);
                        let event = DirEvent::HeadPartition { node, on };
                        self.handle(Event::DirectoryShard { shard, event });
                    }
                }
                let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
                let effects = self
                    .directory
                    .handle(self.now, event, &mut self.rng, faults_on);
                self.apply_directory(effects);
            }
            Event::DirectoryShard { shard, event } => {
                let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
                let now = self.now;
                let directory = match shard {
                    0 => &mut self.directory,
                    s => &mut self.shards[s - 1],
                };
                let effects = directory.handle(now, event, &mut self.rng, faults_on);
                self.apply_shard(shard, effects);
            }
            Event::DirectoryNotice {
                shard,
                to,
                inc,
                notice,
            } => {
                if !self.alive(to, inc) {
                    return;
                }
                self.shard_mut(shard).delivering(to, &notice);
                let Some(notice) = self.one_directory_notice(shard, to, notice) else {
                    return;
                };
                self.directory_named(to, inc, &notice);
                let Some(notice) = self.replica_notice(to, inc, notice) else {
                    return;
                };
                match notice {
                    DirectoryNotice::Reply { op, reply } => {
                        self.record_args(format_args!("{to} <- directory {op} {reply}"));
                        self.feed(to, NodeInput::DirectoryReply { op, reply });
                    }
                    DirectoryNotice::Event(event) => {
                        self.record_args(format_args!("{to} <- directory {event}"));
                        self.feed(to, NodeInput::DirectoryEvent { event });
                    }
                    DirectoryNotice::Members(members) => {
                        let (names, view) = self.member_views.view(&members);
                        self.record(|| format!("{to} <- directory members {names}"));
                        self.feed(to, NodeInput::DirectoryMembers { members: view });
                    }
                    DirectoryNotice::Health(health) => {
                        // The directory's own trace says when it goes up or down.
                        self.feed(to, NodeInput::DirectoryHealth { health });
                    }
                }
            }
            Event::ReadServed {
                holder_inc,
                admitted,
                read,
            } => self.read_served(holder_inc, admitted, read),
            Event::ReadGranted {
                node,
                inc,
                reader,
                req,
                result,
            } => {
                if !self.alive(node, inc) {
                    return;
                }
                let peer = reader;
                self.feed(node, NodeInput::ReadGranted { peer, req, result });
            }
            Event::ReadRevoked {
                node,
                inc,
                reader,
                req,
            } => {
                if !self.alive(node, inc) {
                    return;
                }
                // Only now does the key stop admitting READs (a verbs invalidation completes
                // later than it is posted); READs being served keep the region reached until
                // they are done. Until the revocation is complete the core keeps the pin.
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                match sim_node.memory.revoke(reader, req) {
                    Revocation::Complete => {}
                    Revocation::NotGranted => self.checker.violation(
                        now,
                        format!("{node}: revokes {reader}'s {req}, which was never granted"),
                    ),
                    Revocation::AfterServing => {
                        self.stats.revocations_after_serving += 1;
                        self.record(|| {
                            format!("{node} revoking {reader} {req}: waits for READs being served")
                        });
                        if !self.flaws.revoke_ignores_serving_reads {
                            return;
                        }
                    }
                }
                self.read_access_ended(node, reader, req);
            }
            Event::Timer { node, inc } => {
                if !self.alive(node, inc) {
                    return;
                }
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                if sim_node.timer_at.is_some_and(|at| at <= now) {
                    sim_node.timer_at = None;
                }
                self.feed(node, NodeInput::Timeout);
            }
            Event::PeerLost { node, inc, peer } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.record(|| format!("{node}: connection to {peer} lost"));
                self.feed(node, NodeInput::PeerLost { peer });
            }
            Event::PeerConnected {
                node,
                inc,
                peer,
                epoch,
            } => {
                let connection = self.network.connection(node, peer);
                if !self.alive(node, inc) || !connection.up || connection.epoch != epoch {
                    return;
                }
                self.record(|| format!("{node}: connected to {peer}"));
                let params = self.peer_params(node, peer);
                self.feed(node, NodeInput::PeerConnected { peer, params });
            }
            Event::ClientOp { node, inc, client } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.client_op(node, client);
                if self.now.0 / 1000 < self.params.workload_us {
                    let pause = self.rng.gen_range(
                        self.params.op_interval_us / 2..=self.params.op_interval_us * 3 / 2,
                    );
                    self.schedule(
                        self.after(pause * 1000),
                        Event::ClientOp { node, inc, client },
                    );
                }
            }
            Event::ClientRelease {
                node,
                inc,
                client,
                id,
            } => {
                if !self.alive(node, inc) {
                    return;
                }
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                let store = sim_node.node.as_ref().expect("alive").store();
                // A held object stays sealed and unchanged until released.
                self.checker.check_sealed_object(
                    now,
                    node,
                    store,
                    &sim_node.memory,
                    id,
                    "before release",
                );
                self.client_release(node, client, id);
            }
            Event::ClientSend {
                node,
                inc,
                client,
                body,
                call,
            } => {
                if self.alive(node, inc) {
                    self.client_request(node, client, body, call);
                }
            }
            Event::Persisted { node, inc, upto } => self.persisted(node, inc, upto),
            Event::SpillWritten {
                node,
                inc,
                job,
                report,
            } => self.spill_written(node, inc, job, report),
            Event::SpillReported { node, inc, op } => {
                if self.alive(node, inc) {
                    let result = Ok(self.spill_place(node, inc, op));
                    self.feed(node, NodeInput::SpillDone { op, result });
                }
            }
            Event::SpillRestored { node, inc, job } => self.spill_restored(node, inc, job),
            Event::Crash { node } => self.crash_node(node),
            Event::Restart { node } => self.restart_node(node),
            Event::Partition { a, b, on } => {
                self.network.set_partition(a, b, on);
                if on {
                    self.record(|| format!("FAULT partition {a} / {b}"));
                    self.break_link(a, b);
                } else {
                    // The connection comes back when the higher id dials (its core's rule).
                    self.record(|| format!("FAULT healed partition {a} / {b}"));
                }
            }
            Event::DirectoryOutage { on } => {
                // An outage is a crash of the head: its registry is lost. Half the time the
                // nodes' connections reset at once; otherwise only heartbeats tell.
                let silent = on && self.rng.gen_bool(0.5);
                let event = DirEvent::Head { up: !on, silent };
                self.handle(Event::Directory(event));
            }
            Event::Slow { node, factor } => {
                self.network.set_slow(node, factor);
                self.record(|| format!("FAULT {node} slowdown x{factor}"));
            }
        }
    }

    /// A READ reaches its holder's fabric: refused, failed by a fault, or admitted and served
    /// (at once, or after a stall).
    pub(super) fn serve_read(&mut self, read: SimRead, remote: RemoteRegion) {
        let SimRead {
            requester,
            holder,
            epoch,
            op,
            ..
        } = read;
        let connection = self.network.connection(requester, holder);
        let complete = |result| read.complete(result);
        let latency = self.network.latency_ns(requester, holder);
        if !connection.up
            || connection.epoch != epoch
            || self.nodes[holder.0 as usize].node.is_none()
        {
            let at = self.after(self.params.qp_timeout_us * 1000);
            self.schedule(at, complete(Err(ReadError::ConnectionLost)));
            return;
        }
        if let Some(count) = self.failing_reads.get_mut(&requester).filter(|c| **c > 0) {
            *count -= 1;
            let error = ReadError::QueuePair("injected: transport retry counter exceeded".into());
            self.schedule(self.after(latency), complete(Err(error)));
            return;
        }
        let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
        if faults_on && self.rng.gen_range(0..1_000_000) < self.params.qp_error_ppm {
            self.record(|| format!("FAULT QP error on {op} {requester} <- {holder}"));
            let error = ReadError::QueuePair("injected: QP went to the error state".into());
            self.schedule(self.after(latency), complete(Err(error)));
            return;
        }
        let holder_node = &mut self.nodes[holder.0 as usize];
        let holder_inc = holder_node.inc;
        match holder_node.memory.admit(requester, remote) {
            Err(why) => {
                self.record(|| format!("{holder} refuses {op} of {remote}: {why}"));
                self.schedule(self.after(latency), complete(Err(ReadError::RemoteAccess)));
            }
            Ok(admitted) => {
                let served = Event::ReadServed {
                    holder_inc,
                    admitted,
                    read,
                };
                match self.media.serve_stall_ns(faults_on) {
                    Some(stall_ns) => {
                        self.stats.serves_stalled += 1;
                        self.record(|| {
                            format!(
                                "FAULT {holder}'s fabric stalls {} µs serving {op} of {requester}",
                                stall_ns / 1000
                            )
                        });
                        self.schedule(self.after(stall_ns), served);
                    }
                    None => self.handle(served),
                }
            }
        }
    }

    /// The holder's fabric copies an admitted READ's data out of its arena and sends it; the
    /// READ is done, which may complete a revocation that waited for it.
    fn read_served(&mut self, holder_inc: u32, admitted: AdmittedRead, read: SimRead) {
        let SimRead {
            requester,
            holder,
            op,
            ..
        } = read;
        let complete = |result| read.complete(result);
        let latency = self.network.latency_ns(requester, holder);
        if !self.alive(holder, holder_inc) {
            // The holder died while serving: its memory's grants went with it.
            self.schedule(
                self.after(latency),
                complete(Err(ReadError::ConnectionLost)),
            );
            return;
        }
        let holder_node = &mut self.nodes[holder.0 as usize];
        // Being copied from: the holder's core must keep the object sealed and pinned, or be
        // receiving it (a relay's partial copy, checked byte by byte below).
        let store = holder_node.node.as_ref().expect("alive").store();
        let granted_object = admitted.object;
        let mut relayed = None;
        match store.summary(&granted_object) {
            Some(s)
                if s.sealed
                    && s.pin_count > 0
                    && s.info.region.offset <= admitted.range.offset
                    && admitted.range.end() <= s.info.region.end() => {}
            Some(s)
                if !s.sealed
                    && s.info.region.offset <= admitted.range.offset
                    && admitted.range.end() <= s.info.region.end() =>
            {
                relayed = Some(s.info);
            }
            other => {
                let state = other.map_or("gone".to_string(), |s| {
                    format!(
                        "sealed={} pins={} refs={} at {}",
                        s.sealed, s.pin_count, s.ref_count, s.info.region
                    )
                });
                let what = format!(
                    "{holder}: READ {op} by {requester} served from {granted_object}, which is not pinned there ({state})"
                );
                self.checker.violation(self.now, what);
            }
        }
        let bytes = holder_node.memory.read(admitted.range).to_vec();
        if let Some(info) = relayed {
            self.check_relayed_read(holder, holder_inc, &info, admitted.range, &read, &bytes);
        }
        let holder_node = &mut self.nodes[holder.0 as usize];
        if let Some((reader, req)) = holder_node.memory.done(admitted.key) {
            if !self.flaws.revoke_ignores_serving_reads {
                self.read_access_ended(holder, reader, req);
            }
        }
        let len = bytes.len() as u64;
        let at = if self.params.reads_share_links {
            self.network.arrival(self.now, holder, requester, len)
        } else {
            self.after(self.network.wire_ns(holder, requester, len) + latency)
        };
        let mut bytes = bytes;
        if let Some(at) = self.corruption(bytes.len()) {
            bytes[at.0] ^= at.1;
            self.damaged_copies
                .insert((requester, read.requester_inc, read.object));
            self.record(|| format!("FAULT corrupt byte {} of {op}'s data", at.0));
        }
        self.schedule(at, complete(Ok(bytes)));
    }

    /// No READ reaches the lease's region any more: the holder's core learns it (and may
    /// unpin).
    fn read_access_ended(&mut self, node: NodeId, reader: NodeId, req: TransferId) {
        self.record(|| format!("{node} revoked {reader} {req}: its key reaches nothing"));
        let peer = reader;
        self.feed(node, NodeInput::ReadRevoked { peer, req });
    }
}
