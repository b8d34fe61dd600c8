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
//! Never: compute a hash, number events or apply them (see `super::convert`); allocate
//! per block (each event's vectors are sized once from their msgpack headers).

use super::frames::{LiveMessage, ReplayReply};
use super::msgpack::{self, Reader};
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
    /// The KV cache group of hybrid models (vLLM ≥ 0.24), if the engine said.
    pub group_idx: Option<u32>,
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
    GroupIdx,
    Ignored,
}

/// `BlockStored`'s fields in array order, after the tag.
const STORED_POSITIONS: [Field; 9] = [
    Field::BlockHashes,
    Field::Parent,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraName,
    // extra_keys: opaque to a router.
    Field::Ignored,
    Field::GroupIdx,
];

/// `BlockRemoved`'s fields in array order, after the tag.
const REMOVED_POSITIONS: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];

fn field_of_key(key: &str) -> Field {
    match key {
        "block_hashes" => Field::BlockHashes,
        "parent_block_hash" => Field::Parent,
        "token_ids" => Field::TokenIds,
        "block_size" => Field::BlockSize,
        "lora_id" => Field::LoraId,
        "medium" => Field::Medium,
        "lora_name" => Field::LoraName,
        "group_idx" => Field::GroupIdx,
        // extra_keys, kv_cache_spec_*, locality, ownership, session_id,
        // lookahead_token_ids and whatever comes next.
        _ => Field::Ignored,
    }
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
    group_idx: Option<u32>,
}

fn read_tag(reader: &mut Reader<'_>) -> Result<Tag, WireError> {
    let name = reader.str()?;
    match name {
        STORED => Ok(Tag::Stored),
        REMOVED => Ok(Tag::Removed),
        CLEARED => Ok(Tag::Cleared),
        _ => Err(WireError::UnknownEventType {
            name: bounded_name(name),
        }),
    }
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
        Field::GroupIdx => fields.group_idx = Some(reader.u32("group_idx")?),
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
                group_idx: fields.group_idx,
                block_hashes: block_hashes()?,
            })
        }
        Tag::Removed => EngineEvent::BlockRemoved(BlockRemoved {
            medium: fields.medium,
            group_idx: fields.group_idx,
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
            let key = reader.str()?;
            if key == "type" {
                tag = Some(read_tag(reader)?);
            } else {
                read_field(reader, field_of_key(key), &mut fields, budget)?;
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

/// The batch array: `[ts, events]` (vLLM 0.9) or `[ts, events, dp_rank]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchShape {
    /// `[ts, events]`: the rank is not sent.
    Pair,
    /// `[ts, events, dp_rank]`, the rank nil when unknown.
    Triple,
}

/// Which trailing fields a positional (array) event carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayFields {
    /// Through `lora_id` (`BlockRemoved`: `block_hashes` only): vLLM 0.9.
    ThroughLoraId,
    /// Through `medium`: vLLM 0.10.0–0.10.1.
    ThroughMedium,
    /// Through `group_idx` (`lora_name`, `extra_keys` (always nil), `group_idx`; for
    /// `BlockRemoved` `medium`, `group_idx`), every position written, nil when absent,
    /// as msgspec writes array-like structs (it omits no default there): vLLM
    /// 0.10.2–0.23.
    All,
}

/// The header width of a map event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapHeader {
    /// The smallest that fits (fixmap below 16 keys), as msgspec writes it.
    Smallest,
    /// Always map16, as vLLM 0.33 writes it.
    Map16,
}

/// How events are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventEncoding {
    /// `["BlockStored", field1, ...]`.
    Array(ArrayFields),
    /// `{"type": "BlockStored", ...}`: the tag, then the required fields (nil when
    /// absent), then the optional ones that are present.
    Map(MapHeader),
}

/// How block hashes are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashEncoding {
    /// Unsigned 64-bit integers (vLLM ≥ 0.10.2).
    Unsigned,
    /// Signed 64-bit integers, the same bits (vLLM before 0.10.2, SGLang).
    Signed,
    /// 32 bytes: the hash big-endian, then 24 zero bytes (vLLM with
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, as the decoder reads it back).
    Bytes32,
}

/// Everything that decides the bytes of an encoded batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The batch array.
    pub batch: BatchShape,
    /// The events.
    pub events: EventEncoding,
    /// The block hashes.
    pub hashes: HashEncoding,
}

/// The engine versions whose format the encoder can write (WIRE.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineFormat {
    /// vLLM 0.9: `[ts, events]`, array events without medium, signed hashes.
    Vllm0_9,
    /// vLLM 0.10.0–0.10.1: rank in the batch, array events with medium, signed hashes.
    Vllm0_10,
    /// vLLM 0.10.2–0.23: array events with every field, unsigned hashes.
    Vllm0_11,
    /// vLLM 0.24–0.32: map events, unsigned hashes.
    Vllm0_24,
    /// vLLM 0.33: map events under map16 headers, unsigned hashes.
    Vllm0_33,
    /// SGLang: map events, signed hashes.
    Sglang,
}

