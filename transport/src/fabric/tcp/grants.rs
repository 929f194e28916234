//! READ access per lease on the TCP fabric: a random key for each grant, valid only for the
//! peer it was granted to and only inside the granted region, dead once revoked.
//!
//! A READ is checked when its request arrives and its data written later by the connection's
//! writer; while the data of a granted READ is queued or being written the grant counts it as
//! *serving*. A revocation with nothing serving takes effect at once; otherwise the key stops
//! admitting new READs at once and the revocation is complete when the last READ in progress
//! is written or dropped ([`Serving`]'s `Drop`), so the core never unpins memory a READ still
//! copies from. The table's rules are the core's [`GrantTable`], which the simulator runs too;
//! here it lives behind the fabric's mutex and draws its keys from the OS.
//!
//! Each grant keeps a view of its region ([`GrantedBytes`]; on the fabric, a claim-checked
//! `ReadableRegion` of a pinned object, or the arena of a copy still being received), and
//! each READ it admits a readable view of its bytes made from it (the whole region's, or,
//! for a partial copy, a claim of just the READ's range below the received prefix, refused
//! where a READ into the copy is still landing): the bytes a READ's data is written from
//! stay claimed for reading, in this process's arena claims, until that READ is done,
//! whatever the revocation does meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;

use skyriver_core::grants::GrantTable;
use skyriver_core::{LocalRegion, NodeId, TransferId};

use crate::fabric::{EventSender, FabricEvent, TrySendError};
use crate::sync::{lock, Mutex};

/// How a grant reaches its region's bytes, and what a READ it admits is served from.
pub(super) trait GrantedBytes {
    /// The bytes one admitted READ is written from, held until it is done.
    type Served;

    /// The bytes for a READ of `[offset, offset + len)`, a range the grant's table found
    /// inside the granted region; `None` refuses the READ.
    fn serve(&self, offset: u64, len: u64) -> Option<Self::Served>;

    /// The region's first `prefix` bytes are in (a partial copy's); a whole region has
    /// nothing to learn.
    fn received(&mut self, prefix: u64) {
        let _ = prefix;
    }
}

/// Every live grant of one fabric: the shared table's rules ([`GrantTable`], which the
/// simulator runs too) with keys drawn from the OS, and each grant's view of its region's
/// bytes (`V`), from which the READs it admits are served.
#[derive(Debug)]
pub(super) struct Grants<V> {
    table: GrantTable,
    /// Each live key's view of its region (removed when its grant leaves the table).
    views: BTreeMap<u32, Granted<V>>,
    /// Keys drawn so far, mixed into each new one.
    attempts: u32,
    /// A planted race for the loom model: a revocation does not wait for READs being served.
    #[cfg(skyriver_loom)]
    revoke_ignores_serving: bool,
}

/// One key's lease and view.
#[derive(Debug)]
struct Granted<V> {
    lease: (NodeId, TransferId),
    view: V,
}

impl<V> Default for Grants<V> {
    fn default() -> Self {
        Grants {
            table: GrantTable::new(),
            views: BTreeMap::new(),
            attempts: 0,
            #[cfg(skyriver_loom)]
            revoke_ignores_serving: false,
        }
    }
}

impl<V: GrantedBytes> Grants<V> {
    /// A fresh key for `peer`'s lease `req` on `region`, viewed through `view`; random, so a
    /// peer cannot guess another lease's key (and a guessed one still fails: keys work for
    /// their own peer only).
    pub(super) fn grant(
        &mut self,
        peer: NodeId,
        req: TransferId,
        region: LocalRegion,
        view: V,
    ) -> u32 {
        let attempts = &mut self.attempts;
        let key = self.table.grant(peer, req, None, region, || {
            let mut bytes = [0u8; 4];
            // The OS's generator does not fail on Linux once booted. Were it to, the counter
            // still makes every attempt a new key (unique, only guessable), so this ends.
            let _ = getrandom::getrandom(&mut bytes);
            *attempts = attempts.wrapping_add(1);
            u32::from_le_bytes(bytes) ^ attempts.wrapping_mul(0x9e37_79b9)
        });
        // A second grant for one lease replaced the first in the table (a driver bug): its
        // older key's view goes with it.
        let table = &self.table;
        self.views.retain(|k, _| table.contains_key(*k));
        self.views.insert(
            key,
            Granted {
                lease: (peer, req),
                view,
            },
        );
        key
    }

