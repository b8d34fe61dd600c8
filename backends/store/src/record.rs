//! One stored value as it lies on the disk and object tiers: a header naming its copy,
//! its key and its value's BLAKE3, then the key, then the value. The header makes a
//! tier's objects self-describing, so a restarted store rebuilds its index from a
//! listing and the headers alone; the digest catches a torn or flipped value when it is
//! read.
//!
//! Layout (little-endian): magic `KVTSTOR1` (8 bytes), copy id (u64), key length (u32),
//! value length (u64), BLAKE3 of the value (32 bytes), key, value.
//!
//! Owns: encoding, decoding the header, checking a value against its digest, and
//! [`RecordReader`] (a record fed as its bytes arrive, its value into the store's pages).
//! Never: I/O (the tiers read and write the bytes).

use crate::pages::{Pages, Value, ValueWriter};
use bytes::{BufMut, Bytes, BytesMut};

/// The record's first bytes.
pub const MAGIC: &[u8; 8] = b"KVTSTOR1";

/// Bytes of the header before the key.
pub const FIXED_HEADER: usize = 8 + 8 + 4 + 8 + 32;

/// The longest key a record holds (Redis allows more; engines' keys are a few hundred
/// bytes at most, and a bound keeps a header read to one small range).
pub const MAX_KEY: usize = 4096;

/// A record's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The copy it holds (unique in the store's life, across restarts).
    pub copy: u64,
    /// The key it was stored under.
    pub key: Bytes,
    /// The value's length, bytes.
    pub value_len: u64,
    /// BLAKE3 of the value.
    pub digest: [u8; 32],
}

impl Header {
    /// The header's length on the tier: the fixed part and the key.
    pub fn len(&self) -> usize {
        FIXED_HEADER + self.key.len()
    }

    /// Always false: a header holds at least its fixed part.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole record's length (saturating: a header from outside may claim any
    /// value length, and no record is that long).
    pub fn record_len(&self) -> u64 {
        (self.len() as u64).saturating_add(self.value_len)
    }
}

/// Why bytes are not a record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Shorter than its header says.
    #[error("truncated: {have} bytes, the header needs {need}")]
    Truncated {
        /// Bytes there are.
        have: usize,
        /// Bytes the header (or the record) needs.
        need: u64,
    },
    /// Not a record of this store.
    #[error("not a kvtwin store record (magic {0:02x?})")]
    Magic([u8; 8]),
    /// A key longer than [`MAX_KEY`].
    #[error("key of {0} bytes (at most {MAX_KEY})")]
    KeyTooLong(u64),
    /// Bytes past the record's length.
    #[error("bytes past the record's {0}")]
    Trailing(u64),
    /// A value longer than the store takes.
    #[error("a value of {0} bytes, longer than the store takes")]
    ValueTooLong(u64),
    /// The value's digest is not the header's.
    #[error("the value's BLAKE3 is not the header's: torn or flipped")]
    Digest,
}

/// The record of `value` under `key` as copy `copy`, with its digest `digest`, whole.
pub fn encode(copy: u64, key: &[u8], value: &[u8], digest: &[u8; 32]) -> Bytes {
    let mut out = BytesMut::with_capacity(FIXED_HEADER + key.len() + value.len());
    put_header(&mut out, copy, key, value.len() as u64, digest);
    out.put_slice(value);
    out.freeze()
}

/// The same record as [`encode`] in parts, the header (and key), then `value`'s own
/// (not copied): what a tier writes when the value is already in memory, so that moving
/// a value down never allocates another of its size.
pub fn encode_parts(copy: u64, key: &[u8], value: &Value, digest: &[u8; 32]) -> Vec<Bytes> {
    let mut header = BytesMut::with_capacity(FIXED_HEADER + key.len());
    put_header(&mut header, copy, key, value.len() as u64, digest);
    let mut parts = Vec::with_capacity(1 + value.parts().len());
    parts.push(header.freeze());
    parts.extend(value.parts().iter().cloned());
    parts
}

fn put_header(out: &mut BytesMut, copy: u64, key: &[u8], value_len: u64, digest: &[u8; 32]) {
    out.put_slice(MAGIC);
    out.put_u64_le(copy);
    out.put_u32_le(key.len() as u32);
    out.put_u64_le(value_len);
    out.put_slice(digest);
    out.put_slice(key);
}

