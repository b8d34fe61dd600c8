//! [`LayerSeparate`]: one region per layer (vLLM's per-layer KV tensors).
//!
//! Invariant: once built, the regions number `num_layers`, share one memory type and
//! device, are aligned, large enough and pairwise disjoint, so every
//! [`BlockLayout::offset`] it returns lies inside its layer's region and distinct (block,
//! layer) pairs never overlap.
//!
//! Never: allocate or touch the memory it describes.

use super::config::{checked_add, checked_mul, widen, LayoutConfig, LayoutError, MemoryType};
use super::{
    check_indices, check_region, Address, BlockLayout, LayoutDescriptor, LayoutKind, Region,
};

/// One region per layer, each at its own base (vLLM's per-layer KV tensors); within layer
/// `l`'s region, block `b` starts at `b × align_up(layer_bytes, alignment)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSeparate {
    config: LayoutConfig,
    num_blocks: usize,
    regions: Vec<Region>,
    memory_type: MemoryType,
    device_id: u32,
    layer_bytes: u64,
    block_stride: u64,
    total_bytes: u64,
}

impl LayerSeparate {
    /// Bytes each layer's region must hold for `num_blocks` blocks of `config`.
    pub fn required_bytes_per_region(
        config: &LayoutConfig,
        num_blocks: usize,
    ) -> Result<u64, LayoutError> {
        checked_mul(
            config.sizes()?.separate_block_stride,
            widen(num_blocks),
            "required bytes",
        )
    }

    /// The layout of `num_blocks` blocks with layer `l` in `regions[l]`. The regions must
    /// number `num_layers`, share one memory type and device, be disjoint, start aligned
    /// and each hold [`LayerSeparate::required_bytes_per_region`].
    pub fn new(
        config: LayoutConfig,
        num_blocks: usize,
        regions: Vec<Region>,
    ) -> Result<Self, LayoutError> {
        let sizes = config.sizes()?;
        let per_region = Self::required_bytes_per_region(&config, num_blocks)?;
        if widen(regions.len()) != u64::from(config.num_layers) {
            return Err(LayoutError::RegionCount {
                expected: usize::try_from(config.num_layers).unwrap_or(usize::MAX),
                got: regions.len(),
            });
        }
        let Some(first) = regions.first() else {
            return Err(LayoutError::Zero {
                field: "num_layers",
            });
        };
        let (memory_type, device_id) = (first.memory_type, first.device_id);
        for (index, region) in regions.iter().enumerate() {
            if (region.memory_type, region.device_id) != (memory_type, device_id) {
                return Err(LayoutError::MixedRegions { region: index });
            }
            check_region(index, region, per_region, config.alignment)?;
        }
        check_disjoint(&regions)?;
        Ok(Self {
            config,
            num_blocks,
            memory_type,
            device_id,
            layer_bytes: sizes.layer_bytes,
            block_stride: sizes.separate_block_stride,
            total_bytes: checked_mul(per_region, widen(regions.len()), "total bytes")?,
            regions,
        })
    }

    /// The regions, one per layer, in layer order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }
}

/// Rejects regions that share a byte. Callers have checked that no region end overflows.
fn check_disjoint(regions: &[Region]) -> Result<(), LayoutError> {
    let mut spans: Vec<(u64, u64, usize)> = regions
        .iter()
        .enumerate()
        .filter(|(_, region)| region.len > 0)
        .map(|(index, region)| {
            (
                region.base_addr,
                region.base_addr.saturating_add(region.len),
                index,
            )
        })
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if let [(_, end, a), (start, _, b)] = pair {
            // Sorted by start and disjoint so far, so the previous end is the furthest.
            if start < end {
                return Err(LayoutError::OverlappingRegions {
                    first: *a.min(b),
                    second: *a.max(b),
                });
            }
        }
    }
    Ok(())
}

impl BlockLayout for LayerSeparate {
    fn config(&self) -> &LayoutConfig {
        &self.config
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn memory_type(&self) -> MemoryType {
        self.memory_type
    }

    fn device_id(&self) -> u32 {
        self.device_id
    }

    fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn block_stride_bytes(&self) -> u64 {
        self.block_stride
    }

    fn layer_stride_bytes(&self) -> Option<u64> {
        None
    }

    fn offset(&self, block: usize, layer: usize) -> Result<Address, LayoutError> {
        check_indices(&self.config, self.num_blocks, block, layer)?;
        let region = self
            .regions
            .get(layer)
            .ok_or(LayoutError::LayerOutOfRange {
                layer,
                num_layers: self.config.num_layers,
            })?;
        let within = checked_mul(widen(block), self.block_stride, "offset")?;
        Ok(Address {
            addr: checked_add(region.base_addr, within, "address")?,
            len: self.layer_bytes,
        })
    }

    fn descriptor(&self) -> LayoutDescriptor {
        LayoutDescriptor {
            kind: LayoutKind::LayerSeparate,
            config: self.config,
            num_blocks: widen(self.num_blocks),
            memory_type: self.memory_type,
            device_id: self.device_id,
            block_stride_bytes: self.block_stride,
            layer_stride_bytes: None,
            regions: self
                .regions
                .iter()
                .map(|region| Address {
                    addr: region.base_addr,
                    len: region.len,
                })
                .collect(),
        }
    }
}
