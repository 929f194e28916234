//! What each scheduled event does: deliveries, READs served from the simulated arena without
//! the holder's core, timers, client operations, the disk's commits, faults.

use skyriver_core::node::ClusterMember;

use super::*;

impl Cluster {
    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                to_inc,
                epoch,
                bytes,
            } => {
                let connection = self.network.connection(from, to);
                if !self.alive(to, to_inc) || !connection.up || connection.epoch != epoch {
                    return;
                }
                let now = self.now;
                let text = match wire::decode(&bytes) {
                    Ok(message) => format!("{to} <- {from} {message}"),
                    Err(error) => format!("{to} <- {from} undecodable: {error}"),
                };
                self.record(|| text);
                let node = self.nodes[to.0 as usize].node.as_mut().expect("alive");
                if let Err(error) = node.handle_peer_bytes(now, from, &bytes) {
                    self.checker.violation(
                        now,
                        format!("{to}: message from {from} does not decode: {error}"),
                    );
                }
                // The outputs copy an eager payload straight from the delivered bytes.
                self.input = bytes;
                self.after_input(to);
                self.input = Vec::new();
            }
            Event::ReadServe {
                requester,
                requester_inc,
                holder,
                epoch,
                op,
                remote,
                local,
                object,
            } => self.serve_read(
                requester,
                requester_inc,
                holder,
                epoch,
                op,
                remote,
                local,
                object,
            ),
            Event::ReadComplete {
                node,
                inc,
                peer,
                epoch,
                op,
                local,
                object,
                result,
            } => {
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
                self.feed(node, |n, now| n.handle_read_completion(now, op, result));
            }
            Event::Directory(event) => {
                let faults_on = self.mode.faults && self.now.0 / 1000 < self.params.faults_until_us;
                let effects = self
                    .directory
                    .handle(self.now, event, &mut self.rng, faults_on);
                self.apply_directory(effects);
            }
            Event::DirectoryNotice { to, inc, notice } => {
                if !self.alive(to, inc) {
                    return;
                }
                self.directory.delivering(to, &notice);
                self.directory_named(to, inc, &notice);
                match notice {
                    DirectoryNotice::Reply { op, reply } => {
                        self.record(|| format!("{to} <- directory {op} {reply}"));
                        self.feed(to, |node, now| node.handle_directory_reply(now, op, reply));
                    }
                    DirectoryNotice::Event(event) => {
                        self.record(|| format!("{to} <- directory {event}"));
                        self.feed(to, |node, now| node.handle_directory_event(now, event));
                    }
                    DirectoryNotice::Members(members) => {
                        self.record(|| {
                            let names: Vec<String> =
                                members.iter().map(|m| m.node.to_string()).collect();
                            format!("{to} <- directory members {}", names.join(" "))
                        });
                        let view = members
                            .iter()
                            .map(|m| ClusterMember {
                                node: m.node,
                                incarnation: m.incarnation,
                                address: m.fabric_addr,
                                fabric: m.fabric.clone(),
                            })
                            .collect();
                        self.feed(to, |node, now| node.handle_directory_members(now, view));
                    }
                    DirectoryNotice::Health(health) => {
                        // The directory's own trace says when it goes up or down.
                        self.feed(to, |node, now| node.handle_directory_health(now, health));
                    }
                }
            }
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
                let now = self.now;
                self.nodes[node.0 as usize]
                    .node
                    .as_mut()
                    .expect("alive")
                    .handle_read_granted(now, reader, req, result);
                self.after_input(node);
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
                // Only now does the key stop working (a verbs invalidation completes later than
                // it is posted): until here the core must keep the object pinned.
                let now = self.now;
                let sim_node = &mut self.nodes[node.0 as usize];
                if !sim_node.memory.revoke(reader, req) {
                    self.checker.violation(
                        now,
                        format!("{node}: revokes {reader}'s {req}, which was never granted"),
                    );
                }
                self.record(|| format!("{node} revoked {reader} {req}: its key reaches nothing"));
                let sim_node = &mut self.nodes[node.0 as usize];
                sim_node
                    .node
                    .as_mut()
                    .expect("alive")
                    .handle_read_revoked(now, reader, req);
                self.after_input(node);
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
                sim_node.node.as_mut().expect("alive").handle_timeout(now);
                self.after_input(node);
            }
            Event::PeerLost { node, inc, peer } => {
                if !self.alive(node, inc) {
                    return;
                }
                self.record(|| format!("{node}: connection to {peer} lost"));
                self.feed(node, |node, now| node.handle_peer_lost(now, peer));
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
                self.feed(node, |node, now| {
                    node.handle_peer_connected(now, peer, params)
                });
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
                self.client_request(node, client, Request::Release { id }, Call::Release { id });
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

    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_read(
        &mut self,
        requester: NodeId,
        requester_inc: u32,
        holder: NodeId,
        epoch: u64,
        op: ReadOpId,
        remote: RemoteRegion,
        local: LocalRegion,
        object: ObjectId,
    ) {
        let connection = self.network.connection(requester, holder);
        let complete = |result| Event::ReadComplete {
            node: requester,
            inc: requester_inc,
            peer: holder,
            epoch,
            op,
            local,
            object,
            result,
        };
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
        let holder_node = &self.nodes[holder.0 as usize];
        match holder_node.memory.serve(requester, remote) {
            Err(why) => {
                self.record(|| format!("{holder} refuses {op} of {remote}: {why:?}"));
                self.schedule(self.after(latency), complete(Err(ReadError::RemoteAccess)));
            }
            Ok((granted_object, bytes)) => {
                // Being read: the holder's core must keep the object sealed and pinned.
                let store = holder_node.node.as_ref().expect("checked above").store();
                match store.summary(&granted_object) {
                    Some(s) if s.sealed && s.pin_count > 0 => {}
                    other => {
                        let state = other.map_or("gone".to_string(), |s| {
                            format!(
                                "sealed={} pins={} refs={}",
                                s.sealed, s.pin_count, s.ref_count
                            )
                        });
                        let what = format!(
                            "{holder}: READ {op} by {requester} served from {granted_object}, which is not pinned ({state})"
                        );
                        self.checker.violation(self.now, what);
                    }
                }
                let at = self
                    .after(self.network.wire_ns(holder, requester, bytes.len() as u64) + latency);
                let mut bytes = bytes;
                if let Some(at) = self.corruption(bytes.len()) {
                    bytes[at.0] ^= at.1;
                    self.record(|| format!("FAULT corrupt byte {} of {op}'s data", at.0));
                }
                self.schedule(at, complete(Ok(bytes)));
            }
        }
    }
}
