//! The simulator as a node's driver: each kind of output becomes a scheduled event (a message
//! on the simulated network, a READ served from the simulated arena, a request to the
//! directory, a write to the simulated disk) or a checked effect on the simulated memory.

use rand::Rng;
use skyriver_core::client_protocol::Response;
use skyriver_core::directory::{DirectoryOpId, DirectoryRequest};
use skyriver_core::node::{DriveHost, Node, NodeDriver, ReadGrant, ReadOpId};
use skyriver_core::wire::{self, EagerHeader, InputBytes, PeerMessage};
use skyriver_core::{
    ClientId, DurableChange, LocalRegion, NodeId, ObjectEvent, ObjectId, ReadError, RemoteRegion,
    RequestId, TransferId,
};

use super::{Cluster, Event, SimRead};

/// How long the simulated fabric takes to grant or revoke READ access (a memory window's bind
/// or invalidation).
const FABRIC_ACCESS_NS: u64 = 2_000;

/// One node's outputs, carried out by the cluster.
pub(super) struct SimDriver<'a> {
    pub(super) cluster: &'a mut Cluster,
    pub(super) n: NodeId,
}

/// The simulator answers nothing at once: grants, revocations and the rest come back as
/// scheduled events; a copy's hash is fed back while it is checked (see `verify_content`).
impl DriveHost<'static> for SimDriver<'_> {
    type Driver = Self;

    fn node(&mut self) -> &mut Node {
        self.cluster.nodes[self.n.0 as usize]
            .node
            .as_mut()
            .expect("a node being driven is alive")
    }

    fn driver(&mut self) -> &mut Self {
        self
    }
}

impl SimDriver<'_> {
    /// Grants `peer` READs of `region` of `object` in the simulated memory and answers the
    /// grant after the fabric's access time; `what` names it in the trace.
    fn grant_memory(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
        what: &str,
    ) {
        let (c, n) = (&mut *self.cluster, self.n);
        let sim_node = &mut c.nodes[n.0 as usize];
        let key = sim_node.memory.grant(peer, req, object, region);
        let inc = sim_node.inc;
        c.record(|| format!("{n} {what} {peer} {req} {object} {region} key {key:#x}"));
        c.schedule(
            c.after(FABRIC_ACCESS_NS),
            Event::ReadGranted {
                node: n,
                inc,
                reader: peer,
                req,
                result: Ok(ReadGrant { keys: vec![key] }),
            },
        );
    }
}

