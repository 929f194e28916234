//! One live connection: its [`VerbsConnection`] and the bookkeeping around it (outstanding READ
//! operations and the work requests that make them up, posts waiting for send-queue room), the
//! completion handling that turns work completions into [`FabricEvent`]s, and teardown.
//!
//! All of it sits behind one `Mutex<ConnState>` taken by callers (send, post_read) and by the
//! poller; see the parent module for the lock order.

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};

use skyriver_core::node::{ReadError, ReadOpId};
use skyriver_core::{NodeId, RemoteRegion};

use super::errors::{ConnectionLost, HelloShapeError, RemoteRegionError};
use super::hello::WireArena;
use super::{lock, Shared, Slot};
use crate::arena::WritableRegion;
use crate::fabric::{EventPlace, FabricError, FabricEvent, MessageBytes};
use crate::verbs::{
    Completion, NegotiatedParams, Opcode, PostError, ReadRequest, RemoteChunk, VerbsConnection,
    WcStatus,
};

/// A peer's arena as this side may READ it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RemoteArena {
    base: u64,
    len: u64,
    /// The key the peer's core puts in its `RemoteRegion`s: its first region's rkey.
    key: u32,
    chunks: Vec<RemoteChunk>,
}

/// A peer's registrations, by address, from its hello.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RemoteTable {
    arenas: Vec<RemoteArena>,
}

impl RemoteTable {
    /// Builds the table; the hello was validated (chunks non-empty and contiguous).
    pub(super) fn from_hello(arenas: &[WireArena]) -> Result<RemoteTable, HelloShapeError> {
        let mut out: Vec<RemoteArena> = arenas
            .iter()
            .filter(|a| !a.chunks.is_empty())
            .map(|a| RemoteArena {
                base: a.chunks[0].addr,
                len: a.chunks.iter().map(|c| c.len).sum(),
                key: a.chunks[0].rkey,
                chunks: a
                    .chunks
                    .iter()
                    .map(|c| RemoteChunk {
                        addr: c.addr,
                        len: c.len,
                        rkey: c.rkey,
                    })
                    .collect(),
            })
            .collect();
        out.sort_by_key(|a| a.base);
        for w in out.windows(2) {
            if w[0]
                .base
                .checked_add(w[0].len)
                .is_none_or(|end| end > w[1].base)
            {
                return Err(HelloShapeError::OverlappingArenas);
            }
        }
        Ok(RemoteTable { arenas: out })
    }

    /// The memory regions of the peer's arena holding all of `region`, if its key is that
    /// arena's; otherwise why not.
    pub(super) fn resolve(
        &self,
        region: &RemoteRegion,
    ) -> Result<&[RemoteChunk], RemoteRegionError> {
        let end = region
            .addr
            .checked_add(region.len)
            .ok_or(RemoteRegionError::Overflow)?;
        let i = self
            .arenas
            .partition_point(|a| a.base + a.len <= region.addr);
        let a = self
            .arenas
            .get(i)
            .filter(|a| a.base <= region.addr)
            .ok_or(RemoteRegionError::OutsideArenas)?;
        if end > a.base + a.len {
            return Err(RemoteRegionError::PastEnd {
                base: a.base,
                len: a.len,
            });
        }
        if region.rkey != a.key {
            return Err(RemoteRegionError::WrongKey {
                rkey: region.rkey,
                base: a.base,
                key: a.key,
            });
        }
        Ok(&a.chunks)
    }
}

/// Where a READ's data lands and where its completion goes, claimed and taken by the
/// fabric's `post_read` before the READ is planned.
pub(super) struct ReadTarget {
    /// The destination, claimed for writing.
    pub(super) destination: WritableRegion,
    /// The place of its `ReadCompleted` in the driver's channel.
    pub(super) completion: EventPlace,
}

/// A READ operation of the core: one or more posted lists.
struct OpState {
    op: ReadOpId,
    lists_left: usize,
    /// Where the device writes the data: claimed from the post until the op is over (all its
    /// lists completed, one failed, or the QPs destroyed), and released before the
    /// `ReadCompleted`, so nothing in this process views these bytes while the device may
    /// write them.
    destination: WritableRegion,
    /// The place of its `ReadCompleted` in the driver's channel, taken when it was posted.
    completion: EventPlace,
}

