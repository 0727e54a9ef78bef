//! The bounded inflater on any bytes and bound: never panics, never passes the bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_core::syncmsg::inflated_len;

fuzz_target!(|input: (u32, &[u8])| {
    let (bound, bytes) = input;
    let bound = bound as usize % (8 * 1024 * 1024);
    if let Ok(n) = inflated_len(bytes, bound) {
        assert!(n <= bound);
    }
});
