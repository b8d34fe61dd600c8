//! Memory layouts of KV blocks: which bytes hold layer `l` of block `b`, and the portable
//! descriptor that lets a remote peer compute the same addresses (the NIXL metadata
//! exchange of seed 000).
//!
//! Owns: [`DType`], [`LayoutConfig`] (the shape of one block: `[num_layers][page_size ×
//! inner_dim]` elements), [`MemoryType`] and [`Region`] (where bytes live), the
//! [`BlockLayout`] trait with its two layouts [`FullyContiguous`] (all blocks in one region,
//! the layers of a block side by side) and [`LayerSeparate`] (one region per layer), the
//! [`AnyLayout`] sum of the two, and [`LayoutDescriptor`] with its binary form.
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
//!
//! # Descriptor format, version 1
//!
//! All integers little-endian, no padding between fields, nothing after the last one.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `b"KVLY"` |
//! | 4 | 2 | version, `u16` = 1 |
//! | 6 | 1 | kind: 0 fully contiguous, 1 layer separate |
//! | 7 | 1 | dtype: 0 F32, 1 F16, 2 BF16, 3 FP8 E4M3, 4 I8 |
//! | 8 | 1 | memory type: 0 device, 1 pinned, 2 system, 3 disk |
//! | 9 | 1 | reserved, 0 |
//! | 10 | 4 | device id, `u32` |
//! | 14 | 4 | num_layers, `u32` |
//! | 18 | 4 | page_size (tokens per block), `u32` |
//! | 22 | 4 | inner_dim (elements per token per layer), `u32` |
//! | 26 | 4 | alignment in bytes, `u32` |
//! | 30 | 8 | num_blocks, `u64` |
//! | 38 | 8 | block stride in bytes, `u64` |
//!
//! Then, for kind 0 (70 bytes in all): layer stride in bytes (`u64`, offset 46), the
//! region's base address (`u64`, 54) and length (`u64`, 62). For kind 1 (`46 + 16 ×
//! num_layers` bytes): `num_layers` regions in layer order, each a base address `u64` then
//! a length `u64`. The region count is implied by the kind and `num_layers`, never sent
//! separately, so a decoder can check the input holds that many before allocating.
//!
//! The strides are redundant with the config on purpose: a peer that computes them
//! differently (another alignment rule, another version of this code) is rejected instead
//! of reading the wrong bytes.

use serde::{Deserialize, Serialize};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float, 4 exponent and 3 mantissa bits.
    Fp8E4M3,
    /// 8-bit signed integer.
    I8,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> u32 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Fp8E4M3 | DType::I8 => 1,
        }
    }

    const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::Fp8E4M3 => 3,
            DType::I8 => 4,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(DType::F32),
            1 => Some(DType::F16),
            2 => Some(DType::BF16),
            3 => Some(DType::Fp8E4M3),
            4 => Some(DType::I8),
            _ => None,
        }
    }
}

/// Where a region's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryType {
    /// GPU memory (`device_id` is the GPU ordinal).
    Device,
    /// Page-locked host memory, reachable by DMA.
    Pinned,
    /// Ordinary pageable host memory.
    System,
    /// A file or block device; addresses are byte offsets into it.
    Disk,
}

impl MemoryType {
    const fn code(self) -> u8 {
        match self {
            MemoryType::Device => 0,
            MemoryType::Pinned => 1,
            MemoryType::System => 2,
            MemoryType::Disk => 3,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(MemoryType::Device),
            1 => Some(MemoryType::Pinned),
            2 => Some(MemoryType::System),
            3 => Some(MemoryType::Disk),
            _ => None,
        }
    }
}

/// A layout is inconsistent, or an address was asked for outside it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A config field (or a count) that must be at least 1 is 0.
    #[error("{field} must be at least 1")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// The alignment is not a power of two.
    #[error("alignment {0} is not a power of two")]
    AlignmentNotPowerOfTwo(u32),
    /// A byte size or address does not fit in its integer type.
    #[error("{quantity} overflows")]
    Overflow {
        /// What overflowed.
        quantity: &'static str,
    },
    /// A block index past the last block.
    #[error("block {block} out of range ({num_blocks} blocks)")]
    BlockOutOfRange {
        /// The requested block.
        block: usize,
        /// Blocks in the layout.
        num_blocks: usize,
    },
    /// A layer index past the last layer.
    #[error("layer {layer} out of range ({num_layers} layers)")]
    LayerOutOfRange {
        /// The requested layer.
        layer: usize,
        /// Layers in the layout.
        num_layers: u32,
    },
    /// A region smaller than the layout needs.
    #[error("region {region} holds {len} bytes, the layout needs {needed}")]
    RegionTooSmall {
        /// Index of the region (its layer for [`LayerSeparate`]).
        region: usize,
        /// Bytes needed.
        needed: u64,
        /// Bytes in the region.
        len: u64,
    },
    /// A region base that is not a multiple of the alignment.
    #[error("region {region} base {base_addr:#x} is not aligned to {alignment} bytes")]
    MisalignedBase {
        /// Index of the region.
        region: usize,
        /// Its base address.
        base_addr: u64,
        /// The required alignment.
        alignment: u32,
    },
    /// The wrong number of regions for the layout kind.
    #[error("expected {expected} regions, got {got}")]
    RegionCount {
        /// Regions the layout needs.
        expected: usize,
        /// Regions given.
        got: usize,
    },
    /// A region whose memory type or device differs from region 0's.
    #[error("region {region} is not in the same memory and device as region 0")]
    MixedRegions {
        /// Index of the odd region.
        region: usize,
    },
    /// Two regions share bytes, so their blocks would too.
    #[error("regions {first} and {second} overlap")]
    OverlappingRegions {
        /// The lower region index.
        first: usize,
        /// The higher region index.
        second: usize,
    },
    /// A stated block stride that differs from what the config implies.
    #[error("block stride is {got} bytes, the config implies {expected}")]
    BlockStrideMismatch {
        /// The implied stride.
        expected: u64,
        /// The stated stride.
        got: u64,
    },
    /// A stated layer stride that differs from what the layout kind and config imply.
    #[error("layer stride is {got:?}, the layout implies {expected:?}")]
    LayerStrideMismatch {
        /// The implied stride (`None`: layers live in separate regions).
        expected: Option<u64>,
        /// The stated stride.
        got: Option<u64>,
    },
    /// A descriptor of one kind converted to a layout of the other.
    #[error("descriptor is {got:?}, expected {expected:?}")]
    WrongKind {
        /// The kind asked for.
        expected: LayoutKind,
        /// The descriptor's kind.
        got: LayoutKind,
    },
}

