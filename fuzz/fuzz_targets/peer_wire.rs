//! The peer wire decoder never panics, and whatever decodes re-encodes to the same bytes.
//! Also feeds the bytes to a node, which must turn them into an error or a well-formed step.
//!
//! Half the inputs are used raw; the other half get a valid header (magic, version, the kind
//! from the second byte, the right length) so the fuzzer spends its time in the body decoders.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skyriver_core::{wire, Instant, Node, NodeConfig, NodeId, NodeInput};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 || rest.is_empty() {
        rest.to_vec()
    } else {
        let (kind, body) = (rest[0] % 9, &rest[1..]);
        let mut bytes = vec![wire::MAGIC[0], wire::MAGIC[1], wire::WIRE_VERSION, kind];
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    };
    let _ = wire::message_len(&bytes);
    if let Ok(message) = wire::decode(&bytes) {
        assert_eq!(wire::to_bytes(&message), bytes, "decode/encode round trip");
        let mut node = Node::new(NodeConfig::new(NodeId(0), 1 << 16), Instant::ZERO);
        let peer = NodeId(1);
        let _ = node.handle(Instant::ZERO, NodeInput::PeerMessage { peer, message });
        while node.poll_output().is_some() {}
        node.check_invariants();
    }
});