    /// Ends the lease's access: `true` when no READ can touch the region any more, `false`
    /// when READs under it are still being written (see the module documentation).
    pub(super) fn revoke(&mut self, peer: NodeId, req: TransferId) -> bool {
        let complete = self.table.revoke(peer, req).is_complete();
        if complete {
            let table = &self.table;
            self.views.retain(|k, _| table.contains_key(*k));
        }
        #[cfg(skyriver_loom)]
        if self.revoke_ignores_serving {
            return true;
        }
        complete
    }

    /// The first `prefix` bytes of the region of `peer`'s lease `req` are in (a partial
    /// copy's received prefix grew). Nothing for a lease with no grant.
    pub(super) fn received(&mut self, peer: NodeId, req: TransferId, prefix: u64) {
        let lease = (peer, req);
        if let Some(granted) = self.views.values_mut().find(|g| g.lease == lease) {
            granted.view.received(prefix);
        }
    }

    /// Admits `peer`'s READ of `[offset, offset + len)` under `key`: the bytes to serve it
    /// from, or `None` (unknown or revoked key, another peer's key, outside the region, or
    /// refused by the grant's view: past a partial copy's prefix, or still being written).
    fn admit(&mut self, peer: NodeId, key: u32, offset: u64, len: u64) -> Option<V::Served> {
        self.table.admit(peer, key, offset, len).ok()?;
        // Every key in the table has its view; were one missing, the READ is refused.
        let served = self.views.get(&key).and_then(|g| g.view.serve(offset, len));
        if served.is_none() {
            // Admitted just now under a live key: this completes no revocation.
            let revoked = self.table.done(key);
            debug_assert!(revoked.is_none(), "a live key's READ ends no revocation");
        }
        served
    }

    /// A READ admitted under `key` is done; the lease whose revocation it completes, if any.
    fn done(&mut self, key: u32) -> Option<(NodeId, TransferId)> {
        let revoked = self.table.done(key);
        if revoked.is_some() {
            self.views.remove(&key);
        }
        revoked
    }

    /// Live grants.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }

    /// Grants with the planted race, for the loom model to show it catches one.
    #[cfg(skyriver_loom)]
    fn with_planted_race() -> Self {
        Grants {
            revoke_ignores_serving: true,
            ..Grants::default()
        }
    }
}

/// Where [`Serving`] reports a revocation it completed: the fabric's event channel.
pub(super) trait RevocationSink {
    /// `peer`'s lease `req` is revoked and no READ under it is served any more.
    fn revoked(&self, peer: NodeId, req: TransferId);
}

impl RevocationSink for EventSender {
    fn revoked(&self, peer: NodeId, req: TransferId) {
        // Reported when a served READ is dropped, by a connection's task (its writer, or its
        // reader refusing to queue it), which a `Drop` cannot make wait: queued at once if
        // there is room, else by a task of the fabric's runtime that waits for room, one per
        // revocation the driver asked for. The driver may be gone (shutting down); nothing to
        // do then.
        let event = FabricEvent::ReadRevoked { peer, req };
        let Err(TrySendError::Full(event)) = self.try_send(event) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let events = self.clone();
                runtime.spawn(async move {
                    let _ = events.send(event).await;
                });
            }
            // Servings live in a connection's tasks, so on its runtime.
            Err(_) => {
                tracing::warn!(%peer, %req, "a revocation completed outside the fabric's runtime was not reported")
            }
        }
    }
}

