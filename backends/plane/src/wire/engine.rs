//! vLLM / SGLang KV event batches: the msgpack payload of one ZMQ message (WIRE.md).
//!
//! Owns: the typed batch ([`EngineBatch`] of [`EngineEvent`]s: [`BlockStored`],
//! [`BlockRemoved`], `AllBlocksCleared`), its decoder ([`EngineDecoder`]: both event
//! encodings, positional arrays of vLLM 0.9–0.23 and maps of vLLM ≥ 0.24 and SGLang, the
//! two-element batch of vLLM 0.9, signed, unsigned and 32-byte block hashes), its encoder
//! (an [`EncodeOptions`] per engine version, [`EngineFormat`]), and the medium ↔ tier
//! mapping ([`medium_tier`], [`tier_medium`]).
//!
//! Decoding is lenient where engines differ and strict where a router could be misled:
//! unknown map keys, extra trailing array elements and any integer width are accepted;
//! a missing `block_hashes` or `block_size`, a token id over 32 bits or a hash of another
//! width refuse the batch; an unknown event type or medium refuses that event only
//! (skipped and reported in [`EngineBatch::skipped`], or the batch with
//! [`UnknownEvents::Reject`]).
//! `extra_keys` (read into `super::extra_keys::ExtraKey`s), a top-level `cache_salt` and
//! `kv_cache_spec_kind` are read in maps; in arrays `extra_keys` sits at its position
//! and `kv_cache_spec_kind` after `group_idx`.
//! Never: compute a hash, number events or apply them (see `super::convert`); allocate
//! per block beyond `extra_keys` (each event's vectors are sized once from their msgpack
//! headers).

use super::extra_keys::{read_extra_keys, write_extra_keys, BlockExtraKeys};
use super::frames::{LiveMessage, ReplayReply};
use super::msgpack::{self, Key, Reader};
use super::{bounded_name, DecodeLimits, WireError};
use kvtwin::tier::Tier;

/// `BlockStored`: blocks became cached, parent first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockStored {
    /// The engine's hash of each block, normalised to 64 bits (WIRE.md: integers by bit
    /// reinterpretation, 32-byte hashes by their first 8 bytes big-endian). Opaque ids:
    /// the router hashes `token_ids` itself.
    pub block_hashes: Vec<u64>,
    /// The hash of the block before the first one (none: the first block of a sequence).
    pub parent_block_hash: Option<u64>,
    /// The tokens of all the blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter's id (integers by bit reinterpretation), if any.
    pub lora_id: Option<u64>,
    /// Where the blocks are, mapped to a tier; none when the engine did not say (which
    /// means GPU: [`BlockStored::tier`]).
    pub medium: Option<Tier>,
    /// The LoRA adapter's name, which seeds the tokens hash (DESIGN.md), if any.
    pub lora_name: Option<String>,
    /// What else keeps each block apart in the engine (vLLM's `extra_keys`: LoRA name,
    /// multimodal identifiers, the cache salt in a request's first block, prompt-embeds
    /// bytes), one entry per block; see `super::extra_keys`.
    pub extra_keys: Option<BlockExtraKeys>,
    /// The request's cache salt when the engine sends it as a field of its own (as
    /// Dynamo's decoder accepts), rather than in the first block's `extra_keys`.
    pub cache_salt: Option<String>,
    /// The KV cache group of hybrid models (vLLM ≥ 0.24), if the engine said.
    pub group_idx: Option<u32>,
    /// The kind of that group's cache (`full_attention`, `sliding_window`, `mamba`, ...),
    /// if the engine said.
    pub kv_cache_spec_kind: Option<String>,
}

impl BlockStored {
    /// The tier the blocks are in (`Device` when the engine named no medium).
    pub fn tier(&self) -> Tier {
        self.medium.unwrap_or(Tier::Device)
    }
}

/// `BlockRemoved`: blocks left the cache of one medium.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockRemoved {
    /// The engine's hashes of the removed blocks, normalised as in [`BlockStored`].
    pub block_hashes: Vec<u64>,
    /// Where they were, mapped to a tier; none means GPU.
    pub medium: Option<Tier>,
    /// The KV cache group of hybrid models, if the engine said.
    pub group_idx: Option<u32>,
    /// The kind of that group's cache, if the engine said.
    pub kv_cache_spec_kind: Option<String>,
}

