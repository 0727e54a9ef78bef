//! The JSON API's request bodies on any text: a claim, a delegation, a `todo_write`;
//! each parses or is refused, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_proto::{parse_write_request, ClaimRequest, DelegateRequest};

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let _ = serde_json::from_str::<ClaimRequest>(text);
    let _ = serde_json::from_str::<DelegateRequest>(text);
    let _ = parse_write_request(text);
});
