//! Memory layouts of KV blocks: where each layer of each block lives, and a portable
//! descriptor so a remote peer can address our blocks (seed 000, NIXL metadata exchange).
//!
//! Owns: [`LayoutConfig`] (layers, tokens per block, inner dimension, dtype, alignment),
//! the two layouts [`FullyContiguous`] (all layers of a block together, block stride
//! aligned up) and [`LayerSeparate`] (one region per layer), the [`BlockLayout`] trait that
//! maps (block, layer) to an address, and [`LayoutDescriptor`] with its binary form.
//!
//! Descriptor format v1, integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"KVLY"` |
//! | 4..6 | version: u16 = 1 |
//! | 6 | kind: 0 fully contiguous, 1 layer separate |
//! | 7 | dtype (see [`DType::code`]) |
//! | 8 | memory type (see [`MemoryType::code`]) |
//! | 9 | padding, zero |
//! | 10..14 | device id: u32 |
//! | 14..18 / 18..22 / 22..26 / 26..30 | num_layers, page_size, inner_dim, alignment: u32 |
//! | 30..38 / 38..46 / 46..54 | num_blocks, block_stride, layer_stride: u64 |
//! | 54..58 | region count: u32 (1, or num_layers for layer separate) |
//! | 58.. | regions: (base address u64, length u64) each |
//!
//! Invariant: a layout never hands out overlapping or out-of-region addresses; a
//! descriptor is re-validated on decode (strides must be what the config implies).
//! Never: allocate or register memory, or do I/O; it only computes addresses.

use serde::{Deserialize, Serialize};

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float (E4M3).
    Fp8E4M3,
    /// 8-bit integer.
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

    /// The descriptor's code for this dtype.
    pub const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::Fp8E4M3 => 3,
            DType::I8 => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::BF16,
            3 => DType::Fp8E4M3,
            4 => DType::I8,
            _ => return None,
        })
    }
}

/// Where a region's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryType {
    /// GPU memory.
    Device,
    /// Page-locked host memory.
    Pinned,
    /// Ordinary host memory.
    System,
    /// A file or block device.
    Disk,
}

impl MemoryType {
    /// The descriptor's code for this memory type.
    pub const fn code(self) -> u8 {
        match self {
            MemoryType::Device => 0,
            MemoryType::Pinned => 1,
            MemoryType::System => 2,
            MemoryType::Disk => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => MemoryType::Device,
            1 => MemoryType::Pinned,
            2 => MemoryType::System,
            3 => MemoryType::Disk,
            _ => return None,
        })
    }
}

/// The shape of one block: `[num_layers][page_size × inner_dim]` elements of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutConfig {
    /// Transformer layers.
    pub num_layers: u32,
    /// Tokens per block.
    pub page_size: u32,
    /// Elements per token per layer (2 × KV heads × head dim for K and V).
    pub inner_dim: u32,
    /// Element type.
    pub dtype: DType,
    /// Alignment of strides and base addresses, in bytes; a power of two.
    pub alignment: u32,
}

/// A layout is inconsistent or an address was asked for outside it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A size field is zero.
    #[error("{field} must be at least 1")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// The alignment is not a power of two.
    #[error("alignment {0} is not a power of two")]
    AlignmentNotPowerOfTwo(u32),
    /// A byte size does not fit in 64 bits.
    #[error("layout size overflows 64 bits")]
    Overflow,
    /// A block index past the end.
    #[error("block {block} out of range ({num_blocks} blocks)")]
    BlockOutOfRange {
        /// Requested block.
        block: u64,
        /// Blocks in the layout.
        num_blocks: u64,
    },
    /// A layer index past the end.
    #[error("layer {layer} out of range ({num_layers} layers)")]
    LayerOutOfRange {
        /// Requested layer.
        layer: u32,
        /// Layers in the layout.
        num_layers: u32,
    },
    /// A region smaller than the layout needs.
    #[error("region of {len} bytes, layout needs {needed}")]
    RegionTooSmall {
        /// Bytes needed.
        needed: u64,
        /// Bytes in the region.
        len: u64,
    },
    /// A base address that is not aligned.
    #[error("base address {addr:#x} not aligned to {alignment}")]
    MisalignedBase {
        /// The address.
        addr: u64,
        /// The alignment.
        alignment: u32,
    },
    /// The wrong number of regions for the layout kind.
    #[error("expected {expected} regions, got {got}")]
    RegionCount {
        /// Regions required.
        expected: u64,
        /// Regions given.
        got: u64,
    },
    /// A stride that differs from what the config implies.
    #[error("{field} is {got}, the config implies {expected}")]
    StrideMismatch {
        /// Which stride.
        field: &'static str,
        /// Implied value.
        expected: u64,
        /// Given value.
        got: u64,
    },
    /// Regions with different memory types or devices in one layout.
    #[error("regions of one layout must share memory type and device")]
    MixedRegions,
}

