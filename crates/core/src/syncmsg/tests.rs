//! Tests of the sync-message validator: real automerge messages pass, each bad shape
//! and each limit is refused with its code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::inflate::testing::Collect;
use super::*;
use crate::format::*;
use automerge::sync::{self, SyncDoc};
use automerge::transaction::Transactable;
use automerge::{AutoCommit, ReadDoc, ROOT};
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn leb(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// LSB-first bit writer for hand-made DEFLATE streams.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    bits: u64,
    count: u32,
}

impl BitWriter {
    fn put(&mut self, value: u32, n: u32) {
        self.bits |= u64::from(value) << self.count;
        self.count += n;
        while self.count >= 8 {
            self.out.push(self.bits as u8);
            self.bits >>= 8;
            self.count -= 8;
        }
    }

    /// A Huffman code is sent most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        let reversed = code.reverse_bits() >> (32 - len);
        self.put(reversed, len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.out.push(self.bits as u8);
        }
        self.out
    }
}

/// A fixed-Huffman DEFLATE stream of one zero byte followed by `matches` copies of
/// 258 bytes at distance 1: 13 bits of input for every 258 bytes of output.
fn zeros_bomb(matches: usize) -> Vec<u8> {
    let mut w = BitWriter::default();
    w.put(1, 1); // final block
    w.put(1, 2); // fixed Huffman codes
    w.code(0x30, 8); // literal 0
    for _ in 0..matches {
        w.code(0xc5, 8); // length symbol 285: 258 bytes
        w.code(0, 5); // distance symbol 0: distance 1
    }
    w.code(0, 7); // end of block
    w.finish()
}

fn chunk(chunk_type: u8, data: &[u8]) -> Vec<u8> {
    let mut out = CHUNK_MAGIC.to_vec();
    out.extend([0xde, 0xad, 0xbe, 0xef]); // checksum, which automerge checks later
    out.push(chunk_type);
    out.extend(leb(data.len() as u64));
    out.extend_from_slice(data);
    out
}

/// A V1 message with no heads, need or have, carrying `entries`.
fn with_changes(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![MESSAGE_TYPE_SYNC_V1, 0, 0, 0];
    out.extend(leb(entries.len() as u64));
    for entry in entries {
        out.extend(leb(entry.len() as u64));
        out.extend_from_slice(entry);
    }
    out
}

/// A V1 message with one `have` whose Bloom filter is `bloom`.
fn with_bloom(bloom: &[u8]) -> Vec<u8> {
    let mut out = vec![MESSAGE_TYPE_SYNC_V1, 0, 0, 1, 0];
    out.extend(leb(bloom.len() as u64));
    out.extend_from_slice(bloom);
    out.push(0);
    out
}

/// A boolean column (whose data is any number of runs, so that zeros are valid
/// whatever their length), compressed.
const DEFLATED_BOOLEAN_COLUMN: u32 = (1 << COLUMN_ID_SHIFT) | COLUMN_DEFLATE_BIT | 4;

/// A document chunk whose only column is DEFLATE-compressed `column`.
fn document_with_deflated_column(column: &[u8]) -> Vec<u8> {
    let mut data = vec![0, 0]; // no actors, no heads
    data.push(1); // one change column
    data.extend(leb(u64::from(DEFLATED_BOOLEAN_COLUMN)));
    data.extend(leb(column.len() as u64));
    data.push(0); // no op columns
    data.extend_from_slice(column);
    chunk(CHUNK_TYPE_DOCUMENT, &data)
}

fn check_code(bytes: &[u8], limits: &Limits) -> &'static str {
    match check(bytes, limits) {
        Ok(summary) => panic!("accepted: {summary:?}"),
        Err(e) => e.code(),
    }
}

/// The 10-byte message found crashing automerge: one `have` whose Bloom filter has one entry,
/// 0 bits per entry and one probe. automerge 0.12 accepts it, and its next
/// `generate_sync_message` divides by zero.
const ZERO_BITS_PER_ENTRY: [u8; 10] = [0x42, 0, 0, 1, 0, 3, 1, 0, 1, 0];
/// The 15-byte message found crashing automerge: one entry, 1 bit per entry, 2^32 − 1 probes.
/// `generate_sync_message` allocates 16 GiB for the probes and aborts.
const MAX_PROBES: [u8; 15] = [
    0x42, 0, 0, 1, 0, 8, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0,
];

#[test]
fn messages_that_crashed_automerge_are_refused_before_it_sees_them() {
    let limits = Limits::default();
    assert_eq!(check_code(&ZERO_BITS_PER_ENTRY, &limits), "bloom_invalid");
    assert_eq!(check_code(&MAX_PROBES, &limits), "bloom_invalid");
    // automerge's own decoder accepts both (decoding alone is harmless; what
    // crashes is the next generate_sync_message), which is why this module exists.
    assert!(Message::decode(&ZERO_BITS_PER_ENTRY).is_ok());
    assert!(Message::decode(&MAX_PROBES).is_ok());
    // validate refuses them too, and never reaches automerge's decoder.
    assert_eq!(
        validate(&ZERO_BITS_PER_ENTRY, &limits).unwrap_err().code(),
        "bloom_invalid"
    );
}

#[test]
fn compression_bombs_are_refused_under_the_bound() {
    let limits = Limits::default();
    // 16_400 matches inflate to 4.03 MiB from 26 KiB: past CHANGE_BYTES_MAX.
    let matches = CHANGE_BYTES_MAX / 258 + 10;
    let bomb = zeros_bomb(matches);
    assert!(bomb.len() < 32 * 1024);
    let msg = with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &bomb)]);
    assert_eq!(
        check(&msg, &limits).unwrap_err(),
        SyncMsgError::InflateBound {
            index: 0,
            max: CHANGE_BYTES_MAX
        }
    );
    // The same stream in a document column, against a smaller total budget.
    let small = Limits {
        inflated_bytes_max: 1024 * 1024,
        ..Limits::default()
    };
    let msg = with_changes(&[document_with_deflated_column(&bomb)]);
    assert_eq!(
        check(&msg, &small).unwrap_err(),
        SyncMsgError::InflateBound {
            index: 0,
            max: 1024 * 1024
        }
    );
    // The budget is for the whole message: two streams of 600 KiB each pass
    // alone and fail together.
    let half = zeros_bomb(600 * 1024 / 258);
    let one = with_changes(&[document_with_deflated_column(&half)]);
    assert_eq!(
        check(&one, &small).unwrap().inflated_bytes,
        1 + 258 * (600 * 1024 / 258)
    );
    let two = with_changes(&[
        document_with_deflated_column(&half),
        document_with_deflated_column(&half),
    ]);
    assert_eq!(check_code(&two, &small), "inflate_bound");
    // And in a bundle chunk's column.
    let mut bundle = vec![0, 0]; // no dependencies, no actors
    bundle.push(1); // one change column
    bundle.extend(leb(u64::from(DEFLATED_BOOLEAN_COLUMN)));
    bundle.extend(leb(bomb.len() as u64));
    bundle.extend_from_slice(&bomb);
    bundle.push(0); // no op columns
    let msg = with_changes(&[chunk(CHUNK_TYPE_BUNDLE, &bundle)]);
    assert_eq!(check_code(&msg, &small), "inflate_bound");
}

#[test]
fn the_hand_made_bomb_is_real_deflate() {
    let mut out = Collect::default();
    let stream = zeros_bomb(3);
    assert_eq!(
        inflate::inflate(&stream, usize::MAX, &mut out),
        Ok(1 + 3 * 258)
    );
    assert!(out.0.iter().all(|&b| b == 0));
}

