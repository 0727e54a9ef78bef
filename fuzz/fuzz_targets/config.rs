//! The hub's configuration file on any text: parsed or refused with a reason, and what
//! parses yields its policy, roles, tokens and limits without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_hub::config::Config;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(c) = Config::parse(text) {
        let _ = (
            c.policy(),
            c.roles(),
            c.tokens(),
            c.conn_limits(),
            c.list_creations(),
        );
    }
});