impl BlockRemoved {
    /// The tier the blocks left (`Device` when the engine named no medium).
    pub fn tier(&self) -> Tier {
        self.medium.unwrap_or(Tier::Device)
    }
}

/// One event of an engine's batch as decoded off the wire: what vLLM / SGLang wrote,
/// in the engine's own block hashes and with the raw token ids (the first stage of the
/// event chain in the crate documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// Blocks stored.
    BlockStored(BlockStored),
    /// Blocks removed.
    BlockRemoved(BlockRemoved),
    /// Every block of the engine (rank) is gone.
    AllBlocksCleared,
}

/// An event left out of a decoded batch, with why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedEvent {
    /// Its position in the batch as sent.
    pub index: usize,
    /// Why (an unknown event type or medium: [`WireError::is_per_event`]).
    pub error: WireError,
}

/// One message of an engine's KV event stream.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineBatch {
    /// The publisher's sequence number (from the message's second frame).
    pub seq: u64,
    /// The engine's timestamp, seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order (skipped ones left out).
    pub events: Vec<EngineEvent>,
    /// The data-parallel rank (none: vLLM 0.9's two-element batch, or nil).
    pub dp_rank: Option<u32>,
    /// Events the decoder left out; always empty on a batch to encode.
    pub skipped: Vec<SkippedEvent>,
}

impl EngineBatch {
    /// A batch of `events` with nothing skipped.
    pub fn new(seq: u64, ts: f64, events: Vec<EngineEvent>, dp_rank: Option<u32>) -> Self {
        Self {
            seq,
            ts,
            events,
            dp_rank,
            skipped: Vec::new(),
        }
    }

    /// Block hashes in the batch, all events together.
    pub fn block_count(&self) -> usize {
        self.events
            .iter()
            .map(|event| match event {
                EngineEvent::BlockStored(stored) => stored.block_hashes.len(),
                EngineEvent::BlockRemoved(removed) => removed.block_hashes.len(),
                EngineEvent::AllBlocksCleared => 0,
            })
            .sum()
    }
}

/// The tier of an engine's `medium` string, compared case-insensitively (WIRE.md); none
/// for a medium kvtwin does not know (count it, never guess).
pub fn medium_tier(medium: &str) -> Option<Tier> {
    const TABLE: [(&str, Tier); 13] = [
        ("GPU", Tier::Device),
        ("DEVICE", Tier::Device),
        ("CPU", Tier::Host),
        ("CPU_PINNED", Tier::Host),
        ("CPU_TIER1", Tier::Host),
        ("CPU_TIER2", Tier::Disk),
        ("DISK", Tier::Disk),
        ("NVME", Tier::Disk),
        ("STORAGE", Tier::Disk),
        ("EXTERNAL", Tier::Remote),
        ("NETWORK", Tier::Remote),
        ("REMOTE", Tier::Remote),
        ("SHARED", Tier::Remote),
    ];
    TABLE
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(medium))
        .map(|(_, tier)| *tier)
}

/// The medium the encoder writes for `tier`: the name vLLM uses where it has one.
pub const fn tier_medium(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "GPU",
        Tier::Host => "CPU",
        Tier::Disk => "DISK",
        Tier::Remote => "EXTERNAL",
    }
}

/// What a batch decoder does with an event of an unknown type or medium.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownEvents {
    /// Leave the event out, report it in [`EngineBatch::skipped`] and keep the others:
    /// skipping every event of an unknown medium, stores and removals alike, keeps the
    /// router's view of the known tiers exact.
    #[default]
    Skip,
    /// Refuse the whole batch with the event's error.
    Reject,
}

/// Decodes engine batches within limits; see the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineDecoder {
    /// Bounds on one batch.
    pub limits: DecodeLimits,
    /// What to do with events of an unknown type or medium.
    pub unknown: UnknownEvents,
}

/// Running totals of one batch against its limits.
struct Budget {
    limits: DecodeLimits,
    blocks: usize,
    tokens: usize,
}