fn sleb(mut n: i64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if (n == 0 && byte & 0x40 == 0) || (n == -1 && byte & 0x40 != 0) {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// `data` as a DEFLATE stream of stored (uncompressed) blocks.
fn stored(data: &[u8]) -> Vec<u8> {
    let blocks: Vec<&[u8]> = if data.is_empty() {
        vec![&[]]
    } else {
        data.chunks(usize::from(u16::MAX)).collect()
    };
    let mut out = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i + 1 == blocks.len())); // final?, stored
        let len = block.len() as u16;
        out.extend(len.to_le_bytes());
        out.extend((!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out
}

/// Columns of a hand-made chunk: specification and data of each.
type Cols = Vec<(u32, Vec<u8>)>;

/// Column metadata (count, then specification and length of each).
fn column_meta(columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = leb(columns.len() as u64);
    for (spec, data) in columns {
        out.extend(leb(u64::from(*spec)));
        out.extend(leb(data.len() as u64));
    }
    out
}

fn column_data(columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
    columns.iter().flat_map(|(_, d)| d.clone()).collect()
}

/// The body of a change chunk by actor `[actor; 16]` (seq 1, no dependencies, time
/// 0, no message) whose first op is `start_op`, with these op columns.
fn change_body(actor: u8, start_op: u64, columns: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut data = vec![0, 16];
    data.extend([actor; 16]);
    data.push(1);
    data.extend(leb(start_op));
    data.extend([0, 0, 0]); // time, message length, other actors
    data.extend(column_meta(columns));
    data.extend(column_data(columns));
    data
}

/// Op columns that declare `n` ops by run-length encoding alone: `n` times "put
/// null at key x" in the root, with no predecessors.
fn rle_ops(n: u64) -> Cols {
    let run = sleb(i64::try_from(n).unwrap());
    vec![
        (0x15, [run.clone(), vec![1, b'x']].concat()), // key: run of "x"
        (0x34, leb(n)),                                // insert: n times false
        (0x42, [run.clone(), vec![1]].concat()),       // action: run of 1 (put)
        (0x56, [run.clone(), vec![0]].concat()),       // value metadata: run of null
        (0x70, [run, vec![0]].concat()),               // pred: run of 0
    ]
}

/// A change chunk (its checksum not computed) of `n` run-length encoded ops, a few
/// dozen bytes whatever `n`.
fn rle_change(actor: u8, n: u64) -> Vec<u8> {
    chunk(CHUNK_TYPE_CHANGE, &change_body(actor, 1, &rle_ops(n)))
}

fn document_chunk(changes: &[(u32, Vec<u8>)], ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut data = vec![0, 0]; // no actors, no heads
    data.extend(column_meta(changes));
    data.extend(column_meta(ops));
    data.extend(column_data(changes));
    data.extend(column_data(ops));
    chunk(CHUNK_TYPE_DOCUMENT, &data)
}

fn bundle_chunk(changes: &[(u32, Vec<u8>)], ops: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut data = vec![0, 0]; // no dependencies, no actors
    data.extend(column_meta(changes));
    data.extend(column_data(changes));
    data.extend(column_meta(ops));
    data.extend(column_data(ops));
    chunk(CHUNK_TYPE_BUNDLE, &data)
}

#[test]
fn the_run_length_change_is_what_automerge_reads() {
    // Without a bound, automerge walks every op such a change declares.
    let change = automerge::Change::from_bytes(rle_change(7, 5)).unwrap();
    assert_eq!(change.len(), 5);
    assert!(rle_change(7, 1 << 40).len() < 100);
}

#[test]
fn a_change_declaring_a_trillion_ops_by_run_length_is_refused() {
    let limits = Limits::default();
    let trillion = 1u64 << 40;
    let msg = with_changes(&[rle_change(7, trillion)]);
    let err = check(&msg, &limits).unwrap_err();
    assert_eq!(
        err,
        SyncMsgError::TooManyOps {
            index: 0,
            count: trillion,
            limit: OPS_LIMIT_PER_CHANGE,
            max: OPS_PER_CHANGE_MAX,
        }
    );
    assert_eq!(err.code(), "too_many_ops");
    assert_eq!(
        err.to_string(),
        "chunk 0 declares 1099511627776 ops, the limit is 1048576 ops per change"
    );
    assert_eq!(validate(&msg, &limits).unwrap_err().code(), "too_many_ops");

    let run = |n: u64| sleb(i64::try_from(n).unwrap());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "compressed change",
            chunk(
                CHUNK_TYPE_COMPRESSED,
                &stored(&change_body(7, 1, &rle_ops(trillion))),
            ),
        ),
        ("a trillion nulls", {
            let mut ops = rle_ops(5);
            ops[0] = (0x15, [vec![0], leb(trillion)].concat()); // null run
            chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
        }),
        ("a trillion falses", {
            let mut ops = rle_ops(5);
            ops[1] = (0x34, [leb(5), leb(trillion)].concat()); // 5 false, then true
            chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
        }),
        ("one op with a trillion predecessors", {
            let mut ops = rle_ops(1);
            ops[4] = (0x70, [run(1), leb(trillion)].concat());
            ops.push((0x71, [run(trillion), leb(0)].concat())); // pred actor 0
            ops.push((0x73, [run(trillion), sleb(1)].concat())); // pred counter +1
            chunk(CHUNK_TYPE_CHANGE, &change_body(7, 1, &ops))
        }),
        (
            "document ops",
            document_chunk(&[], &[(0x42, [run(trillion), vec![1]].concat())]),
        ),
        (
            "document changes",
            document_chunk(&[(0x01, [run(trillion), vec![0]].concat())], &[]),
        ),
        (
            "compressed document column",
            document_chunk(
                &[],
                &[(
                    0x42 | COLUMN_DEFLATE_BIT,
                    stored(&[run(trillion), vec![1]].concat()),
                )],
            ),
        ),
        (
            "bundle ops",
            bundle_chunk(&[], &[(0x42, [run(trillion), vec![1]].concat())]),
        ),
        (
            "bundle changes",
            bundle_chunk(&[(0x01, [run(trillion), vec![0]].concat())], &[]),
        ),
    ];
    for (what, chunk) in cases {
        assert!(chunk.len() < 200, "{what}: {} bytes", chunk.len());
        let err = check(&with_changes(&[chunk]), &limits).unwrap_err();
        assert_eq!(err.code(), "too_many_ops", "{what}: {err}");
    }
}

