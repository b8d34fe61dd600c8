//! Block shape and its byte arithmetic: [`DType`], [`LayoutConfig`] with its validation
//! and derived sizes, [`MemoryType`], and [`LayoutError`], the error of every layout
//! operation.
//!
//! Invariant: a config that [`LayoutConfig::validate`] accepts has no zero field, a
//! power-of-two alignment, and every byte size derived from it (aligned strides included)
//! fits in a `u64`; the checked helpers here are the only place those sizes are computed.
//!
//! Never: place blocks in memory (the layouts do) or encode anything on the wire (the
//! descriptor does; it borrows the dtype and memory type codes from here).

use serde::{Deserialize, Serialize};

use super::LayoutKind;

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

    pub(super) const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::Fp8E4M3 => 3,
            DType::I8 => 4,
        }
    }

    pub(super) const fn from_code(code: u8) -> Option<Self> {
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
    pub(super) const fn code(self) -> u8 {
        match self {
            MemoryType::Device => 0,
            MemoryType::Pinned => 1,
            MemoryType::System => 2,
            MemoryType::Disk => 3,
        }
    }

    pub(super) const fn from_code(code: u8) -> Option<Self> {
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
        /// Index of the region (its layer for [`LayerSeparate`](super::LayerSeparate)).
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
pub(super) fn align_up(
    value: u64,
    alignment: u32,
    quantity: &'static str,
) -> Result<u64, LayoutError> {
    let mask = u64::from(alignment).saturating_sub(1);
    value
        .checked_add(mask)
        .map(|v| v & !mask)
        .ok_or(LayoutError::Overflow { quantity })
}

/// `usize` is at most 64 bits on every target Rust supports, so this never truncates.
pub(super) const fn widen(n: usize) -> u64 {
    n as u64
}

pub(super) fn checked_mul(a: u64, b: u64, quantity: &'static str) -> Result<u64, LayoutError> {
    a.checked_mul(b).ok_or(LayoutError::Overflow { quantity })
}

pub(super) fn checked_add(a: u64, b: u64, quantity: &'static str) -> Result<u64, LayoutError> {
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
pub(super) struct Sizes {
    pub(super) layer_bytes: u64,
    pub(super) contiguous_block_stride: u64,
    pub(super) separate_block_stride: u64,
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

    pub(super) fn sizes(&self) -> Result<Sizes, LayoutError> {
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
