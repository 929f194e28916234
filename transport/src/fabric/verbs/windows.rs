//! READ access per lease through memory windows: for each lease the holder binds a type 2
//! window over exactly the object's bytes on every lane to the reader (a type 2 window serves
//! the one queue pair it is bound on), answers the grant with the windows' rkeys once every
//! bind completed, and at revocation invalidates them, answering once every invalidation
//! completed. The arenas are then registered without remote access of their own
//! (`VerbsDevice::register_windows_only`), so a window is the only way in.
//!
//! Windows are kept in a pool and re-bound (each bind gives a new rkey, so a key from an earlier
//! lease is refused). A connection torn down takes its leases' windows with it: its queue pairs
//! are destroyed, so no READ reaches them, and the windows (bound to a dead QP) are freed rather
//! than re-used.
//!
//! Lock order: a connection's state, then [`Windows`] (as for the peer table).

use std::collections::BTreeMap;

use skyriver_core::node::{GrantError, ReadGrant};
use skyriver_core::{LocalRegion, NodeId, TransferId};

use super::peer::{ConnState, PeerConn};
use super::{lock, FabricError, FabricEvent, Shared};
use crate::arena::ReadableRegion;
use crate::verbs::{MemoryWindow, PostError};

/// Where one lease's windows stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Binds posted; `ReadGranted` when they all completed.
    Binding,
    /// The reader has the keys.
    Bound,
    /// Invalidations posted; `ReadRevoked` when they all completed.
    Invalidating,
}

/// The windows of one lease.
struct LeaseWindows {
    /// The connection (by address) whose lanes they are bound on.
    conn: usize,
    region: LocalRegion,
    /// `region` claimed for reading while a window may be bound over it: nothing in this
    /// process writes the bytes peers may READ. Released when the lease's windows are
    /// invalidated or gone with their connection, before the `ReadRevoked`.
    _view: ReadableRegion,
    /// One per lane, in lane order.
    windows: Vec<MemoryWindow>,
    keys: Vec<u32>,
    /// Work requests posted and not completed.
    pending: usize,
    phase: Phase,
    /// The core waits for this lease's `ReadRevoked` (false: a failed grant's undo).
    report_revoked: bool,
}

/// Every lease's windows, and the pool of free ones.
pub(super) struct Windows {
    free: Vec<MemoryWindow>,
    /// Windows in existence (free or bound).
    allocated: usize,
    max: usize,
    leases: BTreeMap<(NodeId, TransferId), LeaseWindows>,
    /// Window work requests in flight → their lease and the phase they belong to.
    requests: BTreeMap<u64, ((NodeId, TransferId), Phase)>,
    next_wr_id: u64,
}

impl Windows {
    /// Memory windows on, with `first` (the probe's window) in the pool and at most `max`.
    pub(super) fn new(first: MemoryWindow, max: usize) -> Windows {
        Windows {
            free: vec![first],
            allocated: 1,
            max,
            leases: BTreeMap::new(),
            requests: BTreeMap::new(),
            next_wr_id: 1,
        }
    }

    /// Leases with windows now (tests, diagnostics): reader, transfer, region, keys.
    pub(super) fn granted(&self) -> Vec<(NodeId, TransferId, LocalRegion, Vec<u32>)> {
        self.leases
            .iter()
            .map(|(&(peer, req), l)| (peer, req, l.region, l.keys.clone()))
            .collect()
    }

    fn window(&mut self, s: &Shared) -> Result<MemoryWindow, FabricError> {
        if let Some(window) = self.free.pop() {
            return Ok(window);
        }
        if self.allocated >= self.max {
            return Err(FabricError::Grant(GrantError::WindowsExhausted {
                limit: self.max,
            }));
        }
        let window = s
            .device
            .alloc_window()
            .map_err(|e| FabricError::Grant(GrantError::Device(format!("ibv_alloc_mw: {e}"))))?;
        self.allocated += 1;
        Ok(window)
    }