impl EngineFormat {
    /// Every format, oldest first.
    pub const ALL: [EngineFormat; 6] = [
        EngineFormat::Vllm0_9,
        EngineFormat::Vllm0_10,
        EngineFormat::Vllm0_11,
        EngineFormat::Vllm0_24,
        EngineFormat::Vllm0_33,
        EngineFormat::Sglang,
    ];

    /// The encoder options that write this format.
    pub const fn options(self) -> EncodeOptions {
        let (batch, events, hashes) = match self {
            EngineFormat::Vllm0_9 => (
                BatchShape::Pair,
                EventEncoding::Array(ArrayFields::ThroughLoraId),
                HashEncoding::Signed,
            ),
            EngineFormat::Vllm0_10 => (
                BatchShape::Triple,
                EventEncoding::Array(ArrayFields::ThroughMedium),
                HashEncoding::Signed,
            ),
            EngineFormat::Vllm0_11 => (
                BatchShape::Triple,
                EventEncoding::Array(ArrayFields::All),
                HashEncoding::Unsigned,
            ),
            EngineFormat::Vllm0_24 => (
                BatchShape::Triple,
                EventEncoding::Map(MapHeader::Smallest),
                HashEncoding::Unsigned,
            ),
            EngineFormat::Vllm0_33 => (
                BatchShape::Triple,
                EventEncoding::Map(MapHeader::Map16),
                HashEncoding::Unsigned,
            ),
            EngineFormat::Sglang => (
                BatchShape::Triple,
                EventEncoding::Map(MapHeader::Smallest),
                HashEncoding::Signed,
            ),
        };
        EncodeOptions {
            batch,
            events,
            hashes,
        }
    }
}

impl From<EngineFormat> for EncodeOptions {
    fn from(format: EngineFormat) -> Self {
        format.options()
    }
}

fn write_hash(out: &mut Vec<u8>, hash: u64, encoding: HashEncoding) {
    match encoding {
        HashEncoding::Unsigned => msgpack::write_uint(out, hash),
        HashEncoding::Signed => msgpack::write_int(out, hash as i64),
        HashEncoding::Bytes32 => {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&hash.to_be_bytes());
            msgpack::write_bin(out, &bytes);
        }
    }
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64], encoding: HashEncoding) {
    msgpack::write_array_len(out, hashes.len());
    for hash in hashes {
        write_hash(out, *hash, encoding);
    }
}

fn write_opt_hash(out: &mut Vec<u8>, hash: Option<u64>, encoding: HashEncoding) {
    match hash {
        Some(hash) => write_hash(out, hash, encoding),
        None => msgpack::write_nil(out),
    }
}

fn write_tokens(out: &mut Vec<u8>, tokens: &[u32]) {
    msgpack::write_array_len(out, tokens.len());
    for token in tokens {
        msgpack::write_uint(out, u64::from(*token));
    }
}

fn write_opt_uint(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        Some(value) => msgpack::write_uint(out, value),
        None => msgpack::write_nil(out),
    }
}

fn write_opt_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) => msgpack::write_str(out, value),
        None => msgpack::write_nil(out),
    }
}

fn write_medium(out: &mut Vec<u8>, medium: Option<Tier>) {
    write_opt_str(out, medium.map(tier_medium));
}

fn write_array_event(
    out: &mut Vec<u8>,
    event: &EngineEvent,
    fields: ArrayFields,
    hashes: HashEncoding,
) {
    match event {
        EngineEvent::BlockStored(stored) => {
            // Positions after the tag: 5 through lora_id, 6 through medium, 9 through
            // group_idx (lora_name 7, extra_keys 8, always nil here).
            let len = match fields {
                ArrayFields::ThroughLoraId => 5,
                ArrayFields::ThroughMedium => 6,
                ArrayFields::All => 9,
            };
            msgpack::write_array_len(out, 1 + len);
            msgpack::write_str(out, STORED);
            write_hashes(out, &stored.block_hashes, hashes);
            write_opt_hash(out, stored.parent_block_hash, hashes);
            write_tokens(out, &stored.token_ids);
            msgpack::write_uint(out, u64::from(stored.block_size));
            write_opt_uint(out, stored.lora_id);
            if len >= 6 {
                write_medium(out, stored.medium);
            }
            if len >= 9 {
                write_opt_str(out, stored.lora_name.as_deref());
                msgpack::write_nil(out);
                write_opt_uint(out, stored.group_idx.map(u64::from));
            }
        }
        EngineEvent::BlockRemoved(removed) => {
            let len = match fields {
                ArrayFields::ThroughLoraId => 1,
                ArrayFields::ThroughMedium => 2,
                ArrayFields::All => 3,
            };
            msgpack::write_array_len(out, 1 + len);
            msgpack::write_str(out, REMOVED);
            write_hashes(out, &removed.block_hashes, hashes);
            if len >= 2 {
                write_medium(out, removed.medium);
            }
            if len >= 3 {
                write_opt_uint(out, removed.group_idx.map(u64::from));
            }
        }
        EngineEvent::AllBlocksCleared => {
            msgpack::write_array_len(out, 1);
            msgpack::write_str(out, CLEARED);
        }
    }
}