impl Budget {
    fn take_blocks(&mut self, count: usize) -> Result<(), WireError> {
        self.blocks = self.blocks.saturating_add(count);
        if self.blocks > self.limits.max_blocks {
            return Err(WireError::Oversized {
                what: "blocks",
                got: self.blocks,
                limit: self.limits.max_blocks,
            });
        }
        Ok(())
    }

    fn take_tokens(&mut self, count: usize) -> Result<(), WireError> {
        self.tokens = self.tokens.saturating_add(count);
        if self.tokens > self.limits.max_tokens {
            return Err(WireError::Oversized {
                what: "tokens",
                got: self.tokens,
                limit: self.limits.max_tokens,
            });
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Stored,
    Removed,
    Cleared,
}

const STORED: &str = "BlockStored";
const REMOVED: &str = "BlockRemoved";
const CLEARED: &str = "AllBlocksCleared";

/// A field of an event, wherever it sits in either encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    BlockHashes,
    Parent,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    CacheSalt,
    GroupIdx,
    SpecKind,
    Ignored,
}

/// `BlockStored`'s fields in array order, after the tag.
const STORED_POSITIONS: [Field; 10] = [
    Field::BlockHashes,
    Field::Parent,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraName,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::SpecKind,
];

/// `BlockRemoved`'s fields in array order, after the tag.
const REMOVED_POSITIONS: [Field; 4] = [
    Field::BlockHashes,
    Field::Medium,
    Field::GroupIdx,
    Field::SpecKind,
];

/// The field a map key names; an unknown key is checked to be UTF-8 (known ones are
/// ASCII, so matching one proves it).
fn field_of_key(key: Key<'_>) -> Result<Field, WireError> {
    Ok(match key.bytes {
        b"block_hashes" => Field::BlockHashes,
        b"parent_block_hash" => Field::Parent,
        b"token_ids" => Field::TokenIds,
        b"block_size" => Field::BlockSize,
        b"lora_id" => Field::LoraId,
        b"medium" => Field::Medium,
        b"lora_name" => Field::LoraName,
        b"extra_keys" => Field::ExtraKeys,
        b"cache_salt" => Field::CacheSalt,
        b"group_idx" => Field::GroupIdx,
        b"kv_cache_spec_kind" => Field::SpecKind,
        // kv_cache_spec_sliding_window, locality, ownership, session_id,
        // lookahead_token_ids and whatever comes next.
        _ => {
            key.text()?;
            Field::Ignored
        }
    })
}

/// An event's fields as read, before its tag says which are required.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<u64>>,
    parent: Option<u64>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<u64>,
    medium: Option<Tier>,
    lora_name: Option<String>,
    extra_keys: Option<BlockExtraKeys>,
    cache_salt: Option<String>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<String>,
}

fn read_tag(reader: &mut Reader<'_>) -> Result<Tag, WireError> {
    // Compared as bytes: a tag is read on every event, and the known ones are ASCII.
    let name = reader.key()?;
    for (known, tag) in [
        (STORED, Tag::Stored),
        (REMOVED, Tag::Removed),
        (CLEARED, Tag::Cleared),
    ] {
        if known.as_bytes() == name.bytes {
            return Ok(tag);
        }
    }
    Err(WireError::UnknownEventType {
        name: bounded_name(name.text()?),
    })
}

/// One block hash: an integer of any width, or 32 bytes.
fn read_hash(reader: &mut Reader<'_>) -> Result<u64, WireError> {
    if reader.at_bin() {
        let bytes = reader.bin()?;
        let Some(head) = bytes.first_chunk::<8>().filter(|_| bytes.len() == 32) else {
            return Err(WireError::BadHashWidth { len: bytes.len() });
        };
        return Ok(u64::from_be_bytes(*head));
    }
    match reader.int() {
        Ok(int) => Ok(int.bits()),
        Err(WireError::UnexpectedType { offset, .. }) => Err(WireError::UnexpectedType {
            offset,
            expected: "a block hash (integer or 32 bytes)",
        }),
        Err(error) => Err(error),
    }
}

