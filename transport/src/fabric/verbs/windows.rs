//! READ access per lease through memory windows: for each lease the holder binds a type 2
//! window over exactly the object's bytes on every lane to the reader (a type 2 window serves
//! the one queue pair it is bound on), answers the grant with the windows' rkeys once every
//! bind completed, and at revocation invalidates them, answering once every invalidation
//! completed. The arenas are then registered without remote access of their own
//! (`VerbsDevice::register_windows_only`), so a window is the only way in.
//!
//! Windows are kept in a pool and re-bound (each bind gives a new rkey, so a key from an earlier
//! lease is refused). A connection torn down takes its leases' windows with it: they are freed
//! (not re-used) once its queue pairs are in the error state and before they are destroyed, as
//! a queue pair held by a bound type 2 window cannot be destroyed promptly (rxe waits ~100 s).
//!
//! A relay's copy still being received is leased the same way, its window over the whole
//! block while its own READs still land in it: why that is safe is in `claim`.
//!
//! **Threads.** Callers grant and revoke; the poller reports the completions of binds and
//! invalidations and tears connections down. They share one [`SharedWindows`], whose lock is
//! taken inside its methods: a grant posts its binds and records its lease in one critical
//! section, so a bind's completion, polled on another thread, always finds its lease. The
//! bookkeeping ([`WindowPool`]) is generic over the window, the claim a lease holds and the
//! queue pairs it posts on ([`WindowLanes`]), so the loom model at the end runs the same code
//! with a simulated completion queue (`RUSTFLAGS='--cfg skyriver_loom'`, see `crate::sync`).
//!
//! Lock order: a connection's state, then the windows (as for the peer table).

use std::collections::BTreeMap;

use skyriver_core::node::{GrantError, ReadGrant};
use skyriver_core::{LocalRegion, NodeId, TransferId};

use super::claim::LeaseClaim;
use super::peer::{ConnState, PeerConn};
use super::{FabricError, FabricEvent, Shared};
use crate::sync::{lock, Mutex};
use crate::verbs::{MemoryWindow, PostError, Registration, VerbsConnection};

/// A lease: the reader and its transfer.
type Lease = (NodeId, TransferId);

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

/// What the pool posts on a connection's lanes (its queue pairs).
pub(super) trait WindowLanes<W> {
    /// Posts the bind of `window` on `lane` as work request `wr_id`: the window's new rkey.
    fn bind(&mut self, lane: usize, wr_id: u64, window: &mut W) -> Result<u32, FabricError>;
    /// Posts the invalidation of `window` on `lane` as work request `wr_id`.
    fn invalidate(&mut self, lane: usize, wr_id: u64, window: &W) -> Result<(), PostError>;
}

/// The windows of one lease.
struct LeaseWindows<W, V> {
    /// The connection (by address) whose lanes they are bound on.
    conn: usize,
    region: LocalRegion,
    /// What the lease holds on `region` while a window may be bound over it (a sealed
    /// object's read claim: nothing in this process writes the bytes peers may READ; see
    /// `claim`). Released when the lease's windows are invalidated or gone with their
    /// connection, before the `ReadRevoked`.
    _claim: V,
    /// One per lane, in lane order.
    windows: Vec<W>,
    keys: Vec<u32>,
    /// Work requests posted and not completed.
    pending: usize,
    phase: Phase,
    /// The core waits for this lease's `ReadRevoked` (false: a failed grant's undo).
    report_revoked: bool,
}

/// Every lease's windows, and the pool of free ones: `W` a window, `V` the claim a lease holds
/// on its region. Single-threaded; [`SharedWindows`] holds it under its lock.
pub(super) struct WindowPool<W, V> {
    free: Vec<W>,
    /// Windows in existence (free or bound).
    allocated: usize,
    max: usize,
    leases: BTreeMap<Lease, LeaseWindows<W, V>>,
    /// Window work requests in flight → their lease and the phase they belong to.
    requests: BTreeMap<u64, (Lease, Phase)>,
    next_wr_id: u64,
}