impl OpState {
    /// Tells the driver the op is over, through the place taken for it; the destination's
    /// claim ends first.
    fn complete(self, result: Result<(), ReadError>) {
        let OpState {
            op,
            destination,
            completion,
            ..
        } = self;
        drop(destination);
        completion.send(FabricEvent::ReadCompleted { op, result });
    }
}

/// A posted (or queued) list of READ work requests; keyed by its last (signaled) wr id.
struct ListRef {
    first: u64,
    op_key: u64,
}

/// Everything behind a connection's lock.
pub(super) struct ConnState {
    /// `None` once torn down (QPs destroyed).
    pub(super) conn: Option<VerbsConnection>,
    /// The TCP control stream, non-blocking: EOF means the peer is gone.
    control: TcpStream,
    /// Next READ work request id.
    pub(super) next_wr_id: u64,
    /// Outstanding READ operations, by the wr id of their first work request.
    ops: BTreeMap<u64, OpState>,
    /// Posted or queued lists, by the wr id of their last work request.
    lists: BTreeMap<u64, ListRef>,
    /// Per lane, READ lists waiting for send-queue room, in order.
    queued_reads: Vec<VecDeque<Vec<ReadRequest>>>,
    queued_read_lists: usize,
    /// Messages waiting for send-queue room, in order.
    queued_sends: VecDeque<Vec<u8>>,
    /// Bytes of `queued_sends`.
    queued_send_bytes: usize,
    /// Receives polled during the handshake's probe, delivered first.
    backlog: Vec<Completion>,
    completions: Vec<Completion>,
}

impl ConnState {
    pub(super) fn new(
        conn: VerbsConnection,
        control: TcpStream,
        backlog: Vec<Completion>,
        lanes: usize,
    ) -> ConnState {
        ConnState {
            conn: Some(conn),
            control,
            next_wr_id: 1,
            ops: BTreeMap::new(),
            lists: BTreeMap::new(),
            queued_reads: (0..lanes).map(|_| VecDeque::new()).collect(),
            queued_read_lists: 0,
            queued_sends: VecDeque::new(),
            queued_send_bytes: 0,
            backlog,
            completions: Vec::new(),
        }
    }

    /// The control stream's descriptor, for the idle poller to sleep on.
    pub(super) fn control_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.control)
    }
}

/// A live connection to one peer.
pub(super) struct PeerConn {
    pub(super) peer: NodeId,
    pub(super) lanes: usize,
    pub(super) remote: RemoteTable,
    pub(super) state: Mutex<ConnState>,
}

/// Destroying a connection's queue pairs normally takes microseconds; longer is worth a
/// warning, as the poller serves no other peer meanwhile.
const SLOW_DESTROY: std::time::Duration = std::time::Duration::from_secs(1);

fn read_error(status: WcStatus) -> ReadError {
    match status {
        WcStatus::REMOTE_ACCESS => ReadError::RemoteAccess,
        WcStatus::FLUSHED => ReadError::ConnectionLost,
        s => ReadError::QueuePair(s.to_string()),
    }
}

impl PeerConn {
    pub(super) fn new(
        peer: NodeId,
        params: NegotiatedParams,
        remote: RemoteTable,
        state: ConnState,
    ) -> PeerConn {
        PeerConn {
            peer,
            lanes: params.lanes,
            remote,
            state: Mutex::new(state),
        }
    }

