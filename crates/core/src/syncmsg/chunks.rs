//! The change chunks of a sync message: every chunk walked, its columns measured and
//! its ops counted against the limits, DEFLATE streams inflated under the bound.

use super::reader::Reader;
use super::{inflate, runs};
use super::{Limits, SyncMsgError, COLUMNS_COUNT_MAX, OPS_LIMIT_PER_CHANGE, OPS_LIMIT_PER_MESSAGE};
use crate::format::{
    CHUNK_CHECKSUM_BYTES, CHUNK_MAGIC, CHUNK_TYPE_BUNDLE, CHUNK_TYPE_CHANGE, CHUNK_TYPE_COMPRESSED,
    CHUNK_TYPE_DOCUMENT, COLUMN_DEFLATE_BIT, COLUMN_ID_SHIFT, COLUMN_TYPE_BITS, COLUMN_TYPE_GROUP,
    COLUMN_TYPE_VALUE, HASH_BYTES,
};

/// Walks the change chunks of one message and keeps the running totals.
#[derive(Debug)]
pub(super) struct Chunks<'l> {
    pub(super) limits: &'l Limits,
    /// Chunks seen so far.
    pub(super) count: usize,
    /// Bytes of chunks seen so far.
    pub(super) bytes: usize,
    /// Bytes inflated so far, over all DEFLATE streams.
    pub(super) inflated: usize,
    /// Ops declared so far, over all chunks (as [`Summary::ops_count`] counts them).
    pub(super) ops: u64,
}

