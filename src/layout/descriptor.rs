//! The portable descriptor: [`LayoutDescriptor`] (a layout's shape, strides, memory type,
//! device id and regions) and its binary form, so a remote peer can compute the same
//! addresses we do (the NIXL metadata exchange of seed 000).
//!
//! Invariant: nothing trusts a descriptor until [`LayoutDescriptor::into_layout`] has
//! rebuilt the layout from it through the layouts' own constructors and found the strides
//! it states equal to the ones the config implies; decoding never panics and allocates
//! only once the input is known to hold the regions it claims.
//!
//! Never: compute addresses itself (the layouts do) or do I/O. The binary format is
//! documented on [`LayoutDescriptor`], where users of the public API see it.

use super::config::{widen, DType, LayoutConfig, LayoutError, MemoryType};
use super::{Address, AnyLayout, BlockLayout, FullyContiguous, LayerSeparate, Region};

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
///
/// # Binary format, version 1
///
/// All integers little-endian, no padding between fields, nothing after the last one.
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 4 | magic `b"KVLY"` |
/// | 4 | 2 | version, `u16` = 1 |
/// | 6 | 1 | kind: 0 fully contiguous, 1 layer separate |
/// | 7 | 1 | dtype: 0 F32, 1 F16, 2 BF16, 3 FP8 E4M3, 4 I8 |
/// | 8 | 1 | memory type: 0 device, 1 pinned, 2 system, 3 disk |
/// | 9 | 1 | reserved, 0 |
/// | 10 | 4 | device id, `u32` |
/// | 14 | 4 | num_layers, `u32` |
/// | 18 | 4 | page_size (tokens per block), `u32` |
/// | 22 | 4 | inner_dim (elements per token per layer), `u32` |
/// | 26 | 4 | alignment in bytes, `u32` |
/// | 30 | 8 | num_blocks, `u64` |
/// | 38 | 8 | block stride in bytes, `u64` |
///
/// Then, for kind 0 (70 bytes in all): layer stride in bytes (`u64`, offset 46), the
/// region's base address (`u64`, 54) and length (`u64`, 62). For kind 1 (`46 + 16 ×
/// num_layers` bytes): `num_layers` regions in layer order, each a base address `u64` then
/// a length `u64`. The region count is implied by the kind and `num_layers`, never sent
/// separately, so a decoder can check the input holds that many before allocating.
///
/// The strides are redundant with the config on purpose: a peer that computes them
/// differently (another alignment rule, another version of this code) is rejected instead
/// of reading the wrong bytes.
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
pub(super) const VERSION: u16 = 1;
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
    /// The descriptor's bytes in format v1 (see [`LayoutDescriptor`]). Descriptors from
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
