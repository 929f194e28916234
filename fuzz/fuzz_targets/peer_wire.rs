//! The peer wire decoder never panics, and whatever decodes re-encodes to the same bytes.
//! Also feeds the bytes to a node, which must turn them into an error or a well-formed step.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skyriver_core::{wire, Instant, Node, NodeConfig, NodeId};

fuzz_target!(|data: &[u8]| {
    let _ = wire::message_len(data);
    if let Ok(message) = wire::decode(data) {
        assert_eq!(wire::to_bytes(&message), data, "decode/encode round trip");
    }
    let mut node = Node::new(NodeConfig::new(NodeId(0), 1 << 16), Instant::ZERO);
    let _ = node.handle_peer_bytes(Instant::ZERO, NodeId(1), data);
    while node.poll_output().is_some() {}
    node.check_invariants();
});
