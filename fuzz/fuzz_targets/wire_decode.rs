//! The automerge-repo wire decoder on any bytes: never panics; what it decodes encodes
//! back to a frame it decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_proto::wire;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(msg) = wire::decode(bytes) {
        let again = wire::encode(&msg);
        assert_eq!(wire::decode(&again).ok(), Some(msg));
    }
});
