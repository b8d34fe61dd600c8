//! The MRDN v1 wire frame for disaggregated KV transfer (seed 004, ADR-0006).
//!
//! Owns: encoding and decoding of one frame. Layout (integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"MRDN"` |
//! | 4..8 | version: u32 = 1 |
//! | 8..12 | body_len: u32 |
//! | 12 | tier: the producer's [`Phase`] (`Phase::to_wire`) |
//! | 13..16 | padding, zero |
//! | 16..32 | BLAKE3 of the body, first 16 bytes |
//! | 32.. | body (`body_len` bytes, opaque: raw KV) |
//!
//! Invariant: every single-bit corruption of a valid frame is rejected. The checksum
//! covers the body; the header is protected by its fixed fields (magic, version,
//! padding), the length check, and phase codes two bits apart.
//! Never: I/O, or panic on any input.

use crate::phase::Phase;

/// The frame's first four bytes.
pub const MRDN_MAGIC: [u8; 4] = *b"MRDN";
/// The only version this code speaks.
pub const MRDN_VERSION: u32 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 32;
/// The largest body accepted (1 GiB): a bound, so a corrupt length cannot make a reader
/// allocate without limit.
pub const MAX_BODY_LEN: usize = 1 << 30;

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The producer's phase class of the blocks.
    pub phase: Phase,
    /// Body length in bytes.
    pub body_len: usize,
    /// Truncated BLAKE3 of the body.
    pub checksum: [u8; 16],
}

/// A decoded frame: a view of its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The producer's phase class of the blocks.
    pub phase: Phase,
    /// The body.
    pub body: &'a [u8],
}

/// A frame could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The body exceeds [`MAX_BODY_LEN`].
    #[error("body of {len} bytes exceeds the {max}-byte limit", max = MAX_BODY_LEN)]
    BodyTooLarge {
        /// The body's length.
        len: usize,
    },
}

/// A frame could not be decoded: one variant per failure kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer than 32 bytes.
    #[error("frame of {len} bytes is shorter than the 32-byte header")]
    ShortHeader {
        /// Bytes present.
        len: usize,
    },
    /// Not `MRDN`.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A version this code does not speak.
    #[error("unsupported MRDN version {version}")]
    UnsupportedVersion {
        /// The version on the wire.
        version: u32,
    },
    /// A tier byte that names no phase.
    #[error("unknown phase byte {byte:#04x}")]
    UnknownPhase {
        /// The byte.
        byte: u8,
    },
    /// Padding bytes that are not zero.
    #[error("non-zero header padding")]
    NonZeroPadding,
    /// Fewer body bytes than declared.
    #[error("body declared {declared} bytes, {actual} present")]
    BodyTooShort {
        /// Declared length.
        declared: usize,
        /// Bytes present.
        actual: usize,
    },
    /// More bytes than declared (trailing garbage).
    #[error("body declared {declared} bytes, {actual} present")]
    BodyTooLong {
        /// Declared length.
        declared: usize,
        /// Bytes present.
        actual: usize,
    },
    /// A declared length over [`MAX_BODY_LEN`].
    #[error("declared body of {declared} bytes exceeds the limit")]
    BodyTooLarge {
        /// Declared length.
        declared: usize,
    },
    /// The body's checksum does not match the header's.
    #[error("body checksum mismatch")]
    ChecksumMismatch,
}

fn checksum(body: &[u8]) -> [u8; 16] {
    let hash = blake3::hash(body);
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash.as_bytes()[..16]);
    out
}

/// Appends the frame of `body` to `out`.
pub fn encode_into(phase: Phase, body: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if body.len() > MAX_BODY_LEN {
        return Err(EncodeError::BodyTooLarge { len: body.len() });
    }
    out.reserve(HEADER_LEN + body.len());
    out.extend_from_slice(&MRDN_MAGIC);
    out.extend_from_slice(&MRDN_VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.push(phase.to_wire());
    out.extend_from_slice(&[0u8; 3]);
    out.extend_from_slice(&checksum(body));
    out.extend_from_slice(body);
    Ok(())
}

/// The frame of `body`.
pub fn encode(phase: Phase, body: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    encode_into(phase, body, &mut out)?;
    Ok(out)
}

/// Decodes the 32-byte header at the start of `bytes` (a streaming reader learns the
/// body length from it before reading the body).
pub fn decode_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(DecodeError::ShortHeader { len: bytes.len() });
    };
    let field = |at: usize| [header[at], header[at + 1], header[at + 2], header[at + 3]];
    let magic = field(0);
    if magic != MRDN_MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let version = u32::from_le_bytes(field(4));
    if version != MRDN_VERSION {
        return Err(DecodeError::UnsupportedVersion { version });
    }
    let body_len = u32::from_le_bytes(field(8)) as usize;
    if body_len > MAX_BODY_LEN {
        return Err(DecodeError::BodyTooLarge { declared: body_len });
    }
    let phase =
        Phase::from_wire(header[12]).ok_or(DecodeError::UnknownPhase { byte: header[12] })?;
    if header[13..16] != [0, 0, 0] {
        return Err(DecodeError::NonZeroPadding);
    }
    let mut checksum = [0u8; 16];
    checksum.copy_from_slice(&header[16..32]);
    Ok(Header {
        phase,
        body_len,
        checksum,
    })
}