    /// Posts a message on lane 0, or queues it behind earlier ones.
    pub(super) fn send(
        &self,
        st: &mut ConnState,
        s: &Shared,
        bytes: Vec<u8>,
    ) -> Result<(), FabricError> {
        let Some(conn) = st.conn.as_mut() else {
            return Err(FabricError::NotConnected(self.peer));
        };
        if st.queued_sends.is_empty() {
            match conn.post_send(0, 0, &bytes) {
                Ok(()) => return Ok(()),
                Err(PostError::QueueFull { .. }) => {}
                Err(source) => {
                    self.teardown(st, s, ConnectionLost::PostSend { source });
                    return Err(FabricError::NotConnected(self.peer));
                }
            }
        }
        let (queued, queued_bytes) = (st.queued_sends.len(), st.queued_send_bytes);
        let (max_messages, max_bytes) = (s.config.max_queued_sends, s.config.max_queued_send_bytes);
        if queued >= max_messages || (queued > 0 && queued_bytes + bytes.len() > max_bytes) {
            let reason = ConnectionLost::PeerNotReading {
                queued,
                queued_bytes,
                max_messages,
                max_bytes,
            };
            self.teardown(st, s, reason);
            return Err(FabricError::PeerNotReading {
                peer: self.peer,
                queued,
                limit: max_messages,
                unit: "messages",
            });
        }
        st.queued_send_bytes += bytes.len();
        st.queued_sends.push_back(bytes);
        Ok(())
    }

    /// Posts a planned READ operation (work request ids from `st.next_wr_id`) on `lane`, in
    /// lists of at most `max_reads_per_list`, queueing what does not fit. Completes the op with
    /// an error when it cannot be posted at all.
    ///
    /// `reqs` write only into the target's destination (planned from it, through the arena's
    /// registration), which the op holds until it is over; its completion is told through the
    /// target's place.
    pub(super) fn post_read(
        &self,
        st: &mut ConnState,
        s: &Shared,
        op: ReadOpId,
        lane: usize,
        reqs: Vec<ReadRequest>,
        target: ReadTarget,
    ) {
        let ReadTarget {
            destination,
            completion,
        } = target;
        // The destination's claim ends before the failure is told.
        let fail = |destination: WritableRegion, completion: EventPlace, e: ReadError| {
            OpState {
                op,
                lists_left: 0,
                destination,
                completion,
            }
            .complete(Err(e));
        };
        if st.conn.is_none() {
            return fail(destination, completion, ReadError::ConnectionLost);
        }
        let (Some(first), Some(last)) = (reqs.first(), reqs.last()) else {
            return fail(
                destination,
                completion,
                ReadError::QueuePair("empty READ".into()),
            );
        };
        assert_eq!(
            first.wr_id, st.next_wr_id,
            "READ planned with the next wr ids"
        );
        let (key, last_id) = (first.wr_id, last.wr_id);
        let per_list = s.config.max_reads_per_list as usize;
        let lists: Vec<Vec<ReadRequest>> = reqs.chunks(per_list).map(<[_]>::to_vec).collect();
        if st.queued_read_lists + lists.len() > s.config.max_queued_read_lists {
            return fail(
                destination,
                completion,
                ReadError::QueuePair(format!(
                    "{} READ lists already waiting for send-queue room",
                    st.queued_read_lists
                )),
            );
        }
        st.next_wr_id = last_id + 1;
        st.ops.insert(
            key,
            OpState {
                op,
                lists_left: lists.len(),
                destination,
                completion,
            },
        );
        let mut failure = None;
        for list in lists {
            // Chunks of a non-empty vector are non-empty.
            let (lf, ll) = (list[0].wr_id, list[list.len() - 1].wr_id);
            st.lists.insert(
                ll,
                ListRef {
                    first: lf,
                    op_key: key,
                },
            );
            if failure.is_some() {
                continue;
            }
            let conn = st
                .conn
                .as_mut()
                .expect("checked above, not torn down since");
            if st.queued_reads[lane].is_empty() {
                // SAFETY: the list writes only into the op's destination, claimed in `st.ops`
                // (no other view of it in this process) until the op is over: its last
                // completion polled, a failed one (the QP then writes nothing more), or the QP
                // destroyed at teardown before `st.ops` is cleared. The arena stays mapped and
                // registered while the connection lives (`Shared`'s drop order).
                match unsafe { conn.post_reads(lane, &list) } {
                    Ok(()) => continue,
                    Err(PostError::QueueFull { .. }) => {}
                    Err(source) => {
                        failure = Some(ConnectionLost::PostReads { lane, source });
                        continue;
                    }
                }
            }
            st.queued_reads[lane].push_back(list);
            st.queued_read_lists += 1;
        }
        if let Some(reason) = failure {
            self.teardown(st, s, reason);
        }
    }

