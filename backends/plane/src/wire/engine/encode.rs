//! The encoder of engine batches: exactly what each engine version writes (WIRE.md),
//! for tests, benches and `kvtwin`'s own publishers.
//!
//! Owns: [`EncodeOptions`] and its parts, [`EngineFormat`], `EngineBatch::encode` and
//! [`EngineBatch::as_encoded_by`] (what decoding an encoding gives back).
//! Never: write a field an engine of that format does not (it is left out, and
//! `as_encoded_by` says so).

use super::{
    msgpack, tier_medium, write_extra_keys, BlockRemoved, BlockStored, EngineBatch, EngineEvent,
    LiveMessage, CLEARED, REMOVED, STORED,
};
use kvtwin::tier::Tier;

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
    /// Through `group_idx` (`lora_name`, `extra_keys`, `group_idx`; for
    /// `BlockRemoved` `medium`, `group_idx`), every position written, nil when absent,
    /// as msgspec writes array-like structs (it omits no default there): vLLM
    /// 0.10.2–0.23. (No `cache_salt` or `kv_cache_spec_kind`: those versions had none.)
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
                match &stored.extra_keys {
                    Some(keys) => write_extra_keys(out, keys),
                    None => msgpack::write_nil(out),
                }
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
            let optional = usize::from(stored.lora_name.is_some())
                + usize::from(stored.extra_keys.is_some())
                + usize::from(stored.cache_salt.is_some())
                + usize::from(stored.group_idx.is_some())
                + usize::from(stored.kv_cache_spec_kind.is_some());
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
            if let Some(keys) = &stored.extra_keys {
                msgpack::write_str(out, "extra_keys");
                write_extra_keys(out, keys);
            }
            if let Some(salt) = &stored.cache_salt {
                msgpack::write_str(out, "cache_salt");
                msgpack::write_str(out, salt);
            }
            if let Some(group) = stored.group_idx {
                msgpack::write_str(out, "group_idx");
                msgpack::write_uint(out, u64::from(group));
            }
            if let Some(kind) = &stored.kv_cache_spec_kind {
                msgpack::write_str(out, "kv_cache_spec_kind");
                msgpack::write_str(out, kind);
            }
        }
        EngineEvent::BlockRemoved(removed) => {
            let optional = usize::from(removed.group_idx.is_some())
                + usize::from(removed.kv_cache_spec_kind.is_some());
            msgpack::write_map_len(out, 3 + optional, wide);
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
            if let Some(kind) = &removed.kv_cache_spec_kind {
                msgpack::write_str(out, "kv_cache_spec_kind");
                msgpack::write_str(out, kind);
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
        // Fields of map events only (vLLM ≥ 0.24, SGLang).
        let keep_map_only = matches!(options.events, EventEncoding::Map(_));
        let events = self
            .events
            .iter()
            .map(|event| match event {
                EngineEvent::BlockStored(stored) => EngineEvent::BlockStored(BlockStored {
                    medium: stored.medium.filter(|_| keep_medium),
                    lora_name: stored.lora_name.clone().filter(|_| keep_optional),
                    extra_keys: stored.extra_keys.clone().filter(|_| keep_optional),
                    cache_salt: stored.cache_salt.clone().filter(|_| keep_map_only),
                    group_idx: stored.group_idx.filter(|_| keep_optional),
                    kv_cache_spec_kind: stored.kv_cache_spec_kind.clone().filter(|_| keep_map_only),
                    ..stored.clone()
                }),
                EngineEvent::BlockRemoved(removed) => EngineEvent::BlockRemoved(BlockRemoved {
                    medium: removed.medium.filter(|_| keep_medium),
                    group_idx: removed.group_idx.filter(|_| keep_optional),
                    kv_cache_spec_kind: removed
                        .kv_cache_spec_kind
                        .clone()
                        .filter(|_| keep_map_only),
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