#[test]
fn the_op_limits_hold_at_their_boundaries() {
    let limits = Limits::default();
    let max = OPS_PER_CHANGE_MAX as u64;
    let at = check(&with_changes(&[rle_change(7, max)]), &limits).unwrap();
    assert_eq!(at.ops_count, max);
    assert_eq!(
        check(&with_changes(&[rle_change(7, max + 1)]), &limits).unwrap_err(),
        SyncMsgError::TooManyOps {
            index: 0,
            count: max + 1,
            limit: OPS_LIMIT_PER_CHANGE,
            max: OPS_PER_CHANGE_MAX,
        }
    );
    // Changes each within the limit add up against the message's.
    let full: Vec<Vec<u8>> = (0..OPS_PER_MESSAGE_MAX / OPS_PER_CHANGE_MAX)
        .map(|i| rle_change(i as u8, max))
        .collect();
    let summary = check(&with_changes(&full), &limits).unwrap();
    assert_eq!(summary.ops_count, OPS_PER_MESSAGE_MAX as u64);
    let one_more = [full, vec![rle_change(99, 1)]].concat();
    let err = check(&with_changes(&one_more), &limits).unwrap_err();
    assert_eq!(err.code(), "too_many_ops");
    assert!(err.to_string().ends_with("ops per message"), "{err}");

    // With small limits, against what automerge itself counts.
    let small = Limits {
        ops_per_change_max: 5,
        ops_per_message_max: 8,
        ..Limits::default()
    };
    assert_eq!(
        automerge::Change::from_bytes(rle_change(7, 5))
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        check(&with_changes(&[rle_change(7, 5)]), &small)
            .unwrap()
            .ops_count,
        5
    );
    assert_eq!(
        check_code(&with_changes(&[rle_change(7, 6)]), &small),
        "too_many_ops"
    );
    let eight = with_changes(&[rle_change(1, 5), rle_change(2, 3)]);
    assert_eq!(check(&eight, &small).unwrap().ops_count, 8);
    let nine = with_changes(&[rle_change(1, 5), rle_change(2, 4)]);
    assert_eq!(
        check(&nine, &small).unwrap_err(),
        SyncMsgError::TooManyOps {
            index: 1,
            count: 9,
            limit: OPS_LIMIT_PER_MESSAGE,
            max: 8,
        }
    );
    // Predecessors count as ops: one op naming 5 of them is 6 in all.
    let mut ops = rle_ops(1);
    ops[4] = (0x70, [sleb(1), leb(5)].concat());
    ops.push((0x71, [sleb(5), leb(0)].concat()));
    ops.push((0x73, [sleb(5), sleb(1)].concat()));
    let preds = with_changes(&[chunk(CHUNK_TYPE_CHANGE, &change_body(7, 9, &ops))]);
    assert_eq!(check(&preds, &small).unwrap().ops_count, 6);
    let five = Limits {
        ops_per_message_max: 5,
        ..small
    };
    assert_eq!(check_code(&preds, &five), "too_many_ops");
}

#[test]
fn op_columns_must_agree_and_op_counters_fit_32_bits() {
    let limits = Limits::default();
    let code = |start_op: u64, ops: &[(u32, Vec<u8>)]| {
        let change = chunk(CHUNK_TYPE_CHANGE, &change_body(7, start_op, ops));
        let automerge_reads = automerge::Change::from_bytes(change.clone()).is_ok();
        match check(&with_changes(&[change]), &limits) {
            Ok(_) => ("ok", automerge_reads),
            Err(e) => (e.code(), automerge_reads),
        }
    };
    let with = |at: usize, column: (u32, Vec<u8>)| {
        let mut ops = rle_ops(5);
        ops[at] = column;
        ops
    };
    // (what, start op, columns, code, whether automerge reads the change)
    let cases: Vec<(&str, u64, Cols, &str, bool)> = vec![
        ("agreeing columns", 1, rle_ops(5), "ok", true),
        (
            // automerge's encoders leave out a column of nulls.
            "an empty column",
            1,
            [vec![(0x01, vec![]), (0x02, vec![])], rle_ops(5)].concat(),
            "ok",
            true,
        ),
        (
            "a longer key column (automerge ignores the extra row)",
            1,
            with(0, (0x15, [sleb(6), vec![1, b'x']].concat())),
            "chunk_invalid",
            true,
        ),
        (
            "a shorter insert column",
            1,
            with(1, (0x34, leb(4))),
            "chunk_invalid",
            false,
        ),
        (
            "predecessor columns shorter than their group",
            1,
            [
                with(4, (0x70, [sleb(5), leb(1)].concat())),
                vec![
                    (0x71, [sleb(4), leb(0)].concat()),
                    (0x73, [sleb(4), sleb(1)].concat()),
                ],
            ]
            .concat(),
            "chunk_invalid",
            false,
        ),
        (
            "literal runs, values as they are",
            1,
            with(2, (0x42, [sleb(-5), vec![1; 5]].concat())),
            "ok",
            true,
        ),
        (
            "a literal run past the column's end",
            1,
            with(2, (0x42, [sleb(-5), vec![1; 4]].concat())),
            "chunk_invalid",
            false,
        ),
        (
            "a compressed column",
            1,
            with(
                2,
                (
                    0x42 | COLUMN_DEFLATE_BIT,
                    stored(&[sleb(5), vec![1]].concat()),
                ),
            ),
            "chunk_invalid",
            false,
        ),
        (
            "the last op at 2^32 - 1",
            u64::from(u32::MAX) - 4,
            rle_ops(5),
            "ok",
            true,
        ),
        (
            "the last op past 2^32 - 1",
            u64::from(u32::MAX) - 3,
            rle_ops(5),
            "chunk_invalid",
            true,
        ),
        (
            "no ops, starting past 2^32 - 1",
            1 << 32,
            vec![],
            "chunk_invalid",
            false,
        ),
        ("start op 0", 0, rle_ops(5), "chunk_invalid", false),
    ];
    for (what, start_op, ops, expected, automerge_reads) in cases {
        assert_eq!(
            code(start_op, &ops),
            (expected, automerge_reads),
            "{what}: (code, whether automerge reads it)"
        );
    }
}

#[test]
fn column_runs_are_counted_without_expanding_them() {
    use runs::{count, Counted};
    type Case = (&'static str, u32, Vec<u8>, Result<Counted, &'static str>);
    let rows = |rows| Ok(Counted { rows, sum: 0 });
    let cases: Vec<Case> = vec![
        ("empty", COLUMN_TYPE_INTEGER, vec![], rows(0)),
        (
            "run",
            COLUMN_TYPE_INTEGER,
            [sleb(3), leb(300)].concat(),
            rows(3),
        ),
        (
            "literal",
            COLUMN_TYPE_ACTOR,
            [sleb(-2), leb(1), leb(300)].concat(),
            rows(2),
        ),
        (
            "nulls",
            COLUMN_TYPE_ACTOR,
            [sleb(0), leb(1 << 40)].concat(),
            rows(1 << 40),
        ),
        (
            "all three",
            COLUMN_TYPE_VALUE_METADATA,
            [sleb(2), leb(7), sleb(0), leb(3), sleb(-1), leb(8)].concat(),
            rows(6),
        ),
        (
            "delta",
            COLUMN_TYPE_DELTA,
            [sleb(4), sleb(-1), sleb(-2), sleb(i64::MIN), sleb(5)].concat(),
            rows(6),
        ),
        (
            "strings",
            COLUMN_TYPE_STRING,
            [sleb(-2), vec![2, b'h', b'i', 0], sleb(9), vec![1, b'x']].concat(),
            rows(11),
        ),
        (
            "booleans",
            COLUMN_TYPE_BOOLEAN,
            [leb(0), leb(4), leb(0), leb(2)].concat(),
            rows(6),
        ),
        (
            "group",
            COLUMN_TYPE_GROUP,
            [sleb(3), leb(2), sleb(-2), leb(1), leb(5), sleb(0), leb(4)].concat(),
            Ok(Counted { rows: 9, sum: 12 }),
        ),
        (
            "group past u64",
            COLUMN_TYPE_GROUP,
            [sleb(i64::MAX), leb(u64::MAX)].concat(),
            Ok(Counted {
                rows: i64::MAX as u64,
                sum: u64::MAX,
            }),
        ),
        (
            "runs past u64 saturate",
            COLUMN_TYPE_INTEGER,
            [sleb(i64::MAX), leb(1), sleb(0), leb(u64::MAX)].concat(),
            rows(u64::MAX),
        ),
        ("value bytes", COLUMN_TYPE_VALUE, vec![0xff; 3], rows(0)),
        (
            "overlong, as automerge's column decoder reads it",
            COLUMN_TYPE_INTEGER,
            vec![0x83, 0x80, 0x00, 0x01],
            rows(3),
        ),
        (
            "truncated value",
            COLUMN_TYPE_INTEGER,
            [sleb(3), vec![0x80]].concat(),
            Err("column data ends mid-value"),
        ),
        (
            "string past the end",
            COLUMN_TYPE_STRING,
            [sleb(1), vec![5, b'h']].concat(),
            Err("column value past the end of the column"),
        ),
        (
            "count past 64 bits",
            COLUMN_TYPE_BOOLEAN,
            [vec![0xff; 9], vec![0x02]].concat(),
            Err("column value larger than 64 bits"),
        ),
        (
            "literal of 2^63 values ends with the data",
            COLUMN_TYPE_INTEGER,
            [sleb(i64::MIN), vec![1; 3]].concat(),
            Err("column data ends mid-value"),
        ),
    ];
    for (what, kind, data, expected) in cases {
        assert_eq!(count(kind, &data), expected, "{what}");
    }
}

