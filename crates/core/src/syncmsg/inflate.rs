//! A DEFLATE (RFC 1951) decoder that measures the inflated length under a bound.
//!
//! It follows zlib's rules (which automerge's `flate2` backend, zlib-rs, shares):
//! over-subscribed Huffman codes are refused, incomplete ones are allowed only for a
//! single code of length one, a dynamic block must code end-of-block, and a distance
//! may not reach before the start of the output. The output itself goes to a [`Sink`];
//! validation uses [`Discard`], so a bomb costs time in proportion to its compressed
//! size and no memory at all.

/// Why inflating stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Error {
    /// The stream is not valid DEFLATE.
    Invalid(&'static str),
    /// The output would exceed the bound.
    Bound,
}

/// Where inflated bytes go.
pub(super) trait Sink {
    /// Bytes copied as they are (a stored block) or one literal.
    fn bytes(&mut self, bytes: &[u8]);
    /// `length` bytes copied from `distance` bytes back. The decoder has checked
    /// that `distance` is within the output so far.
    fn copy(&mut self, distance: usize, length: usize);
}

/// Keeps nothing.
#[derive(Debug)]
pub(super) struct Discard;

impl Sink for Discard {
    fn bytes(&mut self, _: &[u8]) {}
    fn copy(&mut self, _: usize, _: usize) {}
}

/// Keeps the output, to read what was compressed. It grows only as the decoder
/// produces bytes, so never past the bound given to [`inflate`].
#[derive(Debug, Default)]
pub(super) struct Keep(pub(super) Vec<u8>);

impl Sink for Keep {
    fn bytes(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn copy(&mut self, distance: usize, length: usize) {
        // The decoder checked 1 <= distance <= len. A copy longer than its distance
        // repeats the last `distance` bytes: everything from `start` on has that
        // period, so copying as much of it as there is (a whole number of periods
        // until the last piece) doubles what can be copied next.
        if distance == 0 || distance > self.0.len() {
            return;
        }
        let start = self.0.len() - distance;
        let mut left = length;
        while left > 0 {
            let n = left.min(self.0.len() - start);
            // start + n <= the length so far.
            self.0.extend_from_within(start..start + n);
            left -= n;
        }
    }
}

const CODE_BITS_MAX: usize = 15;
const LITERAL_LENGTH_CODES_MAX: usize = 286;
const DISTANCE_CODES_MAX: usize = 30;
const FIXED_LITERAL_LENGTH_CODES: usize = 288;
const CODE_LENGTH_CODES: usize = 19;
const END_OF_BLOCK: u16 = 256;

const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DISTANCE_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DISTANCE_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
const CODE_LENGTH_ORDER: [usize; CODE_LENGTH_CODES] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Least-significant-bit-first reader.
struct Bits<'a> {
    input: &'a [u8],
    pos: usize,
    buf: u32,
    count: u32,
}

impl<'a> Bits<'a> {
    /// Up to 16 bits.
    fn take(&mut self, n: u32) -> Result<u32, Error> {
        while self.count < n {
            let byte = *self
                .input
                .get(self.pos)
                .ok_or(Error::Invalid("truncated stream"))?;
            self.pos += 1;
            self.buf |= u32::from(byte) << self.count;
            self.count += 8;
        }
        let value = self.buf & ((1u32 << n) - 1);
        self.buf >>= n;
        self.count -= n;
        Ok(value)
    }

    /// Drop the bits left in the current byte (fewer than 8 are ever buffered).
    fn align(&mut self) {
        self.buf = 0;
        self.count = 0;
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.input.len())
            .ok_or(Error::Invalid("truncated stored block"))?;
        let out = self.input.get(self.pos..end).unwrap_or_default();
        self.pos = end;
        Ok(out)
    }
}

/// A canonical Huffman code: how many codes of each length, and the symbols
/// ordered by code.
struct Huffman {
    count: [u16; CODE_BITS_MAX + 1],
    symbol: [u16; FIXED_LITERAL_LENGTH_CODES],
}

