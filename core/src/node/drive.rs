//! The one drive-until-idle loop every driver runs after giving its node an input (the
//! daemon, the simulator, the core's tests, a replay): carry out every output in order, feed
//! back the answers the driver gave at once, fire the timers already due, and stop when the
//! node has nothing more to say, with the instant it next wants time to pass.

use super::{Node, NodeDriver, NodeInput, NodeOutput};
use crate::time::Instant;

/// What [`drive_host`] needs of its caller: the node, the driver that carries out its outputs, the
/// answers that driver owes the node at once, and (optionally) a look at what goes in and out.
///
/// The node and the driver are reached through methods, not held, so a driver may look at the
/// node (its store, for checks) between outputs. `'i` is how long the answers' borrowed bytes
/// live (`'static` for a driver whose answers own everything).
pub trait DriveHost<'i> {
    /// What carries out the outputs.
    type Driver: NodeDriver;

    /// The node.
    fn node(&mut self) -> &mut Node;

    /// The driver.
    fn driver(&mut self) -> &mut Self::Driver;

    /// The next input the driver owes the node right away, produced while it carried out
    /// outputs (a client it had to close, a fabric's immediate answer to a grant, a hash); fed
    /// before any due timer. None by default.
    fn poll_answer(&mut self) -> Option<NodeInput<'i>> {
        None
    }

    /// Sees each input [`drive_host`] feeds the node (answers and due timers) just before it does:
    /// for recording. Does nothing by default.
    fn observe_input(&mut self, _now: Instant, _input: &NodeInput<'_>) {}

    /// Sees each output just before it is carried out: for recording. Does nothing by default.
    fn observe_output(&mut self, _output: &NodeOutput) {}
}

/// Drives the host's node until idle at `now`: every output is carried out, every answer fed
/// back, every timer due at or before `now` fired. Returns when the node next wants time to
/// pass (feed it [`NodeInput::Timeout`] then, or call this again). Calling it early, or twice,
/// is a harmless no-op.
pub fn drive_host<'i>(host: &mut impl DriveHost<'i>, now: Instant) -> Option<Instant> {
    loop {
        while let Some(output) = host.node().poll_output() {
            host.observe_output(&output);
            output.dispatch(host.driver());
        }
        let input = match host.poll_answer() {
            Some(answer) => answer,
            // Timers the node set for "right after these outputs" fire here at once.
            None if host.node().poll_timeout().is_some_and(|due| due <= now) => NodeInput::Timeout,
            None => return host.node().poll_timeout(),
        };
        host.observe_input(now, &input);
        // Answers and timers are never peer bytes: nothing to report.
        let _ = host.node().handle(now, input);
    }
}

/// [`drive_host`] for a node and a driver that owes no answers and records nothing.
pub fn drive<D: NodeDriver>(node: &mut Node, driver: &mut D, now: Instant) -> Option<Instant> {
    drive_host(&mut Pair { node, driver }, now)
}

struct Pair<'a, D> {
    node: &'a mut Node,
    driver: &'a mut D,
}

impl<D: NodeDriver> DriveHost<'static> for Pair<'_, D> {
    type Driver = D;

    fn node(&mut self) -> &mut Node {
        self.node
    }

    fn driver(&mut self) -> &mut D {
        self.driver
    }
}