fn write_map_event(
    out: &mut Vec<u8>,
    event: &EngineEvent,
    header: MapHeader,
    hashes: HashEncoding,
) {
    let wide = header == MapHeader::Map16;
    match event {
        EngineEvent::BlockStored(stored) => {
            let optional =
                usize::from(stored.lora_name.is_some()) + usize::from(stored.group_idx.is_some());
            msgpack::write_map_len(out, 7 + optional, wide);
            msgpack::write_str(out, "type");
            msgpack::write_str(out, STORED);
            msgpack::write_str(out, "block_hashes");
            write_hashes(out, &stored.block_hashes, hashes);
            msgpack::write_str(out, "parent_block_hash");
            write_opt_hash(out, stored.parent_block_hash, hashes);
            msgpack::write_str(out, "token_ids");
            write_tokens(out, &stored.token_ids);
            msgpack::write_str(out, "block_size");
            msgpack::write_uint(out, u64::from(stored.block_size));
            msgpack::write_str(out, "lora_id");
            write_opt_uint(out, stored.lora_id);
            msgpack::write_str(out, "medium");
            write_medium(out, stored.medium);
            if let Some(name) = &stored.lora_name {
                msgpack::write_str(out, "lora_name");
                msgpack::write_str(out, name);
            }
            if let Some(group) = stored.group_idx {
                msgpack::write_str(out, "group_idx");
                msgpack::write_uint(out, u64::from(group));
            }
        }
        EngineEvent::BlockRemoved(removed) => {
            msgpack::write_map_len(out, 3 + usize::from(removed.group_idx.is_some()), wide);
            msgpack::write_str(out, "type");
            msgpack::write_str(out, REMOVED);
            msgpack::write_str(out, "block_hashes");
            write_hashes(out, &removed.block_hashes, hashes);
            msgpack::write_str(out, "medium");
            write_medium(out, removed.medium);
            if let Some(group) = removed.group_idx {
                msgpack::write_str(out, "group_idx");
                msgpack::write_uint(out, u64::from(group));
            }
        }
        EngineEvent::AllBlocksCleared => {
            msgpack::write_map_len(out, 1, wide);
            msgpack::write_str(out, "type");
            msgpack::write_str(out, CLEARED);
        }
    }
}

impl EngineBatch {
    /// Appends the msgpack payload of this batch, as `options` says, to `out`. What the
    /// format cannot carry is left out ([`EngineBatch::as_encoded_by`] says what).
    pub fn encode(&self, options: &EncodeOptions, out: &mut Vec<u8>) {
        let triple = options.batch == BatchShape::Triple;
        msgpack::write_array_len(out, if triple { 3 } else { 2 });
        msgpack::write_f64(out, self.ts);
        msgpack::write_array_len(out, self.events.len());
        for event in &self.events {
            match options.events {
                EventEncoding::Array(fields) => {
                    write_array_event(out, event, fields, options.hashes)
                }
                EventEncoding::Map(header) => write_map_event(out, event, header, options.hashes),
            }
        }
        if triple {
            write_opt_uint(out, self.dp_rank.map(u64::from));
        }
    }

    /// The msgpack payload of this batch.
    pub fn to_payload(&self, options: &EncodeOptions) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(options, &mut out);
        out
    }

    /// The three frames of a live message: `[topic, seq, payload]`.
    pub fn to_live_frames(&self, topic: &[u8], options: &EncodeOptions) -> [Vec<u8>; 3] {
        LiveMessage {
            topic,
            seq: self.seq,
            payload: &self.to_payload(options),
        }
        .to_frames()
    }

    /// This batch as decoding its encoding with `options` gives it back: the fields the
    /// format does not carry are absent, nothing is skipped.
    pub fn as_encoded_by(&self, options: &EncodeOptions) -> EngineBatch {
        let keep_medium = options.events != EventEncoding::Array(ArrayFields::ThroughLoraId);
        let keep_optional = !matches!(
            options.events,
            EventEncoding::Array(ArrayFields::ThroughLoraId | ArrayFields::ThroughMedium)
        );
        let events = self
            .events
            .iter()
            .map(|event| match event {
                EngineEvent::BlockStored(stored) => EngineEvent::BlockStored(BlockStored {
                    medium: stored.medium.filter(|_| keep_medium),
                    lora_name: stored.lora_name.clone().filter(|_| keep_optional),
                    group_idx: stored.group_idx.filter(|_| keep_optional),
                    ..stored.clone()
                }),
                EngineEvent::BlockRemoved(removed) => EngineEvent::BlockRemoved(BlockRemoved {
                    medium: removed.medium.filter(|_| keep_medium),
                    group_idx: removed.group_idx.filter(|_| keep_optional),
                    block_hashes: removed.block_hashes.clone(),
                }),
                EngineEvent::AllBlocksCleared => EngineEvent::AllBlocksCleared,
            })
            .collect();
        EngineBatch {
            seq: self.seq,
            ts: self.ts,
            events,
            dp_rank: self.dp_rank.filter(|_| options.batch == BatchShape::Triple),
            skipped: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