#[test]
fn changes_automerge_writes_declare_what_automerge_reads() {
    // Small changes, one with thousands of ops, ones that overwrite, delete and
    // resolve a conflict (predecessors), and the compressed forms of all of them.
    let mut doc = doc_with_tasks(1, 20);
    let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
    for i in 0..1500 {
        let task = doc
            .put_object(&list, format!("big{i}"), automerge::ObjType::Map)
            .unwrap();
        doc.put(&task, "content", format!("Task number {i}"))
            .unwrap();
        doc.put(&task, "status", "pending").unwrap();
    }
    doc.commit();
    for i in 0..10 {
        let task = doc.get(&list, format!("t{i}")).unwrap().unwrap().1;
        doc.put(&task, "status", "completed").unwrap();
        doc.delete(&list, format!("big{i}")).unwrap();
    }
    doc.commit();
    let mut other = doc.fork().with_actor(automerge::ActorId::from([2; 16]));
    let task = doc.get(&list, "t19").unwrap().unwrap().1;
    doc.put(&task, "status", "cancelled").unwrap();
    other.put(&task, "status", "in_progress").unwrap();
    doc.merge(&mut other).unwrap();
    doc.put(&task, "status", "pending").unwrap();
    doc.commit();

    let (mut largest, mut compressed, mut two_preds) = (0, 0, 0);
    for mut change in doc.get_changes(&[]) {
        let ops = change.decode().operations;
        let expected: u64 = ops.iter().map(|op| 1 + op.pred.len() as u64).sum();
        largest = largest.max(ops.len());
        two_preds += ops.iter().filter(|op| op.pred.len() == 2).count();
        let raw = change.raw_bytes().to_vec();
        let sent = change.bytes().to_vec();
        if sent[8] == CHUNK_TYPE_COMPRESSED {
            compressed += 1;
        }
        for bytes in [raw, sent] {
            let summary = check(&with_changes(&[bytes]), &Limits::default()).unwrap();
            assert_eq!(summary.ops_count, expected, "{}", change.hash());
        }
    }
    assert!(largest >= 4500, "a change with thousands of ops: {largest}");
    assert!(compressed >= 1, "automerge compressed a change");
    assert!(two_preds >= 1, "an op with two predecessors");

    // The whole document as one chunk: its ops and their successors, its changes
    // and their dependencies. Deletions are not ops of a document.
    let changes = doc.get_changes(&[]);
    let decoded: Vec<_> = changes.iter().map(|c| c.decode()).collect();
    let ops: u64 = decoded
        .iter()
        .flat_map(|c| &c.operations)
        .map(|op| u64::from(!matches!(op.action, automerge::legacy::OpType::Delete)))
        .sum();
    let preds: u64 = decoded
        .iter()
        .flat_map(|c| &c.operations)
        .map(|op| op.pred.len() as u64)
        .sum();
    let deps: u64 = decoded.iter().map(|c| 1 + c.deps.len() as u64).sum();
    for saved in [doc.save(), doc.save_nocompress()] {
        let summary = check(&with_changes(&[saved]), &Limits::default()).unwrap();
        assert_eq!(summary.ops_count, ops + preds + deps);
    }
}

#[test]
fn bad_messages_are_refused_with_a_stable_code() {
    let limits = Limits::default();
    let valid = real_messages().remove(0);
    let hash = |b: u8| [b; HASH_BYTES];
    let mut unsorted = vec![MESSAGE_TYPE_SYNC_V1, 2];
    unsorted.extend(hash(2));
    unsorted.extend(hash(1));
    unsorted.extend([0, 0, 0]);
    let mut change_too_large = CHUNK_MAGIC.to_vec();
    change_too_large.extend([0, 0, 0, 0, CHUNK_TYPE_CHANGE]);
    change_too_large.extend(leb(CHANGE_BYTES_MAX as u64 + 1));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "malformed"),
        (
            "unknown type byte",
            vec![0x44, 0, 0, 0, 0],
            "unknown_version",
        ),
        ("truncated", valid[..valid.len() - 1].to_vec(), "malformed"),
        ("truncated heads", vec![0x42, 1, 0xaa], "malformed"),
        (
            "overlong LEB128",
            vec![0x42, 0x80, 0x00, 0, 0, 0],
            "malformed",
        ),
        (
            "LEB128 above 64 bits",
            [vec![0x42], vec![0xff; 10], vec![0x01]].concat(),
            "malformed",
        ),
        (
            "oversize",
            vec![0x42; SYNC_MESSAGE_BYTES_MAX + 1],
            "message_too_large",
        ),
        (
            "2^40 heads declared",
            [vec![0x42], leb(1 << 40)].concat(),
            "too_many_hashes",
        ),
        (
            "too many needs",
            [vec![0x42, 0], leb(HEADS_COUNT_MAX as u64 + 1)].concat(),
            "too_many_hashes",
        ),
        ("unsorted heads", unsorted, "heads_unsorted"),
        (
            "too many haves",
            [vec![0x42, 0, 0], leb(HAVE_COUNT_MAX as u64 + 1)].concat(),
            "too_many_haves",
        ),
        (
            "Bloom filter over the limit",
            [vec![0x42, 0, 0, 1, 0], leb(BLOOM_BYTES_MAX as u64 + 1)].concat(),
            "bloom_too_large",
        ),
        (
            "Bloom filter for 0 entries",
            with_bloom(&[0, 10, 7]),
            "bloom_invalid",
        ),
        (
            "Bloom filter with 0 probes",
            with_bloom(&[1, 10, 0, 0, 0]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, 33 bits per entry",
            with_bloom(&[1, 33, 7, 0, 0, 0, 0, 0]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, 33 probes",
            with_bloom(&[1, 10, 33, 0, 0]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, bits too short",
            with_bloom(&[2, 10, 7, 0, 0]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, a byte too many",
            with_bloom(&[1, 10, 7, 0, 0, 0]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, truncated parameters",
            with_bloom(&[1, 10]),
            "bloom_invalid",
        ),
        (
            "Bloom filter, 2^32 entries",
            with_bloom(&[0x80, 0x80, 0x80, 0x80, 0x10, 1, 1]),
            "bloom_invalid",
        ),
        (
            "2^40 changes declared",
            [vec![0x42, 0, 0, 0], leb(1 << 40)].concat(),
            "too_many_changes",
        ),
        (
            "change longer than the limit",
            with_changes(&[change_too_large]),
            "change_too_large",
        ),
        (
            "empty change entry",
            with_changes(&[vec![]]),
            "chunk_invalid",
        ),
        ("bad magic", with_changes(&[vec![0; 12]]), "chunk_invalid"),
        (
            "unknown chunk type",
            with_changes(&[chunk(9, b"x")]),
            "chunk_invalid",
        ),
        (
            "chunk longer than its entry",
            with_changes(&[chunk(CHUNK_TYPE_CHANGE, b"abc")[..11].to_vec()]),
            "chunk_invalid",
        ),
        (
            "chunk split over two entries",
            with_changes(&[
                chunk(CHUNK_TYPE_CHANGE, b"abc")[..6].to_vec(),
                chunk(CHUNK_TYPE_CHANGE, b"abc")[6..].to_vec(),
            ]),
            "chunk_invalid",
        ),
        (
            "document column past the chunk",
            with_changes(&[chunk(CHUNK_TYPE_DOCUMENT, &[0, 0, 1, 0x10, 50, 0, 1, 2])]),
            "chunk_invalid",
        ),
        (
            "document with too many columns",
            with_changes(&[chunk(CHUNK_TYPE_DOCUMENT, &[0, 0, 0xff, 0x01])]),
            "chunk_invalid",
        ),
        (
            "compressed chunk, block type 3",
            with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &[0x07])]),
            "deflate_invalid",
        ),
        (
            "compressed chunk, truncated stream",
            with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &zeros_bomb(10)[..4])]),
            "deflate_invalid",
        ),
        (
            "compressed chunk, distance before the start",
            with_changes(&[chunk(CHUNK_TYPE_COMPRESSED, &{
                let mut w = BitWriter::default();
                w.put(1, 1);
                w.put(1, 2);
                w.code(0xc5, 8);
                w.code(0, 5);
                w.code(0, 7);
                w.finish()
            })]),
            "deflate_invalid",
        ),
        (
            "stored block with a bad length check",
            with_changes(&[chunk(
                CHUNK_TYPE_COMPRESSED,
                &[0x01, 2, 0, 0, 0, b'h', b'i'],
            )]),
            "deflate_invalid",
        ),
        (
            "too many change chunks in one entry",
            with_changes(&[[rle_change(1, 1), rle_change(2, 1)].concat()]),
            "too_many_changes",
        ),
    ];
    let one_change = Limits {
        changes_count_max: 1,
        ..Limits::default()
    };
    for (name, bytes, code) in cases {
        let limits = if name.starts_with("too many change chunks") {
            &one_change
        } else {
            &limits
        };
        let err = check(&bytes, limits).expect_err(name);
        assert_eq!(err.code(), code, "{name}: {err}");
    }
}

