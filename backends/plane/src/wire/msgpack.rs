//! A minimal msgpack reader and writer over byte slices, for the decoders of this module.
//!
//! Owns: [`Reader`] (a cursor over untrusted bytes: typed reads that check the marker
//! first and never read past the end, and an iterative [`Reader::skip`]), [`Key`] (a
//! string whose UTF-8 check waits until it matches none of the names a decoder knows),
//! and the
//! `write_*` functions (the smallest encoding of each value, as msgspec and rmp write
//! it: non-negative integers as unsigned, floats as float64, `str8`/`bin8` from 32/0
//! bytes up).
//! Why not a generic `Value` tree: the batch decoders read fields straight into their
//! output vectors, so a block costs no allocation of its own.
//! Never: recurse on input (a hostile nesting depth would overflow the stack), allocate,
//! or panic: every failure is a `WireError` with the byte offset.

use super::WireError;

/// A cursor over one msgpack message. Typed reads leave the cursor where it was when the
/// value has another type, so a caller can try another reading.
#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A string as [`Reader::key`] read it: its bytes, not yet checked to be UTF-8.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key<'a> {
    /// The string's bytes.
    pub(crate) bytes: &'a [u8],
    /// Where its marker was: the offset of the error when they are not UTF-8.
    at: usize,
}

impl<'a> Key<'a> {
    /// The string, checked to be UTF-8.
    pub(crate) fn text(self) -> Result<&'a str, WireError> {
        std::str::from_utf8(self.bytes).map_err(|_| WireError::MalformedMsgpack { offset: self.at })
    }
}

/// An integer as msgpack carries it: unsigned, or negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int {
    /// 0 ..= u64::MAX.
    Unsigned(u64),
    /// i64::MIN ..= -1 (a signed encoding of a non-negative value is folded into
    /// `Unsigned`).
    Negative(i64),
}

impl Int {
    /// The 64 bits of the value: negative values by two's-complement reinterpretation
    /// (how WIRE.md normalises signed block hashes).
    pub(crate) fn bits(self) -> u64 {
        match self {
            Int::Unsigned(value) => value,
            Int::Negative(value) => value as u64,
        }
    }

