//! A bounds-checked cursor over untrusted bytes.

use super::SyncMsgError;

/// Why a [`Reader`] stopped.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadError {
    at: usize,
    reason: &'static str,
}

impl ReadError {
    pub(super) fn malformed(self) -> SyncMsgError {
        SyncMsgError::Malformed {
            at: self.at,
            reason: self.reason,
        }
    }
}

/// A cursor over untrusted bytes. Every read is bounds-checked.
#[derive(Debug)]
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    pub(super) fn fail(&self, reason: &'static str) -> ReadError {
        ReadError {
            at: self.pos,
            reason,
        }
    }

    pub(super) fn byte(&mut self) -> Result<u8, ReadError> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| self.fail("unexpected end of input"))?;
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn take(&mut self, len: u64) -> Result<&'a [u8], ReadError> {
        if len > self.remaining() as u64 {
            return Err(self.fail("length past the end of input"));
        }
        // len <= remaining, so it fits in usize and the range is in bounds.
        let end = self.pos + len as usize;
        let out = self.bytes.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(out)
    }

    /// Unsigned LEB128 with automerge's rules: at most 64 bits, no overlong encoding.
    pub(super) fn leb128_u64(&mut self) -> Result<u64, ReadError> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let byte = self.byte()?;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            shift += 7;
            if byte & 0x80 == 0 {
                if shift > 64 && byte > 1 {
                    return Err(self.fail("LEB128 larger than 64 bits"));
                }
                if shift > 7 && byte == 0 {
                    return Err(self.fail("overlong LEB128"));
                }
                return Ok(value);
            }
            if shift > 64 {
                return Err(self.fail("LEB128 larger than 64 bits"));
            }
        }
    }

    /// Skip one LEB128 number, signed or not, without decoding it. automerge reads at
    /// most ten bytes; whether the value fits is its business.
    pub(super) fn skip_leb128(&mut self) -> Result<(), ReadError> {
        for _ in 0..10 {
            if self.byte()? & 0x80 == 0 {
                return Ok(());
            }
        }
        Err(self.fail("LEB128 longer than ten bytes"))
    }

    pub(super) fn leb128_u32(&mut self) -> Result<u32, ReadError> {
        let value = self.leb128_u64()?;
        u32::try_from(value).map_err(|_| self.fail("LEB128 larger than 32 bits"))
    }
}