fn read_hashes(reader: &mut Reader<'_>, budget: &mut Budget) -> Result<Vec<u64>, WireError> {
    let len = reader.array_len()?;
    budget.take_blocks(len)?;
    reader.check_count(len, 1)?;
    let mut hashes = Vec::with_capacity(len);
    for _ in 0..len {
        hashes.push(read_hash(reader)?);
    }
    Ok(hashes)
}

fn read_tokens(reader: &mut Reader<'_>, budget: &mut Budget) -> Result<Vec<u32>, WireError> {
    let len = reader.array_len()?;
    budget.take_tokens(len)?;
    reader.check_count(len, 1)?;
    let mut tokens = Vec::with_capacity(len);
    for _ in 0..len {
        tokens.push(reader.u32("token_ids")?);
    }
    Ok(tokens)
}

/// Reads `field`'s value into `fields`; nil reads as absent everywhere.
fn read_field(
    reader: &mut Reader<'_>,
    field: Field,
    fields: &mut Fields,
    budget: &mut Budget,
) -> Result<(), WireError> {
    if field == Field::Ignored {
        return reader.skip();
    }
    if reader.try_nil()? {
        return Ok(());
    }
    match field {
        Field::BlockHashes => fields.block_hashes = Some(read_hashes(reader, budget)?),
        Field::Parent => fields.parent = Some(read_hash(reader)?),
        Field::TokenIds => fields.token_ids = Some(read_tokens(reader, budget)?),
        Field::BlockSize => fields.block_size = Some(reader.u32("block_size")?),
        Field::LoraId => fields.lora_id = Some(reader.int()?.bits()),
        Field::Medium => {
            let name = reader.str()?;
            let tier = medium_tier(name).ok_or_else(|| WireError::UnknownMedium {
                name: bounded_name(name),
            })?;
            fields.medium = Some(tier);
        }
        Field::LoraName => fields.lora_name = Some(reader.str()?.to_string()),
        Field::ExtraKeys => fields.extra_keys = Some(read_extra_keys(reader)?),
        Field::CacheSalt => fields.cache_salt = Some(reader.str()?.to_string()),
        Field::GroupIdx => fields.group_idx = Some(reader.u32("group_idx")?),
        Field::SpecKind => fields.kv_cache_spec_kind = Some(reader.str()?.to_string()),
        Field::Ignored => {}
    }
    Ok(())
}

fn build(tag: Tag, fields: Fields) -> Result<EngineEvent, WireError> {
    let block_hashes = || {
        fields.block_hashes.ok_or(WireError::MissingField {
            field: "block_hashes",
        })
    };
    Ok(match tag {
        Tag::Stored => {
            let block_size = fields.block_size.ok_or(WireError::MissingField {
                field: "block_size",
            })?;
            EngineEvent::BlockStored(BlockStored {
                parent_block_hash: fields.parent,
                token_ids: fields.token_ids.unwrap_or_default(),
                block_size,
                lora_id: fields.lora_id,
                medium: fields.medium,
                lora_name: fields.lora_name,
                extra_keys: fields.extra_keys,
                cache_salt: fields.cache_salt,
                group_idx: fields.group_idx,
                kv_cache_spec_kind: fields.kv_cache_spec_kind,
                block_hashes: block_hashes()?,
            })
        }
        Tag::Removed => EngineEvent::BlockRemoved(BlockRemoved {
            medium: fields.medium,
            group_idx: fields.group_idx,
            kv_cache_spec_kind: fields.kv_cache_spec_kind,
            block_hashes: block_hashes()?,
        }),
        Tag::Cleared => EngineEvent::AllBlocksCleared,
    })
}

