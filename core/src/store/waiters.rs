//! Gets that wait: a `get` completes when every id is sealed (or aborted) or at its deadline,
//! whichever comes first.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{Store, StoreOutput};
use crate::error::StoreError;
use crate::ids::{ClientId, ObjectId, RequestId};
use crate::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct WaiterId(pub(super) u64);

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) client: ClientId,
    pub(super) request: RequestId,
    pub(super) ids: Vec<ObjectId>,
    pub(super) deadline: Instant,
    /// Distinct ids not sealed yet.
    pub(super) unsealed_remaining: usize,
    /// A zero timeout: report NotFound/NotSealed instead of Timeout.
    pub(super) poll: bool,
    /// Ids aborted while waited for: reported as [`StoreError::Aborted`].
    pub(super) aborted: BTreeSet<ObjectId>,
    /// Ids whose restore failed while waited for, with the error to report.
    pub(super) failed: BTreeMap<ObjectId, StoreError>,
}

impl Store {
    /// Asks for objects: completes (as a [`StoreOutput::GetReply`]) when every id is sealed or
    /// at `now + timeout`. A zero timeout polls; `None` waits for ever.
    pub fn get(
        &mut self,
        now: Instant,
        client: ClientId,
        request: RequestId,
        ids: Vec<ObjectId>,
        timeout: Option<Duration>,
    ) {
        if ids.len() > self.config.max_batch_len {
            let error = StoreError::BadRequest(format!(
                "a get names {} ids; the limit is {}",
                ids.len(),
                self.config.max_batch_len
            ));
            let results = vec![Err(error); ids.len()];
            self.outputs.push_back(StoreOutput::GetReply {
                client,
                request,
                results,
            });
            return;
        }
        self.clients.entry(client).or_default();
        let unsealed: BTreeSet<ObjectId> = ids
            .iter()
            .copied()
            .filter(|id| !self.is_sealed(id))
            .collect();
        let spilled: Vec<ObjectId> = unsealed
            .iter()
            .copied()
            .filter(|id| self.is_spilled(id))
            .collect();
        let present = self.objects_to_hold_for_get(&ids, &unsealed);
        // A spilled object is restored for any get; the get waits for it within its
        // timeout like for any object not here yet (a poll only starts the restore).
        let deadline = timeout.map_or(Instant::NEVER, |t| now.saturating_add(t));
        let waiter = Waiter {
            client,
            request,
            ids,
            deadline,
            unsealed_remaining: unsealed.len(),
            poll: timeout == Some(Duration::ZERO),
            aborted: BTreeSet::new(),
            failed: BTreeMap::new(),
        };
        if unsealed.is_empty() || deadline <= now {
            self.complete_get(waiter);
            for id in spilled {
                self.request_restore(id);
            }
            return;
        }
        let waiter_id = WaiterId(self.next_waiter);
        self.next_waiter += 1;
        for id in unsealed {
            self.waiters_by_object
                .entry(id)
                .or_default()
                .insert(waiter_id);
        }
        if deadline != Instant::NEVER {
            self.deadlines.insert((deadline, waiter_id));
        }
        self.waiters.insert(waiter_id, waiter);
        self.hold_for_get(waiter_id, present);
        for id in spilled {
            self.request_restore(id);
        }
    }

    /// Time passed: completes every get whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(deadline, waiter_id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(waiter) = self.take_waiter(waiter_id) {
                self.complete_get(waiter);
            }
        }
    }

    /// The next instant at which [`Store::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(deadline, _)| deadline)
    }

    /// `id` was sealed: gets waiting for it count it as settled.
    pub(super) fn wake_waiters(&mut self, id: ObjectId) {
        self.settle_waiters(id, false);
    }

    /// Gets waiting for `id`, aborted before it was sealed, hear so now instead of at their
    /// deadline: the id counts as settled (with [`StoreError::Aborted`]).
    pub(super) fn abort_waiters(&mut self, id: ObjectId) {
        self.settle_waiters(id, true);
    }

    /// Every get waiting for `id` counts it as settled; those with nothing left to wait for
    /// complete.
    pub(super) fn settle_waiters(&mut self, id: ObjectId, aborted: bool) {
        self.settle_waiters_with(id, aborted, None);
    }

    /// Gets waiting for `id` hear `error` for it now (a restore that failed).
    pub(super) fn fail_waiters_with(&mut self, id: ObjectId, error: StoreError) {
        self.settle_waiters_with(id, false, Some(error));
    }

    fn settle_waiters_with(&mut self, id: ObjectId, aborted: bool, error: Option<StoreError>) {
        let Some(waiter_ids) = self.waiters_by_object.remove(&id) else {
            return;
        };
        for waiter_id in waiter_ids {
            let Some(waiter) = self.waiters.get_mut(&waiter_id) else {
                continue;
            };
            if aborted {
                waiter.aborted.insert(id);
            }
            if let Some(error) = &error {
                waiter.failed.entry(id).or_insert_with(|| error.clone());
            }
            waiter.unsealed_remaining -= 1;
            if waiter.unsealed_remaining == 0 {
                let waiter = self
                    .take_waiter(waiter_id)
                    .expect("the waiter was just found");
                self.complete_get(waiter);
            }
        }
    }

    pub(super) fn take_waiter(&mut self, waiter_id: WaiterId) -> Option<Waiter> {
        let waiter = self.waiters.remove(&waiter_id)?;
        self.waiter_gone(waiter_id);
        self.deadlines.remove(&(waiter.deadline, waiter_id));
        for id in &waiter.ids {
            if let Some(list) = self.waiters_by_object.get_mut(id) {
                list.remove(&waiter_id);
                if list.is_empty() {
                    self.waiters_by_object.remove(id);
                }
            }
        }
        Some(waiter)
    }

    pub(super) fn drop_waiter(&mut self, waiter_id: WaiterId) {
        let _ = self.take_waiter(waiter_id);
    }

    pub(super) fn complete_get(&mut self, waiter: Waiter) {
        let results = waiter
            .ids
            .iter()
            .map(|&id| match self.get_now(waiter.client, id) {
                Ok(info) => Ok(info),
                Err(_) if waiter.failed.contains_key(&id) => Err(waiter.failed[&id].clone()),
                Err(_) if waiter.aborted.contains(&id) => Err(StoreError::Aborted(id)),
                // Present, on disk: not back within the get's timeout.
                Err(_) if self.is_spilled(&id) => Err(StoreError::Timeout(id)),
                Err(error) if waiter.poll => Err(error),
                Err(_) => Err(StoreError::Timeout(id)),
            })
            .collect();
        self.outputs.push_back(StoreOutput::GetReply {
            client: waiter.client,
            request: waiter.request,
            results,
        });
    }
}
