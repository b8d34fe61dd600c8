//! [`FullyContiguous`]: all blocks in one region, the layers of a block side by side.
//!
//! Invariant: once built, the region is aligned, large enough for every block, and does
//! not wrap around the address space, so every [`BlockLayout::offset`] it returns lies
//! inside it and distinct (block, layer) pairs never overlap.
//!
//! Never: allocate or touch the memory it describes.

use super::config::{checked_add, checked_mul, widen, LayoutConfig, LayoutError, MemoryType};
use super::{
    check_indices, check_region, Address, BlockLayout, LayoutDescriptor, LayoutKind, Region,
};

/// All blocks in one region; within a block the layers are consecutive
/// (`layer stride = layer_bytes`), and blocks are `align_up(num_layers × layer_bytes,
/// alignment)` apart, so every block starts aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullyContiguous {
    config: LayoutConfig,
    num_blocks: usize,
    region: Region,
    layer_bytes: u64,
    block_stride: u64,
    total_bytes: u64,
}

impl FullyContiguous {
    /// Bytes a region must hold for `num_blocks` blocks of `config` (the last block's
    /// padding included).
    pub fn required_bytes(config: &LayoutConfig, num_blocks: usize) -> Result<u64, LayoutError> {
        checked_mul(
            config.sizes()?.contiguous_block_stride,
            widen(num_blocks),
            "required bytes",
        )
    }

    /// The layout of `num_blocks` blocks in `region`, which must start aligned and hold at
    /// least [`FullyContiguous::required_bytes`].
    pub fn new(
        config: LayoutConfig,
        num_blocks: usize,
        region: Region,
    ) -> Result<Self, LayoutError> {
        let sizes = config.sizes()?;
        let total_bytes = Self::required_bytes(&config, num_blocks)?;
        check_region(0, &region, total_bytes, config.alignment)?;
        Ok(Self {
            config,
            num_blocks,
            region,
            layer_bytes: sizes.layer_bytes,
            block_stride: sizes.contiguous_block_stride,
            total_bytes,
        })
    }

    /// The region holding all blocks.
    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl BlockLayout for FullyContiguous {
    fn config(&self) -> &LayoutConfig {
        &self.config
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn memory_type(&self) -> MemoryType {
        self.region.memory_type
    }

    fn device_id(&self) -> u32 {
        self.region.device_id
    }

    fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn block_stride_bytes(&self) -> u64 {
        self.block_stride
    }

    fn layer_stride_bytes(&self) -> Option<u64> {
        Some(self.layer_bytes)
    }

    fn offset(&self, block: usize, layer: usize) -> Result<Address, LayoutError> {
        check_indices(&self.config, self.num_blocks, block, layer)?;
        // The construction checks make overflow impossible here; checked anyway so that a
        // broken invariant is an error rather than a wrapped address into someone's memory.
        let within = checked_add(
            checked_mul(widen(block), self.block_stride, "offset")?,
            checked_mul(widen(layer), self.layer_bytes, "offset")?,
            "offset",
        )?;
        Ok(Address {
            addr: checked_add(self.region.base_addr, within, "address")?,
            len: self.layer_bytes,
        })
    }

    fn descriptor(&self) -> LayoutDescriptor {
        LayoutDescriptor {
            kind: LayoutKind::FullyContiguous,
            config: self.config,
            num_blocks: widen(self.num_blocks),
            memory_type: self.region.memory_type,
            device_id: self.region.device_id,
            block_stride_bytes: self.block_stride,
            layer_stride_bytes: Some(self.layer_bytes),
            regions: vec![Address {
                addr: self.region.base_addr,
                len: self.region.len,
            }],
        }
    }
}