fn align_up(value: u64, alignment: u32) -> Result<u64, LayoutError> {
    let mask = u64::from(alignment) - 1;
    value
        .checked_add(mask)
        .map(|v| v & !mask)
        .ok_or(LayoutError::Overflow)
}

impl LayoutConfig {
    /// The layout of a model's KV cache: `inner_dim = 2 × num_kv_heads × head_dim`
    /// (K and V), 256-byte alignment.
    pub fn for_model(
        num_layers: u32,
        page_size: u32,
        num_kv_heads: u32,
        head_dim: u32,
        dtype: DType,
    ) -> Self {
        Self {
            num_layers,
            page_size,
            inner_dim: 2u32.saturating_mul(num_kv_heads).saturating_mul(head_dim),
            dtype,
            alignment: 256,
        }
    }

    /// Checks fields and that every size fits in 64 bits.
    pub fn validate(&self) -> Result<(), LayoutError> {
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
        let block = self.try_block_bytes()?;
        align_up(block, self.alignment)?;
        Ok(())
    }

    fn try_layer_bytes(&self) -> Result<u64, LayoutError> {
        u64::from(self.page_size)
            .checked_mul(u64::from(self.inner_dim))
            .and_then(|v| v.checked_mul(u64::from(self.dtype.size_bytes())))
            .ok_or(LayoutError::Overflow)
    }

    fn try_block_bytes(&self) -> Result<u64, LayoutError> {
        self.try_layer_bytes()?
            .checked_mul(u64::from(self.num_layers))
            .ok_or(LayoutError::Overflow)
    }

    /// Bytes of one layer of one block (saturating; exact for validated configs).
    pub fn layer_bytes(&self) -> u64 {
        self.try_layer_bytes().unwrap_or(u64::MAX)
    }

    /// Bytes of one block, all layers, without padding (saturating; exact for validated
    /// configs): what a transfer of one block moves.
    pub fn block_bytes(&self) -> u64 {
        self.try_block_bytes().unwrap_or(u64::MAX)
    }

    /// KV bytes per token, all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.block_bytes() / u64::from(self.page_size.max(1))
    }
}

/// A contiguous memory range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Where its bytes live.
    pub memory_type: MemoryType,
    /// Which device (GPU ordinal; 0 for host memory).
    pub device_id: u32,
    /// First byte's address.
    pub base_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One layer of one block: where it starts and how long it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    /// Absolute address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// Maps (block, layer) to memory.
pub trait BlockLayout {
    /// The block shape.
    fn config(&self) -> &LayoutConfig;
    /// Blocks in the layout.
    fn num_blocks(&self) -> u64;
    /// Where the bytes live.
    fn memory_type(&self) -> MemoryType;
    /// Which device.
    fn device_id(&self) -> u32;
    /// Bytes the layout spans, padding included.
    fn total_bytes(&self) -> u64;
    /// Distance between consecutive blocks.
    fn block_stride_bytes(&self) -> u64;
    /// Distance between consecutive layers of one block (0 when layers live in separate
    /// regions).
    fn layer_stride_bytes(&self) -> u64;
    /// Layer `layer` of block `block`.
    fn offset(&self, block: u64, layer: u32) -> Result<Address, LayoutError>;
    /// The portable descriptor of this layout.
    fn descriptor(&self) -> LayoutDescriptor;
}

fn check_indices(
    config: &LayoutConfig,
    num_blocks: u64,
    block: u64,
    layer: u32,
) -> Result<(), LayoutError> {
    if block >= num_blocks {
        return Err(LayoutError::BlockOutOfRange { block, num_blocks });
    }
    if layer >= config.num_layers {
        return Err(LayoutError::LayerOutOfRange {
            layer,
            num_layers: config.num_layers,
        });
    }
    Ok(())
}