    fn wr_id(&mut self, lease: (NodeId, TransferId), phase: Phase) -> u64 {
        let id = self.next_wr_id;
        // Work request ids carry 62 bits; wrapping takes centuries.
        self.next_wr_id = (self.next_wr_id + 1) & crate::verbs::WR_ID_MASK;
        self.requests.insert(id, (lease, phase));
        id
    }

    /// Binds a window over `region` (claimed for reading by `view`) on every lane of `conn`
    /// for `peer`'s lease `req`. `Ok(())`: answered by `ReadGranted` once the binds complete.
    pub(super) fn grant(
        &mut self,
        s: &Shared,
        conn: &PeerConn,
        st: &mut ConnState,
        req: TransferId,
        region: LocalRegion,
        view: ReadableRegion,
    ) -> Result<(), FabricError> {
        let peer = conn.peer;
        let lease = (peer, req);
        let arena = s
            .local_arena(&region)
            .ok_or(FabricError::BadRegion(region))?;
        let addr = arena.reg.addr() + region.offset;
        let Some(verbs) = st.conn.as_mut() else {
            return Err(FabricError::NotConnected(peer));
        };
        let mut windows = Vec::with_capacity(conn.lanes);
        let mut keys = Vec::with_capacity(conn.lanes);
        let mut failure = None;
        for lane in 0..conn.lanes {
            let mut window = match self.window(s) {
                Ok(window) => window,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let id = self.wr_id(lease, Phase::Binding);
            match verbs.bind_window(lane, id, &mut window, &arena.reg, addr, region.len) {
                Ok(rkey) => {
                    windows.push(window);
                    keys.push(rkey);
                }
                Err(e) => {
                    self.requests.remove(&id);
                    // Not bound: back to the pool.
                    self.free.push(window);
                    failure = Some(FabricError::Grant(GrantError::Device(match e {
                        PostError::OutsideRegistration { .. } => format!(
                            "{region} spans two memory regions of its arena, and a window lies \
                             in one (raise max_mr_bytes)"
                        ),
                        e => format!("binding a memory window: {e}"),
                    })));
                    break;
                }
            }
        }
        let pending = windows.len();
        let entry = LeaseWindows {
            conn: conn as *const PeerConn as usize,
            region,
            _view: view,
            windows,
            keys,
            pending,
            phase: Phase::Binding,
            report_revoked: true,
        };
        match failure {
            None => {
                self.leases.insert(lease, entry);
                Ok(())
            }
            Some(error) => {
                // Undo the binds that were posted: invalidate them silently (no event).
                if pending > 0 {
                    self.leases.insert(lease, entry);
                    self.invalidate(st, lease, false);
                }
                Err(error)
            }
        }
    }

    /// Ends `peer`'s lease `req`: `true` when no window of it is usable any more, `false` when
    /// invalidations were posted (answered by `ReadRevoked`).
    pub(super) fn revoke(
        &mut self,
        conn: Option<(&PeerConn, &mut ConnState)>,
        lease: (NodeId, TransferId),
    ) -> bool {
        let Some(windows) = self.leases.get(&lease) else {
            return true; // gone with its connection, or never bound
        };
        match conn {
            Some((conn, st))
                if st.conn.is_some() && windows.conn == conn as *const PeerConn as usize =>
            {
                self.invalidate(st, lease, true)
            }
            // Its connection is gone: its queue pairs were destroyed with it (the windows,
            // bound to a dead QP, are freed rather than re-used).
            _ => {
                if let Some(entry) = self.leases.remove(&lease) {
                    self.requests.retain(|_, (l, _)| *l != lease);
                    self.allocated -= entry.windows.len();
                }
                true
            }
        }
    }

    /// Posts the invalidation of every window of `lease`; `report`: emit `ReadRevoked` when
    /// done. `true` when nothing is left to wait for.
    fn invalidate(
        &mut self,
        st: &mut ConnState,
        lease: (NodeId, TransferId),
        report: bool,
    ) -> bool {
        let Some(mut entry) = self.leases.remove(&lease) else {
            return true;
        };
        // Completions of binds still in flight no longer count (they precede the
        // invalidations on each lane's send queue).
        self.requests.retain(|_, (l, _)| *l != lease);
        let mut invalidating = Vec::with_capacity(entry.windows.len());
        let mut windows = std::mem::take(&mut entry.windows).into_iter();
        if let Some(verbs) = st.conn.as_mut() {
            for (lane, window) in windows.by_ref().enumerate() {
                let id = self.wr_id(lease, Phase::Invalidating);
                if let Err(error) = verbs.invalidate_window(lane, id, &window) {
                    self.requests.remove(&id);
                    tracing::warn!(peer = %lease.0, req = %lease.1, %error, "verbs fabric: cannot post a window invalidation; freeing the window instead");
                    // Freeing a window invalidates it at once (`ibv_dealloc_mw`).
                    drop(window);
                    self.allocated -= 1;
                    break;
                }
                invalidating.push(window);
            }
        }
        // The rest (a lane that refused, or a connection without QPs) are freed likewise.
        let rest = windows.count();
        self.allocated -= rest;
        let posted = invalidating.len();
        entry.windows = invalidating;
        if posted == 0 {
            return true;
        }
        entry.pending = posted;
        entry.phase = Phase::Invalidating;
        // `report` is false for a failed grant's undo: no one waits for its revocation.
        entry.report_revoked = report;
        self.leases.insert(lease, entry);
        !report
    }

    /// A window work request completed successfully (the poller, under the connection's lock).
    pub(super) fn completed(&mut self, s: &Shared, wr_id: u64) {
        let Some((lease, phase)) = self.requests.remove(&wr_id) else {
            return;
        };
        let Some(entry) = self.leases.get_mut(&lease).filter(|e| e.phase == phase) else {
            return;
        };
        entry.pending = entry.pending.saturating_sub(1);
        if entry.pending > 0 {
            return;
        }
        let (peer, req) = lease;
        match entry.phase {
            Phase::Binding => {
                entry.phase = Phase::Bound;
                let grant = ReadGrant {
                    keys: entry.keys.clone(),
                };
                s.emit(FabricEvent::ReadGranted {
                    peer,
                    req,
                    result: Ok(grant),
                });
            }
            Phase::Invalidating => {
                let mut entry = self.leases.remove(&lease).expect("found above");
                self.free.extend(std::mem::take(&mut entry.windows));
                let report_revoked = entry.report_revoked;
                // The region's claim ends before the core hears the revocation.
                drop(entry);
                if report_revoked {
                    s.emit(FabricEvent::ReadRevoked { peer, req });
                }
            }
            Phase::Bound => {}
        }
    }

    /// `conn` was torn down (its QPs destroyed): its leases' windows are freed, a grant under
    /// way fails and a revocation under way is complete.
    pub(super) fn connection_gone(&mut self, s: &Shared, conn: &PeerConn) {
        let id = conn as *const PeerConn as usize;
        let gone: Vec<(NodeId, TransferId)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.conn == id)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in gone {
            let entry = self.leases.remove(&lease).expect("listed above");
            self.requests.retain(|_, (l, _)| *l != lease);
            // Bound to a destroyed QP: freed, not re-used.
            self.allocated -= entry.windows.len();
            let (peer, req) = lease;
            let (phase, report_revoked) = (entry.phase, entry.report_revoked);
            // The region's claim ends before the core hears of the lease.
            drop(entry);
            match phase {
                Phase::Binding => s.emit(FabricEvent::ReadGranted {
                    peer,
                    req,
                    result: Err(FabricError::NotConnected(peer)),
                }),
                Phase::Invalidating if report_revoked => {
                    s.emit(FabricEvent::ReadRevoked { peer, req })
                }
                Phase::Invalidating | Phase::Bound => {}
            }
        }
    }
}

/// Holds the windows state for [`Shared`]; `None` when the device has no memory windows (or
/// they are turned off) and the arenas' registrations serve every connected peer.
pub(super) type WindowState = Option<std::sync::Mutex<Windows>>;

/// Locks the windows state of `s`, if windows are on.
pub(super) fn windows(s: &Shared) -> Option<std::sync::MutexGuard<'_, Windows>> {
    s.windows.as_ref().map(lock)
}
