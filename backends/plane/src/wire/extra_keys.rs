//! vLLM's per-block `extra_keys`: what keeps blocks of equal tokens apart in the engine
//! (vLLM 0.32 `generate_block_hash_extra_keys`), read off the wire and turned into what
//! seeds and extends a block's tokens hash the way Dynamo's router does.
//!
//! Owns: [`ExtraKey`] (one key as sent: a string, a `[identifier, offset]` pair, or any
//! other msgpack value kept as its encoding), its reader and writer (for
//! `super::engine`), and the interpretation: [`salt_of`] (the request's cache salt, in
//! the first block of a request only, as vLLM sends it) and [`BlockExtras`] (a block's
//! multimodal hashes, and a digest of every key it cannot interpret).
//!
//! What vLLM puts in a block's keys, in order: the LoRA adapter's name (every block of an
//! adapter's request), multimodal identifiers (`[identifier, offset]` pairs since vLLM
//! 0.19, 64-hex digests before), the request's `cache_salt` (only in the block starting at
//! token 0), prompt-embeds bytes. Dynamo (ai-dynamo/dynamo
//! `lib/kv-router/src/zmq_wire/extra_keys.rs` and `convert.rs`) reads the salt from the
//! first block's strings after the first one equal to the LoRA name (tagged
//! `dynamo-cache-salt:` by its own frontend), maps 64-hex digests to their first 16 hex
//! digits and other pair identifiers to xxh3-64, and appends a block's multimodal hashes,
//! sorted, as little-endian u64s after its tokens before hashing. kvtwin does the same,
//! and takes an untagged string as the salt too (vLLM sends the caller's `cache_salt`
//! as is).
//! Where Dynamo ignores a key (bytes, numbers, other shapes, a second salt-like string),
//! kvtwin mixes its bytes into the block's hash instead: a block the engine keeps apart
//! must never share an index entry with a plain one. Such a block matches no query the
//! router hashes itself (a miss), never another request's block (a wrong merge).
//! Never: allocate per key beyond what the payload holds (each key is at least a byte of
//! it), or decide a seed (`kvtwin::tokens::HashSeed::for_request` does).

use super::msgpack::{self, Reader};
use super::WireError;
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// The tag Dynamo's frontend puts before a caller's cache salt in vLLM's `cache_salt`,
/// so its event decoder can tell the salt from a LoRA name or an untagged identifier.
pub const DYNAMO_CACHE_SALT_TAG: &str = "dynamo-cache-salt:";

/// Bytes mixed between a block's multimodal hashes and the digest of its uninterpreted
/// keys, so that input never has the length of a Dynamo-compatible one.
const OPAQUE_MARKER: &[u8] = b"kvtwin:opaque-extra-keys";

/// One extra key of a block, as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string: a LoRA name, a cache salt, or a 64-hex multimodal digest.
    Str(String),
    /// `[identifier, offset]`: a multimodal item starting `offset` tokens into the block
    /// (vLLM ≥ 0.19; the offset may be negative for an item begun in an earlier block).
    Item {
        /// The item's identifier (a hash).
        id: String,
        /// Its start, relative to the block.
        offset: i64,
    },
    /// Any other value (prompt-embeds bytes, a number, another shape), as its msgpack
    /// encoding: mixed into the block's hash, never interpreted.
    Raw(Vec<u8>),
}

/// A block's `extra_keys`, first block first; `None` for a block that has none.
pub type BlockExtraKeys = Vec<Option<Vec<ExtraKey>>>;

fn read_key(reader: &mut Reader<'_>) -> Result<ExtraKey, WireError> {
    if reader.at_str() {
        return Ok(ExtraKey::Str(reader.str()?.to_string()));
    }
    let start = reader.position();
    if reader.at_array() {
        // `[identifier, offset]`; anything else of array shape is kept raw.
        if reader.array_len()? == 2 && reader.at_str() {
            let id = reader.str()?.to_string();
            if let Ok(offset) = reader.int() {
                if let Some(offset) = offset_of(offset) {
                    return Ok(ExtraKey::Item { id, offset });
                }
            }
        }
        reader.rewind(start);
    }
    let start = reader.position();
    reader.skip()?;
    Ok(ExtraKey::Raw(reader.slice_from(start).to_vec()))
}

fn offset_of(int: msgpack::Int) -> Option<i64> {
    match int {
        msgpack::Int::Unsigned(value) => i64::try_from(value).ok(),
        msgpack::Int::Negative(value) => Some(value),
    }
}