fn check_region(region: &Region, needed: u64, alignment: u32) -> Result<(), LayoutError> {
    if region.base_addr % u64::from(alignment) != 0 {
        return Err(LayoutError::MisalignedBase {
            addr: region.base_addr,
            alignment,
        });
    }
    if region.len < needed {
        return Err(LayoutError::RegionTooSmall {
            needed,
            len: region.len,
        });
    }
    region
        .base_addr
        .checked_add(needed)
        .ok_or(LayoutError::Overflow)?;
    Ok(())
}

/// All layers of a block together, blocks one after another at an aligned stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullyContiguous {
    config: LayoutConfig,
    num_blocks: u64,
    region: Region,
    block_stride: u64,
}

impl FullyContiguous {
    /// Block stride: all layers of a block, aligned up.
    pub fn block_stride_for(config: &LayoutConfig) -> Result<u64, LayoutError> {
        config.validate()?;
        align_up(config.try_block_bytes()?, config.alignment)
    }

    /// Bytes a region must have for `num_blocks` blocks.
    pub fn required_bytes(config: &LayoutConfig, num_blocks: u64) -> Result<u64, LayoutError> {
        Self::block_stride_for(config)?
            .checked_mul(num_blocks)
            .ok_or(LayoutError::Overflow)
    }

    /// The layout of `num_blocks` blocks in `region`.
    pub fn new(config: LayoutConfig, num_blocks: u64, region: Region) -> Result<Self, LayoutError> {
        if num_blocks == 0 {
            return Err(LayoutError::Zero {
                field: "num_blocks",
            });
        }
        let block_stride = Self::block_stride_for(&config)?;
        let needed = block_stride
            .checked_mul(num_blocks)
            .ok_or(LayoutError::Overflow)?;
        check_region(&region, needed, config.alignment)?;
        Ok(Self {
            config,
            num_blocks,
            region,
            block_stride,
        })
    }
}

impl BlockLayout for FullyContiguous {
    fn config(&self) -> &LayoutConfig {
        &self.config
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    fn memory_type(&self) -> MemoryType {
        self.region.memory_type
    }

    fn device_id(&self) -> u32 {
        self.region.device_id
    }

    fn total_bytes(&self) -> u64 {
        self.block_stride * self.num_blocks
    }

    fn block_stride_bytes(&self) -> u64 {
        self.block_stride
    }

    fn layer_stride_bytes(&self) -> u64 {
        self.config.layer_bytes()
    }

    fn offset(&self, block: u64, layer: u32) -> Result<Address, LayoutError> {
        check_indices(&self.config, self.num_blocks, block, layer)?;
        // In range by construction: new() checked base + stride × blocks fits.
        let addr = self.region.base_addr
            + block * self.block_stride
            + u64::from(layer) * self.config.layer_bytes();
        Ok(Address {
            addr,
            len: self.config.layer_bytes(),
        })
    }

    fn descriptor(&self) -> LayoutDescriptor {
        LayoutDescriptor {
            kind: LayoutKind::FullyContiguous,
            config: self.config,
            num_blocks: self.num_blocks,
            memory_type: self.region.memory_type,
            device_id: self.region.device_id,
            block_stride: self.block_stride,
            layer_stride: self.config.layer_bytes(),
            regions: vec![(self.region.base_addr, self.region.len)],
        }
    }
}

/// One region per layer; within a layer's region, blocks at an aligned stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSeparate {
    config: LayoutConfig,
    num_blocks: u64,
    regions: Vec<Region>,
    block_stride: u64,
}

impl LayerSeparate {
    /// Block stride within a layer region: one layer of a block, aligned up.
    pub fn block_stride_for(config: &LayoutConfig) -> Result<u64, LayoutError> {
        config.validate()?;
        align_up(config.try_layer_bytes()?, config.alignment)
    }

