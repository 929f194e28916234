//! The data path of a connection: SEND (inline when small), READ lists, receive slots and
//! their reposting, completion polling.

use std::ffi::{c_int, c_uint};
use std::io;
use std::time::{Duration, Instant};

use super::*;
use crate::verbs::sys::library::{ibv_poll_cq, ibv_post_send, ibv_post_srq_recv};
use crate::verbs::MAX_MESSAGE_BYTES;

impl VerbsConnection {
    /// SEND `bytes` (at most the agreed receive slot size) on `lane`; the completion
    /// reports `wr_id`. Small messages go inline; others are copied into a registered send
    /// slot, so `bytes` may be reused at once.
    pub fn post_send(&mut self, lane: usize, wr_id: u64, bytes: &[u8]) -> Result<(), PostError> {
        let limit = u64::from(self.params.recv_slot_bytes);
        if bytes.is_empty() || bytes.len() as u64 > limit {
            return Err(PostError::BadLength {
                len: bytes.len() as u64,
                limit,
            });
        }
        let inline = bytes.len() as u32 <= self.params.max_inline_bytes;
        let slot_bytes = self.params.recv_slot_bytes as usize;
        let send_base = self.send_reg.addr();
        let send_lkey = self.send_reg.chunks()[0].lkey;
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, 1, depth)?;
        let Some(slot) = l.free_send_slots.pop() else {
            return Err(PostError::QueueFull {
                lane,
                in_flight: l.sq_in_flight,
                depth,
                wanted: 1,
            });
        };
        let offset = slot as usize * slot_bytes;
        let id = (KIND_SEND << KIND_SHIFT) | u64::from(slot);
        let mut sge = if inline {
            // Inline data is copied out of `bytes` by the post itself; no key is needed.
            ibv_sge {
                addr: bytes.as_ptr() as u64,
                length: bytes.len() as u32,
                lkey: 0,
            }
        } else {
            // The slab has one chunk (registered without a size cap); the slot is free, so the
            // device is not reading it.
            self.send_mem[offset..offset + bytes.len()].copy_from_slice(bytes);
            ibv_sge {
                addr: send_base + offset as u64,
                length: bytes.len() as u32,
                lkey: send_lkey,
            }
        };
        let mut wr = send_wr(id, IBV_WR_SEND, &mut sge);
        // IBV_SEND_INLINE must be in the WR flags: the provider copies the bytes at post time.
        wr.send_flags = IBV_SEND_SIGNALED | if inline { IBV_SEND_INLINE } else { 0 };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the WR and its one SGE live on this stack frame for the
        // call. Inline: the provider copies `bytes` before returning. Otherwise the SGE names
        // the send slot [send_base + offset, + len) of the registered send slab (lkey
        // send_lkey), which stays registered while the QP lives, and the slot is not reused
        // until this WR's completion is polled.
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), &mut wr, &mut bad) };
        if let Err(e) = crate::verbs::objects::check_rc(rc) {
            l.free_send_slots.push(slot);
            return Err(post_err("ibv_post_send(SEND)")(e));
        }
        l.sq_in_flight += 1;
        l.blocks.push_back(1);
        self.send_wr_ids[slot as usize] = wr_id;
        Ok(())
    }

    /// Post `reads` on `lane` as one work request list. Only the last one is signaled: its
    /// successful completion means the whole list is done (a QP executes its work requests
    /// in order). Any failed request completes on its own with an error status.
    ///
    /// # Safety
    ///
    /// The device writes each read's `[local_addr, local_addr + len)` at some time until the
    /// read is over: the list's signaled completion polled, an error completion of this
    /// lane polled (the QP then writes nothing more), or the connection dropped. Until then,
    /// for every read:
    /// - the range lies in memory registered under `lkey` (the device checks this much), and
    ///   stays mapped;
    /// - nothing in this process reads or writes the range: for arena memory, the caller holds
    ///   a [`WritableRegion`](crate::WritableRegion) of it; for memory of its own, it makes
    ///   no reference to it.
    ///
    /// The remote side needs no promise: the peer's device checks `rkey` and the range
    /// against what the peer registered or bound.
    pub unsafe fn post_reads(
        &mut self,
        lane: usize,
        reads: &[ReadRequest],
    ) -> Result<(), PostError> {
        if reads.is_empty() {
            return Ok(());
        }
        for r in reads {
            if r.wr_id > ID_MASK {
                return Err(PostError::BadWrId(r.wr_id));
            }
            if r.len == 0 || u64::from(r.len) > MAX_MESSAGE_BYTES {
                return Err(PostError::BadLength {
                    len: u64::from(r.len),
                    limit: MAX_MESSAGE_BYTES,
                });
            }
        }
        let n = u32::try_from(reads.len()).unwrap_or(u32::MAX);
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, n, depth)?;
        let mut sges: Vec<ibv_sge> = reads
            .iter()
            .map(|r| ibv_sge {
                addr: r.local_addr,
                length: r.len,
                lkey: r.lkey,
            })
            .collect();
        let mut wrs: Vec<ibv_send_wr> = reads
            .iter()
            .zip(sges.iter_mut())
            .map(|(r, sge)| {
                let mut wr = send_wr((KIND_READ << KIND_SHIFT) | r.wr_id, IBV_WR_RDMA_READ, sge);
                wr.wr.rdma = ibv_send_wr_rdma {
                    remote_addr: r.remote_addr,
                    rkey: r.rkey,
                };
                wr
            })
            .collect();
        // Only the last one is signaled; link the list.
        if let Some(last) = wrs.last_mut() {
            last.send_flags = IBV_SEND_SIGNALED;
        }
        for i in 1..wrs.len() {
            let next: *mut ibv_send_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the linked WRs and their SGEs live in `wrs` and `sges` (not
        // moved or resized after linking) for the call. Each SGE names a local range that stays
        // mapped and that nothing in this process views until the read is over (this
        // function's contract), so the device's writes alias no reference.
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        crate::verbs::objects::check_rc(rc).map_err(post_err("ibv_post_send(READ)"))?;
        l.sq_in_flight += n;
        l.blocks.push_back(n);
        Ok(())
    }

    /// Binds `window` to `[addr, addr + len)` of `registration` for remote READs through
    /// `lane`'s queue pair (a type 2 window is usable through that QP only), as one signaled
    /// work request; its completion (`Opcode::BindWindow`) says the binding holds. Returns the
    /// window's new rkey, which the peer READs with; the previous binding's rkey is refused
    /// from then on.
    pub fn bind_window(
        &mut self,
        lane: usize,
        wr_id: u64,
        window: &mut MemoryWindow,
        registration: &Registration,
        addr: u64,
        len: u64,
    ) -> Result<u32, PostError> {
        if wr_id > ID_MASK {
            return Err(PostError::BadWrId(wr_id));
        }
        let mr = registration
            .region_for(addr, len)
            .filter(|_| len > 0)
            .ok_or(PostError::OutsideRegistration { addr, len })?;
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, 1, depth)?;
        let rkey = window.next_rkey();
        let mut sge = ibv_sge::default();
        let mut wr = send_wr(
            (KIND_WINDOW << KIND_SHIFT) | wr_id,
            IBV_WR_BIND_MW,
            &mut sge,
        );
        wr.num_sge = 0;
        wr.sg_list = std::ptr::null_mut();
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.bind_mw = ibv_send_wr_bind_mw {
            mw: window.as_ptr(),
            rkey,
            bind_info: ibv_mw_bind_info {
                mr: mr.as_ptr(),
                addr,
                length: len,
                mw_access_flags: IBV_ACCESS_REMOTE_READ as c_uint,
            },
        };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP, the window and the region are live for the call (borrowed); the
        // request names no local memory. The device checks the range against the region.
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), &mut wr, &mut bad) };
        crate::verbs::objects::check_rc(rc).map_err(post_err("ibv_post_send(BIND_MW)"))?;
        l.sq_in_flight += 1;
        l.blocks.push_back(1);
        window.set_rkey(rkey);
        Ok(rkey)
    }

    /// Invalidates `window`'s current binding on `lane` (the lane it was bound on), as one
    /// signaled work request; once it completes (`Opcode::InvalidateWindow`) a READ with the
    /// window's rkey fails with a remote access error.
    pub fn invalidate_window(
        &mut self,
        lane: usize,
        wr_id: u64,
        window: &MemoryWindow,
    ) -> Result<(), PostError> {
        if wr_id > ID_MASK {
            return Err(PostError::BadWrId(wr_id));
        }
        let depth = self.params.send_queue_depth;
        let l = lane_checked(&mut self.lanes, lane, 1, depth)?;
        let mut sge = ibv_sge::default();
        let mut wr = send_wr(
            (KIND_WINDOW << KIND_SHIFT) | wr_id,
            IBV_WR_LOCAL_INV,
            &mut sge,
        );
        wr.num_sge = 0;
        wr.sg_list = std::ptr::null_mut();
        wr.send_flags = IBV_SEND_SIGNALED;
        // `imm_data` is the union's `invalidate_rkey`.
        wr.imm_data = window.rkey();
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the request names no memory, only the rkey to invalidate.
        let rc = unsafe { ibv_post_send(l.qp.as_ptr(), &mut wr, &mut bad) };
        crate::verbs::objects::check_rc(rc).map_err(post_err("ibv_post_send(LOCAL_INV)"))?;
        l.sq_in_flight += 1;
        l.blocks.push_back(1);
        Ok(())
    }

    /// The message in a receive slot reported by a RECV completion.
    pub fn recv_bytes(&self, slot: RecvSlot) -> &[u8] {
        match self.recv_held.get(slot.0 as usize) {
            // SAFETY: the slot holds an arrived message: it is not posted, and it is not
            // re-posted while `&self` is borrowed (that takes `&mut self`).
            Some(&Some(len)) => unsafe { self.recv_slab.slot_bytes(slot.0, len) },
            // Not holding a message (never arrived, or released): the device may be writing it.
            _ => &[],
        }
    }

    /// Takes the message in a receive slot out of the connection, as a handle that keeps the
    /// slot out of circulation until dropped (on any thread); the slot is then re-posted by
    /// [`VerbsConnection::reclaim_returned`]. Taking a slot that holds no message is refused.
    pub fn take_recv(&mut self, slot: RecvSlot) -> Result<RecvMessage, PostError> {
        let len = match self.recv_held.get_mut(slot.0 as usize) {
            Some(held @ Some(_)) => held.take().unwrap_or(0),
            _ => return Err(PostError::SlotNotHeld(slot.0)),
        };
        self.recv_lent += 1;
        self.debug_check_recv_slots();
        // SAFETY: the slot held an arrived message (so it is not posted), and it is now
        // neither held nor queued for reposting: only the handle's drop brings it back.
        Ok(unsafe { RecvMessage::lend(self.recv_slab.clone(), slot.0, len) })
    }

    /// Re-posts the slots whose [`RecvMessage`]s were dropped since the last call (in batches,
    /// or at once when few receives are posted); returns how many came back.
    pub fn reclaim_returned(&mut self) -> Result<usize, PostError> {
        let n = self.recv_slab.take_returned(&mut self.to_repost);
        if n == 0 {
            return Ok(0);
        }
        // Cannot underflow: every returned slot was lent by `take_recv`, once.
        self.recv_lent -= n as u32;
        self.debug_check_recv_slots();
        if self.to_repost.len() as u32 >= self.repost_batch || self.recv_posted < self.repost_batch
        {
            self.repost().map_err(post_err("ibv_post_srq_recv"))?;
        }
        Ok(n)
    }

    /// Runs `waker` (on the dropping thread) whenever a lent message is dropped, so an owner
    /// that sleeps knows to call [`VerbsConnection::reclaim_returned`]. Set once; false if a
    /// waker was already set.
    pub fn set_return_waker(&self, waker: ReturnWaker) -> bool {
        self.recv_slab.set_waker(waker)
    }

    /// Every receive slot is in exactly one place: posted, holding a message, lent out (or
    /// returned and not yet reclaimed), or waiting to be reposted. A flushed receive leaves the
    /// count (the connection is dead by then), hence at most.
    fn debug_check_recv_slots(&self) {
        if cfg!(debug_assertions) {
            let held = self.recv_held.iter().filter(|h| h.is_some()).count() as u32;
            let accounted = self.recv_posted + held + self.recv_lent + self.to_repost.len() as u32;
            debug_assert!(
                accounted <= self.params.recv_slots,
                "receive slots: {} posted + {held} held + {} lent + {} to repost > {}",
                self.recv_posted,
                self.recv_lent,
                self.to_repost.len(),
                self.params.recv_slots
            );
        }
    }

    /// Messages taken with [`VerbsConnection::take_recv`] and not yet reclaimed.
    pub fn recv_lent(&self) -> u32 {
        self.recv_lent
    }

    /// Give a receive slot back; slots are reposted in batches. Releasing a slot that holds
    /// no message (twice, or never received) is refused.
    pub fn release_recv(&mut self, slot: RecvSlot) -> Result<(), PostError> {
        match self.recv_held.get_mut(slot.0 as usize) {
            Some(held @ Some(_)) => *held = None,
            _ => return Err(PostError::SlotNotHeld(slot.0)),
        }
        self.to_repost.push(slot.0);
        // Repost a full batch, or at once when the queue runs low on posted receives.
        if self.to_repost.len() as u32 >= self.repost_batch || self.recv_posted < self.repost_batch
        {
            self.repost().map_err(post_err("ibv_post_srq_recv"))?;
        }
        Ok(())
    }

    /// Repost every released or returned receive slot now.
    pub fn flush_reposts(&mut self) -> Result<(), PostError> {
        let n = self.recv_slab.take_returned(&mut self.to_repost);
        self.recv_lent -= n as u32;
        self.repost().map_err(post_err("ibv_post_srq_recv"))
    }

    /// Receive slots posted to the shared receive queue and not yet filled.
    pub fn recv_posted(&self) -> u32 {
        self.recv_posted
    }

    pub(super) fn repost(&mut self) -> io::Result<()> {
        if self.to_repost.is_empty() {
            return Ok(());
        }
        let slot_bytes = u64::from(self.params.recv_slot_bytes);
        let base = self.recv_reg.addr();
        let lkey = self.recv_reg.chunks()[0].lkey;
        let mut sges: Vec<ibv_sge> = self
            .to_repost
            .iter()
            .map(|&slot| ibv_sge {
                addr: base + u64::from(slot) * slot_bytes,
                length: slot_bytes as u32,
                lkey,
            })
            .collect();
        let mut wrs: Vec<ibv_recv_wr> = self
            .to_repost
            .iter()
            .zip(sges.iter_mut())
            .map(|(&slot, sge)| ibv_recv_wr {
                wr_id: (KIND_RECV << KIND_SHIFT) | u64::from(slot),
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: 1,
            })
            .collect();
        for i in 1..wrs.len() {
            let next: *mut ibv_recv_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live; the linked WRs and SGEs live in `wrs`/`sges` for the call.
        // Each slot lies in the registered receive slab (one region, lkey), which outlives the
        // QPs; a posted slot is not handed out again until its completion is polled.
        let rc = unsafe { ibv_post_srq_recv(self.srq.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
        crate::verbs::objects::check_rc(rc)?;
        self.recv_posted += self.to_repost.len() as u32;
        self.to_repost.clear();
        Ok(())
    }

    /// Force `lane`'s QP into the error state: everything in flight on it completes with
    /// `WR_FLUSH_ERR`. For fault handling and tests.
    pub fn force_error(&mut self, lane: usize) -> Result<(), PostError> {
        let l = self
            .lanes
            .get_mut(lane)
            .ok_or(PostError::NoSuchLane(lane))?;
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..ibv_qp_attr::default()
        };
        l.qp.modify(&mut attr, IBV_QP_STATE)
            .map_err(post_err("ibv_modify_qp(ERR)"))?;
        l.failed = true;
        Ok(())
    }

    /// Append the completions available now (one `ibv_poll_cq` of up to `poll_batch`) to
    /// `out`; returns how many. Never blocks.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, PollError> {
        let want = self.wc_buf.capacity();
        self.wc_buf.clear();
        // SAFETY: wc_buf has room for `want` entries; ibv_poll_cq writes at most that many
        // and returns how many it wrote, which is all set_len exposes. The CQ is alive (owned).
        let n = unsafe {
            let n = ibv_poll_cq(
                self.cq.as_ptr(),
                c_int::try_from(want).unwrap_or(c_int::MAX),
                self.wc_buf.as_mut_ptr(),
            );
            if n < 0 {
                return Err(PollError::PollCq(-n));
            }
            self.wc_buf.set_len(n as usize);
            n as usize
        };
        for i in 0..n {
            let wc = self.wc_buf[i];
            self.complete(&wc, out);
        }
        Ok(n)
    }

    /// Ask for one event on the completion channel at the next completion (`ibv_req_notify_cq`).
    /// To sleep without missing a completion: arm, [`VerbsConnection::poll`] once more, and
    /// only if that found nothing wait on the channel. Without a channel this is a no-op.
    pub fn arm(&mut self) -> Result<(), PollError> {
        if !self.cq.has_channel() {
            return Ok(());
        }
        self.cq.arm().map_err(PollError::Arm)
    }

    /// Poll until at least one completion arrives or `timeout` passes.
    pub fn poll_wait(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, PollError> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Err(PollError::Timeout(timeout));
            }
            std::thread::yield_now();
        }
    }

    fn complete(&mut self, wc: &ibv_wc, out: &mut Vec<Completion>) {
        let Some(lane) = self.lanes.iter().position(|l| l.qpn == wc.qp_num) else {
            return; // a QP dropped by the lane negotiation
        };
        let status = WcStatus(wc.status);
        let kind = wc.wr_id >> KIND_SHIFT;
        let id = wc.wr_id & ID_MASK;
        let l = &mut self.lanes[lane];
        if !status.is_success() {
            l.failed = true;
        }
        let completion = match kind {
            KIND_RECV => {
                self.recv_posted = self.recv_posted.saturating_sub(1);
                if let Some(held) = self.recv_held.get_mut(id as usize) {
                    *held = status.is_success().then_some(wc.byte_len);
                }
                Completion {
                    lane,
                    wr_id: id,
                    status,
                    opcode: Opcode::Recv,
                    byte_len: if status.is_success() { wc.byte_len } else { 0 },
                }
            }
            KIND_SEND => {
                l.free_send_slots.push(id as u32);
                retire(l, status);
                Completion {
                    lane,
                    wr_id: self.send_wr_ids.get(id as usize).copied().unwrap_or(0),
                    status,
                    opcode: Opcode::Send,
                    byte_len: wc.byte_len,
                }
            }
            KIND_WINDOW => {
                retire(l, status);
                Completion {
                    lane,
                    wr_id: id,
                    status,
                    opcode: if wc.opcode == IBV_WC_LOCAL_INV {
                        Opcode::InvalidateWindow
                    } else {
                        Opcode::BindWindow
                    },
                    byte_len: 0,
                }
            }
            _ => {
                retire(l, status);
                Completion {
                    lane,
                    wr_id: id,
                    status,
                    opcode: Opcode::Read,
                    byte_len: wc.byte_len,
                }
            }
        };
        out.push(completion);
    }
}