/// Reads `extra_keys`: an array with one entry per block, each nil or an array of keys.
pub(crate) fn read_extra_keys(reader: &mut Reader<'_>) -> Result<BlockExtraKeys, WireError> {
    let blocks = reader.array_len()?;
    reader.check_count(blocks, 1)?;
    let mut out = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        if reader.try_nil()? {
            out.push(None);
            continue;
        }
        let keys = reader.array_len()?;
        reader.check_count(keys, 1)?;
        let mut block = Vec::with_capacity(keys);
        for _ in 0..keys {
            block.push(read_key(reader)?);
        }
        out.push(Some(block));
    }
    Ok(out)
}

/// Writes `extra_keys` as [`read_extra_keys`] reads them (`Raw` keys byte for byte).
pub(crate) fn write_extra_keys(out: &mut Vec<u8>, blocks: &[Option<Vec<ExtraKey>>]) {
    msgpack::write_array_len(out, blocks.len());
    for block in blocks {
        let Some(keys) = block else {
            msgpack::write_nil(out);
            continue;
        };
        msgpack::write_array_len(out, keys.len());
        for key in keys {
            match key {
                ExtraKey::Str(text) => msgpack::write_str(out, text),
                ExtraKey::Item { id, offset } => {
                    msgpack::write_array_len(out, 2);
                    msgpack::write_str(out, id);
                    msgpack::write_int(out, *offset);
                }
                ExtraKey::Raw(bytes) => out.extend_from_slice(bytes),
            }
        }
    }
}

/// A 64-hex multimodal digest's routing hash: its first 16 hex digits (Dynamo's
/// `parse_mm_hash_from_extra_key`).
fn hex_digest(text: &str) -> Option<u64> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return u64::from_str_radix(&text[..16], 16).ok();
    }
    None
}

/// A multimodal identifier's routing hash (Dynamo's `hash_mm_identifier`): a 64-hex
/// digest as above, anything else non-empty by xxh3-64; `None` for an empty one.
fn item_hash(id: &str) -> Option<u64> {
    if id.is_empty() {
        return None;
    }
    Some(hex_digest(id).unwrap_or_else(|| xxh3_64(id.as_bytes())))
}

/// The keys of a block, less the first string equal to the LoRA name (vLLM repeats the
/// adapter's name in every block; it seeds the hash instead).
fn without_lora<'a>(
    keys: &'a [ExtraKey],
    lora_name: Option<&'a str>,
) -> impl Iterator<Item = &'a ExtraKey> + 'a {
    let mut lora = lora_name.filter(|name| !name.is_empty());
    keys.iter().filter(move |key| match (key, lora) {
        (ExtraKey::Str(text), Some(name)) if text == name => {
            lora = None;
            false
        }
        _ => true,
    })
}

/// The request's cache salt in a first block's keys: the first string, after the LoRA
/// name, that is not a 64-hex multimodal digest, with Dynamo's tag stripped; `None` when
/// there is none (or it is empty). Only meaningful for the block that starts a request
/// (vLLM sends the salt there alone).
pub fn salt_of<'a>(first_block: &'a [ExtraKey], lora_name: Option<&'a str>) -> Option<&'a str> {
    without_lora(first_block, lora_name).find_map(|key| match key {
        ExtraKey::Str(text) if hex_digest(text).is_none() => {
            let salt = text.strip_prefix(DYNAMO_CACHE_SALT_TAG).unwrap_or(text);
            (!salt.is_empty()).then_some(salt)
        }
        _ => None,
    })
}

/// What a block's keys add to its tokens hash, beyond the seed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockExtras {
    /// Multimodal hashes, sorted (appended after the tokens, as Dynamo does).
    pub mm: Vec<u64>,
    /// A digest of every key kvtwin cannot interpret, in order; `None` when there is none.
    pub opaque: Option<u64>,
}

