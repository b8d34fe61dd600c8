//! One row of a Mooncake trace, read from its line of JSON.
//!
//! Owns: [`Row`] and the two ways to it: a scan of the usual form (an object of the four
//! fields, each a plain integer or an array of them, in any order and spacing), and
//! serde reading the line whole for everything else.
//! Never: accept a line serde would refuse, or read one differently: the scan gives up
//! on anything it does not know (escapes, other keys, signs, fractions, exponents,
//! leading zeros, numbers of 20 digits or more) and serde reads that line as it always
//! did, errors included. Why the scan: serde's reading of `hash_ids` cost ~300
//! instructions an id, 7 % of `kvtwin bench sim` on the Mooncake trace.

use serde::Deserialize;

/// A row read whole by serde.
#[derive(Deserialize)]
struct MooncakeRecord {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// A row's figures; its hash ids go into a buffer the reader keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) timestamp: u64,
    pub(super) input_length: u64,
    pub(super) output_length: u64,
}

impl Row {
    /// The row in `text`, its hash ids put in `ids` (emptied first).
    pub(super) fn parse(text: &str, ids: &mut Vec<u64>) -> Result<Row, serde_json::Error> {
        ids.clear();
        if let Some(row) = scan_row(text, ids) {
            return Ok(row);
        }
        let (row, read) = serde_row(text)?;
        *ids = read;
        Ok(row)
    }
}

/// serde's reading of the whole of `text`: the row and its hash ids.
pub(super) fn serde_row(text: &str) -> Result<(Row, Vec<u64>), serde_json::Error> {
    let record: MooncakeRecord = serde_json::from_str(text)?;
    let row = Row {
        timestamp: record.timestamp,
        input_length: record.input_length,
        output_length: record.output_length,
    };
    Ok((row, record.hash_ids))
}

/// The row in `text` if it is in the usual form, its hash ids appended to `ids`; `None`
/// (with `ids` in any state) for any other text, which serde then reads.
pub(super) fn scan_row(text: &str, ids: &mut Vec<u64>) -> Option<Row> {
    let mut scan = Scan {
        bytes: text.as_bytes(),
        at: 0,
    };
    let (mut timestamp, mut input_length, mut output_length) = (None, None, None);
    let mut have_ids = false;
    scan.expect(b'{')?;
    loop {
        scan.expect(b'"')?;
        let key = scan.key()?;
        scan.expect(b':')?;
        // A key twice is serde's error ("duplicate field"): left to it.
        match key {
            b"timestamp" if timestamp.is_none() => timestamp = Some(scan.integer()?),
            b"input_length" if input_length.is_none() => input_length = Some(scan.integer()?),
            b"output_length" if output_length.is_none() => output_length = Some(scan.integer()?),
            b"hash_ids" if !have_ids => {
                scan.integers(ids)?;
                have_ids = true;
            }
            _ => return None,
        }
        match scan.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    scan.skip_space();
    if scan.at != scan.bytes.len() || !have_ids {
        return None;
    }
    Some(Row {
        timestamp: timestamp?,
        input_length: input_length?,
        output_length: output_length?,
    })
}

/// A cursor over a line's bytes.
struct Scan<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// Past JSON's whitespace.
    fn skip_space(&mut self) {
        while self
            .bytes
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, taken.
    fn next(&mut self) -> Option<u8> {
        self.skip_space();
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// Takes `byte` after whitespace, or gives up.
    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// A key's bytes up to its closing quote (taken). A key with an escape ends at the
    /// escaped quote or names no field here: either way the scan gives up at the match.
    fn key(&mut self) -> Option<&'a [u8]> {
        let rest = &self.bytes[self.at..];
        let end = rest.iter().position(|&b| b == b'"')?;
        self.at += end + 1;
        Some(&rest[..end])
    }

    /// A plain integer after whitespace: digits, no leading zero, at most 19 of them (so
    /// it fits a `u64` without a check per digit; longer ones are serde's).
    fn integer(&mut self) -> Option<u64> {
        self.skip_space();
        let start = self.at;
        let mut value = 0u64;
        while let Some(&digit @ b'0'..=b'9') = self.bytes.get(self.at) {
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            self.at += 1;
        }
        let digits = self.at - start;
        if digits == 0 || digits > 19 || (digits > 1 && self.bytes[start] == b'0') {
            return None;
        }
        Some(value)
    }

    /// An array of plain integers after whitespace, appended to `ids`.
    fn integers(&mut self, ids: &mut Vec<u64>) -> Option<()> {
        self.expect(b'[')?;
        self.skip_space();
        if self.bytes.get(self.at) == Some(&b']') {
            self.at += 1;
            return Some(());
        }
        loop {
            ids.push(self.integer()?);
            match self.next()? {
                b',' => {}
                b']' => return Some(()),
                _ => return None,
            }
        }
    }
}