fn sync_until_quiet(a: &mut AutoCommit, b: &mut AutoCommit, mut on_message: impl FnMut(&Message)) {
    let (mut sa, mut sb) = (sync::State::new(), sync::State::new());
    for _ in 0..20 {
        let ma = a.sync().generate_sync_message(&mut sa);
        let mb = b.sync().generate_sync_message(&mut sb);
        if ma.is_none() && mb.is_none() {
            return;
        }
        if let Some(m) = ma {
            on_message(&m);
            b.sync().receive_sync_message(&mut sb, m).unwrap();
        }
        if let Some(m) = mb {
            on_message(&m);
            a.sync().receive_sync_message(&mut sa, m).unwrap();
        }
    }
    panic!("sync did not settle");
}

fn doc_with_tasks(actor: u8, tasks: usize) -> AutoCommit {
    let mut doc = AutoCommit::new().with_actor(automerge::ActorId::from([actor; 16]));
    let list = doc
        .put_object(ROOT, "tasks", automerge::ObjType::Map)
        .unwrap();
    doc.commit();
    for i in 0..tasks {
        let task = doc
            .put_object(&list, format!("t{i}"), automerge::ObjType::Map)
            .unwrap();
        doc.put(&task, "content", format!("Run the tests, round {i}"))
            .unwrap();
        doc.put(&task, "status", "pending").unwrap();
        doc.commit();
    }
    doc
}

/// Sync messages that automerge 0.12 generates, all of which must pass.
fn real_messages() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut a = doc_with_tasks(1, 5);
    let mut b = doc_with_tasks(2, 3);
    sync_until_quiet(&mut a, &mut b, |m| out.push(m.clone().encode()));
    out
}

fn passes_and_decodes_to(msg: &Message) -> Summary {
    let bytes = msg.clone().encode();
    let checked = validate(&bytes, &Limits::default())
        .unwrap_or_else(|e| panic!("{e} ({} bytes)", bytes.len()));
    assert_eq!(checked.message(), msg);
    checked.summary().clone()
}

#[test]
fn messages_automerge_generates_pass_and_decode_to_the_same_message() {
    let mut a = doc_with_tasks(1, 20);
    let mut b = doc_with_tasks(2, 7);
    let mut seen = 0;
    sync_until_quiet(&mut a, &mut b, |m| {
        passes_and_decode_to_count(m, &mut seen);
    });
    assert!(seen >= 3);
    assert_eq!(a.get_heads(), b.get_heads());

    // Concurrent edits to the same task after the first sync.
    let list = a.get(ROOT, "tasks").unwrap().unwrap().1;
    let task = a.get(&list, "t3").unwrap().unwrap().1;
    a.put(&task, "status", "completed").unwrap();
    let task_b = b.get(&list, "t3").unwrap().unwrap().1;
    b.put(&task_b, "status", "cancelled").unwrap();
    sync_until_quiet(&mut a, &mut b, |m| {
        passes_and_decode_to_count(m, &mut seen);
    });
    assert_eq!(a.get_heads(), b.get_heads());
    assert_eq!(a.get_heads().len(), 2);
}

fn passes_and_decode_to_count(m: &Message, seen: &mut usize) {
    passes_and_decodes_to(m);
    *seen += 1;
}

#[test]
fn a_whole_document_with_compressed_columns_passes() {
    // A fresh peer gets the whole document as one chunk (a V2 message), whose
    // larger columns automerge DEFLATE-compresses.
    let mut big = doc_with_tasks(1, 1000);
    let mut empty = AutoCommit::new();
    let mut with_changes = Vec::new();
    sync_until_quiet(&mut big, &mut empty, |m| {
        let summary = passes_and_decodes_to(m);
        if summary.chunks_count > 0 {
            with_changes.push(summary);
        }
    });
    assert_eq!(empty.get_heads(), big.get_heads());
    assert!(!with_changes.is_empty());
    for summary in with_changes {
        assert_eq!(summary.version, SyncVersion::V2);
        assert_eq!(summary.chunks_count, 1, "the document travels as one chunk");
        assert!(
            summary.inflated_bytes > 5 * summary.change_bytes,
            "compressed columns were measured: {summary:?}"
        );
    }
}

#[test]
fn many_changes_in_v1_messages_pass() {
    // A peer that never sends flags is taken for a V1-only peer, so the other
    // side sends every change as its own chunk.
    let mut big = doc_with_tasks(1, 1000);
    let mut old = AutoCommit::new();
    let (mut s_big, mut s_old) = (sync::State::new(), sync::State::new());
    let mut chunks = 0;
    for _ in 0..10 {
        let from_old = old.sync().generate_sync_message(&mut s_old).map(|mut m| {
            m.flags = None;
            m.version = sync::MessageVersion::V1;
            m
        });
        if let Some(m) = from_old {
            passes_and_decodes_to(&m);
            big.sync().receive_sync_message(&mut s_big, m).unwrap();
        }
        if let Some(m) = big.sync().generate_sync_message(&mut s_big) {
            let summary = passes_and_decodes_to(&m);
            chunks += summary.chunks_count;
            old.sync().receive_sync_message(&mut s_old, m).unwrap();
        }
    }
    assert_eq!(old.get_heads(), big.get_heads());
    assert_eq!(chunks, 1001, "one chunk per change");
}