impl BlockExtras {
    /// Reads a block's keys; `salt` is the salt string taken from them (the first block
    /// of a request), which is then not uninterpreted.
    pub fn of(keys: &[ExtraKey], lora_name: Option<&str>, salt: Option<&str>) -> Self {
        let mut extras = BlockExtras::default();
        let mut salt_seen = salt.is_none();
        let mut opaque: Option<Xxh3> = None;
        let mut mix = |bytes: &[u8]| {
            let hasher = opaque.get_or_insert_with(Xxh3::new);
            // Length-prefixed, so key boundaries are part of the digest.
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        for key in without_lora(keys, lora_name) {
            match key {
                ExtraKey::Str(text) => {
                    if let Some(hash) = hex_digest(text) {
                        extras.mm.push(hash);
                    } else if !salt_seen
                        && Some(text.strip_prefix(DYNAMO_CACHE_SALT_TAG).unwrap_or(text)) == salt
                    {
                        // The salt seeds every block's hash; here it is not extra.
                        salt_seen = true;
                    } else {
                        mix(text.as_bytes());
                    }
                }
                ExtraKey::Item { id, .. } => match item_hash(id) {
                    Some(hash) => extras.mm.push(hash),
                    None => mix(b""),
                },
                ExtraKey::Raw(bytes) => mix(bytes),
            }
        }
        extras.mm.sort_unstable();
        extras.opaque = opaque.map(|hasher| hasher.digest());
        extras
    }

    /// Whether the block hashes as its tokens alone.
    pub fn is_empty(&self) -> bool {
        self.mm.is_empty() && self.opaque.is_none()
    }

    /// The bytes hashed after the tokens: each multimodal hash little-endian, then, when
    /// some key was uninterpreted, a marker and its digest.
    pub fn suffix(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(8 * self.mm.len() + OPAQUE_MARKER.len() + 8);
        for hash in &self.mm {
            bytes.extend_from_slice(&hash.to_le_bytes());
        }
        if let Some(digest) = self.opaque {
            bytes.extend_from_slice(OPAQUE_MARKER);
            bytes.extend_from_slice(&digest.to_le_bytes());
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef00112233445566778899aabbccddeefffedcba9876543210";

    fn s(text: &str) -> ExtraKey {
        ExtraKey::Str(text.to_string())
    }

    #[test]
    fn the_salt_follows_the_lora_name_and_loses_dynamos_tag() {
        let keys = [s("adapter"), s(HEX), s("dynamo-cache-salt:tenant-a")];
        assert_eq!(salt_of(&keys, Some("adapter")), Some("tenant-a"));
        // A salt equal to the adapter's name: the first occurrence is the adapter.
        let keys = [s("adapter"), s("adapter")];
        assert_eq!(salt_of(&keys, Some("adapter")), Some("adapter"));
        assert_eq!(salt_of(&[s("adapter")], Some("adapter")), None);
        assert_eq!(salt_of(&[s("tenant-b")], None), Some("tenant-b"));
        assert_eq!(salt_of(&[s(HEX)], None), None);
        assert_eq!(salt_of(&[s("dynamo-cache-salt:")], None), None);
        assert_eq!(salt_of(&[ExtraKey::Raw(vec![0xc4, 1, 7])], None), None);
    }

    #[test]
    fn multimodal_keys_hash_as_dynamo_and_the_rest_is_mixed_in() {
        let item = ExtraKey::Item {
            id: "opaque-image".to_string(),
            offset: -3,
        };
        let extras = BlockExtras::of(&[s("adapter"), s(HEX), item], Some("adapter"), None);
        // Computed apart with Python's xxhash 4.1.0: xxh3_64(b"opaque-image").
        let mut mm = vec![81_985_529_216_486_895, 16_964_032_267_962_093_720];
        mm.sort_unstable();
        assert_eq!(extras.mm, mm);
        assert_eq!(extras.opaque, None);

        let salted = BlockExtras::of(&[s("tenant-a")], None, Some("tenant-a"));
        assert!(salted.is_empty());
        let bytes = BlockExtras::of(&[ExtraKey::Raw(vec![0xc4, 1, 7])], None, None);
        let other = BlockExtras::of(&[ExtraKey::Raw(vec![0xc4, 1, 8])], None, None);
        assert!(bytes.opaque.is_some() && bytes.opaque != other.opaque);
        // A second salt-like string is not dropped.
        let two = BlockExtras::of(&[s("tenant-a"), s("more")], None, Some("tenant-a"));
        assert!(two.opaque.is_some());
        assert_eq!(
            two.suffix().len(),
            OPAQUE_MARKER.len() + 8,
            "marker and digest"
        );
    }

    #[test]
    fn keys_round_trip_through_msgpack() {
        let blocks: BlockExtraKeys = vec![
            Some(vec![
                s("adapter"),
                ExtraKey::Item {
                    id: "img".into(),
                    offset: -2,
                },
                ExtraKey::Raw(vec![0xc4, 2, 1, 2]),
                ExtraKey::Raw(vec![0x93, 1, 2, 3]),
                ExtraKey::Raw(vec![0xcb, 0, 0, 0, 0, 0, 0, 0, 0]),
            ]),
            None,
            Some(vec![]),
        ];
        let mut out = Vec::new();
        write_extra_keys(&mut out, &blocks);
        let mut reader = Reader::new(&out);
        assert_eq!(read_extra_keys(&mut reader).unwrap(), blocks);
        assert!(reader.is_at_end());
    }
}
