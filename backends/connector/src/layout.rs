//! The engine's KV cache as the connector sees it: one region of memory per layer, each
//! holding that layer's pages block after block. vLLM's CPU attention keeps its cache in
//! layout LBHNC (`../shared/ENGINES.md`): per layer a tensor `[num_blocks, kv_heads,
//! block_size, 2 × head_dim]`, so one block's page of one layer is `kv_heads × block_size
//! × 2·head_dim` elements in one piece. A kvtwin block is one engine block's pages over
//! all the layers, first layer first: what [`EngineLayout::gather`] copies out and
//! [`EngineLayout::scatter`] copies back.
//!
//! Owns: [`EngineLayout`] (the regions and their checks), gather and scatter,
//! [`LayoutError`]. Never: allocate or free the engine's memory, know what a tensor or a
//! dtype is (the Python side hands over addresses and sizes, and keeps the tensors alive),
//! or copy a block the engine is writing (the connector's calls are ordered so that it
//! does not).

use thiserror::Error;

/// Why a layout could not be made or a block copied.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LayoutError {
    /// No layer was given.
    #[error("the engine's KV cache has no layer")]
    NoLayers,
    /// Pages or blocks of zero bytes.
    #[error("a layer of {num_blocks} blocks of {page_bytes} bytes holds nothing")]
    Empty {
        /// Blocks per layer.
        num_blocks: usize,
        /// Bytes of one block's page in one layer.
        page_bytes: usize,
    },
    /// A layer's address is null.
    #[error("layer {layer}'s address is null")]
    NullAddress {
        /// The layer.
        layer: usize,
    },
    /// The sizes overflow the address space.
    #[error("{num_blocks} blocks of {page_bytes} bytes a layer overflow the address space")]
    Overflow {
        /// Blocks per layer.
        num_blocks: usize,
        /// Bytes of one block's page in one layer.
        page_bytes: usize,
    },
    /// Two layers' regions overlap.
    #[error("layers {first} and {second} overlap")]
    Overlap {
        /// One layer.
        first: usize,
        /// The other.
        second: usize,
    },
    /// A block beyond the engine's cache.
    #[error("the engine's cache has {num_blocks} blocks, no block {block}")]
    BlockOutOfRange {
        /// The block asked for.
        block: usize,
        /// Blocks per layer.
        num_blocks: usize,
    },
    /// A buffer that is not one kvtwin block long.
    #[error("a buffer of {actual} bytes for a block of {expected}")]
    WrongLength {
        /// Bytes of one kvtwin block.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
}

/// The engine's KV cache: per layer, the address of its first block's page.
#[derive(Debug)]
pub struct EngineLayout {
    layers: Vec<usize>,
    num_blocks: usize,
    page_bytes: usize,
}

impl EngineLayout {
    /// The layout of `layers` (each the address of a region of `num_blocks × page_bytes`
    /// bytes holding that layer's pages, block after block).
    ///
    /// # Safety
    /// Each region must stay allocated, readable and writable for as long as the layout
    /// lives, and nothing may write a block's pages while [`Self::gather`] or
    /// [`Self::scatter`] copies that block. The Python side keeps the engine's tensors
    /// alive beside the layout; vLLM writes a block only in a forward pass, which never
    /// overlaps the connector's copies of the same block.
    pub unsafe fn from_raw(
        layers: &[usize],
        num_blocks: usize,
        page_bytes: usize,
    ) -> Result<Self, LayoutError> {
        if layers.is_empty() {
            return Err(LayoutError::NoLayers);
        }
        if num_blocks == 0 || page_bytes == 0 {
            return Err(LayoutError::Empty {
                num_blocks,
                page_bytes,
            });
        }
        let overflow = LayoutError::Overflow {
            num_blocks,
            page_bytes,
        };
        let region = num_blocks.checked_mul(page_bytes).ok_or(overflow)?;
        page_bytes
            .checked_mul(layers.len())
            .ok_or(LayoutError::Overflow {
                num_blocks,
                page_bytes,
            })?;
        for (layer, &address) in layers.iter().enumerate() {
            if address == 0 {
                return Err(LayoutError::NullAddress { layer });
            }
            address.checked_add(region).ok_or(LayoutError::Overflow {
                num_blocks,
                page_bytes,
            })?;
        }
        // Overlapping layers would make one block's copy clobber another's.
        let mut order: Vec<(usize, usize)> = layers.iter().copied().zip(0..).collect();
        order.sort_unstable();
        for pair in order.windows(2) {
            if pair[0].0 + region > pair[1].0 {
                return Err(LayoutError::Overlap {
                    first: pair[0].1.min(pair[1].1),
                    second: pair[0].1.max(pair[1].1),
                });
            }
        }
        Ok(Self {
            layers: layers.to_vec(),
            num_blocks,
            page_bytes,
        })
    }

    /// Layers.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Blocks in each layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Bytes of one block's page in one layer.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Bytes of one kvtwin block: one page per layer.
    pub fn block_bytes(&self) -> usize {
        self.page_bytes * self.layers.len()
    }