fn lane_checked(
    lanes: &mut [Lane],
    lane: usize,
    wanted: u32,
    depth: u32,
) -> Result<&mut Lane, PostError> {
    let l = lanes.get_mut(lane).ok_or(PostError::NoSuchLane(lane))?;
    if l.failed {
        return Err(PostError::LaneFailed(lane));
    }
    if l.sq_in_flight + wanted > depth {
        return Err(PostError::QueueFull {
            lane,
            in_flight: l.sq_in_flight,
            depth,
            wanted,
        });
    }
    Ok(l)
}

/// A signaled send-queue completion retires its whole block (RC completes in order). After
/// an error the lane is dead and its accounting no longer matters.
fn retire(l: &mut Lane, status: WcStatus) {
    if status.is_success() {
        if let Some(n) = l.blocks.pop_front() {
            l.sq_in_flight -= n;
        }
    }
}

/// A send work request with one scatter/gather entry, unsignaled, not linked.
fn send_wr(wr_id: u64, opcode: u32, sge: &mut ibv_sge) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: 0,
        imm_data: 0,
        wr: ibv_send_wr_wr {
            atomic: ibv_send_wr_atomic::default(),
        },
        qp_type_xrc_remote_srqn: 0,
        bind_mw: ibv_send_wr_bind_mw {
            mw: std::ptr::null_mut(),
            rkey: 0,
            bind_info: ibv_mw_bind_info {
                mr: std::ptr::null_mut(),
                addr: 0,
                length: 0,
                mw_access_flags: 0,
            },
        },
    }
}