    /// The value as a `u32`, if it is one.
    pub(crate) fn to_u32(self) -> Option<u32> {
        match self {
            Int::Unsigned(value) => u32::try_from(value).ok(),
            Int::Negative(_) => None,
        }
    }
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// The bytes from `start` (a position this reader was at) to where it is now: the
    /// encoding of what was read in between.
    pub(crate) fn slice_from(&self, start: usize) -> &'a [u8] {
        &self.buf[start.min(self.pos)..self.pos]
    }

    /// Moves back to `pos`, a position this reader was at before.
    pub(crate) fn rewind(&mut self, pos: usize) {
        debug_assert!(pos <= self.pos);
        self.pos = pos;
    }

    /// Bytes left. Every msgpack value takes at least one, which bounds any declared
    /// element count worth preallocating for.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Whether every byte has been read.
    pub(crate) fn is_at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// The error for bytes that are not msgpack, at the cursor.
    pub(crate) fn malformed(&self) -> WireError {
        WireError::MalformedMsgpack { offset: self.pos }
    }

    fn unexpected(&self, expected: &'static str) -> WireError {
        // A reserved marker is broken msgpack whatever the field expected.
        if self.buf.get(self.pos) == Some(&0xc1) {
            return self.malformed();
        }
        WireError::UnexpectedType {
            offset: self.pos,
            expected,
        }
    }

    fn peek(&self) -> Result<u8, WireError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or_else(|| self.malformed())
    }

    /// `n` bytes after `skip` bytes from the cursor, without moving it.
    fn bytes_at(&self, skip: usize, n: usize) -> Result<&'a [u8], WireError> {
        let start = self.pos.checked_add(skip).ok_or_else(|| self.malformed())?;
        let end = start.checked_add(n).ok_or_else(|| self.malformed())?;
        self.buf.get(start..end).ok_or_else(|| self.malformed())
    }

    /// A big-endian unsigned integer of `n` (1, 2, 4 or 8) bytes after `skip` bytes.
    fn be_at(&self, skip: usize, n: usize) -> Result<u64, WireError> {
        let bytes = self.bytes_at(skip, n)?;
        // One load for the 64-bit case (block hashes, most of a batch's integers).
        if let Ok(word) = <[u8; 8]>::try_from(bytes) {
            return Ok(u64::from_be_bytes(word));
        }
        Ok(bytes
            .iter()
            .fold(0u64, |value, byte| (value << 8) | u64::from(*byte)))
    }

    /// The length that follows a marker in `n` bytes.
    fn len_at(&self, n: usize) -> Result<usize, WireError> {
        // At most 32 bits: fits usize on every platform this crate builds for.
        Ok(self.be_at(1, n)? as usize)
    }

    /// Consumes `bytes` if they are exactly what comes next; whether it did. For a
    /// decoder's fast path over an encoding it expects byte for byte.
    #[inline]
    pub(crate) fn eat(&mut self, bytes: &[u8]) -> bool {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        if rest.starts_with(bytes) {
            self.pos += bytes.len();
            return true;
        }
        false
    }

    /// Consumes a nil if one is next; whether it did.
    pub(crate) fn try_nil(&mut self) -> Result<bool, WireError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the next value is an array (of any width).
    pub(crate) fn at_array(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0x90..=0x9f | 0xdc | 0xdd))
    }

    /// Whether the next value is a map (of any width).
    pub(crate) fn at_map(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0x80..=0x8f | 0xde | 0xdf))
    }

    /// Whether the next value is binary (of any width).
    pub(crate) fn at_bin(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0xc4..=0xc6))
    }

    /// Whether the next value is a string (of any width).
    pub(crate) fn at_str(&self) -> bool {
        matches!(self.buf.get(self.pos), Some(0xa0..=0xbf | 0xd9..=0xdb))
    }

    /// An array header; its element count.
    pub(crate) fn array_len(&mut self) -> Result<usize, WireError> {
        let (header, len) = match self.peek()? {
            marker @ 0x90..=0x9f => (1, usize::from(marker & 0x0f)),
            0xdc => (3, self.len_at(2)?),
            0xdd => (5, self.len_at(4)?),
            _ => return Err(self.unexpected("an array")),
        };
        self.pos += header;
        Ok(len)
    }

    /// A map header; its entry count.
    pub(crate) fn map_len(&mut self) -> Result<usize, WireError> {
        let (header, len) = match self.peek()? {
            marker @ 0x80..=0x8f => (1, usize::from(marker & 0x0f)),
            0xde => (3, self.len_at(2)?),
            0xdf => (5, self.len_at(4)?),
            _ => return Err(self.unexpected("a map")),
        };
        self.pos += header;
        Ok(len)
    }

    /// A string's bytes, checked to be UTF-8.
    pub(crate) fn str(&mut self) -> Result<&'a str, WireError> {
        let start = self.pos;
        let key = self.key()?;
        key.text().inspect_err(|_| self.pos = start)
    }

    /// A string's bytes before their UTF-8 check: what a decoder compares with the names
    /// it knows. Those are ASCII, so a match proves the bytes valid; anything else is
    /// checked with [`Key::text`] (the error [`Reader::str`] gives, at the same offset).
    /// A key costs a compare instead of a validation pass, and a batch reads several a
    /// block.
    pub(crate) fn key(&mut self) -> Result<Key<'a>, WireError> {
        let (header, len) = match self.peek()? {
            marker @ 0xa0..=0xbf => (1, usize::from(marker & 0x1f)),
            0xd9 => (2, self.len_at(1)?),
            0xda => (3, self.len_at(2)?),
            0xdb => (5, self.len_at(4)?),
            _ => return Err(self.unexpected("a string")),
        };
        let bytes = self.bytes_at(header, len)?;
        let at = self.pos;
        self.pos += header + len;
        Ok(Key { bytes, at })
    }

    /// A binary value's bytes.
    pub(crate) fn bin(&mut self) -> Result<&'a [u8], WireError> {
        let (header, len) = match self.peek()? {
            0xc4 => (2, self.len_at(1)?),
            0xc5 => (3, self.len_at(2)?),
            0xc6 => (5, self.len_at(4)?),
            _ => return Err(self.unexpected("binary")),
        };
        let bytes = self.bytes_at(header, len)?;
        self.pos += header + len;
        Ok(bytes)
    }

    /// An integer of any width.
    pub(crate) fn int(&mut self) -> Result<Int, WireError> {
        let marker = self.peek()?;
        let (header, value) = match marker {
            0x00..=0x7f => (1, Int::Unsigned(u64::from(marker))),
            0xe0..=0xff => (1, Int::Negative(i64::from(marker as i8))),
            0xcc => (2, Int::Unsigned(self.be_at(1, 1)?)),
            0xcd => (3, Int::Unsigned(self.be_at(1, 2)?)),
            0xce => (5, Int::Unsigned(self.be_at(1, 4)?)),
            0xcf => (9, Int::Unsigned(self.be_at(1, 8)?)),
            0xd0 => (2, signed(self.be_at(1, 1)? as u8 as i8 as i64)),
            0xd1 => (3, signed(self.be_at(1, 2)? as u16 as i16 as i64)),
            0xd2 => (5, signed(self.be_at(1, 4)? as u32 as i32 as i64)),
            0xd3 => (9, signed(self.be_at(1, 8)? as i64)),
            _ => return Err(self.unexpected("an integer")),
        };
        self.pos += header;
        Ok(value)
    }

    /// An unsigned integer that fits a `u32` (token ids, block sizes, ranks); `field`
    /// names it in the error.
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        // Token ids dominate a batch: the widths they come in (a vocabulary past 128
        // entries writes most as 16 or 32 bits) are read here from one slice; anything
        // else, a truncated value included, takes `int` to the same result or error.
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        let (width, value) = match *rest {
            [marker @ 0x00..=0x7f, ..] => (1, u32::from(marker)),
            [0xcc, byte, ..] => (2, u32::from(byte)),
            [0xcd, a, b, ..] => (3, u32::from(u16::from_be_bytes([a, b]))),
            [0xce, a, b, c, d, ..] => (5, u32::from_be_bytes([a, b, c, d])),
            _ => (0, 0),
        };
        if width > 0 {
            self.pos += width;
            return Ok(value);
        }
        self.int()?
            .to_u32()
            .ok_or(WireError::IntegerRange { field })
    }

    /// A float of either width, or an integer (a timestamp written by a lax encoder).
    pub(crate) fn f64(&mut self) -> Result<f64, WireError> {
        match self.peek()? {
            0xca => {
                let bits = self.be_at(1, 4)? as u32;
                self.pos += 5;
                Ok(f64::from(f32::from_bits(bits)))
            }
            0xcb => {
                let bits = self.be_at(1, 8)?;
                self.pos += 9;
                Ok(f64::from_bits(bits))
            }
            _ => match self.int() {
                Ok(Int::Unsigned(value)) => Ok(value as f64),
                Ok(Int::Negative(value)) => Ok(value as f64),
                Err(WireError::UnexpectedType { offset, .. }) => Err(WireError::UnexpectedType {
                    offset,
                    expected: "a float",
                }),
                Err(error) => Err(error),
            },
        }
    }

    /// Skips one whole value, checking that it is well-formed msgpack. Iterative: nested
    /// containers only add to a count of values still to skip, which can never exceed the
    /// bytes left (each value takes one), so hostile input is refused early.
    pub(crate) fn skip(&mut self) -> Result<(), WireError> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            let marker = self.peek()?;
            // (bytes of this value's own encoding, values it contains)
            let (size, children) = match marker {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (1, 0),
                0x80..=0x8f => (1, 2 * usize::from(marker & 0x0f)),
                0x90..=0x9f => (1, usize::from(marker & 0x0f)),
                0xa0..=0xbf => (1 + usize::from(marker & 0x1f), 0),
                0xc1 => return Err(self.malformed()),
                0xc4 | 0xd9 => (2 + self.len_at(1)?, 0),
                0xc5 | 0xda => (3 + self.len_at(2)?, 0),
                0xc6 | 0xdb => (5 + self.len_at(4)?, 0),
                // ext 8/16/32: length, type byte, data.
                0xc7 => (3 + self.len_at(1)?, 0),
                0xc8 => (4 + self.len_at(2)?, 0),
                0xc9 => (6 + self.len_at(4)?, 0),
                0xca => (5, 0),
                0xcb => (9, 0),
                0xcc | 0xd0 => (2, 0),
                0xcd | 0xd1 => (3, 0),
                0xce | 0xd2 => (5, 0),
                0xcf | 0xd3 => (9, 0),
                // fixext 1/2/4/8/16: type byte, data.
                0xd4 => (3, 0),
                0xd5 => (4, 0),
                0xd6 => (6, 0),
                0xd7 => (10, 0),
                0xd8 => (18, 0),
                0xdc => (3, self.len_at(2)?),
                0xdd => (5, self.len_at(4)?),
                0xde => (3, self.len_at(2)?.saturating_mul(2)),
                0xdf => (5, self.len_at(4)?.saturating_mul(2)),
            };
            if size > self.remaining() {
                return Err(self.malformed());
            }
            self.pos += size;
            pending = pending.saturating_add(children);
            if pending > self.remaining() {
                return Err(self.malformed());
            }
        }
        Ok(())
    }

    /// Checks that an element count is possible in the bytes left, so a caller may
    /// preallocate for it (each element takes at least `min_bytes`).
    pub(crate) fn check_count(&self, count: usize, min_bytes: usize) -> Result<(), WireError> {
        if count.saturating_mul(min_bytes) > self.remaining() {
            return Err(self.malformed());
        }
        Ok(())
    }
}

