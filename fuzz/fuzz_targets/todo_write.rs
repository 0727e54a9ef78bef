//! `todo_write` JSON on any text: parsed with the API's parser, then written to a list
//! of a few tasks (planned, checked, committed): every outcome is an answer or a typed
//! error, never a panic, and a refused write changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use swarmtodo_core::model::{parse_write_request, TodoList, WriteContext};

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(req) = parse_write_request(text) else {
        return;
    };
    let mut list = TodoList::create(automerge::ActorId::from([1u8; 16]));
    let seed = parse_write_request(
        r#"{"mode":"patch","ops":[
            {"op":"upsert","task":{"id":"a","content":"A","status":"in_progress","owner":"w1"}},
            {"op":"upsert","task":{"id":"b","content":"B","blocked_by":["a"]}},
            {"op":"upsert","task":{"id":"c","content":"C","status":"completed"}}]}"#,
    )
    .expect("the seed write parses");
    list.write(&seed, &WriteContext::new("lead", 1, 1))
        .expect("the seed write applies");
    let before = list.read();
    match list.write(&req, &WriteContext::new("w1", 2, 2)) {
        Ok(_) => {
            let _ = list.read();
        }
        Err(_) => assert_eq!(list.read(), before, "a refused write changed the list"),
    }
});