/// Decodes a whole frame; the body is borrowed from `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let header = decode_header(bytes)?;
    let body = &bytes[HEADER_LEN..];
    if body.len() < header.body_len {
        return Err(DecodeError::BodyTooShort {
            declared: header.body_len,
            actual: body.len(),
        });
    }
    if body.len() > header.body_len {
        return Err(DecodeError::BodyTooLong {
            declared: header.body_len,
            actual: body.len(),
        });
    }
    if checksum(body) != header.checksum {
        return Err(DecodeError::ChecksumMismatch);
    }
    Ok(Frame {
        phase: header.phase,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn phase_strategy() -> impl Strategy<Value = Phase> {
        prop::sample::select(Phase::COLDEST_FIRST.to_vec())
    }

    #[test]
    fn frames_round_trip_with_a_32_byte_header() {
        let frame = encode(Phase::ThinkActive, b"hello kv").unwrap();
        assert_eq!(frame.len(), HEADER_LEN + 8);
        assert_eq!(&frame[..4], b"MRDN");
        let decoded = decode(&frame).unwrap();
        assert_eq!(
            decoded,
            Frame {
                phase: Phase::ThinkActive,
                body: b"hello kv"
            }
        );
        assert_eq!(
            decode(&encode(Phase::OutputCritical, b"").unwrap())
                .unwrap()
                .body,
            b""
        );
    }

    #[test]
    fn each_failure_kind_has_its_own_error() {
        let good = encode(Phase::ThinkComplete, b"body").unwrap();
        assert_eq!(
            decode(&good[..10]),
            Err(DecodeError::ShortHeader { len: 10 })
        );
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(decode(&bad), Err(DecodeError::BadMagic { .. })));
        let mut bad = good.clone();
        bad[4] = 2;
        assert_eq!(
            decode(&bad),
            Err(DecodeError::UnsupportedVersion { version: 2 })
        );
        let mut bad = good.clone();
        bad[12] = 0;
        assert_eq!(decode(&bad), Err(DecodeError::UnknownPhase { byte: 0 }));
        let mut bad = good.clone();
        bad[14] = 1;
        assert_eq!(decode(&bad), Err(DecodeError::NonZeroPadding));
        assert_eq!(
            decode(&good[..good.len() - 1]),
            Err(DecodeError::BodyTooShort {
                declared: 4,
                actual: 3
            })
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            decode(&long),
            Err(DecodeError::BodyTooLong {
                declared: 4,
                actual: 5
            })
        );
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&bad),
            Err(DecodeError::BodyTooLarge { .. })
        ));
        let mut bad = good;
        bad[HEADER_LEN] ^= 0x80;
        assert_eq!(decode(&bad), Err(DecodeError::ChecksumMismatch));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decoding_arbitrary_bytes_after_a_valid_prefix_never_panics(
            rest in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut bytes = MRDN_MAGIC.to_vec();
            bytes.extend_from_slice(&MRDN_VERSION.to_le_bytes());
            bytes.extend_from_slice(&rest);
            let _ = decode(&bytes);
        }

        #[test]
        fn every_single_bit_flip_of_a_valid_frame_is_rejected(
            body in prop::collection::vec(any::<u8>(), 0..256),
            phase in phase_strategy(),
        ) {
            let frame = encode(phase, &body).unwrap();
            for bit in 0..frame.len() * 8 {
                let mut corrupt = frame.clone();
                corrupt[bit / 8] ^= 1 << (bit % 8);
                prop_assert!(decode(&corrupt).is_err(), "bit {} accepted", bit);
            }
        }

        #[test]
        fn every_truncation_and_extension_is_rejected(
            body in prop::collection::vec(any::<u8>(), 0..64),
            phase in phase_strategy(),
            extra in any::<u8>(),
        ) {
            let frame = encode(phase, &body).unwrap();
            for len in 0..frame.len() {
                prop_assert!(decode(&frame[..len]).is_err());
            }
            let mut longer = frame.clone();
            longer.push(extra);
            prop_assert!(decode(&longer).is_err());
        }
    }
}