/// One admitted READ, from its request to the end of its data's write: dropping it (written,
/// or discarded with its connection) ends it and may complete a revocation.
pub(super) struct Serving<V: GrantedBytes, S: RevocationSink = EventSender> {
    grants: Arc<Mutex<Grants<V>>>,
    events: S,
    key: u32,
    /// The bytes this READ is served from, viewed until it is done.
    view: V::Served,
}

impl<V: GrantedBytes, S: RevocationSink + Clone> Serving<V, S> {
    /// Admits `peer`'s READ under `key` (see [`Grants::admit`]).
    pub(super) fn admit(
        grants: &Arc<Mutex<Grants<V>>>,
        events: &S,
        peer: NodeId,
        key: u32,
        offset: u64,
        len: u64,
    ) -> Option<Serving<V, S>> {
        let view = lock(grants).admit(peer, key, offset, len)?;
        Some(Serving {
            grants: grants.clone(),
            events: events.clone(),
            key,
            view,
        })
    }
}

impl<V: GrantedBytes, S: RevocationSink> Serving<V, S> {
    /// The bytes this READ is served from.
    pub(super) fn view(&self) -> &V::Served {
        &self.view
    }
}

impl<V: GrantedBytes, S: RevocationSink> Drop for Serving<V, S> {
    fn drop(&mut self) {
        let revoked = lock(&self.grants).done(self.key);
        if let Some((peer, req)) = revoked {
            self.events.revoked(peer, req);
        }
    }
}

/// Grants that stand for their bytes with a token, for the tests and models of the table's
/// rules: every READ inside the region is served.
#[cfg(test)]
impl GrantedBytes for () {
    type Served = ();

    fn serve(&self, _: u64, _: u64) -> Option<()> {
        Some(())
    }
}