#[test]
fn compressed_change_chunks_pass_and_inflate_like_zlib() {
    let mut doc = doc_with_tasks(1, 0);
    let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
    for i in 0..50 {
        let task = doc
            .put_object(&list, format!("t{i}"), automerge::ObjType::Map)
            .unwrap();
        doc.put(&task, "content", "a long description ".repeat(5))
            .unwrap();
    }
    doc.commit();
    let mut change = doc.get_last_local_change().unwrap().clone();
    let raw = change.raw_bytes().to_vec();
    let compressed = change.bytes().to_vec();
    assert_eq!(
        compressed[8], CHUNK_TYPE_COMPRESSED,
        "automerge compressed it"
    );

    // Our inflater produces exactly the change body that zlib-rs compressed.
    let mut r = Reader::new(&compressed[9..]);
    let len = r.leb128_u64().unwrap();
    let body = r.take(len).unwrap();
    let mut out = Collect::default();
    let n = inflate::inflate(body, usize::MAX, &mut out).unwrap();
    let mut raw_reader = Reader::new(&raw[9..]);
    let raw_len = raw_reader.leb128_u64().unwrap();
    assert_eq!(out.0, raw_reader.take(raw_len).unwrap());
    assert_eq!(n as u64, raw_len);
    // So does the one validation keeps, to count the ops in it.
    let mut kept = inflate::Keep::default();
    assert_eq!(inflate::inflate(body, usize::MAX, &mut kept), Ok(n));
    assert_eq!(kept.0, out.0);

    // In a sync message it passes, and automerge applies it.
    let msg = Message {
        heads: doc.get_heads(),
        need: vec![],
        have: vec![],
        changes: vec![compressed].into(),
        flags: None,
        version: sync::MessageVersion::V1,
    };
    let summary = passes_and_decodes_to(&msg);
    assert_eq!(summary.inflated_bytes as u64, raw_len);
    let mut base = doc_with_tasks(1, 0);
    let mut fresh = base.fork();
    fresh
        .sync()
        .receive_sync_message(&mut sync::State::new(), msg)
        .unwrap();
    base.merge(&mut doc).unwrap();
    assert_eq!(fresh.get_heads(), base.get_heads());
}

/// Sync messages produced by `@automerge/automerge` 3.5.0 under node: a document
/// with 120 changes syncing with a document with one, until both were quiet
/// (`Automerge.generateSyncMessage` / `receiveSyncMessage`).
const JS_MESSAGES: [&str; 4] = [
    // a2b, 198 bytes
    "4201ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001009b01790a07a3db35d6d5587fc834b43c17c635d51533ecd1375aecc91aa794203259c94f7186177f5f4d475e48b1754615b0bfa001fedd97ea2ff58ff6153d3cd5c7d396762fb2e39627b22d9bd0d3276d11bfcd1c7cf07c08d3a0be9288d3a81f4e195ab9b9268d6ae5376cd5bf724d94a0c9d27515488e4dcb124097f0a954a91ee73738110a180a831427f95c1657952f88c6560c63089cc4a15aee00020284",
    // b2a, 228 bytes
    "43014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e9301ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b98346277643695010005010a07e521019301856f4a8353b1ecbe0088010110bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93060102030213022302400256020b01040204130415082102230234024203560357018001027f007f017f027f007f007f0700017f0000017f0100017f007f046e6f746500010200020101017e04017e001662020000020284",
    // a2b, 3484 bytes
    "43024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001014d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e939b01790a07a3db35d6d5587fc834b43c17c635d51533ecd1375aecc91aa794203259c94f7186177f5f4d475e48b1754615b0bfa001fedd97ea2ff58ff6153d3cd5c7d396762fb2e39627b22d9bd0d3276d11bfcd1c7cf07c08d3a0be9288d3a81f4e195ab9b9268d6ae5376cd5bf724d94a0c9d27515488e4dcb124097f0a954a91ee73738110a180a831427f95c1657952f88c6560c63089cc4a15aee019419856f4a83248b0eac0089190210aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa10bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950701050306130c230e4007430556030c010a0ae406191a1bc8081dae02210a2b6834f2014a175e155fb002800103f900007f01f900017f887f7f010a20da002114227fff607ef1dbbad8068fa4c5a779f800007f00f800017f007f00f70001fa00070002f800007f018a1e0005c1e7421467000550e7ceecde6db3b375eeb765f647922749f224491e84002a76eca8a8340b282a766c51c0868a0a8a8a2da1da000b8a8a62ce59822f4b2cc0b7e9e027ff67fe825ffddff83bfef0ffe45fa8b6fc1a8bb5165a2cbfd5629b851ecbefb5d86761d4f2c72c8e5ba8865f03d6022df05bc136a007ea05fb8031681c9c006a6d2db5b9ccc61e5b7b6deeb371c5d6559bd76c4cd97a61f3a58d3a472b1cae74d0eea8c3e10107fd8e6e38bce9e0b5a3370ea71dac0e694d886b43e80ce9508887431808e976887742980de96d88ef42a80f6b7d981bc2e80aeb6898c7c2180c6b28cc7b617c086b2ecc8f616ca236935b8813d449f214314c3d201f12f3d467f20bd110d1b608b747d01dd19908cf463012d1e3089f44b010d1b708bf47d018d5ce287745713eaa0b51fe13c5b3a89e47f96f143fa2aa8af1ef189a626a8eb125864b31f5c4d81bc3684c63318ec75013576d9c4be3688b6b4f9c7be3b81cd79538afc63119d7549c2fe2589e505d822b12d89f507b821d095c4fa83fc11b09bc4ae875826f1258e56ab5cb352e0ebaea7479c8c52d57032e6fbb987135ebf2ad8b7549d527b93e8923497525793489bb490d263994c4fba43e243997c4464f9b3c6ef670dcd3098f273ddcf734ecf181874f9ee63d7ef6b035a58614b7a5703aa5ee14cfa4f028a591141fa7f035a58514bfa5b023adc63477a6712eadf3695e48e3695acfd27c9ec6625a3fd2acca6077464d1936677031a34b19f664f05f46a3198e65509d554d96b559b466d596e59e2cfab2ba9ce5952c26b29acc722a8b65392dcfb12e877d39edcfb13d876b395dcfb13f879739bdcaf1750e2bf35a95e7ea3c0ee47530cfce3c6ee6752bcf813ca6f39ac973368fb5bed6f9acf771d8d7119f5d3eeef8baeb73d0c73b5fef7d7ef0b141da286e128e49c7c513c23de9be382c7c943e89f3c216a3ad860d06a78c4e1b761b3c347a643862f0c5e8abe182c1f6827614d858c0d982ce1578be802705f3b4c067052c16cc8f02ab8a682a9ae6225b8ae8299ade22fb8a182f9a8922278b585632cb4bac2b617fc9b497d851427fc9dc28f166096f4a66bac49912d696cdba32ebcb3852365d651e2d63b06c86cabc57c65cd97c2cf353195b02b335604380d381e90e7826c048601e077c12e05b60be075c0cb0ab627657d854c1c58ab954614f05a3153356e178e57f63a81365606064636060a6162d364a8f86c3304a07e2839a060025d5e93b146a1806f07995f6bd79a7bd6fe7af385fceb7f36f9cd9f77ddf5e242649929084a12ca1ec5b4394a649428862b25496525124d590733deff3edf97db8bfdcd7755f8fc0932010c43141bc9030e5a978228863fffd2524ecdfbff9fd4f582024ac22212ae00c26cc810309317462420a1112b6c00a08f70c2b03475808ddcdc2e00a164507d91c38c062e844961207797f411ce6fd65e0883f84eef687e32861e5fe37e862ff3c38c5bf89fee30b6ca384cdfa8ab6714ffa2ac13dbe2e7487af175cea9b4117f816c149bea4eddcbfbde9db296133de52f4b8b706dce5ed41b779fbc145de59749e7709bce94989e7fee1c98ca784bdf194a3473d75e09027826ef20c816f783ea0b33d2be05feeb41ddc2beeec1d94b0d7ee2af490bb09dceaee43d7b947c1b9eecfe84cf70ff09a2b6327f7922b6f2725eca5eb1ebadfd5066e740da26b5ce3e0abaeafe874d76ff03767d62eee4567c12e4ad80b6703bad7d901ae758ea02b9d93e0cbceefe880f30ff88b236737f7bca3783725ecb9a3051d767483ab1dafd0b71d6fc1171d3fd1c98e737b28611fedf97bb8dfd96f819fdaefa31fda1f832bec5174d03e074eb56fa0b76ca97b296173b6c2bddc53b60af063db0374a7ed29f8966d1a7dd3f6117cce96b88f3b66bdb88f12f6d65a829eb05683bbad8fd0edd6e7e062eb7bf475eb17f01fcbf9fddceb96cbfb2961939632f498a516dc6179826eb6bc00175816d0d72cdfc0bfcd170e70af9aaf1ea0848d9befa087cd8de036f33374bdf92538cffc097dc5bc06fe61ba74907bd9947b9012366aba8b1e30b5829b4c03e8bba6d7e06cd332fa92e91778c578e510f727e38d4394b021633dfa993104ae330ea3ef18df80338dabe80bc64df092e1da61ee0543d1614a58bfa119fdc4d005ae318ca1cb0c33e074c33afabc21e908256c517ffd08f77b7d29b857df8e7ea4ef0157ea27d025fa5970401f4327ea538e52c2e675378f724febcac1615d27fa812e02bead9b4217ea3e8093755be80d6d9a9012f64e1b147247b555e087da87e8fbda3e7050fb0e9daffd0cded22453ee9f9a0c4a099bd2dc46bfd2dc03776ac2e816cd20f8a6661e9da3f90a8ea90322eeefea2c11256c425d891e513780dbd5bde806f508f8ba7a119da5fe0e5e57a51fe3feaaca3946091b53d5a007552de066553ffa9eea15f89a6a099da1fa095e55661ee7feaccc3f4e091b56d6a1fb94f7c1f5ca217495320abea25c41a72937c0cb8aec13dc1f1485272861038a267444f1007c57318a2e574c9f101196ae58479f57249d1411f6519e7f12f72dbf058ec843e86e79185c269f4417c917c0c9f22df4862ced9488b0b7b2127c4513b26a7097ac07dd26eb0717cae6d0b9b265704c1a388d7d4bb34e8b081b97de410f4b1bc1add23e749d74149c23fd82be2c5d07af4a32cf605f92fc3322c28624f5e8679210b8563282ae944c8233246be854c916f89338ef2cf7acb8e4ac88b05e713bfa91b8075c218ea283e239708a78f36c3cf91fed933d8e15410c0697a9054e015c61dcff7d9c157a11d2dbe01529649c1b79b90204489394dc9f5d89d5fef5f3f9feeaedbd2f8f6f8fc3f33030ce67e37c43244aa2265aa227466226566263e4ec9bfaa74a2bd28ab422ad482bd28ab422ad8251311a46c71818136361ecc382e5c41258b2ae581a968e6560995816967d58b19e58036bc19aef86b5631d5827d685751f366c27b6c056b0556c99756c03dbc4b6b0edc38efdc41ed80bf68abd61cf7c609fd817f67d38709c380247c15171341c1d47f6268e85631f4e9c27cec05970569c0d67c73970667fe1dc870bd7892b70155c1557c3d5710d5c1357ceecc38dfbc41db80bee8abbe1eeb807ee897be1de4fef7e7cfcfa7af776f7c3c317bf3f9e3efd87c9e72bb9b671fd84eb0aae2bb8aee02f5dc1972bb9fd836dfc067f01f900007f018a1e00ab6264605458c0344b9c53a9ee6ada59494ea5fa4529ec8a75d7ab4fb1702ad6adadfcc2c6a958d75c3e8f9353b1ee66c9096e4ec5baf5459f783915eb5a0be608702ad6ddce3d26c4a958b731fb8308a762fdf13479c67a2639223048dd28aea7791828501503007a01021d021d021d021d021d021d021d021d021d021d021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021e021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021f021fab67f9c9c050cfc8c4224b24961bc52cf4080379aa6200fbc5c0502fc6c4204b24961bc50cf4080379aa620085d6bb4d04311885d156a604bfedbf0d4a58315a08182176b77f3222741cdfecc88feff6f6ba8ee7c7793ccfc7f3715cafafdbf973a4eff37affbceeff8e5963d15835368d5de3d038352e8d410413d128132953299329d329132a532a932ad3aad0aaf83cd1aad0aad0aad0aad0aad0aad0aad0aad2aad2aafaf2d1aad2aad2aad2aad2aad2aad2aad1aad1aad1aaf9a5a255a355a355a355a355a355a755a755a755a755f7b34eab4eab4eab4eab4eab41ab41ab41ab41ab41abe13f9056835683568356935693569356935693569356d3c140ab49ab49ab45ab45ab45ab45ab45ab45ab45abe5baa2d5a255d02a6815b40a5a05ad825641aba0553845372dea184daed1e41c4deed1e4204d2ed2e4244d6ed2e4284d56db257cf66cb54dc56f327ed3f19b90df94fc26e5ff5afe17851f007978020284",
    // b2a, 138 bytes
    "43024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950001024d86fda1bba427075dd8b2132039d31a4086a13ac8d841d74553bffff6423e93ea57d91351c8b885a46ec35c0f6ca5dc50d23b09a738f73d1b983462776436950000020284",
];

