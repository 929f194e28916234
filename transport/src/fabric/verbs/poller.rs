//! The completion poller: one thread for every connection of the fabric.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::peer::PeerConn;
use super::{lock, Shared, Slot};

// ---- the poller ---------------------------------------------------------------------------

pub(super) fn poll_loop(s: &Shared) {
    let mut conns: Vec<Arc<PeerConn>> = Vec::new();
    let mut control_fds = Vec::new();
    let mut idle_rounds = 0u32;
    let mut last_work = Instant::now();
    let mut last_liveness = Instant::now();
    let mut liveness_due = false;
    while !s.shutdown.load(Ordering::Acquire) {
        conns.clear();
        conns.extend(lock(&s.table).peers.values().filter_map(|slot| match slot {
            Slot::Up(c) => Some(c.clone()),
            Slot::Connecting { .. } => None,
        }));
        let check_liveness = liveness_due || last_liveness.elapsed() >= s.config.liveness_interval;
        if check_liveness {
            last_liveness = Instant::now();
            liveness_due = false;
        }
        // Events the driver's channel had no room for go first, in order, as room appears.
        let held_back = s.events.move_on();
        let mut work = 0;
        for c in &conns {
            let mut st = lock(&c.state);
            work += c.service(&mut st, s, check_liveness);
        }
        if work > 0 {
            idle_rounds = 0;
            last_work = Instant::now();
            continue;
        }
        // Spin for a bounded time, not a number of rounds: on a busy machine every round
        // is a CPU slice taken from the daemon's other threads.
        if last_work.elapsed() < s.config.busy_poll {
            thread::yield_now();
            continue;
        }
        let idle = match &s.idle {
            // Recently busy (or no completion channel, or events held back until the driver
            // makes room, which raises no completion event): short sleeps from 10 µs to
            // idle_poll_max, cut short by posts (unpark), keep the next reply's latency a poll,
            // not an event wake-up.
            Some(idle) if held_back == 0 && last_work.elapsed() >= s.config.event_sleep_after => {
                idle
            }
            _ => {
                let shift = idle_rounds.min(10);
                idle_rounds = idle_rounds.saturating_add(1);
                let sleep = Duration::from_micros(10u64 << shift).min(s.config.idle_poll_max);
                thread::park_timeout(sleep);
                continue;
            }
        };
        // Sleep on events: arm every CQ, then look once more (a completion that arrived before
        // arming raises no event), and sleep only if that finds nothing.
        control_fds.clear();
        let quiet = idle.last_look(|| {
            for c in &conns {
                let mut st = lock(&c.state);
                if c.arm(&mut st, s) {
                    work += c.service(&mut st, s, false);
                    control_fds.push(st.control_fd());
                } else {
                    work += 1;
                }
            }
            work > 0
        });
        if !quiet {
            last_work = Instant::now();
            continue;
        }
        match idle.sleep(&control_fds, IDLE_SLEEP_MAX) {
            Ok(woken) => {
                // Control stream events and the periodic safety net both check liveness.
                liveness_due = woken.control || !woken.completions;
                if woken.completions {
                    last_work = Instant::now();
                }
            }
            Err(e) => {
                tracing::warn!("verbs poller: waiting for events failed: {e}; polling instead");
                thread::sleep(s.config.idle_poll_max);
            }
        }
    }
}

/// Longest sleep of the idle poller when no event comes: a safety net, not a mechanism.
const IDLE_SLEEP_MAX: Duration = Duration::from_secs(1);
