//! The client protocol decoders never panic on arbitrary bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skyriver_core::client_protocol;

fuzz_target!(|data: &[u8]| {
    let _ = client_protocol::decode_request(data);
    let _ = client_protocol::decode_server_frame(data);
});
