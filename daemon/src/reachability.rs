//! Which peers the daemon cannot reach, when it dials them again, and what it says about it.
//!
//! A peer that cannot be reached is dialed again after 1 s, then 2 s, 4 s, … up to
//! [`MAX_DIAL_DELAY`], so a node that is gone costs a dial (and a log line) every half minute,
//! not two a second. The log says it once per change of state: WARN when a peer becomes
//! unreachable, DEBUG for each further failure, INFO when it is back. A change of the cluster's
//! membership (a node joined, left, or came back) dials at once again: the peer may be new.
//! Pure bookkeeping: the loop passes the time in and logs what it is told.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use skyriver_core::NodeId;

/// The first wait before dialing a peer that could not be reached again.
pub(super) const FIRST_DIAL_DELAY: Duration = Duration::from_secs(1);

/// The longest wait between two dials of an unreachable peer.
pub(super) const MAX_DIAL_DELAY: Duration = Duration::from_secs(30);

/// A peer this daemon failed to reach, since it last was connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unreachable {
    /// Failures since it was last connected (the count the log reports).
    failures: u32,
    /// Failures since the back-off last started over (the count the delay grows with).
    backoff_failures: u32,
    /// Not dialed again before this.
    next_dial: Instant,
}

/// What a failure means for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The peer was reachable (or never tried): say so at WARN.
    BecameUnreachable {
        /// When it is dialed again.
        retry_in: Duration,
    },
    /// It already was unreachable: DEBUG.
    StillUnreachable {
        /// Failures in a row, this one included.
        failures: u32,
        /// When it is dialed again.
        retry_in: Duration,
    },
}

/// Every peer the daemon could not reach, with its back-off.
#[derive(Debug, Default)]
pub(super) struct Reachability {
    unreachable: BTreeMap<NodeId, Unreachable>,
}

impl Reachability {
    /// A connection to `peer` failed or was lost at `now`.
    pub(super) fn failed(&mut self, peer: NodeId, now: Instant) -> Failure {
        match self.unreachable.get_mut(&peer) {
            Some(state) => {
                state.failures += 1;
                state.backoff_failures += 1;
                let retry_in = delay_after(state.backoff_failures);
                state.next_dial = now + retry_in;
                Failure::StillUnreachable {
                    failures: state.failures,
                    retry_in,
                }
            }
            None => {
                let retry_in = delay_after(1);
                self.unreachable.insert(
                    peer,
                    Unreachable {
                        failures: 1,
                        backoff_failures: 1,
                        next_dial: now + retry_in,
                    },
                );
                Failure::BecameUnreachable { retry_in }
            }
        }
    }

    /// `peer` is connected; the failures before, when it had been unreachable (to say at INFO
    /// that it is back).
    pub(super) fn connected(&mut self, peer: NodeId) -> Option<u32> {
        self.unreachable.remove(&peer).map(|state| state.failures)
    }

    /// Whether `peer` may be dialed at `now`.
    pub(super) fn may_dial(&self, peer: NodeId, now: Instant) -> bool {
        self.unreachable
            .get(&peer)
            .is_none_or(|state| now >= state.next_dial)
    }

    /// The membership changed to `members`: peers no longer listed are forgotten, the others
    /// are dialed at once and their back-off starts over (they stay unreachable for the log
    /// until they connect).
    pub(super) fn membership_changed(&mut self, members: &[NodeId], now: Instant) {
        self.unreachable.retain(|peer, _| members.contains(peer));
        for state in self.unreachable.values_mut() {
            state.backoff_failures = 0;
            state.next_dial = now;
        }
    }
}

/// The wait after `failures` failures in a row: 1 s, 2 s, 4 s, … at most [`MAX_DIAL_DELAY`].
fn delay_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST_DIAL_DELAY * 2u32.pow(doublings)).min(MAX_DIAL_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: NodeId = NodeId(1);
    const OTHER: NodeId = NodeId(2);

    #[test]
    fn a_peer_is_reported_once_when_it_goes_and_once_when_it_comes_back() {
        let mut r = Reachability::default();
        let t = Instant::now();
        assert!(matches!(
            r.failed(PEER, t),
            Failure::BecameUnreachable { .. }
        ));
        for n in 2..=5 {
            assert!(matches!(
                r.failed(PEER, t),
                Failure::StillUnreachable { failures, .. } if failures == n
            ));
        }
        // Another peer has a state of its own.
        assert!(matches!(
            r.failed(OTHER, t),
            Failure::BecameUnreachable { .. }
        ));
        assert_eq!(r.connected(PEER), Some(5));
        // Connected without having failed: nothing to report.
        assert_eq!(r.connected(PEER), None);
        // Lost again: a new change of state, a new warning.
        assert!(matches!(
            r.failed(PEER, t),
            Failure::BecameUnreachable { .. }
        ));
    }

    #[test]
    fn dials_back_off_exponentially_up_to_the_cap() {
        let mut r = Reachability::default();
        let mut t = Instant::now();
        assert!(r.may_dial(PEER, t), "a peer never tried is dialed at once");
        let mut delays = Vec::new();
        for _ in 0..8 {
            let retry_in = match r.failed(PEER, t) {
                Failure::BecameUnreachable { retry_in }
                | Failure::StillUnreachable { retry_in, .. } => retry_in,
            };
            assert!(!r.may_dial(PEER, t + retry_in - Duration::from_millis(1)));
            assert!(r.may_dial(PEER, t + retry_in));
            delays.push(retry_in.as_secs());
            t += retry_in;
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(delay_after(u32::MAX), MAX_DIAL_DELAY);
    }

    #[test]
    fn a_membership_change_dials_at_once_and_starts_the_back_off_over_without_a_new_warning() {
        let mut r = Reachability::default();
        let t = Instant::now();
        for _ in 0..6 {
            r.failed(PEER, t);
        }
        r.failed(OTHER, t);
        assert!(!r.may_dial(PEER, t + Duration::from_secs(29)));
        let later = t + Duration::from_secs(5);
        r.membership_changed(&[PEER], later);
        assert!(r.may_dial(PEER, later));
        assert_eq!(
            r.failed(PEER, later),
            Failure::StillUnreachable {
                failures: 7,
                retry_in: FIRST_DIAL_DELAY
            }
        );
        // OTHER left the membership: forgotten, so its return is news again.
        assert_eq!(r.connected(OTHER), None);
        assert!(matches!(
            r.failed(OTHER, later),
            Failure::BecameUnreachable { .. }
        ));
    }
}