fn signed(value: i64) -> Int {
    if value < 0 {
        Int::Negative(value)
    } else {
        Int::Unsigned(value as u64)
    }
}

/// Writes nil.
pub(crate) fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

/// Writes `value` in the fewest bytes.
pub(crate) fn write_uint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
    } else if value <= u64::from(u8::MAX) {
        out.extend_from_slice(&[0xcc, value as u8]);
    } else if value <= u64::from(u16::MAX) {
        out.push(0xcd);
        out.extend_from_slice(&(value as u16).to_be_bytes());
    } else if value <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(value as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Writes `value` in the fewest bytes; non-negative values as unsigned, as msgspec does.
pub(crate) fn write_int(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        write_uint(out, value as u64);
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if value >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, value as i8 as u8]);
    } else if value >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(value as i16).to_be_bytes());
    } else if value >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(value as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Writes a float64.
pub(crate) fn write_f64(out: &mut Vec<u8>, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_bits().to_be_bytes());
}

/// A container or string length as msgpack carries it (32 bits at most; a longer one
/// cannot be encoded and is a caller's bug).
fn len32(len: usize) -> u32 {
    debug_assert!(
        u32::try_from(len).is_ok(),
        "msgpack length {len} over 32 bits"
    );
    len as u32
}

/// Writes a string.
pub(crate) fn write_str(out: &mut Vec<u8>, text: &str) {
    let len = len32(text.len());
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= u32::from(u8::MAX) {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&len.to_be_bytes());
    }
    out.extend_from_slice(text.as_bytes());
}