/// Rounds `value` up to a multiple of `alignment`, a power of two.
fn align_up(value: u64, alignment: u32, quantity: &'static str) -> Result<u64, LayoutError> {
    let mask = u64::from(alignment).saturating_sub(1);
    value
        .checked_add(mask)
        .map(|v| v & !mask)
        .ok_or(LayoutError::Overflow { quantity })
}

/// `usize` is at most 64 bits on every target Rust supports, so this never truncates.
const fn widen(n: usize) -> u64 {
    n as u64
}

fn checked_mul(a: u64, b: u64, quantity: &'static str) -> Result<u64, LayoutError> {
    a.checked_mul(b).ok_or(LayoutError::Overflow { quantity })
}

fn checked_add(a: u64, b: u64, quantity: &'static str) -> Result<u64, LayoutError> {
    a.checked_add(b).ok_or(LayoutError::Overflow { quantity })
}

/// The shape of one block: `[num_layers][page_size × inner_dim]` elements of `dtype`.
///
/// Serde deserialisation does not validate; call [`LayoutConfig::validate`] (the layout
/// constructors do).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutConfig {
    /// Transformer layers.
    pub num_layers: u32,
    /// Tokens per block.
    pub page_size: u32,
    /// Elements per token per layer: `2 × num_kv_heads × head_dim` for K and V.
    pub inner_dim: u32,
    /// Element type.
    pub dtype: DType,
    /// Alignment of block strides and region bases, in bytes; a power of two, at least 1.
    pub alignment: u32,
}

/// Byte sizes derived from a valid config.
struct Sizes {
    layer_bytes: u64,
    contiguous_block_stride: u64,
    separate_block_stride: u64,
}

impl LayoutConfig {
    /// The alignment [`LayoutConfig::for_model`] uses: enough for any vectorised copy
    /// kernel and for GPU memory allocations.
    pub const DEFAULT_ALIGNMENT: u32 = 256;

    /// The validated shape of a model's KV cache: `inner_dim = 2 × num_kv_heads × head_dim`
    /// (K and V), [`LayoutConfig::DEFAULT_ALIGNMENT`].
    pub fn for_model(
        num_layers: u32,
        page_size: u32,
        num_kv_heads: u32,
        head_dim: u32,
        dtype: DType,
    ) -> Result<Self, LayoutError> {
        let inner_dim = 2u32
            .checked_mul(num_kv_heads)
            .and_then(|v| v.checked_mul(head_dim))
            .ok_or(LayoutError::Overflow {
                quantity: "inner_dim",
            })?;
        let config = Self {
            num_layers,
            page_size,
            inner_dim,
            dtype,
            alignment: Self::DEFAULT_ALIGNMENT,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks that no field is zero, that the alignment is a power of two, and that every
    /// byte size a layout derives from this config (aligned strides included) fits in a
    /// `u64`.
    pub fn validate(&self) -> Result<(), LayoutError> {
        self.sizes().map(|_| ())
    }

    /// Bytes of one layer of one block: `page_size × inner_dim × dtype size`. Does not
    /// validate; fails only on overflow.
    pub fn layer_bytes(&self) -> Result<u64, LayoutError> {
        let elements = checked_mul(
            u64::from(self.page_size),
            u64::from(self.inner_dim),
            "layer bytes",
        )?;
        checked_mul(elements, u64::from(self.dtype.size_bytes()), "layer bytes")
    }

    /// Bytes of one block, all layers, without padding: what a transfer of one block
    /// moves. Does not validate; fails only on overflow.
    pub fn block_bytes(&self) -> Result<u64, LayoutError> {
        checked_mul(
            u64::from(self.num_layers),
            self.layer_bytes()?,
            "block bytes",
        )
    }

    fn sizes(&self) -> Result<Sizes, LayoutError> {
        for (field, value) in [
            ("num_layers", self.num_layers),
            ("page_size", self.page_size),
            ("inner_dim", self.inner_dim),
            ("alignment", self.alignment),
        ] {
            if value == 0 {
                return Err(LayoutError::Zero { field });
            }
        }
        if !self.alignment.is_power_of_two() {
            return Err(LayoutError::AlignmentNotPowerOfTwo(self.alignment));
        }
        let layer_bytes = self.layer_bytes()?;
        Ok(Sizes {
            layer_bytes,
            contiguous_block_stride: align_up(self.block_bytes()?, self.alignment, "block stride")?,
            separate_block_stride: align_up(layer_bytes, self.alignment, "block stride")?,
        })
    }
}

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

/// Which layout a descriptor describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// [`FullyContiguous`].
    FullyContiguous,
    /// [`LayerSeparate`].
    LayerSeparate,
}

impl LayoutKind {
    const fn code(self) -> u8 {
        match self {
            LayoutKind::FullyContiguous => 0,
            LayoutKind::LayerSeparate => 1,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(LayoutKind::FullyContiguous),
            1 => Some(LayoutKind::LayerSeparate),
            _ => None,
        }
    }
}

/// Everything a peer needs to address our blocks: shape, strides, memory and regions.
///
/// The fields are public so a descriptor can be inspected or built by hand; nothing
/// trusts one until [`LayoutDescriptor::into_layout`] (or [`LayoutDescriptor::deserialize`],
/// which calls it) has checked it against the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutDescriptor {
    /// The layout kind.
    pub kind: LayoutKind,
    /// The block shape.
    pub config: LayoutConfig,
    /// Blocks in the layout.
    pub num_blocks: u64,
    /// Where the bytes live.
    pub memory_type: MemoryType,
    /// Which device.
    pub device_id: u32,
    /// See [`BlockLayout::block_stride_bytes`].
    pub block_stride_bytes: u64,
    /// See [`BlockLayout::layer_stride_bytes`]; `Some` exactly for fully contiguous.
    pub layer_stride_bytes: Option<u64>,
    /// The regions: one for fully contiguous, one per layer (in layer order) for layer
    /// separate.
    pub regions: Vec<Address>,
}