/// The `data` of the `sync` frame in which the JS client sent a whole new document
/// to the JS server (see the wire tests).
const JS_DOC_SYNC: &str = "4301b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee00010008040a074b8df42398019803856f4a83a90d1e6d008d030110a238ae38f721270add0f569cd57acee001b6a9b3d8c7944165a9b9eeaa3b9c2ba93869e62d501cfb4d6f27140212bcb4ee0701020302130423084004430456020c01050216111813261545210323103406420e560c5742800103040004017f0103197f96d7bad80603007f0003017f00020104070001cb00000001030102020f030704021b0f1c071d02340f35073600070e000001060000030e000001060000030e000001060000067e00050d017e6e14050100027e671e0d017e552d050100027e4e370d017ebc7fc60005017a057461736b7302743002743102743207636f6e74656e740673746174757300167e07636f6e74656e740673746174757300167e07636f6e74656e74067374617475730016cc0000020102197f4f17017f0217017f021701061602160216040002041601020416010204160106001616020016160200161652756e20746865207465737473203070656e64696e6752756e20746865207465737473203170656e64696e6752756e20746865207465737473203270656e64696e67cc000003020284";

#[test]
fn messages_the_js_client_generates_pass() {
    let mut totals = (0, 0);
    for fixture in JS_MESSAGES.iter().chain([&JS_DOC_SYNC]) {
        let bytes = hex(fixture);
        let checked = validate(&bytes, &Limits::default()).unwrap();
        assert_eq!(checked.message().clone().encode(), bytes);
        totals.0 += checked.summary().chunks_count;
        totals.1 += checked.summary().inflated_bytes;
    }
    assert!(totals.0 >= 2, "the fixtures carry changes");
    // Feed them to a Rust document: it converges with what the JS side built.
    let mut doc = AutoCommit::new();
    let mut state = sync::State::new();
    for fixture in JS_MESSAGES.iter().step_by(2) {
        let msg = validate(&hex(fixture), &Limits::default()).unwrap();
        doc.sync()
            .receive_sync_message(&mut state, msg.into_message())
            .unwrap();
    }
    let list = doc.get(ROOT, "tasks").unwrap().unwrap().1;
    assert_eq!(doc.length(&list), 120);
}