/// Writes a binary value.
pub(crate) fn write_bin(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = len32(bytes.len());
    if len <= u32::from(u8::MAX) {
        out.extend_from_slice(&[0xc4, len as u8]);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xc5);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&len.to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

/// Writes an array header of `len` elements.
pub(crate) fn write_array_len(out: &mut Vec<u8>, len: usize) {
    let len = len32(len);
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xdc);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Writes a map header of `len` entries; `wide` forces at least a map16 header (vLLM
/// 0.33 writes one even for a few keys).
pub(crate) fn write_map_len(out: &mut Vec<u8>, len: usize, wide: bool) {
    let len = len32(len);
    if len < 16 && !wide {
        out.push(0x80 | len as u8);
    } else if len <= u32::from(u16::MAX) {
        out.push(0xde);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unsigned values on either side of each of msgpack's widths.
    const UNSIGNED_EDGES: [u64; 11] = [
        0,
        1,
        127,
        128,
        255,
        256,
        65_535,
        65_536,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        u64::MAX,
    ];

    #[test]
    fn integers_round_trip_through_every_width() {
        for value in UNSIGNED_EDGES {
            let mut out = Vec::new();
            write_uint(&mut out, value);
            let mut reader = Reader::new(&out);
            assert_eq!(reader.int().unwrap(), Int::Unsigned(value));
            assert!(reader.is_at_end());
        }
        for value in [-1, -32, -33, -128, -129, -32_768, -32_769, i64::MIN, 5] {
            let mut out = Vec::new();
            write_int(&mut out, value);
            let mut reader = Reader::new(&out);
            assert_eq!(reader.int().unwrap().bits(), value as u64);
            assert!(reader.is_at_end());
        }
        // A signed encoding of a non-negative value reads as unsigned.
        let mut reader = Reader::new(&[0xd3, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(reader.int().unwrap(), Int::Unsigned(7));
    }

    #[test]
    fn u32_reads_every_width_as_int_does_truncated_ones_included() {
        // What `u32` must give: `int`'s value when it fits, at the same position.
        let reference = |bytes: &[u8]| {
            let mut reader = Reader::new(bytes);
            let value = reader.int().and_then(|int| {
                int.to_u32()
                    .ok_or(WireError::IntegerRange { field: "token_ids" })
            });
            (value, reader.position())
        };
        let mut encodings = Vec::new();
        for value in UNSIGNED_EDGES {
            let mut out = Vec::new();
            write_uint(&mut out, value);
            encodings.push(out);
        }
        for value in [-1, -200, 7] {
            let mut out = Vec::new();
            write_int(&mut out, value);
            encodings.push(out);
        }
        encodings.push(vec![0xd1, 0, 9]);
        encodings.push(vec![0xa1, b'x']);
        for encoding in &encodings {
            for end in 0..=encoding.len() {
                let bytes = &encoding[..end];
                let mut reader = Reader::new(bytes);
                let got = (reader.u32("token_ids"), reader.position());
                assert_eq!(got, reference(bytes), "{bytes:02x?}");
            }
        }
    }

    #[test]
    fn strings_bins_and_containers_round_trip_at_each_width() {
        for len in [0, 31, 32, 255, 256, 65_536] {
            let text = "x".repeat(len);
            let mut out = Vec::new();
            write_str(&mut out, &text);
            write_bin(&mut out, text.as_bytes());
            write_array_len(&mut out, len);
            write_map_len(&mut out, len, false);
            let mut reader = Reader::new(&out);
            assert_eq!(reader.str().unwrap(), text);
            assert_eq!(reader.bin().unwrap(), text.as_bytes());
            assert_eq!(reader.array_len().unwrap(), len);
            assert_eq!(reader.map_len().unwrap(), len);
            assert!(reader.is_at_end());
        }
        let mut wide = Vec::new();
        write_map_len(&mut wide, 3, true);
        assert_eq!(wide, [0xde, 0, 3]);
    }

    #[test]
    fn a_key_defers_the_utf8_check_to_text_which_fails_where_str_does() {
        // One valid key, then two bytes that are not UTF-8 after a fixstr marker.
        let bytes = [0xa1, b'k', 0xa2, 0xff, 0xfe];
        let mut reader = Reader::new(&bytes);
        let key = reader.key().unwrap();
        assert_eq!((key.bytes, key.text()), (&b"k"[..], Ok("k")));
        let bad = reader.key().unwrap();
        assert_eq!(bad.bytes, [0xff, 0xfe]);
        assert!(reader.is_at_end(), "the key is read past either way");
        assert_eq!(bad.text(), Err(WireError::MalformedMsgpack { offset: 2 }));
        let mut reader = Reader::new(&bytes[2..]);
        assert_eq!(reader.str(), Err(WireError::MalformedMsgpack { offset: 0 }));
        assert_eq!(reader.position(), 0, "str leaves the cursor on an error");
    }

    #[test]
    fn a_wrong_type_leaves_the_cursor_and_names_the_expectation() {
        let mut reader = Reader::new(&[0xa1, b'x']);
        assert_eq!(
            reader.int(),
            Err(WireError::UnexpectedType {
                offset: 0,
                expected: "an integer"
            })
        );
        assert_eq!(reader.str().unwrap(), "x");
        assert_eq!(
            Reader::new(&[0xc1]).int(),
            Err(WireError::MalformedMsgpack { offset: 0 })
        );
        assert!(Reader::new(&[0xa2, 0xff, 0xfe]).str().is_err());
    }

    #[test]
    fn skip_walks_nested_values_and_refuses_impossible_counts() {
        // {"a": [1, nil, 2.0f32], "b": ext8(len 1)}
        let bytes = [
            0x82, 0xa1, b'a', 0x93, 0x01, 0xc0, 0xca, 0, 0, 0, 0, 0xa1, b'b', 0xc7, 1, 5, 0,
        ];
        let mut reader = Reader::new(&bytes);
        reader.skip().unwrap();
        assert!(reader.is_at_end());
        // An array32 claiming 2^32-1 elements in five bytes.
        assert!(Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).skip().is_err());
        // Deep nesting is a loop, not recursion.
        let deep = vec![0x91; 1 << 20];
        assert!(Reader::new(&deep).skip().is_err());
        let mut deep_ok = vec![0x91; 1 << 20];
        deep_ok.push(0xc0);
        Reader::new(&deep_ok).skip().unwrap();
    }
}