    /// One round of the poller for this connection: deliver the probe's backlog, poll a batch of
    /// completions, post queued work, and now and then check the control stream. Returns how
    /// much happened (0: idle).
    pub(super) fn service(&self, st: &mut ConnState, s: &Shared, check_liveness: bool) -> usize {
        if st.conn.is_none() {
            return 0;
        }
        let mut work = 0;
        let reclaimed = {
            let conn = st.conn.as_mut().expect("checked above");
            conn.reclaim_returned()
        };
        match reclaimed {
            Ok(n) => work += n,
            Err(source) => {
                self.teardown(st, s, ConnectionLost::Repost { source });
                return 1;
            }
        }
        let mut batch = std::mem::take(&mut st.backlog);
        let polled = {
            let conn = st.conn.as_mut().expect("checked above");
            conn.poll(&mut batch)
        };
        if let Err(source) = polled {
            self.teardown(st, s, ConnectionLost::Poll { source });
            return 1;
        }
        work += batch.len();
        for c in batch.drain(..) {
            if let Err(reason) = self.complete(st, s, c) {
                self.teardown(st, s, reason);
                return work.max(1);
            }
        }
        st.completions = batch;
        if let Err(reason) = self.post_queued(st) {
            self.teardown(st, s, reason);
            return work.max(1);
        }
        if work == 0 {
            if let Some(conn) = st.conn.as_mut() {
                if let Err(source) = conn.flush_reposts() {
                    self.teardown(st, s, ConnectionLost::Repost { source });
                    return 1;
                }
            }
        }
        if check_liveness {
            let mut buf = [0u8; 64];
            match st.control.read(&mut buf) {
                Ok(0) => {
                    self.teardown(st, s, ConnectionLost::ControlClosed);
                    return 1;
                }
                // Nothing is sent after the handshake; ignore stray bytes.
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    self.teardown(st, s, ConnectionLost::Control { source });
                    return 1;
                }
            }
        }
        work
    }

    /// Handles one completion; `Err` is a reason to tear the connection down.
    fn complete(
        &self,
        st: &mut ConnState,
        s: &Shared,
        c: Completion,
    ) -> Result<(), ConnectionLost> {
        match c.opcode {
            Opcode::Recv => {
                let Some(slot) = c.recv_slot() else {
                    return Err(ConnectionLost::Recv {
                        lane: c.lane,
                        status: c.status,
                    });
                };
                let conn = st.conn.as_mut().expect("serviced connections are live");
                // The slot goes to the driver with the message and is re-posted only when the
                // driver dropped it: a peer cannot have more messages waiting than slots.
                let message = conn
                    .take_recv(slot)
                    .map_err(|source| ConnectionLost::RecvSlot { source })?;
                s.emit(FabricEvent::Message {
                    peer: self.peer,
                    bytes: MessageBytes::slot(message),
                });
                Ok(())
            }
            Opcode::Send if c.status.is_success() => Ok(()),
            Opcode::Send => Err(ConnectionLost::Send {
                lane: c.lane,
                status: c.status,
            }),
            Opcode::BindWindow | Opcode::InvalidateWindow if c.status.is_success() => {
                if let Some(windows) = super::windows::windows(s) {
                    windows.completed(s, c.wr_id);
                }
                Ok(())
            }
            // The lane is in the error state: teardown fails the lease's grant (or completes
            // its revocation) with the connection.
            Opcode::BindWindow | Opcode::InvalidateWindow => Err(ConnectionLost::Send {
                lane: c.lane,
                status: c.status,
            }),
            Opcode::Read => {
                let list = st
                    .lists
                    .range(c.wr_id..)
                    .next()
                    .filter(|(_, l)| l.first <= c.wr_id)
                    .map(|(&last, l)| (last, l.op_key));
                let Some((last, op_key)) = list else {
                    // Not one of ours (cannot happen); only an error matters.
                    return if c.status.is_success() {
                        Ok(())
                    } else {
                        Err(ConnectionLost::Read {
                            lane: c.lane,
                            status: c.status,
                        })
                    };
                };
                if c.status.is_success() {
                    if c.wr_id == last {
                        st.lists.remove(&last);
                        let op = st.ops.get_mut(&op_key).expect("a list's op is outstanding");
                        op.lists_left -= 1;
                        if op.lists_left == 0 {
                            // Its destination's claim ends before the driver hears of it.
                            if let Some(op) = st.ops.remove(&op_key) {
                                op.complete(Ok(()));
                            }
                        }
                    }
                    return Ok(());
                }
                // The QP is in the error state now: this op fails with the cause, the others
                // with ConnectionLost at teardown.
                st.lists.retain(|_, l| l.op_key != op_key);
                if let Some(op) = st.ops.remove(&op_key) {
                    op.complete(Err(read_error(c.status)));
                }
                Err(ConnectionLost::Read {
                    lane: c.lane,
                    status: c.status,
                })
            }
        }
    }

    /// Posts queued messages and READ lists while the send queues have room.
    fn post_queued(&self, st: &mut ConnState) -> Result<(), ConnectionLost> {
        let ConnState {
            conn,
            queued_sends,
            queued_send_bytes,
            queued_reads,
            queued_read_lists,
            ..
        } = st;
        let Some(conn) = conn.as_mut() else {
            return Ok(());
        };
        while let Some(bytes) = queued_sends.front() {
            match conn.post_send(0, 0, bytes) {
                Ok(()) => {
                    *queued_send_bytes -= bytes.len();
                    queued_sends.pop_front();
                }
                Err(PostError::QueueFull { .. }) => break,
                Err(source) => return Err(ConnectionLost::PostSend { source }),
            }
        }
        for (lane, queue) in queued_reads.iter_mut().enumerate() {
            while let Some(list) = queue.front() {
                // SAFETY: as in `post_read`: a queued list belongs to an op still in `st.ops`
                // (teardown clears the queues with the ops), whose destination it alone writes.
                match unsafe { conn.post_reads(lane, list) } {
                    Ok(()) => {
                        queue.pop_front();
                        *queued_read_lists -= 1;
                    }
                    Err(PostError::QueueFull { .. }) => break,
                    Err(source) => return Err(ConnectionLost::PostReads { lane, source }),
                }
            }
        }
        Ok(())
    }

    /// Arms the connection's completion queue before the poller sleeps; `Err` tears it down.
    /// Returns false when the connection is gone.
    pub(super) fn arm(&self, st: &mut ConnState, s: &Shared) -> bool {
        let Some(conn) = st.conn.as_mut() else {
            return false;
        };
        if let Err(source) = conn.arm() {
            self.teardown(st, s, ConnectionLost::Arm { source });
            return false;
        }
        true
    }

    /// Ends the connection: frees its leases' memory windows, destroys its QPs (the device
    /// stops reading and writing memory for it), completes every outstanding READ with
    /// [`ReadError::ConnectionLost`], removes it from the table and reports `PeerLost`, the last
    /// three under the table lock so a new connection's `PeerConnected` cannot come before them.
    /// Idempotent.
    pub(super) fn teardown(&self, st: &mut ConnState, s: &Shared, reason: ConnectionLost) {
        let Some(mut conn) = st.conn.take() else {
            return;
        };
        for lane in 0..conn.lanes() {
            let _ = conn.force_error(lane);
        }
        // The windows go before the QPs: a type 2 window bound to a QP holds it, and destroying
        // a held QP waits (on rxe about 100 s) for the hold to end. A freed window lets no
        // READ in, whatever state its QP is in.
        if let Some(windows) = super::windows::windows(s) {
            windows.connection_gone(s, self);
        }
        let destroying = std::time::Instant::now();
        drop(conn);
        let took = destroying.elapsed();
        if took > SLOW_DESTROY {
            tracing::warn!(peer = %self.peer, ?took, "verbs fabric: destroying a connection's queue pairs was slow");
        }
        let _ = st.control.shutdown(Shutdown::Both);
        st.queued_sends.clear();
        st.queued_send_bytes = 0;
        st.queued_reads.iter_mut().for_each(VecDeque::clear);
        st.queued_read_lists = 0;
        st.lists.clear();
        st.backlog.clear();
        // The QPs are destroyed (above): the device writes no destination any more, and their
        // claims end as they fail, each before its failure is told.
        let ops = std::mem::take(&mut st.ops);
        let mut t = lock(&s.table);
        if matches!(t.peers.get(&self.peer), Some(Slot::Up(c)) if std::ptr::eq(Arc::as_ptr(c), self))
        {
            t.peers.remove(&self.peer);
        }
        let reads_failed = ops.len();
        for op in ops.into_values() {
            op.complete(Err(ReadError::ConnectionLost));
        }
        if s.shutdown.load(std::sync::atomic::Ordering::Acquire) {
            // Our own shutdown (a daemon stopping): expected, not worth a warning.
            tracing::info!(peer = %self.peer, %reason, reads_failed, "verbs fabric: connection closed");
        } else {
            tracing::warn!(peer = %self.peer, %reason, reads_failed, "verbs fabric: connection lost");
        }
        s.emit(FabricEvent::PeerLost {
            peer: self.peer,
            reason: reason.to_string(),
        });
        drop(t);
    }
}