/// Messages that cover every part of the format: heads, need, have with a Bloom
/// filter, change chunks, compressed columns and flags.
fn corpus() -> Vec<Vec<u8>> {
    let mut out = real_messages();
    let mut big = doc_with_tasks(3, 60);
    let mut empty = AutoCommit::new();
    sync_until_quiet(&mut big, &mut empty, |m| out.push(m.clone().encode()));
    out.extend(JS_MESSAGES.iter().map(|h| hex(h)));
    out.push(ZERO_BITS_PER_ENTRY.to_vec());
    out.push(with_changes(&[chunk(
        CHUNK_TYPE_COMPRESSED,
        &zeros_bomb(4),
    )]));
    out
}

fn mutate(rng: &mut TestRng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.below(4) + 1 {
        if bytes.is_empty() {
            bytes.push(rng.byte());
            continue;
        }
        let at = rng.below(bytes.len());
        match rng.below(6) {
            0 => bytes[at] = rng.byte(),
            1 => bytes[at] ^= 1 << rng.below(8),
            2 => bytes.truncate(at),
            3 => bytes.insert(at, rng.byte()),
            4 => {
                bytes.remove(at);
            }
            _ => bytes[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)],
        }
    }
}

/// Seed and number of cases for a fuzz loop: the defaults, or
/// `SWARMTODO_FUZZ_SEED` / `SWARMTODO_FUZZ_CASES` to replay a failure or search
/// longer.
fn fuzz_budget(seed: u64, cases: usize) -> (u64, usize) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    (
        env("SWARMTODO_FUZZ_SEED").unwrap_or(seed),
        env("SWARMTODO_FUZZ_CASES").map_or(cases, |c: u64| c as usize),
    )
}

/// xorshift64*, so a failing case prints a seed to replay it.
struct TestRng(u64);

impl TestRng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

#[test]
fn mutated_messages_never_panic_and_what_passes_automerge_decodes() {
    let corpus = corpus();
    let limits = Limits::default();
    let (seed, cases) = fuzz_budget(0x5eed_f50c, 20_000);
    let mut rng = TestRng(seed);
    let mut passed = 0;
    for case in 0..cases {
        let mut bytes = corpus[rng.below(corpus.len())].clone();
        mutate(&mut rng, &mut bytes);
        if check(&bytes, &limits).is_ok() {
            passed += 1;
            assert!(
                Message::decode(&bytes).is_ok(),
                "seed {seed:#x}, case {case}: check passed what automerge cannot decode: {bytes:02x?}"
            );
        }
    }
    assert!(
        passed > 1000,
        "the mutations still exercise the accepting paths"
    );
}

#[test]
fn what_passes_does_not_crash_automerge_sync() {
    // Beyond decoding: a document that receives a message that passed, then
    // generates its answer, must not panic (the Bloom filter crashes live here).
    let corpus = corpus();
    let limits = Limits::default();
    let (seed, cases) = fuzz_budget(0xb100_f11e, 2_000);
    let mut rng = TestRng(seed);
    let base = doc_with_tasks(4, 10);
    for case in 0..cases {
        let mut bytes = corpus[rng.below(corpus.len())].clone();
        mutate(&mut rng, &mut bytes);
        let Ok(checked) = validate(&bytes, &limits) else {
            continue;
        };
        let mut doc = base.clone();
        let outcome = std::panic::catch_unwind(move || {
            let mut state = sync::State::new();
            let _ = doc
                .sync()
                .receive_sync_message(&mut state, checked.into_message());
            let _ = doc.sync().generate_sync_message(&mut state);
        });
        assert!(outcome.is_ok(), "seed {seed:#x}, case {case}: {bytes:02x?}");
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = check(&bytes, &Limits::default());
        let mut with_type = vec![MESSAGE_TYPE_SYNC_V1];
        with_type.extend(&bytes);
        let _ = check(&with_type, &Limits::default());
    }

    #[test]
    fn random_deflate_never_panics_and_respects_the_bound(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        bound in 0usize..4096,
    ) {
        let mut out = Collect::default();
        let mut kept = inflate::Keep::default();
        let result = inflate::inflate(&bytes, bound, &mut out);
        prop_assert_eq!(inflate::inflate(&bytes, bound, &mut kept), result);
        if let Ok(n) = result {
            prop_assert!(n <= bound);
            prop_assert_eq!(n, out.0.len());
            prop_assert_eq!(&kept.0, &out.0);
        }
    }
}

/// A first message (a Bloom filter of the whole history) summed up by its heads: the
/// same heads, need and flags, `have` one entry at those heads, and a receiver answers
/// it with what the sender lacks; a message with changes is left as it is.
#[test]
fn a_message_without_changes_is_summed_up_by_its_heads() {
    let mut doc = AutoCommit::new();
    for n in 0..500 {
        doc.put(ROOT, "n", n).unwrap();
        doc.commit();
    }
    let first = doc
        .sync()
        .generate_sync_message(&mut sync::State::new())
        .unwrap();
    let bytes = first.clone().encode();
    let summed = summed_up(&bytes, &Limits::default()).expect("smaller");
    assert!(
        summed.len() < bytes.len() / 4,
        "{} of {}",
        summed.len(),
        bytes.len()
    );
    let m = validate(&summed, &Limits::default())
        .unwrap()
        .into_message();
    assert_eq!(m.heads, first.heads);
    assert_eq!(m.need, first.need);
    assert_eq!(m.flags, first.flags);
    assert_eq!(m.have.len(), 1);
    assert_eq!(m.have[0].last_sync, first.heads);

    // A receiver with 3 changes more sends exactly those.
    let mut ahead = doc.fork();
    for n in 0..3 {
        ahead.put(ROOT, "more", n).unwrap();
        ahead.commit();
    }
    let mut state = sync::State::new();
    ahead.sync().receive_sync_message(&mut state, m).unwrap();
    let answer = ahead.sync().generate_sync_message(&mut state).unwrap();
    let mut behind = doc.fork();
    behind
        .sync()
        .receive_sync_message(&mut sync::State::new(), answer)
        .unwrap();
    assert_eq!(behind.get_heads(), ahead.get_heads());

    // Changes are not summed up.
    let mut s = sync::State::new();
    let mut fresh = AutoCommit::new();
    fresh.sync().receive_sync_message(&mut s, first).unwrap();
    let asks = fresh.sync().generate_sync_message(&mut s).unwrap();
    let mut ds = sync::State::new();
    doc.sync().receive_sync_message(&mut ds, asks).unwrap();
    let with_changes = doc.sync().generate_sync_message(&mut ds).unwrap();
    assert!(!with_changes.changes.is_empty());
    assert_eq!(summed_up(&with_changes.encode(), &Limits::default()), None);
}

/// What a compression bomb at the bound costs the validator: a figure for the notes, not
/// a check (`cargo test -p swarmtodo-core --release --lib -- --ignored a_bomb_at_the_bound
/// --nocapture`).
#[test]
#[ignore]
fn a_bomb_at_the_bound_costs_the_validator() {
    use crate::limits::INFLATED_BYTES_MAX;
    let bomb = zeros_bomb(INFLATED_BYTES_MAX / 258 + 10);
    let msg = with_changes(&[document_with_deflated_column(&bomb)]);
    let limits = Limits::default();
    let runs = 20u32;
    let start = std::time::Instant::now();
    for _ in 0..runs {
        assert_eq!(
            inflate::inflate(&bomb, INFLATED_BYTES_MAX, &mut inflate::Discard),
            Err(inflate::Error::Bound)
        );
    }
    let inflating = start.elapsed() / runs;
    let start = std::time::Instant::now();
    for _ in 0..runs {
        assert_eq!(check_code(&msg, &limits), "inflate_bound");
    }
    let validating = start.elapsed() / runs;
    eprintln!(
        "bomb of {} KiB past {} MiB: inflate {inflating:?}, validate {validating:?} (mean of {runs})",
        bomb.len() / 1024,
        INFLATED_BYTES_MAX >> 20
    );
}
