//! DEFLATE (RFC 1951) measured under a bound, by `flate2`'s raw inflater on the zlib-rs
//! backend — the decoder automerge itself inflates with, which the whole ecosystem
//! fuzzes — behind a loop that stops as soon as the output passes the bound.
//!
//! The output goes to a [`Sink`] one [`SCRATCH_BYTES`] piece at a time; validation uses
//! [`Discard`], so a bomb costs the inflater's state and one piece of memory, and time in
//! proportion to the output up to the bound (zlib-rs inflates a run of zeros at several
//! GB/s: 64 MiB in about 5 ms).

use flate2::{Decompress, FlushDecompress, Status};

/// How much output is inflated at a time (a sink sees pieces of at most this).
pub(super) const SCRATCH_BYTES: usize = 32 * 1024;

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
    /// The next inflated bytes.
    fn bytes(&mut self, bytes: &[u8]);
}

/// Keeps nothing.
#[derive(Debug)]
pub(super) struct Discard;

impl Sink for Discard {
    fn bytes(&mut self, _: &[u8]) {}
}

/// Keeps the output, to read what was compressed. It grows only as the decoder
/// produces bytes, so never past the bound given to [`inflate`].
#[derive(Debug, Default)]
pub(super) struct Keep(pub(super) Vec<u8>);

impl Sink for Keep {
    fn bytes(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

/// Inflate `input` into `sink`, returning the inflated length, or [`Error::Bound`] as
/// soon as the output would pass `bound` bytes. Input after the final block is ignored.
pub(super) fn inflate(input: &[u8], bound: usize, sink: &mut impl Sink) -> Result<usize, Error> {
    let mut d = Decompress::new(false);
    let mut scratch = vec![0u8; SCRATCH_BYTES];
    let mut out: usize = 0;
    loop {
        let (consumed, produced) = (d.total_in(), d.total_out());
        let rest = usize::try_from(consumed)
            .ok()
            .and_then(|at| input.get(at..))
            .ok_or(Error::Invalid("the inflater read past its input"))?;
        // No more than the bound allows, plus one byte to see it passed.
        let room = bound
            .saturating_sub(out)
            .saturating_add(1)
            .min(SCRATCH_BYTES);
        let status = d
            .decompress(rest, &mut scratch[..room], FlushDecompress::None)
            .map_err(|_| Error::Invalid("not a valid DEFLATE stream"))?;
        let made = usize::try_from(d.total_out() - produced).unwrap_or(usize::MAX);
        match out.checked_add(made) {
            Some(total) if total <= bound => out = total,
            _ => return Err(Error::Bound),
        }
        sink.bytes(&scratch[..made]);
        match status {
            Status::StreamEnd => return Ok(out),
            // No progress with input and room left: the stream ends before its final
            // block.
            Status::Ok | Status::BufError if made == 0 && d.total_in() == consumed => {
                return Err(Error::Invalid("truncated stream"))
            }
            Status::Ok | Status::BufError => {}
        }
    }
}

#[cfg(test)]
pub(super) mod testing {
    use super::Sink;

    /// Keeps everything, to compare with what automerge inflates.
    #[derive(Debug, Default)]
    pub(crate) struct Collect(pub(crate) Vec<u8>);

    impl Sink for Collect {
        fn bytes(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
    }
}