    /// The layout of `num_blocks` blocks, layer `l` in `regions[l]`.
    pub fn new(
        config: LayoutConfig,
        num_blocks: u64,
        regions: Vec<Region>,
    ) -> Result<Self, LayoutError> {
        if num_blocks == 0 {
            return Err(LayoutError::Zero {
                field: "num_blocks",
            });
        }
        let block_stride = Self::block_stride_for(&config)?;
        if regions.len() as u64 != u64::from(config.num_layers) {
            return Err(LayoutError::RegionCount {
                expected: u64::from(config.num_layers),
                got: regions.len() as u64,
            });
        }
        let needed = block_stride
            .checked_mul(num_blocks)
            .ok_or(LayoutError::Overflow)?;
        for region in &regions {
            if (region.memory_type, region.device_id)
                != (regions[0].memory_type, regions[0].device_id)
            {
                return Err(LayoutError::MixedRegions);
            }
            check_region(region, needed, config.alignment)?;
        }
        Ok(Self {
            config,
            num_blocks,
            regions,
            block_stride,
        })
    }
}

impl BlockLayout for LayerSeparate {
    fn config(&self) -> &LayoutConfig {
        &self.config
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    fn memory_type(&self) -> MemoryType {
        self.regions[0].memory_type
    }

    fn device_id(&self) -> u32 {
        self.regions[0].device_id
    }

    fn total_bytes(&self) -> u64 {
        self.block_stride * self.num_blocks * u64::from(self.config.num_layers)
    }

    fn block_stride_bytes(&self) -> u64 {
        self.block_stride
    }

    fn layer_stride_bytes(&self) -> u64 {
        0
    }

    fn offset(&self, block: u64, layer: u32) -> Result<Address, LayoutError> {
        check_indices(&self.config, self.num_blocks, block, layer)?;
        let addr = self.regions[layer as usize].base_addr + block * self.block_stride;
        Ok(Address {
            addr,
            len: self.config.layer_bytes(),
        })
    }

    fn descriptor(&self) -> LayoutDescriptor {
        LayoutDescriptor {
            kind: LayoutKind::LayerSeparate,
            config: self.config,
            num_blocks: self.num_blocks,
            memory_type: self.memory_type(),
            device_id: self.device_id(),
            block_stride: self.block_stride,
            layer_stride: 0,
            regions: self.regions.iter().map(|r| (r.base_addr, r.len)).collect(),
        }
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

/// Everything a peer needs to address our blocks: shape, strides, memory and regions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutDescriptor {
    /// Layout kind.
    pub kind: LayoutKind,
    /// Block shape.
    pub config: LayoutConfig,
    /// Blocks.
    pub num_blocks: u64,
    /// Where the bytes live.
    pub memory_type: MemoryType,
    /// Which device.
    pub device_id: u32,
    /// Distance between blocks.
    pub block_stride: u64,
    /// Distance between layers of a block (0 for layer separate).
    pub layer_stride: u64,
    /// (base address, length) of each region.
    pub regions: Vec<(u64, u64)>,
}

/// A layout descriptor could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutDecodeError {
    /// Fewer bytes than the format needs.
    #[error("descriptor truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// Not `KVLY`.
    #[error("bad descriptor magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A version this code does not speak.
    #[error("unsupported descriptor version {0}")]
    UnsupportedVersion(u16),
    /// An unknown layout kind.
    #[error("unknown layout kind {0}")]
    UnknownKind(u8),
    /// An unknown dtype.
    #[error("unknown dtype {0}")]
    UnknownDType(u8),
    /// An unknown memory type.
    #[error("unknown memory type {0}")]
    UnknownMemoryType(u8),
    /// A padding byte that is not zero.
    #[error("non-zero padding")]
    NonZeroPadding,
    /// Bytes after the last region.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    /// The fields decode but do not describe a valid layout.
    #[error("invalid layout: {0}")]
    Invalid(#[from] LayoutError),
}

const MAGIC: [u8; 4] = *b"KVLY";
const VERSION: u16 = 1;
const FIXED_LEN: usize = 58;
const REGION_LEN: usize = 16;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        // Callers check the total length first; this cannot run past the end.
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

impl LayoutDescriptor {
    /// The descriptor's bytes (format v1, see the module docs).
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_LEN + REGION_LEN * self.regions.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(match self.kind {
            LayoutKind::FullyContiguous => 0,
            LayoutKind::LayerSeparate => 1,
        });
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
        for value in [self.num_blocks, self.block_stride, self.layer_stride] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&(self.regions.len() as u32).to_le_bytes());
        for (base, len) in &self.regions {
            out.extend_from_slice(&base.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out
    }

    /// Decodes and validates a descriptor. Never panics; allocates only what the input's
    /// length justifies.
    pub fn deserialize(bytes: &[u8]) -> Result<Self, LayoutDecodeError> {
        if bytes.len() < FIXED_LEN {
            return Err(LayoutDecodeError::Truncated {
                needed: FIXED_LEN,
                got: bytes.len(),
            });
        }
        let mut reader = Reader { bytes, at: 0 };
        let magic: [u8; 4] = reader.take();
        if magic != MAGIC {
            return Err(LayoutDecodeError::BadMagic(magic));
        }
        let version = reader.u16();
        if version != VERSION {
            return Err(LayoutDecodeError::UnsupportedVersion(version));
        }
        let kind = match reader.u8() {
            0 => LayoutKind::FullyContiguous,
            1 => LayoutKind::LayerSeparate,
            other => return Err(LayoutDecodeError::UnknownKind(other)),
        };
        let dtype_code = reader.u8();
        let dtype =
            DType::from_code(dtype_code).ok_or(LayoutDecodeError::UnknownDType(dtype_code))?;
        let memory_code = reader.u8();
        let memory_type = MemoryType::from_code(memory_code)
            .ok_or(LayoutDecodeError::UnknownMemoryType(memory_code))?;
        if reader.u8() != 0 {
            return Err(LayoutDecodeError::NonZeroPadding);
        }
        let device_id = reader.u32();
        let config = LayoutConfig {
            num_layers: reader.u32(),
            page_size: reader.u32(),
            inner_dim: reader.u32(),
            dtype,
            alignment: reader.u32(),
        };
        let num_blocks = reader.u64();
        let block_stride = reader.u64();
        let layer_stride = reader.u64();
        let region_count = reader.u32() as usize;
        let needed = region_count
            .checked_mul(REGION_LEN)
            .and_then(|r| r.checked_add(FIXED_LEN))
            .ok_or(LayoutDecodeError::Truncated {
                needed: usize::MAX,
                got: bytes.len(),
            })?;
        if bytes.len() < needed {
            return Err(LayoutDecodeError::Truncated {
                needed,
                got: bytes.len(),
            });
        }
        if bytes.len() > needed {
            return Err(LayoutDecodeError::TrailingBytes(bytes.len() - needed));
        }
        let regions = (0..region_count)
            .map(|_| (reader.u64(), reader.u64()))
            .collect();
        let descriptor = Self {
            kind,
            config,
            num_blocks,
            memory_type,
            device_id,
            block_stride,
            layer_stride,
            regions,
        };
        descriptor.validate()?;
        Ok(descriptor)
    }

    fn region(&self, (base_addr, len): (u64, u64)) -> Region {
        Region {
            memory_type: self.memory_type,
            device_id: self.device_id,
            base_addr,
            len,
        }
    }

    fn check_strides(&self, block_stride: u64, layer_stride: u64) -> Result<(), LayoutError> {
        if self.block_stride != block_stride {
            return Err(LayoutError::StrideMismatch {
                field: "block_stride",
                expected: block_stride,
                got: self.block_stride,
            });
        }
        if self.layer_stride != layer_stride {
            return Err(LayoutError::StrideMismatch {
                field: "layer_stride",
                expected: layer_stride,
                got: self.layer_stride,
            });
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), LayoutError> {
        match self.kind {
            LayoutKind::FullyContiguous => self.to_fully_contiguous().map(|_| ()),
            LayoutKind::LayerSeparate => self.to_layer_separate().map(|_| ()),
        }
    }

    /// The fully contiguous layout this describes.
    pub fn to_fully_contiguous(&self) -> Result<FullyContiguous, LayoutError> {
        if self.kind != LayoutKind::FullyContiguous || self.regions.len() != 1 {
            return Err(LayoutError::RegionCount {
                expected: 1,
                got: self.regions.len() as u64,
            });
        }
        self.check_strides(
            FullyContiguous::block_stride_for(&self.config)?,
            self.config.layer_bytes(),
        )?;
        FullyContiguous::new(self.config, self.num_blocks, self.region(self.regions[0]))
    }

    /// The layer-separate layout this describes.
    pub fn to_layer_separate(&self) -> Result<LayerSeparate, LayoutError> {
        if self.kind != LayoutKind::LayerSeparate {
            return Err(LayoutError::RegionCount {
                expected: u64::from(self.config.num_layers),
                got: self.regions.len() as u64,
            });
        }
        self.check_strides(LayerSeparate::block_stride_for(&self.config)?, 0)?;
        let regions = self.regions.iter().map(|r| self.region(*r)).collect();
        LayerSeparate::new(self.config, self.num_blocks, regions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    #[test]
    fn llama_3_8b_holds_128_kib_of_kv_per_token() {
        let config = LayoutConfig::for_model(32, 16, 8, 128, DType::BF16);
        config.validate().unwrap();
        assert_eq!(config.bytes_per_token(), 131_072);
        assert_eq!(config.block_bytes(), 2 << 20);
    }

    #[test]
    fn fully_contiguous_block_stride_is_aligned_up() {
        // One layer: 4 tokens × 10 × 2 bytes = 80; a block: 240, aligned to 64 → 256.
        let layout = FullyContiguous::new(config(), 5, region(0x1000, 5 * 256)).unwrap();
        assert_eq!(layout.block_stride_bytes(), 256);
        assert_eq!(layout.layer_stride_bytes(), 80);
        assert_eq!(
            layout.offset(2, 1).unwrap(),
            Address {
                addr: 0x1000 + 512 + 80,
                len: 80
            }
        );
        assert_eq!(layout.total_bytes(), 1280);
        assert_eq!(FullyContiguous::required_bytes(&config(), 5), Ok(1280));
    }

    #[test]
    fn layer_separate_puts_each_layer_in_its_own_region() {
        let regions = vec![
            region(0x10000, 512),
            region(0x20000, 512),
            region(0x40000, 512),
        ];
        let layout = LayerSeparate::new(config(), 4, regions).unwrap();
        // One layer of a block: 80 bytes, aligned to 64 → 128.
        assert_eq!(layout.block_stride_bytes(), 128);
        assert_eq!(
            layout.offset(3, 2).unwrap(),
            Address {
                addr: 0x40000 + 384,
                len: 80
            }
        );
    }

    #[test]
    fn out_of_range_and_inconsistent_layouts_are_errors() {
        let layout = FullyContiguous::new(config(), 2, region(0, 512)).unwrap();
        assert_eq!(
            layout.offset(2, 0),
            Err(LayoutError::BlockOutOfRange {
                block: 2,
                num_blocks: 2
            })
        );
        assert_eq!(
            layout.offset(0, 3),
            Err(LayoutError::LayerOutOfRange {
                layer: 3,
                num_layers: 3
            })
        );
        assert_eq!(
            FullyContiguous::new(config(), 3, region(0, 512)),
            Err(LayoutError::RegionTooSmall {
                needed: 768,
                len: 512
            })
        );
        assert_eq!(
            FullyContiguous::new(config(), 1, region(8, 512)),
            Err(LayoutError::MisalignedBase {
                addr: 8,
                alignment: 64
            })
        );
        let bad = LayoutConfig {
            alignment: 48,
            ..config()
        };
        assert_eq!(bad.validate(), Err(LayoutError::AlignmentNotPowerOfTwo(48)));
        let zero = LayoutConfig {
            page_size: 0,
            ..config()
        };
        assert_eq!(
            zero.validate(),
            Err(LayoutError::Zero { field: "page_size" })
        );
        let huge = LayoutConfig {
            num_layers: u32::MAX,
            page_size: u32::MAX,
            inner_dim: u32::MAX,
            dtype: DType::F32,
            alignment: 1,
        };
        assert_eq!(huge.validate(), Err(LayoutError::Overflow));
        assert!(matches!(
            LayerSeparate::new(config(), 1, vec![region(0, 128)]),
            Err(LayoutError::RegionCount { .. })
        ));
    }

    #[test]
    fn descriptors_round_trip_and_rebuild_the_layout() {
        let layout = FullyContiguous::new(config(), 5, region(0x1000, 4096)).unwrap();
        let bytes = layout.descriptor().serialize();
        let decoded = LayoutDescriptor::deserialize(&bytes).unwrap();
        assert_eq!(decoded.to_fully_contiguous().unwrap(), layout);
        let regions = vec![
            region(0x10000, 512),
            region(0x20000, 512),
            region(0x40000, 512),
        ];
        let layout = LayerSeparate::new(config(), 4, regions).unwrap();
        let decoded = LayoutDescriptor::deserialize(&layout.descriptor().serialize()).unwrap();
        assert_eq!(decoded.to_layer_separate().unwrap(), layout);
    }

    #[test]
    fn each_decode_failure_has_its_own_error() {
        let good = FullyContiguous::new(config(), 5, region(0x1000, 4096))
            .unwrap()
            .descriptor()
            .serialize();
        let corrupt = |at: usize, value: u8| {
            let mut bytes = good.clone();
            bytes[at] = value;
            LayoutDescriptor::deserialize(&bytes)
        };
        assert!(matches!(
            LayoutDescriptor::deserialize(&good[..10]),
            Err(LayoutDecodeError::Truncated { .. })
        ));
        assert!(matches!(
            corrupt(0, b'X'),
            Err(LayoutDecodeError::BadMagic(_))
        ));
        assert_eq!(corrupt(4, 9), Err(LayoutDecodeError::UnsupportedVersion(9)));
        assert_eq!(corrupt(6, 7), Err(LayoutDecodeError::UnknownKind(7)));
        assert_eq!(corrupt(7, 99), Err(LayoutDecodeError::UnknownDType(99)));
        assert_eq!(
            corrupt(8, 99),
            Err(LayoutDecodeError::UnknownMemoryType(99))
        );
        assert_eq!(corrupt(9, 1), Err(LayoutDecodeError::NonZeroPadding));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            LayoutDescriptor::deserialize(&long),
            Err(LayoutDecodeError::TrailingBytes(1))
        );
        // A block stride that disagrees with the config.
        assert!(matches!(
            corrupt(39, 2),
            Err(LayoutDecodeError::Invalid(
                LayoutError::StrideMismatch { .. }
            ))
        ));
        // A huge region count with a short input is refused before allocating.
        let mut bytes = good.clone();
        bytes[54..58].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LayoutDescriptor::deserialize(&bytes),
            Err(LayoutDecodeError::Truncated { .. })
        ));
    }

    fn valid_config() -> impl Strategy<Value = LayoutConfig> {
        (
            1u32..6,
            1u32..33,
            1u32..64,
            prop::sample::select(vec![DType::F32, DType::BF16, DType::I8]),
            0u32..9,
        )
            .prop_map(
                |(num_layers, page_size, inner_dim, dtype, shift)| LayoutConfig {
                    num_layers,
                    page_size,
                    inner_dim,
                    dtype,
                    alignment: 1 << shift,
                },
            )
    }

    proptest! {
        #[test]
        fn deserialising_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = LayoutDescriptor::deserialize(&bytes);
        }

        #[test]
        fn garbage_behind_a_valid_prefix_never_panics(rest in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&VERSION.to_le_bytes());
            bytes.extend_from_slice(&rest);
            let _ = LayoutDescriptor::deserialize(&bytes);
        }

        #[test]
        fn valid_descriptors_round_trip_and_truncations_are_rejected(config in valid_config(), blocks in 1u64..20, separate in any::<bool>()) {
            let descriptor = if separate {
                let stride = LayerSeparate::block_stride_for(&config).unwrap();
                let regions = (0..config.num_layers).map(|l| region(u64::from(l + 1) << 32, stride * blocks)).collect();
                LayerSeparate::new(config, blocks, regions).unwrap().descriptor()
            } else {
                let needed = FullyContiguous::required_bytes(&config, blocks).unwrap();
                FullyContiguous::new(config, blocks, region(1 << 32, needed)).unwrap().descriptor()
            };
            let bytes = descriptor.serialize();
            prop_assert_eq!(LayoutDescriptor::deserialize(&bytes).unwrap(), descriptor);
            for len in 0..bytes.len() {
                prop_assert!(LayoutDescriptor::deserialize(&bytes[..len]).is_err());
            }
        }

        #[test]
        fn addresses_never_overlap_and_stay_inside_the_region(config in valid_config(), blocks in 1u64..12) {
            let needed = FullyContiguous::required_bytes(&config, blocks).unwrap();
            let base = 1u64 << 20;
            let layout = FullyContiguous::new(config, blocks, region(base, needed)).unwrap();
            let mut spans = Vec::new();
            for block in 0..blocks {
                for layer in 0..config.num_layers {
                    let address = layout.offset(block, layer).unwrap();
                    prop_assert!(address.addr >= base && address.addr + address.len <= base + needed);
                    spans.push((address.addr, address.addr + address.len));
                }
            }
            spans.sort();
            for pair in spans.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
            }
        }
    }
}