#[cfg(test)]
mod tests {
    use super::super::hello::WireChunk;
    use super::*;

    fn table() -> RemoteTable {
        let arena = |id: u32, base: u64, sizes: &[u64], key: u32| {
            let mut addr = base;
            WireArena {
                arena: id,
                chunks: sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| {
                        let c = WireChunk {
                            addr,
                            len,
                            rkey: key + i as u32,
                        };
                        addr += len;
                        c
                    })
                    .collect(),
            }
        };
        RemoteTable::from_hello(&[
            arena(1, 0x20_0000, &[0x1000, 0x1000], 50),
            arena(0, 0x10_0000, &[0x4000], 10),
        ])
        .unwrap()
    }

    fn region(addr: u64, len: u64, rkey: u32) -> RemoteRegion {
        RemoteRegion { addr, len, rkey }
    }

    #[test]
    fn reads_resolve_to_the_arena_chunk_table() {
        let t = table();
        assert_eq!(t.resolve(&region(0x10_0000, 0x4000, 10)).unwrap().len(), 1);
        // Across the split of arena 1, named by its first region's key.
        let chunks = t.resolve(&region(0x20_0800, 0x1000, 50)).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1].rkey, 51);
    }

    #[test]
    fn reads_outside_the_arenas_or_with_other_keys_are_refused() {
        let t = table();
        assert!(t.resolve(&region(0x10_0000 - 1, 2, 10)).is_err());
        assert!(t.resolve(&region(0x10_3fff, 2, 10)).is_err());
        assert!(t.resolve(&region(0x20_0000, 0x10, 51)).is_err());
        assert!(t.resolve(&region(0x30_0000, 1, 10)).is_err());
        assert!(t.resolve(&region(u64::MAX, 2, 10)).is_err());
        assert!(t.resolve(&region(0, 1, 10)).is_err());
    }

    #[test]
    fn overlapping_arenas_are_refused() {
        let a = |base| WireArena {
            arena: 0,
            chunks: vec![WireChunk {
                addr: base,
                len: 0x2000,
                rkey: 1,
            }],
        };
        assert!(RemoteTable::from_hello(&[a(0x1000), a(0x2000)]).is_err());
        assert!(RemoteTable::from_hello(&[a(0x1000), a(0x3000)]).is_ok());
    }

    #[test]
    fn completion_statuses_map_to_read_errors() {
        assert_eq!(read_error(WcStatus::REMOTE_ACCESS), ReadError::RemoteAccess);
        assert_eq!(read_error(WcStatus::FLUSHED), ReadError::ConnectionLost);
        assert!(matches!(
            read_error(WcStatus::RETRY_EXCEEDED),
            ReadError::QueuePair(_)
        ));
    }
}
