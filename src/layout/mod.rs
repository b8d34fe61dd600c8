//! Memory layouts of KV blocks: which bytes hold layer `l` of block `b`, and the portable
//! descriptor that lets a remote peer compute the same addresses (the NIXL metadata
//! exchange of seed 000).
//!
//! Owns: the [`BlockLayout`] trait, [`Region`] and [`Address`] (where bytes live), the
//! [`AnyLayout`] sum of the two layouts, and the region and index checks both layouts
//! share. The pieces live in one file each and are re-exported here, so every type is
//! named `kvtwin::layout::X`:
//! - `config`: [`DType`], [`LayoutConfig`] (the shape of one block: `[num_layers][page_size
//!   × inner_dim]` elements), [`MemoryType`] and [`LayoutError`];
//! - `fully_contiguous`: [`FullyContiguous`] (all blocks in one region, the layers of a
//!   block side by side);
//! - `layer_separate`: [`LayerSeparate`] (one region per layer);
//! - `descriptor`: [`LayoutDescriptor`] and its binary form (the format is documented on
//!   the type), [`LayoutKind`] and [`LayoutDecodeError`].
//!
//! Invariants, established by the constructors and re-checked on every decode:
//! - a layout's config is valid and every byte size derived from it fits in a `u64`;
//! - every region base is aligned to `config.alignment`, every region is large enough,
//!   and `base_addr + len` does not overflow;
//! - the regions of a [`LayerSeparate`] share one memory type and device and are disjoint;
//! - hence [`BlockLayout::offset`] of distinct (block, layer) pairs never overlap, and each
//!   lies inside its region.
//!
//! Never: allocate or register device memory, or do any I/O. This module only computes
//! addresses; the backends own the memory they describe.

mod config;
mod descriptor;
mod fully_contiguous;
mod layer_separate;

pub use config::{DType, LayoutConfig, LayoutError, MemoryType};
pub use descriptor::{LayoutDecodeError, LayoutDescriptor, LayoutKind};
pub use fully_contiguous::FullyContiguous;
pub use layer_separate::LayerSeparate;

use config::{checked_add, widen};

/// A contiguous range of memory that a layout places blocks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Where its bytes live.
    pub memory_type: MemoryType,
    /// GPU ordinal for [`MemoryType::Device`]; 0 by convention for host memory and disk.
    pub device_id: u32,
    /// Absolute address (or disk offset) of the first byte.
    pub base_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A byte range: absolute start and length. [`BlockLayout::offset`] returns one per layer
/// of a block; a [`LayoutDescriptor`] lists its regions as these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    /// Absolute address (or disk offset) of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Checks that `region` holds `needed` bytes at an aligned base without wrapping around.
fn check_region(
    index: usize,
    region: &Region,
    needed: u64,
    alignment: u32,
) -> Result<(), LayoutError> {
    if region.base_addr & u64::from(alignment).saturating_sub(1) != 0 {
        return Err(LayoutError::MisalignedBase {
            region: index,
            base_addr: region.base_addr,
            alignment,
        });
    }
    checked_add(region.base_addr, region.len, "region end")?;
    if region.len < needed {
        return Err(LayoutError::RegionTooSmall {
            region: index,
            needed,
            len: region.len,
        });
    }
    Ok(())
}

fn check_indices(
    config: &LayoutConfig,
    num_blocks: usize,
    block: usize,
    layer: usize,
) -> Result<(), LayoutError> {
    if block >= num_blocks {
        return Err(LayoutError::BlockOutOfRange { block, num_blocks });
    }
    if widen(layer) >= u64::from(config.num_layers) {
        return Err(LayoutError::LayerOutOfRange {
            layer,
            num_layers: config.num_layers,
        });
    }
    Ok(())
}

/// Maps (block, layer) to memory. Implementations are immutable once built, so every
/// address they hand out stays valid for as long as the memory they describe.
pub trait BlockLayout {
    /// The block shape.
    fn config(&self) -> &LayoutConfig;
    /// Blocks in the layout.
    fn num_blocks(&self) -> usize;
    /// Where the bytes live.
    fn memory_type(&self) -> MemoryType;
    /// Which device (see [`Region::device_id`]).
    fn device_id(&self) -> u32;
    /// Bytes the blocks occupy, alignment padding included, summed over all regions.
    fn total_bytes(&self) -> u64;
    /// Distance in bytes from the start of one block to the next within a region.
    fn block_stride_bytes(&self) -> u64;
    /// Distance in bytes from one layer of a block to the next, when a block's layers lie
    /// in one region; `None` when each layer has its own region.
    fn layer_stride_bytes(&self) -> Option<u64>;
    /// The absolute address and length (`config().layer_bytes()`) of layer `layer` of
    /// block `block`.
    fn offset(&self, block: usize, layer: usize) -> Result<Address, LayoutError>;
    /// What a remote peer needs to compute the same addresses.
    fn descriptor(&self) -> LayoutDescriptor;
}

/// Either layout, as rebuilt from a descriptor whose kind is known only at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnyLayout {
    /// See [`FullyContiguous`].
    FullyContiguous(FullyContiguous),
    /// See [`LayerSeparate`].
    LayerSeparate(LayerSeparate),
}

impl AnyLayout {
    fn inner(&self) -> &dyn BlockLayout {
        match self {
            AnyLayout::FullyContiguous(layout) => layout,
            AnyLayout::LayerSeparate(layout) => layout,
        }
    }
}

impl BlockLayout for AnyLayout {
    fn config(&self) -> &LayoutConfig {
        self.inner().config()
    }

    fn num_blocks(&self) -> usize {
        self.inner().num_blocks()
    }

    fn memory_type(&self) -> MemoryType {
        self.inner().memory_type()
    }

    fn device_id(&self) -> u32 {
        self.inner().device_id()
    }

    fn total_bytes(&self) -> u64 {
        self.inner().total_bytes()
    }

    fn block_stride_bytes(&self) -> u64 {
        self.inner().block_stride_bytes()
    }

    fn layer_stride_bytes(&self) -> Option<u64> {
        self.inner().layer_stride_bytes()
    }

    fn offset(&self, block: usize, layer: usize) -> Result<Address, LayoutError> {
        self.inner().offset(block, layer)
    }

    fn descriptor(&self) -> LayoutDescriptor {
        self.inner().descriptor()
    }
}

impl From<FullyContiguous> for AnyLayout {
    fn from(layout: FullyContiguous) -> Self {
        AnyLayout::FullyContiguous(layout)
    }
}

impl From<LayerSeparate> for AnyLayout {
    fn from(layout: LayerSeparate) -> Self {
        AnyLayout::LayerSeparate(layout)
    }
}

#[cfg(test)]
mod tests;
