//! The frame of a KV block stored in a shared store (G4) under its key: the block's bytes
//! with what names it, so the store, which sees only keys and values, can tell routers
//! which block arrived (KV events need the block's hash, its parent's and its tokens).
//!
//! Owns: the layout of a stored value ([`encode`], [`decode`], [`FrameIdentity`]) and
//! [`BlockFrameError`]. `KVB2` (written): tag, BLAKE3 of everything after it, then
//! flags (bit 0: a parent follows), the block's sequence hash, its parent's (0 without
//! one), the token count and the tokens (u32 little-endian each), then the block's bytes.
//! `KVB1` (read only; what kvtwin's connector wrote before): tag, BLAKE3 of the bytes,
//! the bytes; it names no block.
//! Invariant: whatever [`decode`] returns is covered by the BLAKE3 it checked: a torn
//! or altered value, its identity included, is an error, never a wrong block.
//! Never: I/O, or trust a length field before checking it against the value's length.

use crate::ids::SequenceHash;
use thiserror::Error;

/// The tag of the frame written now.
pub const TAG: &[u8; 4] = b"KVB2";

/// The tag of the first frame, which carried the bytes only (still read).
pub const TAG_V1: &[u8; 4] = b"KVB1";

/// Bytes of the BLAKE3 digest after the tag.
pub const DIGEST_BYTES: usize = 32;

/// Bytes of a `KVB2` frame before its tokens: tag, digest, flags, hash, parent, count.
pub const FIXED_BYTES: usize = 4 + DIGEST_BYTES + 1 + 8 + 8 + 4;

/// Bytes of a `KVB1` frame before the block's: tag and digest.
pub const V1_HEADER_BYTES: usize = 4 + DIGEST_BYTES;

/// Flag bit: the block has a parent.
const HAS_PARENT: u8 = 1;

/// What a `KVB2` frame says its block is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameIdentity {
    /// The block's sequence hash (the chain up to and including it).
    pub hash: SequenceHash,
    /// Its parent's sequence hash; none for a sequence's first block.
    pub parent: Option<SequenceHash>,
    /// The block's tokens.
    pub tokens: Vec<u32>,
}

/// A value read as a block frame: who the block is (`KVB2`) and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedFrame<'a> {
    /// The block's identity; none for a `KVB1` frame.
    pub identity: Option<FrameIdentity>,
    /// The block's bytes.
    pub payload: &'a [u8],
}

/// Why a value is not a whole block frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BlockFrameError {
    /// It does not start with a known tag (a value some other client wrote).
    #[error("not a block frame (no KVB1 or KVB2 tag)")]
    NotAFrame,
    /// Shorter than its header or its token count says.
    #[error("a block frame cut short")]
    Truncated,
    /// Flags this version does not know.
    #[error("a block frame with unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// Its bytes do not match its BLAKE3.
    #[error("a block frame whose BLAKE3 does not match")]
    Checksum,
}

/// The `KVB2` value of a block: `hash` and `parent` name it, `tokens` are its tokens,
/// `payload` its bytes.
pub fn encode(
    hash: SequenceHash,
    parent: Option<SequenceHash>,
    tokens: &[u32],
    payload: &[u8],
) -> Vec<u8> {
    let mut value = Vec::with_capacity(FIXED_BYTES + 4 * tokens.len() + payload.len());
    value.extend_from_slice(TAG);
    value.extend_from_slice(&[0; DIGEST_BYTES]);
    value.push(if parent.is_some() { HAS_PARENT } else { 0 });
    value.extend_from_slice(&hash.get().to_le_bytes());
    value.extend_from_slice(&parent.map_or(0, SequenceHash::get).to_le_bytes());
    let count = u32::try_from(tokens.len()).expect("a block of fewer than 2^32 tokens");
    value.extend_from_slice(&count.to_le_bytes());
    for token in tokens {
        value.extend_from_slice(&token.to_le_bytes());
    }
    value.extend_from_slice(payload);
    let digest = blake3::hash(&value[4 + DIGEST_BYTES..]);
    value[4..4 + DIGEST_BYTES].copy_from_slice(digest.as_bytes());
    value
}

/// Whether `value` starts with a block frame's tag (cheap: no checksum).
pub fn is_tagged(value: &[u8]) -> bool {
    value.starts_with(TAG) || value.starts_with(TAG_V1)
}