impl<W, V> WindowPool<W, V> {
    /// Memory windows on, with `first` (the probe's window) in the pool and at most `max`.
    fn new(first: W, max: usize) -> WindowPool<W, V> {
        WindowPool {
            free: vec![first],
            allocated: 1,
            max,
            leases: BTreeMap::new(),
            requests: BTreeMap::new(),
            next_wr_id: 1,
        }
    }

    fn window(
        &mut self,
        alloc: &mut impl FnMut() -> Result<W, FabricError>,
    ) -> Result<W, FabricError> {
        if let Some(window) = self.free.pop() {
            return Ok(window);
        }
        if self.allocated >= self.max {
            return Err(FabricError::Grant(GrantError::WindowsExhausted {
                limit: self.max,
            }));
        }
        let window = alloc()?;
        self.allocated += 1;
        Ok(window)
    }

    fn wr_id(&mut self, lease: Lease, phase: Phase) -> u64 {
        let id = self.next_wr_id;
        // Work request ids carry 62 bits; wrapping takes centuries.
        self.next_wr_id = (self.next_wr_id + 1) & crate::verbs::WR_ID_MASK;
        self.requests.insert(id, (lease, phase));
        id
    }

    /// Posts a bind of a window over `region` on each of `lane_count` lanes for `lease`: the
    /// lease's windows (not recorded yet) and the failure that stopped the binds, if one did.
    #[allow(clippy::too_many_arguments)] // the lease's parts, and what it posts through
    fn post_binds(
        &mut self,
        lease: Lease,
        conn: usize,
        lane_count: usize,
        region: LocalRegion,
        view: V,
        lanes: &mut impl WindowLanes<W>,
        alloc: &mut impl FnMut() -> Result<W, FabricError>,
    ) -> (LeaseWindows<W, V>, Option<FabricError>) {
        let mut windows = Vec::with_capacity(lane_count);
        let mut keys = Vec::with_capacity(lane_count);
        let mut failure = None;
        for lane in 0..lane_count {
            let mut window = match self.window(alloc) {
                Ok(window) => window,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let id = self.wr_id(lease, Phase::Binding);
            match lanes.bind(lane, id, &mut window) {
                Ok(rkey) => {
                    tracing::debug!(peer = %lease.0, req = %lease.1, lane, rkey, wr_id = id, "verbs fabric: window bind posted");
                    windows.push(window);
                    keys.push(rkey);
                }
                Err(e) => {
                    self.requests.remove(&id);
                    // Not bound: back to the pool.
                    self.free.push(window);
                    failure = Some(e);
                    break;
                }
            }
        }
        let pending = windows.len();
        let entry = LeaseWindows {
            conn,
            region,
            _claim: view,
            windows,
            keys,
            pending,
            phase: Phase::Binding,
            report_revoked: true,
        };
        (entry, failure)
    }

    /// Records the lease whose binds were posted; on `failure`, undoes them (silently: no
    /// event) and returns it.
    fn record(
        &mut self,
        lease: Lease,
        entry: LeaseWindows<W, V>,
        failure: Option<FabricError>,
        lanes: &mut impl WindowLanes<W>,
    ) -> Result<(), FabricError> {
        let posted = entry.pending;
        match failure {
            None => {
                self.leases.insert(lease, entry);
                Ok(())
            }
            Some(error) => {
                if posted > 0 {
                    self.leases.insert(lease, entry);
                    self.invalidate(Some(lanes), lease, false);
                }
                Err(error)
            }
        }
    }

    /// Ends `lease`; `conn`: the connection it is revoked on and its lanes, `None` when that
    /// connection is gone or has no queue pairs. `true` when no window of it is usable any
    /// more, `false` when invalidations were posted (answered by `ReadRevoked`).
    fn revoke(&mut self, conn: Option<(usize, &mut impl WindowLanes<W>)>, lease: Lease) -> bool {
        let Some(windows) = self.leases.get(&lease) else {
            return true; // gone with its connection, or never bound
        };
        match conn {
            Some((conn, lanes)) if windows.conn == conn => {
                self.invalidate(Some(lanes), lease, true)
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

    /// Posts the invalidation of every window of `lease` on `lanes` (`None`: no queue pairs,
    /// the windows are freed); `report`: emit `ReadRevoked` when done. `true` when nothing is
    /// left to wait for.
    fn invalidate(
        &mut self,
        lanes: Option<&mut impl WindowLanes<W>>,
        lease: Lease,
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
        if let Some(lanes) = lanes {
            for (lane, window) in windows.by_ref().enumerate() {
                let id = self.wr_id(lease, Phase::Invalidating);
                tracing::debug!(peer = %lease.0, req = %lease.1, lane, wr_id = id, "verbs fabric: window invalidation posted");
                if let Err(error) = lanes.invalidate(lane, id, &window) {
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

    /// A window work request completed successfully.
    fn completed(&mut self, wr_id: u64, emit: &mut impl FnMut(FabricEvent)) {
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
                emit(FabricEvent::ReadGranted {
                    peer,
                    req,
                    result: Ok(grant),
                });
            }
            Phase::Invalidating => {
                let Some(mut entry) = self.leases.remove(&lease) else {
                    return; // unreachable: found above
                };
                self.free.extend(std::mem::take(&mut entry.windows));
                let report_revoked = entry.report_revoked;
                // The region's claim ends before the core hears the revocation.
                drop(entry);
                if report_revoked {
                    emit(FabricEvent::ReadRevoked { peer, req });
                }
            }
            Phase::Bound => {}
        }
    }

    /// Connection `conn` is being torn down (its QPs in the error state, about to be
    /// destroyed): its leases' windows are freed, a grant under way fails and a revocation
    /// under way is complete.
    fn connection_gone(&mut self, conn: usize, emit: &mut impl FnMut(FabricEvent)) {
        let gone: Vec<Lease> = self
            .leases
            .iter()
            .filter(|(_, l)| l.conn == conn)
            .map(|(lease, _)| *lease)
            .collect();
        for lease in gone {
            let Some(mut entry) = self.leases.remove(&lease) else {
                continue; // unreachable: listed above
            };
            self.requests.retain(|_, (l, _)| *l != lease);
            // Bound to a QP about to be destroyed: freed, not re-used, before the region's
            // claim ends (a freed window lets no READ in).
            self.allocated -= entry.windows.len();
            drop(std::mem::take(&mut entry.windows));
            let (peer, req) = lease;
            let (phase, report_revoked) = (entry.phase, entry.report_revoked);
            // The region's claim ends before the core hears of the lease.
            drop(entry);
            match phase {
                Phase::Binding => emit(FabricEvent::ReadGranted {
                    peer,
                    req,
                    result: Err(FabricError::NotConnected(peer)),
                }),
                Phase::Invalidating if report_revoked => {
                    emit(FabricEvent::ReadRevoked { peer, req })
                }
                Phase::Invalidating | Phase::Bound => {}
            }
        }
    }
}

/// The window pool the fabric's threads share, behind its lock.
pub(super) struct SharedWindows<W, V> {
    pool: Mutex<WindowPool<W, V>>,
    /// A planted race for the loom model: a grant records its lease in a second critical
    /// section after posting its binds.
    #[cfg(skyriver_loom)]
    record_after_unlock: bool,
}

impl<W, V> SharedWindows<W, V> {
    /// Memory windows on, with `first` (the probe's window) in the pool and at most `max`.
    pub(super) fn new(first: W, max: usize) -> SharedWindows<W, V> {
        SharedWindows {
            pool: Mutex::new(WindowPool::new(first, max)),
            #[cfg(skyriver_loom)]
            record_after_unlock: false,
        }
    }

    /// Leases with windows now (tests, diagnostics): reader, transfer, region, keys.
    pub(super) fn granted(&self) -> Vec<(NodeId, TransferId, LocalRegion, Vec<u32>)> {
        lock(&self.pool)
            .leases
            .iter()
            .map(|(&(peer, req), l)| (peer, req, l.region, l.keys.clone()))
            .collect()
    }

    /// Binds a window over `region` (held by `view`) on each of `lane_count` `lanes` of
    /// connection `conn` for `lease`, and records the lease, under one lock: the binds'
    /// completions are reported under the same lock, so they find the lease recorded.
    #[allow(clippy::too_many_arguments)] // the lease's parts, and what it posts through
    fn grant_lease(
        &self,
        lease: Lease,
        conn: usize,
        lane_count: usize,
        region: LocalRegion,
        view: V,
        lanes: &mut impl WindowLanes<W>,
        mut alloc: impl FnMut() -> Result<W, FabricError>,
    ) -> Result<(), FabricError> {
        #[cfg_attr(not(skyriver_loom), allow(unused_mut))] // re-locked by the planted race
        let mut pool = lock(&self.pool);
        let (entry, failure) =
            pool.post_binds(lease, conn, lane_count, region, view, lanes, &mut alloc);
        #[cfg(skyriver_loom)]
        if self.record_after_unlock {
            drop(pool);
            pool = lock(&self.pool);
        }
        pool.record(lease, entry, failure, lanes)
    }

    fn revoke_lease(&self, conn: Option<(usize, &mut impl WindowLanes<W>)>, lease: Lease) -> bool {
        lock(&self.pool).revoke(conn, lease)
    }

    fn report_completion(&self, wr_id: u64, mut emit: impl FnMut(FabricEvent)) {
        lock(&self.pool).completed(wr_id, &mut emit)
    }

    fn drop_connection(&self, conn: usize, mut emit: impl FnMut(FabricEvent)) {
        lock(&self.pool).connection_gone(conn, &mut emit)
    }
}

/// A connection's queue pairs, binding over one region of an arena's registration.
struct VerbsLanes<'a> {
    verbs: &'a mut VerbsConnection,
    /// The arena's registration, the region's address in it and its length (binds only).
    reg: Option<(&'a Registration, u64, LocalRegion)>,
}

impl WindowLanes<MemoryWindow> for VerbsLanes<'_> {
    fn bind(
        &mut self,
        lane: usize,
        wr_id: u64,
        window: &mut MemoryWindow,
    ) -> Result<u32, FabricError> {
        let Some((reg, addr, region)) = self.reg else {
            // unreachable: the lanes of a grant carry its region
            return Err(FabricError::Grant(GrantError::Device(
                "binding a memory window without a region".into(),
            )));
        };
        self.verbs
            .bind_window(lane, wr_id, window, reg, addr, region.len)
            .map_err(|e| {
                FabricError::Grant(match e {
                    PostError::OutsideRegistration { .. } => GrantError::SpansRegistrations(region),
                    e => GrantError::Device(format!("binding a memory window: {e}")),
                })
            })
    }

    fn invalidate(
        &mut self,
        lane: usize,
        wr_id: u64,
        window: &MemoryWindow,
    ) -> Result<(), PostError> {
        self.verbs.invalidate_window(lane, wr_id, window)
    }
}

/// A connection's identity in the pool: its address.
fn conn_id(conn: &PeerConn) -> usize {
    conn as *const PeerConn as usize
}

impl SharedWindows<MemoryWindow, LeaseClaim> {
    /// Binds a window over `region` (held by `claim` while bound) on every lane of `conn` for
    /// `peer`'s lease `req`. `Ok(())`: answered by `ReadGranted` once the binds complete.
    pub(super) fn grant(
        &self,
        s: &Shared,
        conn: &PeerConn,
        st: &mut ConnState,
        req: TransferId,
        region: LocalRegion,
        claim: LeaseClaim,
    ) -> Result<(), FabricError> {
        let peer = conn.peer;
        let arena = s
            .local_arena(&region)
            .ok_or(FabricError::BadRegion(region))?;
        let addr = arena.reg.addr() + region.offset;
        let Some(verbs) = st.conn.as_mut() else {
            return Err(FabricError::NotConnected(peer));
        };
        let mut lanes = VerbsLanes {
            verbs,
            reg: Some((&arena.reg, addr, region)),
        };
        let alloc = || {
            s.device
                .alloc_window()
                .map_err(|e| FabricError::Grant(GrantError::Device(format!("ibv_alloc_mw: {e}"))))
        };
        self.grant_lease(
            (peer, req),
            conn_id(conn),
            conn.lanes,
            region,
            claim,
            &mut lanes,
            alloc,
        )
    }

    /// Ends `peer`'s lease `req`: `true` when no window of it is usable any more, `false` when
    /// invalidations were posted (answered by `ReadRevoked`).
    pub(super) fn revoke(&self, conn: Option<(&PeerConn, &mut ConnState)>, lease: Lease) -> bool {
        let on = conn.and_then(|(conn, st)| {
            let verbs = st.conn.as_mut()?;
            Some((conn_id(conn), VerbsLanes { verbs, reg: None }))
        });
        match on {
            Some((conn, mut lanes)) => self.revoke_lease(Some((conn, &mut lanes)), lease),
            None => self.revoke_lease(None::<(usize, &mut VerbsLanes<'_>)>, lease),
        }
    }

    /// A window work request completed successfully (the poller, under the connection's lock).
    pub(super) fn completed(&self, s: &Shared, wr_id: u64) {
        self.report_completion(wr_id, |event| s.emit(event));
    }

    /// `conn` is being torn down (its QPs in the error state, destroyed right after): its
    /// leases' windows are freed, a grant under way fails and a revocation under way is
    /// complete.
    pub(super) fn connection_gone(&self, s: &Shared, conn: &PeerConn) {
        self.drop_connection(conn_id(conn), |event| s.emit(event));
    }
}

/// Holds the windows state for [`Shared`]; `None` when the device has no memory windows (or
/// they are turned off) and the arenas' registrations serve every connected peer.
pub(super) type WindowState = Option<SharedWindows<MemoryWindow, LeaseClaim>>;

/// The windows state of `s`, if windows are on.
pub(super) fn windows(s: &Shared) -> Option<&SharedWindows<MemoryWindow, LeaseClaim>> {
    s.windows.as_ref()
}

/// The pool under every interleaving of a caller granting or revoking, the poller reporting
/// completions and a connection's teardown, with a simulated completion queue: every grant is
/// answered once, every revocation that posted invalidations is answered once, and no window
/// is lost or counted twice.
#[cfg(all(test, skyriver_loom))]
mod loom_models {
    use std::collections::VecDeque;

    use loom::sync::Arc;
    use skyriver_core::ArenaId;

    use super::*;

    const LEASE: Lease = (NodeId(2), TransferId(7));
    const CONN: usize = 1;
    const LANES: usize = 2;

    /// A window (the model needs none of its parts).
    #[derive(Debug)]
    struct Window;

    /// A connection's lanes: each post completes, in order, on the completion queue `cq`.
    struct Lanes {
        cq: Arc<Mutex<VecDeque<u64>>>,
        next_key: u32,
    }

    impl WindowLanes<Window> for Lanes {
        fn bind(&mut self, _lane: usize, wr_id: u64, _: &mut Window) -> Result<u32, FabricError> {
            lock(&self.cq).push_back(wr_id);
            self.next_key += 1;
            Ok(self.next_key)
        }

        fn invalidate(&mut self, _lane: usize, wr_id: u64, _: &Window) -> Result<(), PostError> {
            lock(&self.cq).push_back(wr_id);
            Ok(())
        }
    }

    /// The pool, its connection's completion queue and the events it emitted.
    #[derive(Clone)]
    struct Fabric {
        windows: Arc<SharedWindows<Window, ()>>,
        cq: Arc<Mutex<VecDeque<u64>>>,
        events: Arc<Mutex<Vec<FabricEvent>>>,
    }

    impl Fabric {
        fn new(windows: SharedWindows<Window, ()>) -> Fabric {
            Fabric {
                windows: Arc::new(windows),
                cq: Arc::new(Mutex::new(VecDeque::new())),
                events: Arc::new(Mutex::new(Vec::new())),
            }
        }

        fn lanes(&self) -> Lanes {
            Lanes {
                cq: self.cq.clone(),
                next_key: 0,
            }
        }

        fn grant(&self) -> Result<(), FabricError> {
            let region = LocalRegion {
                arena: ArenaId(0),
                offset: 0,
                len: 64,
            };
            let alloc = || Ok(Window);
            let mut lanes = self.lanes();
            self.windows
                .grant_lease(LEASE, CONN, LANES, region, (), &mut lanes, alloc)
        }

        /// The poller's round: reports every completion queued now.
        fn poll(&self) {
            loop {
                let Some(wr_id) = lock(&self.cq).pop_front() else {
                    return;
                };
                self.windows
                    .report_completion(wr_id, |event| lock(&self.events).push(event));
            }
        }

        fn granted(&self) -> usize {
            let events = lock(&self.events);
            events
                .iter()
                .filter(|e| matches!(e, FabricEvent::ReadGranted { result: Ok(g), .. } if g.keys.len() == LANES))
                .count()
        }

        fn revoked(&self) -> usize {
            let events = lock(&self.events);
            events
                .iter()
                .filter(|e| matches!(e, FabricEvent::ReadRevoked { .. }))
                .count()
        }

        /// Every window in existence is free or bound for one lease; none beyond the cap.
        fn assert_windows_accounted(&self) {
            let pool = lock(&self.windows.pool);
            let bound: usize = pool.leases.values().map(|l| l.windows.len()).sum();
            assert_eq!(
                pool.free.len() + bound,
                pool.allocated,
                "window lost or counted twice"
            );
            assert!(pool.allocated <= pool.max);
        }
    }

    fn grant_beside_the_poller(windows: SharedWindows<Window, ()>) {
        let fabric = Fabric::new(windows);
        let granter = {
            let fabric = fabric.clone();
            loom::thread::spawn(move || fabric.grant())
        };
        fabric.poll();
        granter.join().unwrap().expect("windows to spare");
        // The poller's next round.
        fabric.poll();
        assert_eq!(
            fabric.granted(),
            1,
            "lost grant: every bind completed and no ReadGranted came"
        );
        fabric.assert_windows_accounted();
    }

    #[test]
    fn loom_a_grant_is_answered_whenever_its_binds_complete() {
        loom::model(|| grant_beside_the_poller(SharedWindows::new(Window, LANES)));
    }

    #[test]
    #[should_panic(expected = "lost grant")]
    fn loom_finds_a_lease_recorded_after_its_binds_were_unlocked() {
        loom::model(|| {
            let mut windows = SharedWindows::new(Window, LANES);
            windows.record_after_unlock = true;
            grant_beside_the_poller(windows)
        });
    }

    /// A bound lease revoked while its connection is torn down and the poller runs.
    #[test]
    fn loom_a_revocation_beside_a_teardown_is_answered_once() {
        loom::model(|| {
            let fabric = Fabric::new(SharedWindows::new(Window, LANES));
            fabric.grant().expect("windows to spare");
            fabric.poll();
            assert_eq!(fabric.granted(), 1);
            let revoker = {
                let fabric = fabric.clone();
                loom::thread::spawn(move || {
                    let mut lanes = fabric.lanes();
                    fabric.windows.revoke_lease(Some((CONN, &mut lanes)), LEASE)
                })
            };
            let teardown = {
                let fabric = fabric.clone();
                loom::thread::spawn(move || {
                    fabric
                        .windows
                        .drop_connection(CONN, |event| lock(&fabric.events).push(event))
                })
            };
            fabric.poll();
            let revoked_at_once = revoker.join().unwrap();
            teardown.join().unwrap();
            fabric.poll();
            let expected = if revoked_at_once { 0 } else { 1 };
            assert_eq!(
                fabric.revoked(),
                expected,
                "a revocation answered {} times",
                fabric.revoked()
            );
            assert!(lock(&fabric.windows.pool).leases.is_empty());
            fabric.assert_windows_accounted();
        });
    }
}
