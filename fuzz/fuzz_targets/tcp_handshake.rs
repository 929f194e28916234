//! The TCP fabric's handshake frames: whatever decodes survives a round trip, and a hello of
//! another version is refused with its version rather than decoded.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skyriver_transport::fabric::tcp::fuzzing;

fuzz_target!(
    init: skyriver_fuzz::write_seeds(fuzzing::seeds()),
    |data: &[u8]| {
        fuzzing::handshake_frame(data);
    }
);