fn decode_event(reader: &mut Reader<'_>, budget: &mut Budget) -> Result<EngineEvent, WireError> {
    let mut fields = Fields::default();
    if reader.at_array() {
        // vLLM 0.9–0.23: ["BlockStored", field1, field2, ...].
        let len = reader.array_len()?;
        if len == 0 {
            return Err(WireError::MissingField { field: "type" });
        }
        let tag = read_tag(reader)?;
        let positions: &[Field] = match tag {
            Tag::Stored => &STORED_POSITIONS,
            Tag::Removed => &REMOVED_POSITIONS,
            Tag::Cleared => &[],
        };
        for position in 0..len - 1 {
            let field = positions.get(position).copied().unwrap_or(Field::Ignored);
            read_field(reader, field, &mut fields, budget)?;
        }
        return build(tag, fields);
    }
    if reader.at_map() {
        // vLLM ≥ 0.24 and SGLang: {"type": "BlockStored", ...}, the tag anywhere.
        let len = reader.map_len()?;
        let mut tag = None;
        for _ in 0..len {
            if !reader.at_str() {
                // A key of another type names no field of ours.
                reader.skip()?;
                reader.skip()?;
                continue;
            }
            let key = reader.key()?;
            if key.bytes == b"type" {
                tag = Some(read_tag(reader)?);
            } else {
                read_field(reader, field_of_key(key)?, &mut fields, budget)?;
            }
        }
        let tag = tag.ok_or(WireError::MissingField { field: "type" })?;
        return build(tag, fields);
    }
    if reader.remaining() == 0 {
        return Err(reader.malformed());
    }
    Err(WireError::UnexpectedType {
        offset: reader.position(),
        expected: "an event (array or map)",
    })
}

impl EngineDecoder {
    /// A decoder with these limits and this policy for unknown events.
    pub fn new(limits: DecodeLimits, unknown: UnknownEvents) -> Self {
        Self { limits, unknown }
    }

    /// Decodes one msgpack batch that arrived with sequence number `seq`.
    pub fn decode_payload(&self, seq: u64, payload: &[u8]) -> Result<EngineBatch, WireError> {
        if payload.len() > self.limits.max_payload_bytes {
            return Err(WireError::Oversized {
                what: "payload_bytes",
                got: payload.len(),
                limit: self.limits.max_payload_bytes,
            });
        }
        let mut reader = Reader::new(payload);
        let len = reader.array_len()?;
        if len < 2 {
            return Err(WireError::BatchShape { len });
        }
        let ts = reader.f64()?;
        let count = reader.array_len()?;
        if count > self.limits.max_events {
            return Err(WireError::Oversized {
                what: "events",
                got: count,
                limit: self.limits.max_events,
            });
        }
        reader.check_count(count, 1)?;
        let mut budget = Budget {
            limits: self.limits,
            blocks: 0,
            tokens: 0,
        };
        let mut events = Vec::with_capacity(count);
        let mut skipped = Vec::new();
        for index in 0..count {
            let start = reader.position();
            match decode_event(&mut reader, &mut budget) {
                Ok(event) => events.push(event),
                Err(error) if error.is_per_event() && self.unknown == UnknownEvents::Skip => {
                    // Back to the event's start and over it whole: the error was found
                    // part-way through, and the event must still be well-formed msgpack
                    // for the rest of the batch to be trusted.
                    reader.rewind(start);
                    reader.skip()?;
                    skipped.push(SkippedEvent { index, error });
                }
                Err(error) => return Err(error),
            }
        }
        let dp_rank = if len >= 3 && !reader.try_nil()? {
            Some(reader.u32("dp_rank")?)
        } else {
            None
        };
        for _ in 3..len {
            reader.skip()?;
        }
        if !reader.is_at_end() {
            return Err(reader.malformed());
        }
        Ok(EngineBatch {
            seq,
            ts,
            events,
            dp_rank,
            skipped,
        })
    }

    /// Decodes a live message: exactly the frames `[topic, seq, payload]`.
    pub fn decode_live<F: AsRef<[u8]>>(&self, frames: &[F]) -> Result<EngineBatch, WireError> {
        let message = LiveMessage::parse(frames)?;
        self.decode_payload(message.seq, message.payload)
    }

    /// Decodes a replay reply (either layout); `None` for the end marker.
    pub fn decode_replay<F: AsRef<[u8]>>(
        &self,
        frames: &[F],
    ) -> Result<Option<EngineBatch>, WireError> {
        let reply = ReplayReply::parse(frames)?;
        if reply.is_end() {
            return Ok(None);
        }
        self.decode_payload(reply.seq, reply.payload).map(Some)
    }
}

mod encode;
pub use encode::{
    ArrayFields, BatchShape, EncodeOptions, EngineFormat, EventEncoding, HashEncoding, MapHeader,
};

#[cfg(test)]
mod tests;