impl Huffman {
    /// Build from code lengths, refusing over-subscribed sets. Also returns how
    /// many codes of the longest length are left unused (0 for a complete code),
    /// for the callers' completeness rules.
    fn new(lengths: &[u8]) -> Result<(Self, i32), Error> {
        let mut h = Huffman {
            count: [0; CODE_BITS_MAX + 1],
            symbol: [0; FIXED_LITERAL_LENGTH_CODES],
        };
        for &len in lengths {
            let slot = h
                .count
                .get_mut(usize::from(len))
                .ok_or(Error::Invalid("code length above 15"))?;
            *slot += 1;
        }
        if usize::from(h.count[0]) == lengths.len() {
            // No codes at all: complete, and any attempt to decode fails.
            return Ok((h, 0));
        }
        let mut left: i32 = 1;
        for len in 1..=CODE_BITS_MAX {
            left <<= 1;
            left -= i32::from(h.count[len]);
            if left < 0 {
                return Err(Error::Invalid("over-subscribed Huffman code"));
            }
        }
        let mut offsets = [0u16; CODE_BITS_MAX + 2];
        for len in 1..=CODE_BITS_MAX {
            offsets[len + 1] = offsets[len] + h.count[len];
        }
        for (symbol, &len) in lengths.iter().enumerate() {
            if len != 0 {
                let slot = &mut offsets[usize::from(len)];
                if let Some(s) = h.symbol.get_mut(usize::from(*slot)) {
                    *s = symbol as u16;
                }
                *slot += 1;
            }
        }
        Ok((h, left))
    }

    /// zlib's rule for literal/length and distance codes: complete, or a single
    /// code of length one.
    fn new_complete_or_single(lengths: &[u8]) -> Result<Self, Error> {
        let (h, left) = Self::new(lengths)?;
        let only_length_one = usize::from(h.count[0]) + usize::from(h.count[1]) == lengths.len();
        if left > 0 && !only_length_one {
            return Err(Error::Invalid("incomplete Huffman code"));
        }
        Ok(h)
    }

    fn decode(&self, bits: &mut Bits<'_>) -> Result<u16, Error> {
        let mut code: i32 = 0;
        let mut first: i32 = 0;
        let mut index: i32 = 0;
        for len in 1..=CODE_BITS_MAX {
            code |= bits.take(1)? as i32;
            let count = i32::from(self.count[len]);
            if code - count < first {
                let at = (index + code - first) as usize;
                return self
                    .symbol
                    .get(at)
                    .copied()
                    .ok_or(Error::Invalid("bad Huffman code"));
            }
            index += count;
            first += count;
            first <<= 1;
            code <<= 1;
        }
        Err(Error::Invalid("bad Huffman code"))
    }
}

fn fixed_codes() -> Result<(Huffman, Huffman), Error> {
    let mut lengths = [0u8; FIXED_LITERAL_LENGTH_CODES];
    for (symbol, len) in lengths.iter_mut().enumerate() {
        *len = match symbol {
            0..=143 => 8,
            144..=255 => 9,
            256..=279 => 7,
            _ => 8,
        };
    }
    // The fixed distance code uses 30 of 32 five-bit codes; the other two are
    // invalid symbols, which decoding reports.
    let (literal, _) = Huffman::new(&lengths)?;
    let (distance, _) = Huffman::new(&[5; DISTANCE_CODES_MAX])?;
    Ok((literal, distance))
}

fn dynamic_codes(bits: &mut Bits<'_>) -> Result<(Huffman, Huffman), Error> {
    let literal_count = bits.take(5)? as usize + 257;
    let distance_count = bits.take(5)? as usize + 1;
    let code_length_count = bits.take(4)? as usize + 4;
    if literal_count > LITERAL_LENGTH_CODES_MAX || distance_count > DISTANCE_CODES_MAX {
        return Err(Error::Invalid("too many length or distance codes"));
    }
    let mut code_lengths = [0u8; CODE_LENGTH_CODES];
    for &symbol in CODE_LENGTH_ORDER.iter().take(code_length_count) {
        code_lengths[symbol] = bits.take(3)? as u8;
    }
    let (code_length_code, left) = Huffman::new(&code_lengths)?;
    if left != 0 || usize::from(code_length_code.count[0]) == CODE_LENGTH_CODES {
        return Err(Error::Invalid("incomplete code length code"));
    }

    let total = literal_count + distance_count;
    let mut lengths = [0u8; LITERAL_LENGTH_CODES_MAX + DISTANCE_CODES_MAX];
    let mut i = 0;
    while i < total {
        let symbol = code_length_code.decode(bits)?;
        let (value, repeat) = match symbol {
            0..=15 => (symbol as u8, 1),
            16 => {
                let previous = *i
                    .checked_sub(1)
                    .and_then(|p| lengths.get(p))
                    .ok_or(Error::Invalid("repeat with no previous length"))?;
                (previous, 3 + bits.take(2)? as usize)
            }
            17 => (0, 3 + bits.take(3)? as usize),
            _ => (0, 11 + bits.take(7)? as usize),
        };
        if i + repeat > total {
            return Err(Error::Invalid("code lengths overflow"));
        }
        for slot in &mut lengths[i..i + repeat] {
            *slot = value;
        }
        i += repeat;
    }
    if lengths[usize::from(END_OF_BLOCK)] == 0 {
        return Err(Error::Invalid("no end-of-block code"));
    }
    let literal = Huffman::new_complete_or_single(&lengths[..literal_count])?;
    let distance = Huffman::new_complete_or_single(&lengths[literal_count..total])?;
    Ok((literal, distance))
}