/// A layout descriptor could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutDecodeError {
    /// The input ends before a field it must contain.
    #[error("descriptor truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes needed to reach the end of the field that did not fit.
        needed: u64,
        /// Bytes present.
        got: usize,
    },
    /// The input does not start with `b"KVLY"`.
    #[error("bad descriptor magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A format version this code does not speak.
    #[error("unsupported descriptor version {0}")]
    UnsupportedVersion(u16),
    /// An unknown layout kind code.
    #[error("unknown layout kind {0}")]
    UnknownKind(u8),
    /// An unknown dtype code.
    #[error("unknown dtype {0}")]
    UnknownDType(u8),
    /// An unknown memory type code.
    #[error("unknown memory type {0}")]
    UnknownMemoryType(u8),
    /// The reserved byte is not zero: a newer writer meant something by it.
    #[error("reserved byte is {0}, not 0")]
    NonZeroReserved(u8),
    /// Bytes after the last region.
    #[error("{0} trailing bytes after the descriptor")]
    TrailingBytes(usize),
    /// The fields decode but do not describe a valid layout.
    #[error("invalid layout: {0}")]
    Invalid(#[from] LayoutError),
}

const MAGIC: [u8; 4] = *b"KVLY";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 46;
const REGION_LEN: usize = 16;

/// A cursor over untrusted bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn truncated(&self, wanted: u64) -> LayoutDecodeError {
        LayoutDecodeError::Truncated {
            needed: widen(self.at).saturating_add(wanted),
            got: self.bytes.len(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }

    /// Fails unless `wanted` more bytes are present.
    fn ensure(&self, wanted: u64) -> Result<(), LayoutDecodeError> {
        if widen(self.remaining()) < wanted {
            return Err(self.truncated(wanted));
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], LayoutDecodeError> {
        let chunk = self
            .bytes
            .get(self.at..)
            .and_then(|rest| rest.first_chunk::<N>())
            .ok_or_else(|| self.truncated(widen(N)))?;
        self.at += N;
        Ok(*chunk)
    }

    fn u8(&mut self) -> Result<u8, LayoutDecodeError> {
        let [byte] = self.array()?;
        Ok(byte)
    }

    fn u16(&mut self) -> Result<u16, LayoutDecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, LayoutDecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, LayoutDecodeError> {
        self.array().map(u64::from_le_bytes)
    }
}

impl LayoutDescriptor {
    /// The descriptor's bytes in format v1 (see the module docs). Descriptors from
    /// [`BlockLayout::descriptor`] or [`LayoutDescriptor::deserialize`] round-trip exactly;
    /// a hand-built one that [`LayoutDescriptor::into_layout`] would reject is encoded as
    /// far as the format has room for its fields, and need not round-trip.
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER_LEN
                .saturating_add(8)
                .saturating_add(self.regions.len().saturating_mul(REGION_LEN)),
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.kind.code());
        out.push(self.config.dtype.code());
        out.push(self.memory_type.code());
        out.push(0);
        out.extend_from_slice(&self.device_id.to_le_bytes());
        for value in [
            self.config.num_layers,
            self.config.page_size,
            self.config.inner_dim,
            self.config.alignment,
        ] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&self.num_blocks.to_le_bytes());
        out.extend_from_slice(&self.block_stride_bytes.to_le_bytes());
        if self.kind == LayoutKind::FullyContiguous {
            // A missing stride encodes as 0, which no valid config implies.
            out.extend_from_slice(&self.layer_stride_bytes.unwrap_or(0).to_le_bytes());
        }
        for region in &self.regions {
            out.extend_from_slice(&region.addr.to_le_bytes());
            out.extend_from_slice(&region.len.to_le_bytes());
        }
        out
    }

    /// Decodes format v1 and checks the result describes a valid layout. Never panics on
    /// any input, and allocates only once the input is known to hold the regions it
    /// claims.
    pub fn deserialize(bytes: &[u8]) -> Result<Self, LayoutDecodeError> {
        let mut reader = Reader { bytes, at: 0 };
        let magic = reader.array::<4>()?;
        if magic != MAGIC {
            return Err(LayoutDecodeError::BadMagic(magic));
        }
        let version = reader.u16()?;
        if version != VERSION {
            return Err(LayoutDecodeError::UnsupportedVersion(version));
        }
        let kind_code = reader.u8()?;
        let kind =
            LayoutKind::from_code(kind_code).ok_or(LayoutDecodeError::UnknownKind(kind_code))?;
        let dtype_code = reader.u8()?;
        let dtype =
            DType::from_code(dtype_code).ok_or(LayoutDecodeError::UnknownDType(dtype_code))?;
        let memory_code = reader.u8()?;
        let memory_type = MemoryType::from_code(memory_code)
            .ok_or(LayoutDecodeError::UnknownMemoryType(memory_code))?;
        let reserved = reader.u8()?;
        if reserved != 0 {
            return Err(LayoutDecodeError::NonZeroReserved(reserved));
        }
        let device_id = reader.u32()?;
        let config = LayoutConfig {
            num_layers: reader.u32()?,
            page_size: reader.u32()?,
            inner_dim: reader.u32()?,
            dtype,
            alignment: reader.u32()?,
        };
        let num_blocks = reader.u64()?;
        let block_stride_bytes = reader.u64()?;
        let (layer_stride_bytes, region_count) = match kind {
            LayoutKind::FullyContiguous => (Some(reader.u64()?), 1),
            LayoutKind::LayerSeparate => (None, config.num_layers),
        };
        // A peer claiming billions of layers must send their regions before we reserve
        // room for them.
        let region_bytes = u64::from(region_count).saturating_mul(widen(REGION_LEN));
        reader.ensure(region_bytes)?;
        let capacity = usize::try_from(region_count).map_err(|_| reader.truncated(region_bytes))?;
        let mut regions = Vec::with_capacity(capacity);
        for _ in 0..region_count {
            regions.push(Address {
                addr: reader.u64()?,
                len: reader.u64()?,
            });
        }
        if reader.remaining() > 0 {
            return Err(LayoutDecodeError::TrailingBytes(reader.remaining()));
        }
        let descriptor = Self {
            kind,
            config,
            num_blocks,
            memory_type,
            device_id,
            block_stride_bytes,
            layer_stride_bytes,
            regions,
        };
        descriptor.build()?;
        Ok(descriptor)
    }

    /// The layout this describes, after checking the config, the regions and that the
    /// stated strides are the ones the config implies.
    pub fn into_layout(self) -> Result<AnyLayout, LayoutError> {
        self.build()
    }

    fn build(&self) -> Result<AnyLayout, LayoutError> {
        let num_blocks = usize::try_from(self.num_blocks).map_err(|_| LayoutError::Overflow {
            quantity: "num_blocks",
        })?;
        let mut regions = self.regions.iter().map(|span| Region {
            memory_type: self.memory_type,
            device_id: self.device_id,
            base_addr: span.addr,
            len: span.len,
        });
        let layout = match self.kind {
            LayoutKind::FullyContiguous => match (regions.next(), self.regions.len()) {
                (Some(region), 1) => {
                    AnyLayout::from(FullyContiguous::new(self.config, num_blocks, region)?)
                }
                (_, got) => return Err(LayoutError::RegionCount { expected: 1, got }),
            },
            LayoutKind::LayerSeparate => AnyLayout::from(LayerSeparate::new(
                self.config,
                num_blocks,
                regions.collect(),
            )?),
        };
        if layout.block_stride_bytes() != self.block_stride_bytes {
            return Err(LayoutError::BlockStrideMismatch {
                expected: layout.block_stride_bytes(),
                got: self.block_stride_bytes,
            });
        }
        if layout.layer_stride_bytes() != self.layer_stride_bytes {
            return Err(LayoutError::LayerStrideMismatch {
                expected: layout.layer_stride_bytes(),
                got: self.layer_stride_bytes,
            });
        }
        Ok(layout)
    }

    fn expect_kind(&self, expected: LayoutKind) -> Result<(), LayoutError> {
        if self.kind != expected {
            return Err(LayoutError::WrongKind {
                expected,
                got: self.kind,
            });
        }
        Ok(())
    }
}

