//! Deterministic KV content: what a block's bytes should be, so that any round trip
//! (offload, eviction, onboarding, a trip across a fabric) can be checked byte for byte.
//!
//! Owns: [`KvContent`], the shape of one block's bytes (`num_layers` layers of
//! `layer_bytes`, side by side as in the fully contiguous layout), and the content rule:
//! layer `l` of the block with sequence hash `h` is the BLAKE3 extendable output keyed by
//! the context "kvtwin kv content v1" over `le_u64(h) ++ le_u32(l)`. Distinct blocks and
//! distinct layers of one block get unrelated bytes, so a block copied to the wrong place,
//! or layers swapped, fail the check.
//! Never: touch a tier or a transfer (tests hand it the bytes they read), or allocate
//! more than one layer of scratch space.

use kvtwin::ids::SequenceHash;
use kvtwin::layout::{LayoutConfig, LayoutError};

/// The key-derivation context of the content stream; changing it changes every byte.
const CONTEXT: &str = "kvtwin kv content v1";

/// The bytes did not match, or could not be checked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContentError {
    /// The buffer is not one block long.
    #[error("buffer of {actual} bytes, a block is {expected}")]
    WrongLength {
        /// Bytes of one block.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// The first byte that differs from the content of the block.
    #[error("byte {offset} of layer {layer} differs from the block's content")]
    Mismatch {
        /// The layer.
        layer: u32,
        /// The offset within the layer.
        offset: usize,
    },
    /// A block of zero layers or zero-byte layers.
    #[error("a block needs at least one layer of at least one byte")]
    Empty,
    /// The layout's sizes do not fit this machine's address space.
    #[error("layer of {0} bytes does not fit in memory")]
    TooLarge(u64),
    /// The layout config is invalid.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// The content of blocks of one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvContent {
    num_layers: u32,
    layer_bytes: usize,
}

impl KvContent {
    /// Blocks of `num_layers` layers of `layer_bytes` bytes each.
    pub fn new(num_layers: u32, layer_bytes: usize) -> Result<Self, ContentError> {
        if num_layers == 0 || layer_bytes == 0 {
            return Err(ContentError::Empty);
        }
        if layer_bytes.checked_mul(num_layers as usize).is_none() {
            return Err(ContentError::TooLarge(layer_bytes as u64));
        }
        Ok(Self {
            num_layers,
            layer_bytes,
        })
    }

    /// Blocks shaped by `layout` (its layers, its bytes per layer; no padding).
    pub fn for_layout(layout: &LayoutConfig) -> Result<Self, ContentError> {
        layout.validate()?;
        let layer_bytes = layout.layer_bytes()?;
        let layer_bytes =
            usize::try_from(layer_bytes).map_err(|_| ContentError::TooLarge(layer_bytes))?;
        Self::new(layout.num_layers, layer_bytes)
    }

    /// Layers per block.
    pub fn num_layers(&self) -> u32 {
        self.num_layers
    }

    /// Bytes per layer.
    pub fn layer_bytes(&self) -> usize {
        self.layer_bytes
    }

    /// Bytes per block: `num_layers × layer_bytes`.
    pub fn block_bytes(&self) -> usize {
        self.layer_bytes * self.num_layers as usize
    }

    /// Fills `out` with the content of `layer` of block `hash` (any length: the stream
    /// is extendable, and a shorter `out` is a prefix of a longer one).
    pub fn fill_layer(hash: SequenceHash, layer: u32, out: &mut [u8]) {
        let mut hasher = blake3::Hasher::new_derive_key(CONTEXT);
        hasher.update(&hash.get().to_le_bytes());
        hasher.update(&layer.to_le_bytes());
        hasher.finalize_xof().fill(out);
    }

    /// Fills `block` (one block long) with the content of block `hash`.
    pub fn fill(&self, hash: SequenceHash, block: &mut [u8]) -> Result<(), ContentError> {
        self.check_len(block.len())?;
        for (layer, bytes) in (0..self.num_layers).zip(block.chunks_exact_mut(self.layer_bytes)) {
            Self::fill_layer(hash, layer, bytes);
        }
        Ok(())
    }

    /// The content of block `hash`, in a new buffer.
    pub fn block(&self, hash: SequenceHash) -> Vec<u8> {
        let mut block = vec![0; self.block_bytes()];
        for (layer, bytes) in (0..self.num_layers).zip(block.chunks_exact_mut(self.layer_bytes)) {
            Self::fill_layer(hash, layer, bytes);
        }
        block
    }

    /// Checks that `block` holds exactly the content of block `hash`; names the first
    /// byte that differs.
    pub fn check(&self, hash: SequenceHash, block: &[u8]) -> Result<(), ContentError> {
        self.check_len(block.len())?;
        let mut expected = vec![0; self.layer_bytes];
        for (layer, bytes) in (0..self.num_layers).zip(block.chunks_exact(self.layer_bytes)) {
            Self::fill_layer(hash, layer, &mut expected);
            if let Some(offset) = bytes.iter().zip(&expected).position(|(a, b)| a != b) {
                return Err(ContentError::Mismatch { layer, offset });
            }
        }
        Ok(())
    }

    fn check_len(&self, actual: usize) -> Result<(), ContentError> {
        if actual != self.block_bytes() {
            return Err(ContentError::WrongLength {
                expected: self.block_bytes(),
                actual,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::layout::DType;

    #[test]
    fn content_is_deterministic_and_differs_by_block_and_layer() {
        let content = KvContent::new(3, 64).unwrap();
        let a = content.block(SequenceHash::new(1));
        assert_eq!(a, content.block(SequenceHash::new(1)));
        assert_ne!(a, content.block(SequenceHash::new(2)));
        assert_ne!(a[..64], a[64..128], "layers differ");
        assert_eq!(content.check(SequenceHash::new(1), &a), Ok(()));
        let mut filled = vec![0; content.block_bytes()];
        content.fill(SequenceHash::new(1), &mut filled).unwrap();
        assert_eq!(filled, a);
    }

    #[test]
    fn check_names_the_first_differing_byte() {
        let content = KvContent::new(2, 32).unwrap();
        let mut block = content.block(SequenceHash::new(9));
        block[32 + 5] ^= 0x10;
        assert_eq!(
            content.check(SequenceHash::new(9), &block),
            Err(ContentError::Mismatch {
                layer: 1,
                offset: 5
            })
        );
        assert_eq!(
            content.check(SequenceHash::new(9), &block[1..]),
            Err(ContentError::WrongLength {
                expected: 64,
                actual: 63
            })
        );
    }

    #[test]
    fn shapes_come_from_a_layout_and_empty_ones_are_refused() {
        let layout = LayoutConfig::for_model(4, 16, 2, 8, DType::F16).unwrap();
        let content = KvContent::for_layout(&layout).unwrap();
        assert_eq!(content.num_layers(), 4);
        assert_eq!(content.layer_bytes(), 16 * 2 * 2 * 8 * 2);
        assert_eq!(content.block_bytes() as u64, layout.block_bytes().unwrap());
        assert_eq!(KvContent::new(0, 8), Err(ContentError::Empty));
        assert_eq!(KvContent::new(1, 0), Err(ContentError::Empty));
    }
}
