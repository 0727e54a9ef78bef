//! The sync-message validator on any bytes: never panics, never allocates past its
//! limits (libFuzzer's `-rss_limit_mb` and `-malloc_limit_mb` catch that), and what it
//! lets through automerge reads without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_core::syncmsg::{validate, Limits};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(checked) = validate(bytes, &Limits::default()) {
        let _ = checked.into_message();
    }
});
