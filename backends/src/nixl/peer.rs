//! What one agent sends another so that it can address its blocks: the NIXL agent
//! metadata (connection info and registered memory) and the layout descriptor (which
//! address holds layer `l` of block `b`), in one message.
//!
//! Owns: [`NixlPeer`] and its binary form, version 1 (integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"KVNP"` |
//! | 4..6 | version: u16 = 1 |
//! | 6..10 | metadata length `m`: u32, at most [`NixlPeer::MAX_METADATA_LEN`] |
//! | 10..10+m | the agent's metadata (opaque, from NIXL) |
//! | 10+m.. | the layout descriptor (`KVLY` v1, [`LayoutDescriptor::serialize`]), to the end |
//!
//! Never: interpret the agent metadata (NIXL checks it when it is loaded), trust the
//! layout before [`LayoutDescriptor::deserialize`] has checked it, or panic on any input.

use kvtwin::layout::{LayoutDecodeError, LayoutDescriptor};

const MAGIC: [u8; 4] = *b"KVNP";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 10;

/// A peer description could not be built or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// Fewer bytes than the header.
    #[error("peer description of {len} bytes is shorter than its {HEADER_LEN}-byte header")]
    ShortHeader {
        /// Bytes present.
        len: usize,
    },
    /// Not `KVNP`.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A version this code does not speak.
    #[error("unsupported peer description version {version}")]
    UnsupportedVersion {
        /// The version on the wire.
        version: u16,
    },
    /// Agent metadata over [`NixlPeer::MAX_METADATA_LEN`].
    #[error("agent metadata of {declared} bytes exceeds the limit")]
    MetadataTooLarge {
        /// Its (declared) length.
        declared: u64,
    },
    /// Fewer metadata bytes than declared.
    #[error("agent metadata declared {declared} bytes, {actual} present")]
    MetadataTruncated {
        /// The declared length.
        declared: usize,
        /// Bytes present.
        actual: usize,
    },
    /// The layout descriptor is invalid.
    #[error("layout: {0}")]
    Layout(#[from] LayoutDecodeError),
}

/// An agent's metadata and the layout of the memory it offers, as sent to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NixlPeer {
    agent_metadata: Vec<u8>,
    layout: LayoutDescriptor,
}

impl NixlPeer {
    /// The largest agent metadata accepted (16 MiB): a bound, so a corrupt length cannot
    /// make a reader allocate without limit.
    pub const MAX_METADATA_LEN: u32 = 16 << 20;

    /// An agent's metadata (`nixl-sys` `get_local_md`) and the descriptor of its
    /// layout; the metadata must not exceed [`NixlPeer::MAX_METADATA_LEN`].
    pub fn new(agent_metadata: Vec<u8>, layout: LayoutDescriptor) -> Result<Self, PeerError> {
        if agent_metadata.len() as u64 > u64::from(Self::MAX_METADATA_LEN) {
            return Err(PeerError::MetadataTooLarge {
                declared: agent_metadata.len() as u64,
            });
        }
        Ok(Self {
            agent_metadata,
            layout,
        })
    }

    /// The agent's metadata, for `NixlAgent::load_remote`.
    pub fn agent_metadata(&self) -> &[u8] {
        &self.agent_metadata
    }

    /// Where its blocks are.
    pub fn layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    /// The binary form (see the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let layout = self.layout.serialize();
        let mut out = Vec::with_capacity(HEADER_LEN + self.agent_metadata.len() + layout.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        // At most MAX_METADATA_LEN (checked in `new`), so it fits.
        let len = self.agent_metadata.len() as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.agent_metadata);
        out.extend_from_slice(&layout);
        out
    }

    /// Parses the binary form, checking the layout descriptor.
    pub fn decode(bytes: &[u8]) -> Result<Self, PeerError> {
        let Some((header, rest)) = bytes.split_first_chunk::<HEADER_LEN>() else {
            return Err(PeerError::ShortHeader { len: bytes.len() });
        };
        let [m0, m1, m2, m3, v0, v1, l0, l1, l2, l3] = *header;
        if [m0, m1, m2, m3] != MAGIC {
            return Err(PeerError::BadMagic {
                found: [m0, m1, m2, m3],
            });
        }
        let version = u16::from_le_bytes([v0, v1]);
        if version != VERSION {
            return Err(PeerError::UnsupportedVersion { version });
        }
        let declared = u32::from_le_bytes([l0, l1, l2, l3]);
        if declared > Self::MAX_METADATA_LEN {
            return Err(PeerError::MetadataTooLarge {
                declared: declared.into(),
            });
        }
        // Bounded above, so it fits in usize.
        let declared = declared as usize;
        if rest.len() < declared {
            return Err(PeerError::MetadataTruncated {
                declared,
                actual: rest.len(),
            });
        }
        let (metadata, layout) = rest.split_at(declared);
        Ok(Self {
            agent_metadata: metadata.to_vec(),
            layout: LayoutDescriptor::deserialize(layout)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::layout::{BlockLayout, DType, FullyContiguous, LayoutConfig, MemoryType, Region};

    fn peer() -> NixlPeer {
        let config = LayoutConfig::for_model(2, 16, 2, 64, DType::F16).unwrap();
        let len = FullyContiguous::required_bytes(&config, 4).unwrap();
        let region = Region {
            memory_type: MemoryType::System,
            device_id: 0,
            base_addr: 0x7f00_0000_0000,
            len,
        };
        let layout = FullyContiguous::new(config, 4, region)
            .unwrap()
            .descriptor();
        NixlPeer::new(b"opaque agent metadata".to_vec(), layout).unwrap()
    }

    #[test]
    fn round_trips() {
        let peer = peer();
        assert_eq!(NixlPeer::decode(&peer.encode()), Ok(peer));
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = peer().encode();
        for len in 0..bytes.len() {
            assert!(
                NixlPeer::decode(&bytes[..len]).is_err(),
                "prefix of {len} bytes"
            );
        }
    }

    #[test]
    fn bad_headers_are_rejected_each_with_its_error() {
        let bytes = peer().encode();
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(
            NixlPeer::decode(&bad),
            Err(PeerError::BadMagic { .. })
        ));
        let mut bad = bytes.clone();
        bad[4] = 2;
        assert_eq!(
            NixlPeer::decode(&bad),
            Err(PeerError::UnsupportedVersion { version: 2 })
        );
        let mut bad = bytes.clone();
        bad[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            NixlPeer::decode(&bad),
            Err(PeerError::MetadataTooLarge {
                declared: u32::MAX.into()
            })
        );
        let mut bad = bytes;
        bad.push(0);
        assert!(matches!(NixlPeer::decode(&bad), Err(PeerError::Layout(_))));
    }
}
