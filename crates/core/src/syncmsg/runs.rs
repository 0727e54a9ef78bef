//! Counting the rows of a column without expanding its runs.
//!
//! automerge's column encodings, all of them sequences of LEB128 numbers:
//!
//! - run-length (actor, integer, string, value metadata and group columns, and delta
//!   columns, which run-length encode the differences): a signed count, then for `n >
//!   0` one value repeated `n` times, for `n < 0` `-n` values as they are, for `n = 0`
//!   an unsigned count of nulls;
//! - boolean: unsigned counts of alternating runs, starting with `false`;
//! - value bytes: raw, sliced by the metadata column.
//!
//! Values are skipped without being decoded, except a group column's counts, which are
//! added up. A run of 2^40 costs what a run of one does, and a run of values stops at
//! the end of the data because each value takes at least a byte, so counting is linear
//! in the column's bytes. Sums saturate: anything past `u64::MAX` is past every limit.

use crate::format::{
    COLUMN_TYPE_ACTOR, COLUMN_TYPE_BOOLEAN, COLUMN_TYPE_DELTA, COLUMN_TYPE_GROUP,
    COLUMN_TYPE_INTEGER, COLUMN_TYPE_STRING, COLUMN_TYPE_VALUE_METADATA,
};

/// What one column declares.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counted {
    /// Rows.
    pub(super) rows: u64,
    /// For a group column, the sum of its values: the rows of the columns it groups.
    pub(super) sum: u64,
}

/// The rows a column of type `kind` declares.
pub(super) fn count(kind: u32, data: &[u8]) -> Result<Counted, &'static str> {
    let mut r = Cursor { data, pos: 0 };
    match kind {
        COLUMN_TYPE_BOOLEAN => r.boolean(),
        // A group's values are counts, to add up.
        COLUMN_TYPE_GROUP => r.run_length(Cursor::unsigned),
        COLUMN_TYPE_ACTOR | COLUMN_TYPE_INTEGER | COLUMN_TYPE_VALUE_METADATA => {
            r.run_length(|r| r.unsigned().map(|_| 0))
        }
        COLUMN_TYPE_DELTA => r.run_length(|r| r.signed().map(|_| 0)),
        COLUMN_TYPE_STRING => r.run_length(Cursor::bytes),
        // Value bytes have no rows of their own.
        _ => Ok(Counted::default()),
    }
}

/// A cursor over column data that reads LEB128 as automerge's column decoders do
/// (the `leb128` crate): overlong encodings are accepted, values past 64 bits are
/// not.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> Result<u8, &'static str> {
        let b = *self
            .data
            .get(self.pos)
            .ok_or("column data ends mid-value")?;
        self.pos += 1;
        Ok(b)
    }

    fn unsigned(&mut self) -> Result<u64, &'static str> {
        // Most numbers of a column are one byte.
        if let Some(&b) = self.data.get(self.pos) {
            if b & 0x80 == 0 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
        }
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.byte()?;
            if shift == 63 && byte > 1 {
                return Err("column value larger than 64 bits");
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
        }
    }

    fn signed(&mut self) -> Result<i64, &'static str> {
        if let Some(&b) = self.data.get(self.pos) {
            if b & 0x80 == 0 {
                self.pos += 1;
                // Bit 6 is the sign.
                return Ok(i64::from(b) - if b & 0x40 != 0 { 0x80 } else { 0 });
            }
        }
        let mut value = 0i64;
        let mut shift = 0u32;
        loop {
            let byte = self.byte()?;
            if shift == 63 && byte != 0 && byte != 0x7f {
                return Err("column value larger than 64 bits");
            }
            value |= i64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                if shift < 64 && byte & 0x40 != 0 {
                    value |= -1 << shift;
                }
                return Ok(value);
            }
        }
    }

    /// Skip length-prefixed bytes.
    fn bytes(&mut self) -> Result<u64, &'static str> {
        let len = self.unsigned()?;
        self.pos = usize::try_from(len)
            .ok()
            .and_then(|len| self.pos.checked_add(len))
            .filter(|&end| end <= self.data.len())
            .ok_or("column value past the end of the column")?;
        Ok(0)
    }

    /// Add up the runs. `value` reads one value and returns what it adds to the
    /// sum (a group's count, else 0).
    fn run_length(
        &mut self,
        value: impl Fn(&mut Self) -> Result<u64, &'static str>,
    ) -> Result<Counted, &'static str> {
        let mut counted = Counted::default();
        while !self.is_empty() {
            let run = self.signed()?;
            if run > 0 {
                let n = run.unsigned_abs();
                let v = value(self)?;
                counted.rows = counted.rows.saturating_add(n);
                counted.sum = counted.sum.saturating_add(v.saturating_mul(n));
            } else if run < 0 {
                let n = run.unsigned_abs();
                counted.rows = counted.rows.saturating_add(n);
                // Each value takes a byte at least: the loop ends with the data.
                for _ in 0..n {
                    counted.sum = counted.sum.saturating_add(value(self)?);
                }
            } else {
                let nulls = self.unsigned()?;
                counted.rows = counted.rows.saturating_add(nulls);
            }
        }
        Ok(counted)
    }

    fn boolean(&mut self) -> Result<Counted, &'static str> {
        let mut counted = Counted::default();
        while !self.is_empty() {
            counted.rows = counted.rows.saturating_add(self.unsigned()?);
        }
        Ok(counted)
    }
}