/// The header at the start of `bytes` (which may stop anywhere after it).
pub fn decode_header(bytes: &[u8]) -> Result<Header, RecordError> {
    if bytes.len() < FIXED_HEADER {
        return Err(RecordError::Truncated {
            have: bytes.len(),
            need: FIXED_HEADER as u64,
        });
    }
    let magic: [u8; 8] = bytes[0..8].try_into().expect("8 bytes");
    if &magic != MAGIC {
        return Err(RecordError::Magic(magic));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let copy = u64_at(8);
    let key_len = u64::from(u32::from_le_bytes(
        bytes[16..20].try_into().expect("4 bytes"),
    ));
    let value_len = u64_at(20);
    let digest: [u8; 32] = bytes[28..60].try_into().expect("32 bytes");
    if key_len > MAX_KEY as u64 {
        return Err(RecordError::KeyTooLong(key_len));
    }
    let key_end = FIXED_HEADER + key_len as usize;
    if bytes.len() < key_end {
        return Err(RecordError::Truncated {
            have: bytes.len(),
            need: key_end as u64,
        });
    }
    Ok(Header {
        copy,
        key: Bytes::copy_from_slice(&bytes[FIXED_HEADER..key_end]),
        value_len,
        digest,
    })
}

/// The value of a whole record, checked against its digest, and its header.
pub fn decode(record: Bytes) -> Result<(Header, Bytes), RecordError> {
    let header = decode_header(&record)?;
    if (record.len() as u64) != header.record_len() {
        return Err(RecordError::Truncated {
            have: record.len(),
            need: header.record_len(),
        });
    }
    let value = record.slice(header.len()..);
    if blake3::hash(&value).as_bytes() != &header.digest {
        return Err(RecordError::Digest);
    }
    Ok((header, value))
}

/// A record read as its bytes arrive (a file read in pieces, an object store's stream):
/// the header kept, the value copied into pages, nothing past the record's own length
/// taken. Its value's digest is checked by [`RecordReader::finish`].
pub struct RecordReader {
    pages: Pages,
    /// The header's bytes so far, and how many it needs (the fixed part, then the key).
    head: Vec<u8>,
    need: usize,
    body: Option<(Header, ValueWriter)>,
    /// Values longer than this are refused (a corrupt header claims any length).
    max_value: u64,
}

impl RecordReader {
    /// A reader whose value goes into `pages`, refusing values over `max_value` bytes.
    pub fn new(pages: Pages, max_value: u64) -> RecordReader {
        RecordReader {
            pages,
            head: Vec::with_capacity(FIXED_HEADER),
            need: FIXED_HEADER,
            body: None,
            max_value,
        }
    }

    /// Takes the next `bytes`.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), RecordError> {
        while !bytes.is_empty() {
            if let Some((header, writer)) = &mut self.body {
                if bytes.len() > writer.remaining() {
                    return Err(RecordError::Trailing(header.record_len()));
                }
                writer.extend(bytes);
                return Ok(());
            }
            let n = (self.need - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.head.len() < self.need {
                continue;
            }
            match decode_header(&self.head) {
                Ok(header) => {
                    if header.value_len > self.max_value {
                        return Err(RecordError::ValueTooLong(header.value_len));
                    }
                    let writer = self.pages.writer(header.value_len as usize);
                    self.body = Some((header, writer));
                }
                Err(RecordError::Truncated { need, .. }) if need as usize > self.need => {
                    self.need = need as usize;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// The header and the value, whole and checked against the header's digest.
    pub fn finish(self) -> Result<(Header, Value), RecordError> {
        let Some((header, writer)) = self.body else {
            return Err(RecordError::Truncated {
                have: self.head.len(),
                need: self.need as u64,
            });
        };
        if writer.remaining() > 0 {
            return Err(RecordError::Truncated {
                have: (header.record_len() - writer.remaining() as u64) as usize,
                need: header.record_len(),
            });
        }
        let value = writer.finish();
        if value.digest() != header.digest {
            return Err(RecordError::Digest);
        }
        Ok((header, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_record_reads_back_and_a_flipped_byte_is_caught() {
        let value = b"the value".as_slice();
        let digest = *blake3::hash(value).as_bytes();
        let record = encode(7, b"key", value, &digest);
        let (header, read) = decode(record.clone()).expect("decodes");
        assert_eq!(
            header,
            Header {
                copy: 7,
                key: Bytes::from_static(b"key"),
                value_len: 9,
                digest
            }
        );
        assert_eq!(read, value);
        assert_eq!(header.record_len(), record.len() as u64);
        let mut flipped = record.to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode(Bytes::from(flipped)), Err(RecordError::Digest));
        let torn = record.slice(..record.len() - 1);
        assert!(matches!(decode(torn), Err(RecordError::Truncated { .. })));
        assert!(matches!(
            decode_header(b"NOTSTORExxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
            Err(RecordError::Magic(_))
        ));
    }

    proptest! {
        /// Any bytes at all: a header or a typed error, never a panic.
        #[test]
        fn any_bytes_decode_to_a_header_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_header(&bytes);
            let _ = decode(Bytes::from(bytes));
        }

        /// A header that claims any value length at all is refused as truncated, not
        /// overflowed (the fuzz target `store_bytes` found the overflow).
        #[test]
        fn any_claimed_length_is_truncated_not_overflowed(value_len in any::<u64>()) {
            let mut record = encode(1, b"k", b"", blake3::hash(b"").as_bytes()).to_vec();
            record[20..28].copy_from_slice(&value_len.to_le_bytes());
            if value_len > 0 {
                let refused = matches!(decode(Bytes::from(record)), Err(RecordError::Truncated { .. }));
                prop_assert!(refused);
            }
        }

        /// Whatever the key and value, a record decodes to them.
        #[test]
        fn records_round_trip(
            copy in any::<u64>(),
            key in proptest::collection::vec(any::<u8>(), 0..64),
            value in proptest::collection::vec(any::<u8>(), 0..40_000),
            cut in 1usize..20_000,
        ) {
            let digest = *blake3::hash(&value).as_bytes();
            let (header, read) = decode(encode(copy, &key, &value, &digest)).unwrap();
            prop_assert_eq!(header.copy, copy);
            prop_assert_eq!(&header.key[..], &key[..]);
            prop_assert_eq!(&read[..], &value[..]);
            // The parts a tier writes are the same bytes.
            let whole = encode(copy, &key, &value, &digest);
            let parts = encode_parts(copy, &key, &Value::from(Bytes::from(value.clone())), &digest);
            prop_assert_eq!(&parts.concat()[..], &whole[..]);
            // Read back in pieces of any size, through the pages.
            let mut reader = RecordReader::new(Pages::new(0), 1 << 20);
            for piece in whole.chunks(cut) {
                reader.feed(piece).unwrap();
            }
            let (header, read) = reader.finish().unwrap();
            prop_assert_eq!(header.copy, copy);
            prop_assert_eq!(read.to_bytes(), Bytes::from(value));
        }

        /// Any bytes fed in any pieces: a record or a typed error, never a panic; a torn
        /// or flipped record is never a value.
        #[test]
        fn a_record_reader_refuses_what_is_not_a_whole_record(
            value in proptest::collection::vec(any::<u8>(), 0..40_000),
            cut in 1usize..20_000,
            damage in 0usize..40_100,
            how in 0u8..3,
        ) {
            let digest = *blake3::hash(&value).as_bytes();
            let mut record = encode(3, b"key", &value, &digest).to_vec();
            let at = damage % record.len();
            match how {
                0 => record[at] ^= 0x40,
                1 => record.truncate(at),
                _ => record.push(0),
            }
            let mut reader = RecordReader::new(Pages::new(0), 1 << 20);
            let fed = record.chunks(cut).try_for_each(|piece| reader.feed(piece));
            let read = fed.and_then(|()| reader.finish());
            // A flip inside the key or copy id still reads (the key is not digested):
            // only flips in the magic, lengths, digest or value must be refused.
            let harmless = how == 0 && ((8..16).contains(&at) || (60..63).contains(&at));
            if !harmless {
                prop_assert!(read.is_err(), "damaged at {} ({}) but read", at, how);
            }
        }
    }
}