impl NodeDriver for SimDriver<'_> {
    fn send(&mut self, peer: NodeId, message: PeerMessage) {
        if let PeerMessage::NotFound { req }
        | PeerMessage::Busy { req }
        | PeerMessage::Error { req, .. }
        | PeerMessage::Redirect { req, .. } = &message
        {
            self.cluster.note_answer(self.n, peer, *req, None);
        }
        let bytes = wire::to_bytes(&message);
        self.cluster.transmit(self.n, peer, bytes);
    }

    fn send_eager(
        &mut self,
        peer: NodeId,
        header: EagerHeader,
        source: LocalRegion,
        object: ObjectId,
    ) {
        let (c, n) = (&mut *self.cluster, self.n);
        let Some(source) = c.eager_source(object, source) else {
            return;
        };
        c.note_answer(n, peer, header.req, Some(source));
        let now = c.now;
        let sim_node = &c.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        match store.summary(&object) {
            Some(s)
                if s.sealed
                    && s.info.region.offset <= source.offset
                    && source.end() <= s.info.region.end() => {}
            _ => c.checker.violation(
                now,
                format!("{n}: eager send of {source} is not inside sealed {object}"),
            ),
        }
        let mut bytes = Vec::new();
        wire::encode_eager(&header, &sim_node.memory.read(source), &mut bytes);
        if let Some((at, flip)) = c.corruption(source.len as usize) {
            // The payload ends the message.
            let payload_start = bytes.len() - source.len as usize;
            bytes[payload_start + at] ^= flip;
            c.record(|| {
                format!(
                    "FAULT corrupt byte {} of the eager chunk at {} of {object} to {peer}",
                    at, header.offset
                )
            });
        }
        c.transmit(n, peer, bytes);
    }

    fn post_read(
        &mut self,
        peer: NodeId,
        op: ReadOpId,
        lane: u16,
        local: LocalRegion,
        mut remote: RemoteRegion,
        object: ObjectId,
    ) {
        let (c, n) = (&mut *self.cluster, self.n);
        let now = c.now;
        let inc = c.nodes[n.0 as usize].inc;
        let store = c.nodes[n.0 as usize].node.as_ref().expect("alive").store();
        c.checker
            .check_write_target(now, n, store, object, local, "READ destination");
        c.record(|| format!("{n} post {op} lane {lane}: {remote} of {peer} -> {local}"));
        c.reads_in_flight += 1;
        let faults_on = c.mode.faults && c.now.0 / 1000 < c.params.faults_until_us;
        let connection = c.network.connection(n, peer);
        let read = SimRead {
            requester: n,
            requester_inc: inc,
            holder: peer,
            epoch: connection.epoch,
            op,
            local,
            object,
        };
        if c.refused_reads.refuses(faults_on) {
            // The daemon's fabric refuses the post when its event channel is full and the
            // loop feeds the failure right after the outputs: nothing reaches the holder.
            c.stats.reads_refused_busy += 1;
            c.record(|| format!("FAULT {n}'s fabric is busy: {op} not posted"));
            let capacity = super::faults::EVENT_CHANNEL_CAPACITY;
            c.schedule(
                now,
                Event::ReadComplete {
                    read,
                    result: Err(ReadError::Busy { capacity }),
                },
            );
            return;
        }
        if faults_on && c.rng.gen_range(0..1_000_000) < c.params.bad_rkey_ppm {
            c.record(|| format!("FAULT bad rkey on {op}"));
            remote.rkey ^= 0x5a5a;
        }
        let latency = c.network.latency_ns(n, peer);
        c.schedule(c.after(latency), Event::ReadServe { read, remote });
    }

    fn write_local(&mut self, region: LocalRegion, payload: InputBytes, object: ObjectId) {
        let (c, n) = (&mut *self.cluster, self.n);
        let sim_node = &mut c.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        c.checker
            .check_write_target(c.now, n, store, object, region, "eager write");
        match c.input.get(payload.range()) {
            Some(bytes) => sim_node.memory.write(region, bytes),
            None => c.checker.violation(
                c.now,
                format!("{n}: eager write of {object} names bytes outside the input message"),
            ),
        }
    }

    fn write_inline(&mut self, region: LocalRegion, bytes: Vec<u8>, object: ObjectId) {
        let (c, n) = (&mut *self.cluster, self.n);
        let sim_node = &mut c.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        c.checker
            .check_write_target(c.now, n, store, object, region, "inline write");
        if region.len != bytes.len() as u64 {
            c.checker.violation(
                c.now,
                format!("{n}: inline write of {} bytes into {region}", bytes.len()),
            );
        }
        sim_node.memory.write(region, &bytes);
        c.record(|| format!("{n} wrote {object} inline at {region}"));
    }

    fn verify_content(&mut self, transfer: TransferId, region: LocalRegion, object: ObjectId) {
        self.cluster
            .verify_content(self.n, transfer, region, object);
    }

    fn trace(&mut self, client: ClientId, request: RequestId, _record: bool) {
        // No clock to stamp with in the simulator.
        self.cluster
            .client_replied(self.n, client, request, Response::Traced(Vec::new()));
    }

    fn grant_read(&mut self, peer: NodeId, req: TransferId, object: ObjectId, region: LocalRegion) {
        let (c, n) = (&mut *self.cluster, self.n);
        c.note_answer(n, peer, req, None);
        let sim_node = &mut c.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        match store.summary(&object) {
            Some(s) if s.sealed && s.pin_count > 0 && s.info.region == region => {}
            _ => c.checker.violation(
                c.now,
                format!("{n}: grants READs of {region} of {object}, not a pinned sealed object"),
            ),
        }
        self.grant_memory(peer, req, object, region, "grant");
    }

    fn grant_partial_read(
        &mut self,
        peer: NodeId,
        req: TransferId,
        object: ObjectId,
        region: LocalRegion,
    ) {
        let (c, n) = (&mut *self.cluster, self.n);
        let sim_node = &mut c.nodes[n.0 as usize];
        let store = sim_node.node.as_ref().expect("alive").store();
        match store.summary(&object) {
            Some(s) if !s.sealed && s.info.region == region => {}
            _ => c.checker.violation(
                c.now,
                format!("{n}: relays READs of {region} of {object}, not a copy it is receiving"),
            ),
        }
        self.grant_memory(peer, req, object, region, "grant partial");
    }

    fn revoke_read(&mut self, peer: NodeId, req: TransferId, object: ObjectId, _: LocalRegion) {
        let (c, n) = (&mut *self.cluster, self.n);
        let inc = c.nodes[n.0 as usize].inc;
        c.record(|| format!("{n} revoke {peer} {req} {object}"));
        c.schedule(
            c.after(FABRIC_ACCESS_NS),
            Event::ReadRevoked {
                node: n,
                inc,
                reader: peer,
                req,
            },
        );
    }

    fn directory(&mut self, op: DirectoryOpId, request: DirectoryRequest) {
        self.cluster.send_to_directory(self.n, op, request);
    }

    fn reply(&mut self, client: ClientId, request: RequestId, response: Response) {
        self.cluster
            .client_replied(self.n, client, request, response);
    }

    fn event(&mut self, _client: ClientId, _event: ObjectEvent) {}

    fn close_client(&mut self, client: ClientId, reason: String) {
        self.cluster.client_closed(self.n, client, reason);
    }

    fn persist(&mut self, seq: u64, change: DurableChange) {
        self.cluster.persist(self.n, seq, change);
    }

    fn connect(&mut self, peer: NodeId, address: std::net::SocketAddr) {
        self.cluster.dial(self.n, peer, address);
    }

    fn spill(
        &mut self,
        op: skyriver_core::store::SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<skyriver_core::ContentDigest>,
    ) {
        self.cluster.spill_write(self.n, op, object, region, digest);
    }

    fn restore(
        &mut self,
        op: skyriver_core::store::SpillOpId,
        object: ObjectId,
        region: LocalRegion,
        digest: Option<skyriver_core::ContentDigest>,
    ) {
        self.cluster
            .spill_restore(self.n, op, object, region, digest);
    }

    fn discard_spilled(&mut self, op: skyriver_core::store::SpillOpId, _object: ObjectId) {
        self.cluster.spill_discard(self.n, op);
    }

    fn local(&mut self, event: ObjectEvent) {
        let (c, n) = (&mut *self.cluster, self.n);
        match event {
            ObjectEvent::Sealed { id, .. } => {
                let sim_node = &c.nodes[n.0 as usize];
                let store = sim_node.node.as_ref().expect("alive").store();
                c.checker
                    .check_sealed_object(c.now, n, store, &sim_node.memory, id, "at seal");
                c.record(|| format!("{n} sealed {id}"));
            }
            ObjectEvent::Deleted { id } => {
                c.object_left(n, id);
                c.record(|| format!("{n} dropped {id}"));
            }
        }
    }
}