impl Chunks<'_> {
    /// One entry of the `changes` list: one or more whole chunks. automerge
    /// concatenates the entries and parses the result as a sequence of chunks, so
    /// requiring whole chunks per entry makes both readings the same.
    pub(super) fn entry(&mut self, entry: &[u8]) -> Result<(), SyncMsgError> {
        if entry.is_empty() {
            return Err(self.invalid("empty change entry"));
        }
        let mut r = Reader::new(entry);
        while !r.is_empty() {
            if self.count >= self.limits.changes_count_max {
                return Err(SyncMsgError::TooManyChanges {
                    count: self.count as u64 + 1,
                    max: self.limits.changes_count_max,
                });
            }
            self.chunk(&mut r)?;
            self.count += 1;
        }
        Ok(())
    }

    pub(super) fn invalid(&self, reason: &'static str) -> SyncMsgError {
        SyncMsgError::ChunkInvalid {
            index: self.count,
            reason,
        }
    }

    pub(super) fn chunk(&mut self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let magic = r
            .take(CHUNK_MAGIC.len() as u64)
            .map_err(|_| self.invalid("truncated header"))?;
        if magic != CHUNK_MAGIC {
            return Err(self.invalid("bad magic bytes"));
        }
        r.take(CHUNK_CHECKSUM_BYTES as u64)
            .map_err(|_| self.invalid("truncated header"))?;
        let chunk_type = r.byte().map_err(|_| self.invalid("truncated header"))?;
        let len = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad chunk length"))?;
        if len > self.limits.change_bytes_max as u64 {
            return Err(SyncMsgError::ChangeTooLarge {
                len,
                max: self.limits.change_bytes_max,
            });
        }
        let data = r
            .take(len)
            .map_err(|_| self.invalid("chunk longer than its entry"))?;
        self.bytes += data.len();
        match chunk_type {
            CHUNK_TYPE_CHANGE => self.change(data),
            // A change chunk whose whole body is one DEFLATE stream.
            CHUNK_TYPE_COMPRESSED => {
                let body = self.inflate_kept(data, self.limits.change_bytes_max)?;
                self.change(&body)
            }
            CHUNK_TYPE_DOCUMENT => self.document(data),
            CHUNK_TYPE_BUNDLE => self.bundle(data),
            _ => Err(self.invalid("unknown chunk type")),
        }
    }

    /// Change chunk: dependencies, actor, sequence number, the first op's counter,
    /// time, message, other actors, op column metadata, op column data, then extra
    /// bytes automerge keeps as they are. automerge walks every op the columns declare
    /// before it returns the change, so they must agree on how many there are, and
    /// that number must be within the limits.
    pub(super) fn change(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.skip_hashes(&mut r)?;
        self.actor_id(&mut r)?;
        r.leb128_u64()
            .map_err(|_| self.invalid("bad sequence number"))?;
        let start_op = r.leb128_u64().map_err(|_| self.invalid("bad start op"))?;
        if start_op == 0 {
            return Err(self.invalid("start op is zero"));
        }
        r.skip_leb128().map_err(|_| self.invalid("bad time"))?;
        let message_len = r.leb128_u64().map_err(|_| self.invalid("bad message"))?;
        r.take(message_len)
            .map_err(|_| self.invalid("bad message"))?;
        self.actor_ids(&mut r)?;
        let columns = self.columns(&mut r)?;
        // automerge refuses these before reading an op.
        if columns.iter().any(|c| c.deflate) {
            return Err(self.invalid("compressed column in a change"));
        }
        let ops = self.rows(&mut r, &columns)?;
        let max = self.limits.ops_per_change_max;
        if ops.widest > max as u64 {
            return Err(SyncMsgError::TooManyOps {
                index: self.count,
                count: ops.widest,
                limit: OPS_LIMIT_PER_CHANGE,
                max,
            });
        }
        if ops.disagree {
            return Err(self.invalid("op columns disagree on the number of ops"));
        }
        // Op counters are 32-bit in automerge: it refuses a change that starts past
        // them (once it has walked the ops), and the last op's counter must fit too.
        let last_op = start_op.saturating_add(ops.ops.saturating_sub(1));
        if last_op > u64::from(u32::MAX) {
            return Err(self.invalid("op counters past 2^32"));
        }
        self.add_ops(ops.declared())
    }

    /// Document chunk: actors, heads, change and op column metadata, then the change
    /// and op column data. Each compressed column is inflated on load.
    pub(super) fn document(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.actor_ids(&mut r)?;
        self.skip_hashes(&mut r)?;
        let change_columns = self.columns(&mut r)?;
        let op_columns = self.columns(&mut r)?;
        let changes = self.rows(&mut r, &change_columns)?;
        self.add_ops(changes.declared())?;
        let ops = self.rows(&mut r, &op_columns)?;
        self.add_ops(ops.declared())
    }

    /// Bundle chunk: dependencies, actors, change columns and their data, op columns
    /// and their data. Each compressed column is inflated on load.
    pub(super) fn bundle(&mut self, data: &[u8]) -> Result<(), SyncMsgError> {
        let mut r = Reader::new(data);
        self.skip_hashes(&mut r)?;
        self.actor_ids(&mut r)?;
        let change_columns = self.columns(&mut r)?;
        let changes = self.rows(&mut r, &change_columns)?;
        self.add_ops(changes.declared())?;
        let op_columns = self.columns(&mut r)?;
        let ops = self.rows(&mut r, &op_columns)?;
        self.add_ops(ops.declared())
    }

    /// Count `declared` ops against the message's limit.
    pub(super) fn add_ops(&mut self, declared: u64) -> Result<(), SyncMsgError> {
        self.ops = self.ops.saturating_add(declared);
        let max = self.limits.ops_per_message_max;
        if self.ops > max as u64 {
            return Err(SyncMsgError::TooManyOps {
                index: self.count,
                count: self.ops,
                limit: OPS_LIMIT_PER_MESSAGE,
                max,
            });
        }
        Ok(())
    }

    pub(super) fn actor_id(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let len = r.leb128_u64().map_err(|_| self.invalid("bad actor id"))?;
        r.take(len).map_err(|_| self.invalid("bad actor id"))?;
        Ok(())
    }

    pub(super) fn actor_ids(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let count = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad actor count"))?;
        for _ in 0..count {
            self.actor_id(r)?;
        }
        Ok(())
    }

    pub(super) fn skip_hashes(&self, r: &mut Reader<'_>) -> Result<(), SyncMsgError> {
        let count = r.leb128_u64().map_err(|_| self.invalid("bad hash count"))?;
        for _ in 0..count {
            r.take(HASH_BYTES as u64)
                .map_err(|_| self.invalid("truncated hashes"))?;
        }
        Ok(())
    }

    /// Column metadata: a count, then (specification, data length) pairs.
    pub(super) fn columns(&self, r: &mut Reader<'_>) -> Result<Vec<Column>, SyncMsgError> {
        let count = r
            .leb128_u64()
            .map_err(|_| self.invalid("bad column count"))?;
        if count > COLUMNS_COUNT_MAX {
            return Err(self.invalid("too many columns"));
        }
        let mut columns = Vec::new();
        for _ in 0..count {
            let spec = r
                .leb128_u32()
                .map_err(|_| self.invalid("bad column specification"))?;
            let len = r
                .leb128_u64()
                .map_err(|_| self.invalid("bad column length"))?;
            columns.push(Column {
                spec,
                deflate: spec & COLUMN_DEFLATE_BIT != 0,
                len,
            });
        }
        Ok(columns)
    }

    /// The data of `columns`, in order: the rows each declares, counted run by run
    /// (each compressed column inflated under the bound first), and whether they agree.
    ///
    /// A group column starts a group: the columns with its id that follow it have, for
    /// each of its rows, as many rows as its value there. Every other column has a row
    /// per op (or per change). automerge's encoders write a column in full, or not at
    /// all when every row would be null or false.
    pub(super) fn rows(
        &mut self,
        r: &mut Reader<'_>,
        columns: &[Column],
    ) -> Result<Rows, SyncMsgError> {
        let mut rows = Rows::default();
        // Rows of each column outside a group; at most COLUMNS_COUNT_MAX of them.
        let mut outer = Vec::new();
        let mut group: Option<(u32, u64)> = None;
        for column in columns {
            let data = r
                .take(column.len)
                .map_err(|_| self.invalid("column data past the end of the chunk"))?;
            let id = column.spec >> COLUMN_ID_SHIFT;
            let kind = column.spec & COLUMN_TYPE_BITS;
            if group.is_some_and(|(group_id, _)| group_id != id) {
                group = None;
            }
            if kind == COLUMN_TYPE_VALUE {
                // Bytes that the metadata column slices: no rows of their own.
                if column.deflate {
                    self.inflate(data, usize::MAX)?;
                }
                continue;
            }
            let counted = if column.deflate {
                let kept = self.inflate_kept(data, usize::MAX)?;
                runs::count(kind, &kept)
            } else {
                runs::count(kind, data)
            }
            .map_err(|reason| self.invalid(reason))?;
            rows.widest = rows.widest.max(counted.rows).max(counted.sum);
            match group {
                Some((_, sum)) if kind != COLUMN_TYPE_GROUP => {
                    if counted.rows != 0 && counted.rows != sum {
                        rows.disagree = true;
                    }
                }
                _ => {
                    outer.push(counted.rows);
                    if kind == COLUMN_TYPE_GROUP {
                        group = Some((id, counted.sum));
                        rows.grouped = rows.grouped.saturating_add(counted.sum);
                    }
                }
            }
        }
        rows.ops = outer.iter().copied().max().unwrap_or(0);
        if outer.iter().any(|&n| n != 0 && n != rows.ops) {
            rows.disagree = true;
        }
        Ok(rows)
    }

    /// Inflate one DEFLATE stream without keeping the output, refusing it once it
    /// passes `bound` or the message's remaining inflation budget.
    pub(super) fn inflate(&mut self, data: &[u8], bound: usize) -> Result<(), SyncMsgError> {
        self.inflate_into(data, bound, &mut inflate::Discard)
    }

    /// Inflate one DEFLATE stream as [`Chunks::inflate`] does, keeping the output (so
    /// it never holds more than the bounds allow).
    pub(super) fn inflate_kept(
        &mut self,
        data: &[u8],
        bound: usize,
    ) -> Result<Vec<u8>, SyncMsgError> {
        let mut kept = inflate::Keep::default();
        self.inflate_into(data, bound, &mut kept)?;
        Ok(kept.0)
    }

    pub(super) fn inflate_into(
        &mut self,
        data: &[u8],
        bound: usize,
        sink: &mut impl inflate::Sink,
    ) -> Result<(), SyncMsgError> {
        let budget = self.limits.inflated_bytes_max.saturating_sub(self.inflated);
        let (bound, max) = if bound < budget {
            (bound, bound)
        } else {
            (budget, self.limits.inflated_bytes_max)
        };
        match inflate::inflate(data, bound, sink) {
            Ok(len) => {
                self.inflated += len;
                Ok(())
            }
            Err(inflate::Error::Bound) => Err(SyncMsgError::InflateBound {
                index: self.count,
                max,
            }),
            Err(inflate::Error::Invalid(reason)) => Err(SyncMsgError::DeflateInvalid {
                index: self.count,
                reason,
            }),
        }
    }
}

/// One column of a chunk, as its metadata describes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Column {
    /// The column specification: id, deflate bit, type.
    spec: u32,
    deflate: bool,
    len: u64,
}

/// What the columns of one chunk section (a change's ops, a document's changes, …)
/// declare.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Rows {
    /// Rows of the longest column outside a group: the ops (or changes).
    ops: u64,
    /// Rows all groups give the columns they group: the predecessors (or successors,
    /// or dependencies).
    grouped: u64,
    /// Rows of the longest column, or the largest group total.
    widest: u64,
    /// Whether a column has rows but not as many as its section (or group) does.
    disagree: bool,
}

impl Rows {
    /// What the section costs automerge to read: a step for each op and for each op id
    /// a group lists, or more if a column declares more (which automerge then refuses,
    /// or reads past).
    pub(super) fn declared(&self) -> u64 {
        self.ops.saturating_add(self.grouped).max(self.widest)
    }
}