impl TryFrom<LayoutDescriptor> for AnyLayout {
    type Error = LayoutError;

    fn try_from(descriptor: LayoutDescriptor) -> Result<Self, LayoutError> {
        descriptor.into_layout()
    }
}

impl TryFrom<LayoutDescriptor> for FullyContiguous {
    type Error = LayoutError;

    fn try_from(descriptor: LayoutDescriptor) -> Result<Self, LayoutError> {
        descriptor.expect_kind(LayoutKind::FullyContiguous)?;
        match descriptor.into_layout()? {
            AnyLayout::FullyContiguous(layout) => Ok(layout),
            AnyLayout::LayerSeparate(_) => Err(LayoutError::WrongKind {
                expected: LayoutKind::FullyContiguous,
                got: LayoutKind::LayerSeparate,
            }),
        }
    }
}

impl TryFrom<LayoutDescriptor> for LayerSeparate {
    type Error = LayoutError;

    fn try_from(descriptor: LayoutDescriptor) -> Result<Self, LayoutError> {
        descriptor.expect_kind(LayoutKind::LayerSeparate)?;
        match descriptor.into_layout()? {
            AnyLayout::LayerSeparate(layout) => Ok(layout),
            AnyLayout::FullyContiguous(_) => Err(LayoutError::WrongKind {
                expected: LayoutKind::LayerSeparate,
                got: LayoutKind::FullyContiguous,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One layer of a block: 4 tokens × 10 elements × 2 bytes = 80 bytes; a block 240.
    fn config() -> LayoutConfig {
        LayoutConfig {
            num_layers: 3,
            page_size: 4,
            inner_dim: 10,
            dtype: DType::F16,
            alignment: 64,
        }
    }

    fn region(base_addr: u64, len: u64) -> Region {
        Region {
            memory_type: MemoryType::Pinned,
            device_id: 0,
            base_addr,
            len,
        }
    }

    fn three_layer_regions() -> Vec<Region> {
        vec![
            region(0x10000, 512),
            region(0x40000, 512),
            region(0x20000, 512),
        ]
    }

    fn fully_contiguous() -> FullyContiguous {
        FullyContiguous::new(config(), 5, region(0x1000, 1280)).unwrap()
    }

    fn layer_separate() -> LayerSeparate {
        LayerSeparate::new(config(), 4, three_layer_regions()).unwrap()
    }

    fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
        bytes[at..at + value.len()].copy_from_slice(value);
    }

    #[test]
    fn dtype_sizes_are_bytes_per_element() {
        let sizes = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Fp8E4M3,
            DType::I8,
        ]
        .map(DType::size_bytes);
        assert_eq!(sizes, [4, 2, 2, 1, 1]);
    }

    #[test]
    fn llama_3_8b_holds_128_kib_of_kv_per_token_and_2_mib_per_16_token_block() {
        let per_token = LayoutConfig::for_model(32, 1, 8, 128, DType::BF16).unwrap();
        assert_eq!(per_token.block_bytes(), Ok(131_072));
        let config = LayoutConfig::for_model(32, 16, 8, 128, DType::BF16).unwrap();
        assert_eq!(config.inner_dim, 2048);
        assert_eq!(config.alignment, 256);
        assert_eq!(config.layer_bytes(), Ok(65_536));
        assert_eq!(config.block_bytes(), Ok(2 << 20));
        assert_eq!(FullyContiguous::required_bytes(&config, 10), Ok(20 << 20));
    }

    #[test]
    fn for_model_rejects_an_inner_dim_that_overflows_u32() {
        assert_eq!(
            LayoutConfig::for_model(32, 16, 1 << 16, 1 << 16, DType::BF16),
            Err(LayoutError::Overflow {
                quantity: "inner_dim"
            })
        );
    }

    #[test]
    fn validate_names_each_zero_field() {
        for field in ["num_layers", "page_size", "inner_dim", "alignment"] {
            let mut zeroed = config();
            match field {
                "num_layers" => zeroed.num_layers = 0,
                "page_size" => zeroed.page_size = 0,
                "inner_dim" => zeroed.inner_dim = 0,
                _ => zeroed.alignment = 0,
            }
            assert_eq!(zeroed.validate(), Err(LayoutError::Zero { field }));
        }
    }

    #[test]
    fn validate_rejects_alignment_that_is_not_a_power_of_two() {
        let bad = LayoutConfig {
            alignment: 48,
            ..config()
        };
        assert_eq!(bad.validate(), Err(LayoutError::AlignmentNotPowerOfTwo(48)));
        let one = LayoutConfig {
            alignment: 1,
            ..config()
        };
        assert_eq!(one.validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_byte_sizes_that_overflow_u64() {
        let huge_layer = LayoutConfig {
            page_size: u32::MAX,
            inner_dim: u32::MAX,
            dtype: DType::F32,
            ..config()
        };
        assert_eq!(
            huge_layer.validate(),
            Err(LayoutError::Overflow {
                quantity: "layer bytes"
            })
        );
        let huge_block = LayoutConfig {
            num_layers: u32::MAX,
            page_size: u32::MAX,
            inner_dim: 2,
            dtype: DType::F32,
            alignment: 1,
        };
        assert_eq!(
            huge_block.validate(),
            Err(LayoutError::Overflow {
                quantity: "block bytes"
            })
        );
        // The payload fits exactly, but rounding it up to the alignment does not.
        let unaligned_max = LayoutConfig {
            // 257 × 42_009_217 × 1_708_606_335 = 2^64 - 1, which is odd.
            num_layers: 257,
            page_size: 42_009_217,
            inner_dim: 1_708_606_335,
            dtype: DType::I8,
            alignment: 2,
        };
        assert_eq!(unaligned_max.block_bytes(), Ok(u64::MAX));
        assert_eq!(
            unaligned_max.validate(),
            Err(LayoutError::Overflow {
                quantity: "block stride"
            })
        );
    }

    #[test]
    fn fully_contiguous_block_stride_is_aligned_up() {
        // 3 layers × 80 bytes = 240, rounded up to 64 bytes: 256.
        let layout = fully_contiguous();
        assert_eq!(layout.block_stride_bytes(), 256);
        assert_eq!(layout.layer_stride_bytes(), Some(80));
        assert_eq!(layout.total_bytes(), 1280);
        assert_eq!(FullyContiguous::required_bytes(&config(), 5), Ok(1280));
        assert_eq!(
            layout.offset(2, 1),
            Ok(Address {
                addr: 0x1000 + 2 * 256 + 80,
                len: 80
            })
        );
        assert_eq!(
            layout.offset(4, 2),
            Ok(Address {
                addr: 0x1000 + 4 * 256 + 2 * 80,
                len: 80
            })
        );
    }

    #[test]
    fn fully_contiguous_packs_blocks_tightly_with_alignment_one() {
        let config = LayoutConfig {
            alignment: 1,
            ..config()
        };
        let layout = FullyContiguous::new(config, 2, region(7, 480)).unwrap();
        assert_eq!(layout.block_stride_bytes(), 240);
        assert_eq!(layout.offset(1, 0), Ok(Address { addr: 247, len: 80 }));
    }

    #[test]
    fn fully_contiguous_rejects_a_bad_region() {
        assert_eq!(
            FullyContiguous::new(config(), 5, region(0x1000, 1279)),
            Err(LayoutError::RegionTooSmall {
                region: 0,
                needed: 1280,
                len: 1279
            })
        );
        assert_eq!(
            FullyContiguous::new(config(), 1, region(0x1020, 256)),
            Err(LayoutError::MisalignedBase {
                region: 0,
                base_addr: 0x1020,
                alignment: 64
            })
        );
        assert_eq!(
            FullyContiguous::new(config(), 1, region(u64::MAX - 63, 256)),
            Err(LayoutError::Overflow {
                quantity: "region end"
            })
        );
        assert_eq!(
            FullyContiguous::new(config(), usize::MAX, region(0, u64::MAX)),
            Err(LayoutError::Overflow {
                quantity: "required bytes"
            })
        );
    }

    #[test]
    fn layer_separate_places_blocks_at_the_aligned_layer_size() {
        // One layer of a block is 80 bytes, rounded up to 64 bytes: 128.
        let layout = layer_separate();
        assert_eq!(layout.block_stride_bytes(), 128);
        assert_eq!(layout.layer_stride_bytes(), None);
        assert_eq!(layout.total_bytes(), 3 * 512);
        assert_eq!(
            LayerSeparate::required_bytes_per_region(&config(), 4),
            Ok(512)
        );
        // Layer 1 lives in the region at 0x40000: regions need not be in address order.
        assert_eq!(
            layout.offset(3, 1),
            Ok(Address {
                addr: 0x40000 + 3 * 128,
                len: 80
            })
        );
        assert_eq!(
            layout.offset(0, 2),
            Ok(Address {
                addr: 0x20000,
                len: 80
            })
        );
    }

    #[test]
    fn layer_separate_rejects_inconsistent_regions() {
        assert_eq!(
            LayerSeparate::new(config(), 4, vec![region(0, 512)]),
            Err(LayoutError::RegionCount {
                expected: 3,
                got: 1
            })
        );
        let mut mixed = three_layer_regions();
        mixed[2].memory_type = MemoryType::Device;
        assert_eq!(
            LayerSeparate::new(config(), 4, mixed),
            Err(LayoutError::MixedRegions { region: 2 })
        );
        let mut other_device = three_layer_regions();
        other_device[1].device_id = 1;
        assert_eq!(
            LayerSeparate::new(config(), 4, other_device),
            Err(LayoutError::MixedRegions { region: 1 })
        );
        let mut overlapping = three_layer_regions();
        overlapping[2].base_addr = 0x40000 + 448;
        assert_eq!(
            LayerSeparate::new(config(), 4, overlapping),
            Err(LayoutError::OverlappingRegions {
                first: 1,
                second: 2
            })
        );
        let mut small = three_layer_regions();
        small[1].len = 511;
        assert_eq!(
            LayerSeparate::new(config(), 4, small),
            Err(LayoutError::RegionTooSmall {
                region: 1,
                needed: 512,
                len: 511
            })
        );
        let mut misaligned = three_layer_regions();
        misaligned[0].base_addr += 32;
        assert_eq!(
            LayerSeparate::new(config(), 4, misaligned),
            Err(LayoutError::MisalignedBase {
                region: 0,
                base_addr: 0x10020,
                alignment: 64
            })
        );
    }

    #[test]
    fn adjacent_and_empty_layer_regions_are_not_overlapping() {
        let adjacent = vec![region(0, 512), region(512, 512), region(1024, 512)];
        assert!(LayerSeparate::new(config(), 4, adjacent).is_ok());
        let empty_inside = vec![region(0, 512), region(128, 0), region(1024, 0)];
        assert!(LayerSeparate::new(config(), 0, empty_inside).is_ok());
    }

    #[test]
    fn offsets_past_the_last_block_or_layer_are_errors() {
        let layouts = [
            AnyLayout::from(fully_contiguous()),
            AnyLayout::from(layer_separate()),
        ];
        for layout in &layouts {
            let num_blocks = layout.num_blocks();
            assert_eq!(
                layout.offset(num_blocks, 0),
                Err(LayoutError::BlockOutOfRange {
                    block: num_blocks,
                    num_blocks
                })
            );
            assert_eq!(
                layout.offset(0, 3),
                Err(LayoutError::LayerOutOfRange {
                    layer: 3,
                    num_layers: 3
                })
            );
            assert!(layout.offset(num_blocks - 1, 2).is_ok());
        }
    }

    #[test]
    fn a_layout_without_blocks_has_no_addresses() {
        let layout = FullyContiguous::new(config(), 0, region(0, 0)).unwrap();
        assert_eq!(layout.total_bytes(), 0);
        assert_eq!(
            layout.offset(0, 0),
            Err(LayoutError::BlockOutOfRange {
                block: 0,
                num_blocks: 0
            })
        );
    }

    #[test]
    fn any_layout_reports_what_the_wrapped_layout_does() {
        let inner = layer_separate();
        let any = AnyLayout::from(inner.clone());
        assert_eq!(any.config(), inner.config());
        assert_eq!(any.memory_type(), MemoryType::Pinned);
        assert_eq!(any.device_id(), 0);
        assert_eq!(any.total_bytes(), inner.total_bytes());
        assert_eq!(any.offset(1, 1), inner.offset(1, 1));
        assert_eq!(any.descriptor(), inner.descriptor());
        assert_eq!(inner.regions(), three_layer_regions().as_slice());
        assert_eq!(fully_contiguous().region(), &region(0x1000, 1280));
    }

    #[test]
    fn serialised_descriptor_follows_the_documented_format() {
        let layout = FullyContiguous::new(
            config(),
            5,
            Region {
                device_id: 7,
                ..region(0x1000, 1280)
            },
        )
        .unwrap();
        let bytes = layout.descriptor().serialize();
        let mut expected = b"KVLY".to_vec();
        expected.extend_from_slice(&1u16.to_le_bytes());
        expected.extend_from_slice(&[0, 1, 1, 0]);
        for value in [7u32, 3, 4, 10, 64] {
            expected.extend_from_slice(&value.to_le_bytes());
        }
        for value in [5u64, 256, 80, 0x1000, 1280] {
            expected.extend_from_slice(&value.to_le_bytes());
        }
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), 70);
        let separate = layer_separate().descriptor().serialize();
        assert_eq!(separate.len(), 46 + 3 * 16);
        assert_eq!(separate[6], 1);
        assert_eq!(&separate[46..54], &0x10000u64.to_le_bytes());
        assert_eq!(&separate[62..70], &0x40000u64.to_le_bytes());
    }

    #[test]
    fn descriptors_round_trip_and_rebuild_the_same_layout() {
        let contiguous = fully_contiguous();
        let decoded = LayoutDescriptor::deserialize(&contiguous.descriptor().serialize()).unwrap();
        assert_eq!(decoded, contiguous.descriptor());
        assert_eq!(
            FullyContiguous::try_from(decoded.clone()),
            Ok(contiguous.clone())
        );
        assert_eq!(decoded.into_layout(), Ok(AnyLayout::from(contiguous)));

        let separate = layer_separate();
        let decoded = LayoutDescriptor::deserialize(&separate.descriptor().serialize()).unwrap();
        assert_eq!(decoded, separate.descriptor());
        assert_eq!(
            AnyLayout::try_from(decoded.clone()),
            Ok(AnyLayout::from(separate.clone()))
        );
        assert_eq!(LayerSeparate::try_from(decoded), Ok(separate));
    }

    #[test]
    fn converting_a_descriptor_to_the_other_layout_kind_is_an_error() {
        assert_eq!(
            LayerSeparate::try_from(fully_contiguous().descriptor()),
            Err(LayoutError::WrongKind {
                expected: LayoutKind::LayerSeparate,
                got: LayoutKind::FullyContiguous
            })
        );
        assert_eq!(
            FullyContiguous::try_from(layer_separate().descriptor()),
            Err(LayoutError::WrongKind {
                expected: LayoutKind::FullyContiguous,
                got: LayoutKind::LayerSeparate
            })
        );
    }

    #[test]
    fn into_layout_rechecks_hand_built_descriptors() {
        let mut two_regions = fully_contiguous().descriptor();
        two_regions.regions.push(Address {
            addr: 0x8000,
            len: 1280,
        });
        assert_eq!(
            two_regions.into_layout(),
            Err(LayoutError::RegionCount {
                expected: 1,
                got: 2
            })
        );
        let mut with_layer_stride = layer_separate().descriptor();
        with_layer_stride.layer_stride_bytes = Some(80);
        assert_eq!(
            with_layer_stride.into_layout(),
            Err(LayoutError::LayerStrideMismatch {
                expected: None,
                got: Some(80)
            })
        );
        let mut too_many_blocks = fully_contiguous().descriptor();
        too_many_blocks.num_blocks = u64::MAX;
        assert!(too_many_blocks.into_layout().is_err());
    }

    #[test]
    fn decoding_reports_each_malformation_by_kind() {
        let good = fully_contiguous().descriptor().serialize();
        let with = |at: usize, value: &[u8]| {
            let mut bytes = good.clone();
            put(&mut bytes, at, value);
            LayoutDescriptor::deserialize(&bytes)
        };
        use LayoutDecodeError as E;
        assert_eq!(
            LayoutDescriptor::deserialize(&[]),
            Err(E::Truncated { needed: 4, got: 0 })
        );
        assert_eq!(
            LayoutDescriptor::deserialize(&good[..50]),
            Err(E::Truncated {
                needed: 54,
                got: 50
            })
        );
        assert_eq!(with(0, b"KVLZ"), Err(E::BadMagic(*b"KVLZ")));
        assert_eq!(with(4, &2u16.to_le_bytes()), Err(E::UnsupportedVersion(2)));
        assert_eq!(with(6, &[7]), Err(E::UnknownKind(7)));
        assert_eq!(with(7, &[99]), Err(E::UnknownDType(99)));
        assert_eq!(with(8, &[9]), Err(E::UnknownMemoryType(9)));
        assert_eq!(with(9, &[1]), Err(E::NonZeroReserved(1)));
        let mut long = good.clone();
        long.extend_from_slice(&[0, 0]);
        assert_eq!(
            LayoutDescriptor::deserialize(&long),
            Err(E::TrailingBytes(2))
        );
        // A layer-separate descriptor of 3 layers needs 3 regions, not 1 region and a stride.
        assert_eq!(
            with(6, &[1]),
            Err(E::Truncated {
                needed: 94,
                got: 70
            })
        );
    }

    #[test]
    fn decoding_rejects_fields_that_contradict_the_config() {
        let good = fully_contiguous().descriptor().serialize();
        let with = |at: usize, value: &[u8]| {
            let mut bytes = good.clone();
            put(&mut bytes, at, value);
            LayoutDescriptor::deserialize(&bytes)
        };
        use LayoutDecodeError::Invalid;
        assert_eq!(
            with(38, &512u64.to_le_bytes()),
            Err(Invalid(LayoutError::BlockStrideMismatch {
                expected: 256,
                got: 512
            }))
        );
        assert_eq!(
            with(46, &96u64.to_le_bytes()),
            Err(Invalid(LayoutError::LayerStrideMismatch {
                expected: Some(80),
                got: Some(96)
            }))
        );
        assert_eq!(
            with(18, &0u32.to_le_bytes()),
            Err(Invalid(LayoutError::Zero { field: "page_size" }))
        );
        assert_eq!(
            with(26, &48u32.to_le_bytes()),
            Err(Invalid(LayoutError::AlignmentNotPowerOfTwo(48)))
        );
        assert_eq!(
            with(54, &0x1008u64.to_le_bytes()),
            Err(Invalid(LayoutError::MisalignedBase {
                region: 0,
                base_addr: 0x1008,
                alignment: 64
            }))
        );
        assert_eq!(
            with(62, &1024u64.to_le_bytes()),
            Err(Invalid(LayoutError::RegionTooSmall {
                region: 0,
                needed: 1280,
                len: 1024
            }))
        );
    }

    #[test]
    fn a_huge_layer_count_with_a_short_input_is_refused_before_allocating() {
        let mut bytes = layer_separate().descriptor().serialize();
        put(&mut bytes, 14, &u32::MAX.to_le_bytes());
        assert_eq!(
            LayoutDescriptor::deserialize(&bytes),
            Err(LayoutDecodeError::Truncated {
                needed: 46 + 16 * u64::from(u32::MAX),
                got: 94
            })
        );
    }

    fn arb_dtype() -> impl Strategy<Value = DType> {
        prop::sample::select(vec![
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Fp8E4M3,
            DType::I8,
        ])
    }

    fn arb_memory_type() -> impl Strategy<Value = MemoryType> {
        prop::sample::select(vec![
            MemoryType::Device,
            MemoryType::Pinned,
            MemoryType::System,
            MemoryType::Disk,
        ])
    }

    fn arb_config() -> impl Strategy<Value = LayoutConfig> {
        (1u32..6, 1u32..33, 1u32..64, arb_dtype(), 0u32..12).prop_map(
            |(num_layers, page_size, inner_dim, dtype, shift)| LayoutConfig {
                num_layers,
                page_size,
                inner_dim,
                dtype,
                alignment: 1 << shift,
            },
        )
    }

    /// A valid layout with regions at unrelated aligned bases, with slack after them and,
    /// for layer separate, in shuffled address order.
    fn arb_layout() -> impl Strategy<Value = AnyLayout> {
        (
            arb_config(),
            0usize..10,
            any::<bool>(),
            arb_memory_type(),
            any::<u32>(),
        )
            .prop_flat_map(|(config, num_blocks, separate, memory_type, device_id)| {
                let layers = config.num_layers as usize;
                (
                    Just((config, num_blocks, separate, memory_type, device_id)),
                    prop::collection::vec((0u64..4, 0u64..300), layers),
                    Just((0..layers).collect::<Vec<_>>()).prop_shuffle(),
                )
            })
            .prop_map(
                |((config, num_blocks, separate, memory_type, device_id), slots, order)| {
                    let alignment = u64::from(config.alignment);
                    let needed = if separate {
                        LayerSeparate::required_bytes_per_region(&config, num_blocks).unwrap()
                    } else {
                        FullyContiguous::required_bytes(&config, num_blocks).unwrap()
                    };
                    let mut cursor = 1u64 << 40;
                    let mut placed = Vec::new();
                    for (gap, slack) in slots {
                        let base =
                            align_up(cursor, config.alignment, "test").unwrap() + gap * alignment;
                        placed.push(Region {
                            memory_type,
                            device_id,
                            base_addr: base,
                            len: needed + slack,
                        });
                        cursor = base + needed + slack;
                    }
                    if separate {
                        let regions = order.iter().map(|&slot| placed[slot]).collect();
                        AnyLayout::from(LayerSeparate::new(config, num_blocks, regions).unwrap())
                    } else {
                        AnyLayout::from(
                            FullyContiguous::new(config, num_blocks, placed[0]).unwrap(),
                        )
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn deserialising_arbitrary_bytes_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let _ = LayoutDescriptor::deserialize(&bytes);
        }

        #[test]
        fn deserialising_garbage_after_a_valid_prefix_never_panics(
            kind in 0u8..2,
            rest in prop::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = b"KVLY".to_vec();
            bytes.extend_from_slice(&VERSION.to_le_bytes());
            bytes.push(kind);
            bytes.extend_from_slice(&rest);
            let _ = LayoutDescriptor::deserialize(&bytes);
        }

        #[test]
        fn a_mutated_descriptor_is_rejected_or_round_trips(
            layout in arb_layout(),
            at in any::<prop::sample::Index>(),
            value in any::<u8>(),
        ) {
            let mut bytes = layout.descriptor().serialize();
            let at = at.index(bytes.len());
            bytes[at] = value;
            if let Ok(decoded) = LayoutDescriptor::deserialize(&bytes) {
                prop_assert_eq!(decoded.serialize(), bytes);
                prop_assert!(decoded.into_layout().is_ok());
            }
        }

        #[test]
        fn valid_descriptors_round_trip_exactly(layout in arb_layout()) {
            let descriptor = layout.descriptor();
            let decoded = LayoutDescriptor::deserialize(&descriptor.serialize());
            prop_assert_eq!(decoded.as_ref(), Ok(&descriptor));
            prop_assert_eq!(descriptor.into_layout(), Ok(layout));
        }

        #[test]
        fn every_truncation_of_a_valid_descriptor_is_rejected(layout in arb_layout()) {
            let bytes = layout.descriptor().serialize();
            for len in 0..bytes.len() {
                let truncated = LayoutDescriptor::deserialize(&bytes[..len]);
                prop_assert!(
                    matches!(truncated, Err(LayoutDecodeError::Truncated { .. })),
                    "{} of {} bytes gave {:?}", len, bytes.len(), truncated
                );
            }
        }

        #[test]
        fn offsets_never_overlap_and_stay_inside_their_regions(layout in arb_layout()) {
            let alignment = u64::from(layout.config().alignment);
            let layer_bytes = layout.config().layer_bytes().unwrap();
            let mut spans = Vec::new();
            for block in 0..layout.num_blocks() {
                for layer in 0..layout.config().num_layers as usize {
                    let address = layout.offset(block, layer).unwrap();
                    let region = match &layout {
                        AnyLayout::FullyContiguous(inner) => *inner.region(),
                        AnyLayout::LayerSeparate(inner) => inner.regions()[layer],
                    };
                    prop_assert_eq!(address.len, layer_bytes);
                    prop_assert!(address.addr >= region.base_addr);
                    prop_assert!(address.addr + address.len <= region.base_addr + region.len);
                    if layer == 0 || layout.layer_stride_bytes().is_none() {
                        prop_assert_eq!(address.addr % alignment, 0);
                    }
                    spans.push((address.addr, address.addr + address.len));
                }
            }
            let total: u64 = spans.iter().map(|(start, end)| end - start).sum();
            prop_assert!(total <= layout.total_bytes());
            spans.sort_unstable();
            for pair in spans.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "{:?} overlaps {:?}", pair[0], pair[1]);
            }
        }
    }
}
