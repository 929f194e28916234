//! The verbs fabric's handshake frames (`Open`, `Challenge`, `Proven`, `Reply`, `Verdict`,
//! `CostsFrame`, `Hello`): whatever decodes survives a round trip, and a hello that passes
//! `Hello::validate` gives a READ table in which each of its arenas resolves to exactly its
//! memory regions, and only with its key.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skyriver_transport::fabric::verbs::fuzzing;

fuzz_target!(
    init: skyriver_fuzz::write_seeds(fuzzing::seeds()),
    |data: &[u8]| {
        fuzzing::hello_frames(data);
    }
);