/// Reads `value` as a block frame, checking its BLAKE3 over everything it returns.
pub fn decode(value: &[u8]) -> Result<DecodedFrame<'_>, BlockFrameError> {
    let (header, rest) = if value.starts_with(TAG) {
        let identity = read_identity(value)?;
        let start = FIXED_BYTES + 4 * identity.tokens.len();
        (Some(identity), &value[start..])
    } else if value.starts_with(TAG_V1) {
        if value.len() < V1_HEADER_BYTES {
            return Err(BlockFrameError::Truncated);
        }
        (None, &value[V1_HEADER_BYTES..])
    } else {
        return Err(BlockFrameError::NotAFrame);
    };
    if blake3::hash(&value[4 + DIGEST_BYTES..]).as_bytes()[..] != value[4..4 + DIGEST_BYTES] {
        return Err(BlockFrameError::Checksum);
    }
    Ok(DecodedFrame {
        identity: header,
        payload: rest,
    })
}

/// The identity in the head of a `KVB2` frame, WITHOUT checking its BLAKE3 (the head
/// may be all there is, as when a restarted store reads the start of each value): use
/// [`decode`] on whole values.
pub fn read_identity(head: &[u8]) -> Result<FrameIdentity, BlockFrameError> {
    if !head.starts_with(TAG) {
        return Err(BlockFrameError::NotAFrame);
    }
    if head.len() < FIXED_BYTES {
        return Err(BlockFrameError::Truncated);
    }
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let flags = head[4 + DIGEST_BYTES];
    if flags & !HAS_PARENT != 0 {
        return Err(BlockFrameError::UnknownFlags(flags));
    }
    let hash = SequenceHash::new(u64_at(4 + DIGEST_BYTES + 1));
    let parent = (flags & HAS_PARENT != 0).then(|| SequenceHash::new(u64_at(4 + DIGEST_BYTES + 9)));
    let count_at = FIXED_BYTES - 4;
    let count = u32::from_le_bytes(head[count_at..FIXED_BYTES].try_into().expect("4 bytes"));
    // Checked against what is there before anything is allocated for it.
    let tokens_bytes = (count as usize)
        .checked_mul(4)
        .filter(|bytes| head.len() - FIXED_BYTES >= *bytes)
        .ok_or(BlockFrameError::Truncated)?;
    let tokens = head[FIXED_BYTES..FIXED_BYTES + tokens_bytes]
        .chunks_exact(4)
        .map(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")))
        .collect();
    Ok(FrameIdentity {
        hash,
        parent,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> Vec<u8> {
        encode(
            SequenceHash::new(7),
            Some(SequenceHash::new(5)),
            &[1, 2, 3, 4],
            &[9u8; 64],
        )
    }

    #[test]
    fn a_frame_gives_back_its_identity_and_bytes() {
        let value = frame();
        assert_eq!(value.len(), FIXED_BYTES + 16 + 64);
        let decoded = decode(&value).unwrap();
        assert_eq!(
            decoded.identity,
            Some(FrameIdentity {
                hash: SequenceHash::new(7),
                parent: Some(SequenceHash::new(5)),
                tokens: vec![1, 2, 3, 4],
            })
        );
        assert_eq!(decoded.payload, &[9u8; 64][..]);
        let first = encode(SequenceHash::new(1), None, &[], b"");
        let decoded = decode(&first).unwrap();
        assert_eq!(decoded.identity.unwrap().parent, None);
        assert!(decoded.payload.is_empty());
    }

    #[test]
    fn every_byte_of_a_frame_is_checked() {
        let value = frame();
        // Any flipped byte past the tag, identity or bytes, is refused; never another
        // block (a flipped flag bit may also read as unknown flags or a short frame).
        for at in 4..value.len() {
            let mut flipped = value.clone();
            flipped[at] ^= 0x10;
            assert!(decode(&flipped).is_err(), "byte {at} flipped passed");
        }
        assert_eq!(
            decode(&value[..value.len() - 1]),
            Err(BlockFrameError::Checksum)
        );
        assert_eq!(
            decode(&value[..FIXED_BYTES + 3]),
            Err(BlockFrameError::Truncated)
        );
        assert_eq!(decode(b"KVB2"), Err(BlockFrameError::Truncated));
        assert_eq!(decode(b"hello"), Err(BlockFrameError::NotAFrame));
        let mut huge = value.clone();
        huge[FIXED_BYTES - 4..FIXED_BYTES].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(read_identity(&huge), Err(BlockFrameError::Truncated));
    }

    #[test]
    fn the_first_frame_is_still_read_and_names_no_block() {
        let payload = [3u8; 8];
        let mut v1 = TAG_V1.to_vec();
        v1.extend_from_slice(blake3::hash(&payload).as_bytes());
        v1.extend_from_slice(&payload);
        let decoded = decode(&v1).unwrap();
        assert_eq!(decoded.identity, None);
        assert_eq!(decoded.payload, &payload[..]);
        assert!(is_tagged(&v1) && is_tagged(&frame()) && !is_tagged(b"LMCache"));
        assert_eq!(read_identity(&v1), Err(BlockFrameError::NotAFrame));
    }
}