#[cfg(test)]
impl GrantedBytes for &'static str {
    type Served = &'static str;

    fn serve(&self, _: u64, _: u64) -> Option<&'static str> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skyriver_core::ArenaId;

    fn region() -> LocalRegion {
        LocalRegion {
            arena: ArenaId(3),
            offset: 4096,
            len: 8192,
        }
    }

    #[test]
    fn a_key_serves_its_peer_inside_its_region_until_revoked() {
        let mut grants = Grants::default();
        let (a, b) = (NodeId(1), NodeId(2));
        let key = grants.grant(a, TransferId(7), region(), "view");
        assert_eq!(grants.admit(a, key, 4096, 8192), Some("view"));
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.admit(b, key, 4096, 10), None, "another peer");
        assert_eq!(grants.admit(a, key, 4095, 10), None, "before the region");
        assert_eq!(grants.admit(a, key, 12_000, 4096), None, "past its end");
        assert_eq!(grants.admit(a, key, u64::MAX, 2), None, "overflow");
        assert_eq!(grants.admit(a, key ^ 1, 4096, 10), None, "another key");
        assert!(grants.revoke(a, TransferId(7)));
        assert_eq!(grants.admit(a, key, 4096, 10), None, "revoked");
        assert_eq!(grants.len(), 0);
    }

    #[test]
    fn a_revocation_waits_for_the_reads_being_served() {
        let mut grants = Grants::default();
        let a = NodeId(1);
        let key = grants.grant(a, TransferId(7), region(), ());
        assert!(grants.admit(a, key, 4096, 10).is_some());
        assert!(grants.admit(a, key, 5000, 10).is_some());
        assert!(!grants.revoke(a, TransferId(7)), "two READs still serving");
        assert_eq!(
            grants.admit(a, key, 4096, 10),
            None,
            "no new READ after revoke"
        );
        assert_eq!(grants.done(key), None);
        assert_eq!(grants.done(key), Some((a, TransferId(7))));
        assert_eq!(grants.len(), 0);
    }

    #[test]
    fn a_read_being_served_keeps_its_region_claimed_past_the_revocation() {
        use super::super::GrantView;
        use crate::arena::{ArenaOptions, ReadableRegion, SharedArena};
        let arena =
            Arc::new(SharedArena::create("test", 1 << 16, &ArenaOptions::default()).unwrap());
        let grants = Arc::new(Mutex::new(Grants::default()));
        let (events, _received) = crate::fabric::event_channel();
        let a = NodeId(1);
        let view = Arc::new(ReadableRegion::new(arena.clone(), 4096, 8192).unwrap());
        let key = lock(&grants).grant(a, TransferId(9), region(), GrantView::Whole(view));
        let serving = Serving::admit(&grants, &events, a, key, 4096, 1).unwrap();
        assert!(!lock(&grants).revoke(a, TransferId(9)));
        assert!(
            arena.write(4096, b"reuse").is_err(),
            "a READ still reads it"
        );
        drop(serving);
        arena.write(4096, b"reuse").unwrap();
    }

    #[test]
    fn dropping_a_serving_read_completes_the_revocation() {
        let grants = Arc::new(Mutex::new(Grants::default()));
        let (events, mut received) = crate::fabric::event_channel();
        let a = NodeId(1);
        let key = lock(&grants).grant(a, TransferId(9), region(), ());
        let serving = Serving::admit(&grants, &events, a, key, 4096, 1).unwrap();
        assert!(!lock(&grants).revoke(a, TransferId(9)));
        assert!(received.try_recv().is_err());
        drop(serving);
        match received.try_recv() {
            Ok(FabricEvent::ReadRevoked { peer, req }) => {
                assert_eq!((peer, req), (a, TransferId(9)))
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The serve-then-revoke guard under every interleaving of a READ being served and its lease
/// being revoked: the holder reuses the region (the core unpins it) only once no READ reads
/// it. The region is a loom cell, so a read beside the reuse is reported.
#[cfg(all(test, skyriver_loom))]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Arc;

    use super::*;
    use skyriver_core::ArenaId;

    /// The driver's side of `ReadRevoked`: a flag the revoker waits on.
    #[derive(Clone, Default)]
    struct Revoked(Arc<AtomicBool>);

    impl RevocationSink for Revoked {
        fn revoked(&self, _: NodeId, _: TransferId) {
            self.0.store(true, Ordering::Release);
        }
    }

    fn serve_while_revoking(grants: Grants<()>) {
        let (peer, req) = (NodeId(1), TransferId(7));
        let region = LocalRegion {
            arena: ArenaId(0),
            offset: 0,
            len: 64,
        };
        let grants = std::sync::Arc::new(Mutex::new(grants));
        let key = lock(&grants).grant(peer, req, region, ());
        let revoked = Revoked::default();
        let bytes = Arc::new(UnsafeCell::new(0u8));
        let server = {
            let (grants, revoked, bytes) = (grants.clone(), revoked.clone(), bytes.clone());
            loom::thread::spawn(move || {
                if let Some(serving) = Serving::admit(&grants, &revoked, peer, key, 0, 64) {
                    // SAFETY: (the model) a read of the region while the READ is served;
                    // loom reports it if the reuse below can run beside it.
                    bytes.with(|p| unsafe { *p });
                    drop(serving);
                }
            })
        };
        if !lock(&grants).revoke(peer, req) {
            while !revoked.0.load(Ordering::Acquire) {
                loom::thread::yield_now();
            }
        }
        // SAFETY: (the model) the region reused once the revocation is complete.
        bytes.with_mut(|p| unsafe { *p = 1 });
        server.join().unwrap();
    }

    #[test]
    fn loom_a_revocation_completes_only_after_the_reads_being_served() {
        loom::model(|| serve_while_revoking(Grants::default()));
    }

    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_finds_a_revocation_that_does_not_wait_for_reads() {
        loom::model(|| serve_while_revoking(Grants::with_planted_race()));
    }
}
