//! Objects pinned for the gets that wait for others (see [`Store::hold_for_get`]): a get of
//! several objects answers only once all are in memory, so those it found (or that came back
//! for it) must not go back to disk meanwhile.
//!
//! An object is pinned once, however many gets hold it, and released once every get it is held
//! for has completed or gone. Releasing is checked after every input, so it must not walk every
//! held object: the gets that went since the last check are recorded
//! ([`HeldForGets::waiter_gone`]), and only the objects held for them are looked at. A release
//! costs O(log n) per object its gone gets held, whatever the number held.
//!
//! [`Store::hold_for_get`]: crate::store::Store

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::ObjectId;
use crate::store::waiters::WaiterId;

/// The held objects, indexed both ways.
#[derive(Debug, Default)]
pub(in crate::store) struct HeldForGets {
    /// The gets each held object is held for (one may appear more than once: ids of a get may
    /// repeat). Never empty.
    by_object: BTreeMap<ObjectId, Vec<WaiterId>>,
    /// The objects held for each get that has not gone: what its going may release.
    by_waiter: BTreeMap<WaiterId, Vec<ObjectId>>,
    /// Held objects one of whose gets went since the last release: the only ones that can be
    /// released now.
    candidates: BTreeSet<ObjectId>,
}

impl HeldForGets {
    /// Holds `id` for `waiter` (a get still waiting); true when nothing held it before (the
    /// caller pins it then).
    pub(in crate::store) fn hold(&mut self, id: ObjectId, waiter: WaiterId) -> bool {
        let waiters = self.by_object.entry(id).or_default();
        let first = waiters.is_empty();
        waiters.push(waiter);
        self.by_waiter.entry(waiter).or_default().push(id);
        first
    }

    /// `waiter` completed or went: what it held may be released at the next
    /// [`HeldForGets::take_released`].
    pub(in crate::store) fn waiter_gone(&mut self, waiter: WaiterId) {
        if let Some(ids) = self.by_waiter.remove(&waiter) {
            self.candidates.extend(ids);
        }
    }

    /// Takes the held objects whose gets have all gone (`is_live` says which have not), in id
    /// order; the caller unpins them. Looks only at the objects held for gets gone since the
    /// last call.
    pub(in crate::store) fn take_released(
        &mut self,
        mut is_live: impl FnMut(&WaiterId) -> bool,
    ) -> Vec<ObjectId> {
        let mut released = Vec::new();
        for id in std::mem::take(&mut self.candidates) {
            let waiters = self
                .by_object
                .get_mut(&id)
                .expect("a candidate for release is held");
            // Gone gets are forgotten, so an object held by overlapping gets for a long time
            // keeps a short list.
            waiters.retain(&mut is_live);
            if waiters.is_empty() {
                self.by_object.remove(&id);
                released.push(id);
            }
        }
        released
    }

    /// The held objects.
    pub(in crate::store) fn objects(&self) -> impl Iterator<Item = &ObjectId> {
        self.by_object.keys()
    }

    /// Checks that the index agrees with itself and that a release finds what a walk of every
    /// held object would: each object all of whose gets are gone (by `is_live`) is a
    /// candidate, and each get not gone holds the objects listed for it. Panics otherwise.
    pub(in crate::store) fn check_invariants(&self, is_live: impl Fn(&WaiterId) -> bool) {
        for (id, waiters) in &self.by_object {
            assert!(!waiters.is_empty(), "{id} held for no get");
            let mut live = false;
            for waiter in waiters.iter().filter(|w| is_live(w)) {
                live = true;
                assert!(
                    self.by_waiter
                        .get(waiter)
                        .is_some_and(|ids| ids.contains(id)),
                    "{id} held for a waiting get {waiter:?} that does not list it"
                );
            }
            assert!(
                live || self.candidates.contains(id),
                "{id} held only for gone gets is not a candidate for release"
            );
        }
        for (waiter, ids) in &self.by_waiter {
            assert!(
                is_live(waiter),
                "gone get {waiter:?} still listed as holding"
            );
            for id in ids {
                assert!(
                    self.by_object
                        .get(id)
                        .is_some_and(|waiters| waiters.contains(waiter)),
                    "get {waiter:?} lists {id}, not held for it"
                );
            }
        }
        for id in &self.candidates {
            assert!(self.by_object.contains_key(id), "candidate {id} not held");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> ObjectId {
        ObjectId::from_u64(n)
    }

    /// The first hold pins; an object is released only once every get holding it went, and
    /// only the objects of gone gets are looked at: a release next to many objects held for a
    /// waiting get checks one liveness, not thousands.
    #[test]
    fn a_release_looks_only_at_what_gone_gets_held() {
        let (waiting, done) = (WaiterId(1), WaiterId(2));
        let mut held = HeldForGets::default();
        for n in 0..10_000 {
            assert!(held.hold(id(n), waiting), "first hold of {n} pins");
        }
        assert!(held.hold(id(20_000), done));
        assert!(
            !held.hold(id(0), done),
            "second hold of 0 does not pin again"
        );
        held.check_invariants(|_| true);

        let mut checks = 0;
        assert!(held
            .take_released(|_| {
                checks += 1;
                true
            })
            .is_empty());
        assert_eq!(checks, 0, "nothing went: nothing looked at");

        let live = |w: &WaiterId| *w == waiting;
        held.waiter_gone(done);
        held.check_invariants(live);
        let mut checks = 0;
        let released = held.take_released(|w| {
            checks += 1;
            live(w)
        });
        assert_eq!(
            released,
            vec![id(20_000)],
            "0 is still held for the waiting get"
        );
        assert_eq!(checks, 3, "the gets of 0 (two) and of 20000 (one)");
        held.check_invariants(live);

        held.waiter_gone(waiting);
        let released = held.take_released(|_| false);
        assert_eq!(released.len(), 10_000);
        assert!(released.windows(2).all(|w| w[0] < w[1]), "in id order");
        assert_eq!(held.objects().count(), 0);
        held.check_invariants(|_| false);
    }

    /// The check catches a get that went without being recorded (what a walk would release and
    /// the index would miss).
    #[test]
    #[should_panic(expected = "not a candidate for release")]
    fn the_check_catches_a_get_gone_unrecorded() {
        let mut held = HeldForGets::default();
        held.hold(id(1), WaiterId(1));
        held.by_waiter.clear();
        held.check_invariants(|_| false);
    }
}