/// Inflate `input` into `sink`, returning the inflated length, or
/// [`Error::Bound`] as soon as the output would pass `bound` bytes. Input after
/// the final block is ignored, as `flate2` does.
pub(super) fn inflate(input: &[u8], bound: usize, sink: &mut impl Sink) -> Result<usize, Error> {
    let mut bits = Bits {
        input,
        pos: 0,
        buf: 0,
        count: 0,
    };
    let mut out: usize = 0;
    let grow = |out: &mut usize, n: usize| -> Result<(), Error> {
        match out.checked_add(n) {
            Some(total) if total <= bound => {
                *out = total;
                Ok(())
            }
            _ => Err(Error::Bound),
        }
    };
    loop {
        let last = bits.take(1)? == 1;
        match bits.take(2)? {
            0 => {
                bits.align();
                let header = bits.bytes(4)?;
                let len = u16::from_le_bytes([header[0], header[1]]);
                let inverted = u16::from_le_bytes([header[2], header[3]]);
                if len != !inverted {
                    return Err(Error::Invalid("stored block length check failed"));
                }
                let data = bits.bytes(usize::from(len))?;
                grow(&mut out, data.len())?;
                sink.bytes(data);
            }
            kind @ (1 | 2) => {
                let (literal, distance) = if kind == 1 {
                    fixed_codes()?
                } else {
                    dynamic_codes(&mut bits)?
                };
                loop {
                    let symbol = literal.decode(&mut bits)?;
                    if symbol < END_OF_BLOCK {
                        grow(&mut out, 1)?;
                        sink.bytes(&[symbol as u8]);
                        continue;
                    }
                    if symbol == END_OF_BLOCK {
                        break;
                    }
                    let index = usize::from(symbol - END_OF_BLOCK - 1);
                    let (base, extra) = LENGTH_BASE
                        .get(index)
                        .zip(LENGTH_EXTRA.get(index))
                        .ok_or(Error::Invalid("invalid length code"))?;
                    let length = usize::from(*base) + bits.take(u32::from(*extra))? as usize;
                    let index = usize::from(distance.decode(&mut bits)?);
                    let (base, extra) = DISTANCE_BASE
                        .get(index)
                        .zip(DISTANCE_EXTRA.get(index))
                        .ok_or(Error::Invalid("invalid distance code"))?;
                    let dist = usize::from(*base) + bits.take(u32::from(*extra))? as usize;
                    if dist > out {
                        return Err(Error::Invalid("distance too far back"));
                    }
                    grow(&mut out, length)?;
                    sink.copy(dist, length);
                }
            }
            _ => return Err(Error::Invalid("invalid block type")),
        }
        if last {
            return Ok(out);
        }
    }
}

#[cfg(test)]
pub(super) mod testing {
    use super::Sink;

    /// Keeps everything, to compare with what `flate2` inflates.
    #[derive(Debug, Default)]
    pub(crate) struct Collect(pub(crate) Vec<u8>);

    impl Sink for Collect {
        fn bytes(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
        fn copy(&mut self, distance: usize, length: usize) {
            for _ in 0..length {
                let b = self.0[self.0.len() - distance];
                self.0.push(b);
            }
        }
    }
}