    /// Copies engine block `block`'s pages, layer after layer, into `out` (one kvtwin
    /// block).
    pub fn gather(&self, block: usize, out: &mut [u8]) -> Result<(), LayoutError> {
        let offset = self.offset(block, out.len())?;
        for (layer, chunk) in self
            .layers
            .iter()
            .zip(out.chunks_exact_mut(self.page_bytes))
        {
            // SAFETY: `from_raw`'s contract keeps the region alive and unwritten while we
            // copy; `offset` is a whole page inside it (checked above); `chunk` is ours.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (layer + offset) as *const u8,
                    chunk.as_mut_ptr(),
                    self.page_bytes,
                );
            }
        }
        Ok(())
    }

    /// Copies `data` (one kvtwin block) into engine block `block`'s pages, layer after
    /// layer.
    pub fn scatter(&self, block: usize, data: &[u8]) -> Result<(), LayoutError> {
        let offset = self.offset(block, data.len())?;
        for (layer, chunk) in self.layers.iter().zip(data.chunks_exact(self.page_bytes)) {
            // SAFETY: as in `gather`; the engine does not read or write this block while
            // it is loaded (`from_raw`'s contract), and `chunk` does not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    chunk.as_ptr(),
                    (layer + offset) as *mut u8,
                    self.page_bytes,
                );
            }
        }
        Ok(())
    }

    /// The byte offset of `block`'s page in each layer, once `len` is checked to be one
    /// kvtwin block.
    fn offset(&self, block: usize, len: usize) -> Result<usize, LayoutError> {
        if block >= self.num_blocks {
            return Err(LayoutError::BlockOutOfRange {
                block,
                num_blocks: self.num_blocks,
            });
        }
        if len != self.block_bytes() {
            return Err(LayoutError::WrongLength {
                expected: self.block_bytes(),
                actual: len,
            });
        }
        Ok(block * self.page_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three layers of 5 blocks of 8-byte pages; byte `i` of layer `l` is `l × 100 + i`.
    fn engine() -> Vec<Vec<u8>> {
        (0..3u8)
            .map(|layer| (0..40u8).map(|i| layer * 100 + i).collect())
            .collect()
    }

    fn layout_of(engine: &mut [Vec<u8>]) -> EngineLayout {
        let addresses: Vec<usize> = engine.iter_mut().map(|l| l.as_mut_ptr() as usize).collect();
        // SAFETY: the buffers outlive the layout in every test and nothing else touches them.
        unsafe { EngineLayout::from_raw(&addresses, 5, 8) }.unwrap()
    }

    #[test]
    fn a_block_is_its_pages_layer_after_layer() {
        let mut engine = engine();
        let layout = layout_of(&mut engine);
        assert_eq!(layout.block_bytes(), 24);
        let mut block = vec![0; 24];
        layout.gather(2, &mut block).unwrap();
        let expected: Vec<u8> = (0..3u8)
            .flat_map(|layer| (16..24u8).map(move |i| layer * 100 + i))
            .collect();
        assert_eq!(block, expected);
    }

    #[test]
    fn scatter_puts_a_block_back_and_touches_no_other() {
        let mut engine = engine();
        let before = engine.clone();
        let layout = layout_of(&mut engine);
        let mut block = vec![0; 24];
        layout.gather(1, &mut block).unwrap();
        layout.scatter(4, &block).unwrap();
        let mut moved = vec![0; 24];
        layout.gather(4, &mut moved).unwrap();
        assert_eq!(moved, block);
        drop(layout);
        for (layer, (now, was)) in engine.iter().zip(&before).enumerate() {
            assert_eq!(now[..32], was[..32], "layer {layer}: blocks 0-3 unchanged");
            assert_eq!(now[32..], was[8..16], "layer {layer}: block 4 is block 1");
        }
    }

    #[test]
    fn bad_blocks_and_buffers_are_refused_by_name() {
        let mut engine = engine();
        let layout = layout_of(&mut engine);
        let mut block = vec![0; 24];
        assert_eq!(
            layout.gather(5, &mut block),
            Err(LayoutError::BlockOutOfRange {
                block: 5,
                num_blocks: 5
            })
        );
        assert_eq!(
            layout.scatter(0, &block[..23]),
            Err(LayoutError::WrongLength {
                expected: 24,
                actual: 23
            })
        );
    }

    #[test]
    fn layouts_that_cannot_be_are_refused() {
        let mut one = vec![0u8; 64];
        let base = one.as_mut_ptr() as usize;
        // SAFETY: every call below is refused before any copy.
        unsafe {
            assert_eq!(
                EngineLayout::from_raw(&[], 1, 1).unwrap_err(),
                LayoutError::NoLayers
            );
            assert!(matches!(
                EngineLayout::from_raw(&[base], 0, 8),
                Err(LayoutError::Empty { .. })
            ));
            assert_eq!(
                EngineLayout::from_raw(&[base, 0], 2, 8).unwrap_err(),
                LayoutError::NullAddress { layer: 1 }
            );
            assert!(matches!(
                EngineLayout::from_raw(&[base], usize::MAX, 2),
                Err(LayoutError::Overflow { .. })
            ));
            // Two layers of 4 × 8 bytes 16 bytes apart share blocks 2 and 3.
            assert_eq!(
                EngineLayout::from_raw(&[base + 16, base], 4, 8).unwrap_err(),
                LayoutError::Overlap {
                    first: 0,
                    second: 1
                }
            );
        }
    }
}
