//! Dynamo's `RouterEvent`: the JSON form its routers consume over NATS, and the Dynamo
//! 1.6 msgpack envelope (WIRE.md).
//!
//! Owns: [`RouterEvent`] (a worker id plus kvtwin's own [`KvCacheEvent`], which is
//! Dynamo's `KvCacheEvent`: the storage tier travels beside the event and lives in its
//! `Stored` / `Removed` data here), its JSON codec ([`RouterEvent::to_json`],
//! [`RouterEvent::from_json`]), [`Envelope`] (`{publisher_id, sequence, published_at,
//! topic, payload: bin}` whose payload is an array of named-map `RouterEvent`s) and the
//! storage tier names ([`storage_tier_name`], [`storage_tier`]).
//!
//! Block hashes are the publisher's opaque block ids (Dynamo's
//! `ExternalSequenceBlockHash`): kvtwin's chained `SequenceHash` when a kvtwin worker
//! publishes, the engine's own hash when a relay forwards vLLM events; `tokens_hash` is
//! always the xxh3 of the block's tokens. Hashes stay integers (u64) in JSON.
//! Never: allocate per block beyond the output vectors, panic on input, or guess a tier
//! name it does not know.

use super::msgpack::{self, Key, Reader};
use super::{bounded_name, DecodeLimits, WireError};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
use kvtwin::tier::Tier;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One worker's KV event as Dynamo's routers receive it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterEvent {
    /// The publishing worker.
    pub worker_id: WorkerId,
    /// The event; its data carries the storage tier.
    pub event: KvCacheEvent,
}

/// Dynamo's name of `tier` (`device`, `host_pinned`, `disk`, `external`).
pub const fn storage_tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "device",
        Tier::Host => "host_pinned",
        Tier::Disk => "disk",
        Tier::Remote => "external",
    }
}

/// The tier of a Dynamo storage tier name (exact, as Dynamo writes them); none for a
/// name kvtwin does not know.
pub fn storage_tier(name: &str) -> Option<Tier> {
    storage_tier_of_bytes(name.as_bytes())
}

/// [`storage_tier`] of a name's bytes (a known name is ASCII, so a match proves them
/// UTF-8).
fn storage_tier_of_bytes(name: &[u8]) -> Option<Tier> {
    Tier::ALL
        .into_iter()
        .find(|tier| storage_tier_name(*tier).as_bytes() == name)
}

fn tier_of(name: &str) -> Result<Tier, WireError> {
    storage_tier(name).ok_or_else(|| unknown_tier(name))
}

fn unknown_tier(name: &str) -> WireError {
    WireError::UnknownStorageTier {
        name: bounded_name(name),
    }
}

/// [`tier_of`] a msgpack string, compared as bytes (checked as UTF-8 only when it names
/// no tier, and then only to name it in the error).
fn tier_of_key(name: Key<'_>) -> Result<Tier, WireError> {
    match storage_tier_of_bytes(name.bytes) {
        Some(tier) => Ok(tier),
        None => Err(unknown_tier(name.text()?)),
    }
}

/// Skips the value of a key no field of ours has, once the key is known to be UTF-8
/// (the keys matched before it are ASCII, so only these need the check).
fn skip_value_of(key: Key<'_>, reader: &mut Reader<'_>) -> Result<(), WireError> {
    key.text()?;
    reader.skip()
}

impl RouterEvent {
    /// What a restarted engine's stream says to routers: `Cleared` for every rank seen,
    /// each numbered after that rank's last event (`next_ids`: each rank's next id,
    /// advanced), so they forget all it held.
    pub fn cleared_ranks(
        worker_id: WorkerId,
        next_ids: &mut std::collections::BTreeMap<u32, u64>,
    ) -> Vec<RouterEvent> {
        next_ids
            .iter_mut()
            .map(|(&dp_rank, next)| {
                let event_id = *next;
                *next += 1;
                RouterEvent {
                    worker_id,
                    event: KvCacheEvent {
                        event_id,
                        dp_rank,
                        data: KvCacheEventData::Cleared,
                    },
                }
            })
            .collect()
    }

    /// The storage tier the event names (`Cleared` concerns every tier and is sent as
    /// `device`).
    pub fn storage_tier(&self) -> Tier {
        match &self.event.data {
            KvCacheEventData::Stored { tier, .. } | KvCacheEventData::Removed { tier, .. } => *tier,
            KvCacheEventData::Cleared => Tier::Device,
        }
    }

    /// Blocks the event names (stored or removed; none for `Cleared`).
    pub fn block_count(&self) -> usize {
        match &self.event.data {
            KvCacheEventData::Stored { blocks, .. } => blocks.len(),
            KvCacheEventData::Removed { block_hashes, .. } => block_hashes.len(),
            KvCacheEventData::Cleared => 0,
        }
    }

    /// Appends the JSON form to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let data = match &self.event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                ..
            } => DataOut::Stored {
                parent_hash: *parent_hash,
                blocks,
            },
            KvCacheEventData::Removed { block_hashes, .. } => DataOut::Removed { block_hashes },
            KvCacheEventData::Cleared => DataOut::Cleared,
        };
        let json = RouterEventOut {
            worker_id: self.worker_id.get(),
            storage_tier: storage_tier_name(self.storage_tier()),
            event: EventOut {
                event_id: self.event.event_id,
                dp_rank: self.event.dp_rank,
                data,
            },
        };
        // Cannot fail: a Vec takes every byte and every key is a string.
        let written = serde_json::to_writer(out, &json);
        debug_assert!(written.is_ok());
    }

    /// The JSON form.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + 64 * self.block_count());
        self.write_json(&mut out);
        out
    }

    /// Decodes the JSON form. Unknown keys are ignored; `storage_tier` absent means
    /// `device` and `dp_rank` absent means 0 (older Dynamo sent neither).
    pub fn from_json(bytes: &[u8], limits: &DecodeLimits) -> Result<Self, WireError> {
        if bytes.len() > limits.max_payload_bytes {
            return Err(WireError::Oversized {
                what: "payload_bytes",
                got: bytes.len(),
                limit: limits.max_payload_bytes,
            });
        }
        let json: RouterEventIn =
            serde_json::from_slice(bytes).map_err(|error| WireError::BadJson {
                message: error.to_string(),
            })?;
        let tier = match json.storage_tier {
            None => Tier::Device,
            Some(TierIn(tier)) => tier?,
        };
        let data = match json.event.data {
            DataIn::Stored {
                parent_hash,
                blocks,
            } => KvCacheEventData::Stored {
                parent_hash,
                blocks,
                tier,
            },
            DataIn::Removed { block_hashes } => KvCacheEventData::Removed { block_hashes, tier },
            DataIn::Cleared => KvCacheEventData::Cleared,
            DataIn::Unknown(name) => return Err(WireError::UnknownEventType { name }),
        };
        let event = RouterEvent {
            worker_id: WorkerId::new(json.worker_id),
            event: KvCacheEvent {
                event_id: json.event.event_id,
                dp_rank: json.event.dp_rank,
                data,
            },
        };
        let blocks = event.block_count();
        if blocks > limits.max_blocks {
            return Err(WireError::Oversized {
                what: "blocks",
                got: blocks,
                limit: limits.max_blocks,
            });
        }
        Ok(event)
    }
}

#[derive(Serialize)]
struct RouterEventOut<'a> {
    worker_id: u64,
    storage_tier: &'static str,
    event: EventOut<'a>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    event_id: u64,
    dp_rank: u32,
    data: DataOut<'a>,
}

/// Externally tagged, as Dynamo's serde writes it: `{"stored": {..}}`, `"cleared"`.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum DataOut<'a> {
    Stored {
        parent_hash: Option<SequenceHash>,
        blocks: &'a [StoredBlock],
    },
    Removed {
        block_hashes: &'a [SequenceHash],
    },
    Cleared,
}

#[derive(Deserialize)]
struct RouterEventIn {
    worker_id: u64,
    #[serde(default)]
    storage_tier: Option<TierIn>,
    event: EventIn,
}

#[derive(Deserialize)]
struct EventIn {
    event_id: u64,
    #[serde(default)]
    dp_rank: u32,
    data: DataIn,
}

/// A storage tier name, borrowed or escaped, without allocating for the known ones.
struct TierIn(Result<Tier, WireError>);

impl<'de> Deserialize<'de> for TierIn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TierVisitor;
        impl Visitor<'_> for TierVisitor {
            type Value = TierIn;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a storage tier name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<TierIn, E> {
                Ok(TierIn(tier_of(name)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<TierIn, E> {
                Ok(TierIn(Ok(Tier::Device)))
            }
        }
        deserializer.deserialize_any(TierVisitor)
    }
}

#[derive(Deserialize)]
struct StoredIn {
    #[serde(default)]
    parent_hash: Option<SequenceHash>,
    blocks: Vec<StoredBlock>,
}

#[derive(Deserialize)]
struct RemovedIn {
    block_hashes: Vec<SequenceHash>,
}

/// The event data, with a place for variants this decoder does not know (so they count
/// as `unknown_event_type`, not as bad JSON).
enum DataIn {
    Stored {
        parent_hash: Option<SequenceHash>,
        blocks: Vec<StoredBlock>,
    },
    Removed {
        block_hashes: Vec<SequenceHash>,
    },
    Cleared,
    Unknown(String),
}

/// A variant name of `DataIn`.
enum DataKey {
    Stored,
    Removed,
    Other(String),
}

impl<'de> Deserialize<'de> for DataKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = DataKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event kind")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<DataKey, E> {
                Ok(match key {
                    "stored" => DataKey::Stored,
                    "removed" => DataKey::Removed,
                    other => DataKey::Other(bounded_name(other)),
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for DataIn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DataVisitor;
        impl<'de> Visitor<'de> for DataVisitor {
            type Value = DataIn;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""cleared", {"stored": ..} or {"removed": ..}"#)
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<DataIn, E> {
                Ok(match name {
                    "cleared" => DataIn::Cleared,
                    other => DataIn::Unknown(bounded_name(other)),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DataIn, A::Error> {
                let data = match map.next_key::<DataKey>()? {
                    None => DataIn::Unknown(String::new()),
                    Some(DataKey::Stored) => {
                        let stored: StoredIn = map.next_value()?;
                        DataIn::Stored {
                            parent_hash: stored.parent_hash,
                            blocks: stored.blocks,
                        }
                    }
                    Some(DataKey::Removed) => {
                        let removed: RemovedIn = map.next_value()?;
                        DataIn::Removed {
                            block_hashes: removed.block_hashes,
                        }
                    }
                    Some(DataKey::Other(name)) => {
                        map.next_value::<IgnoredAny>()?;
                        DataIn::Unknown(name)
                    }
                };
                // An externally tagged enum has one key; more are ignored like any
                // unknown key.
                while map.next_key::<IgnoredAny>()?.is_some() {
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(data)
            }
        }
        deserializer.deserialize_any(DataVisitor)
    }
}

/// The Dynamo 1.6 envelope: one NATS message carrying up to
/// [`Envelope::MAX_EVENTS`] `RouterEvent`s as msgpack named maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The publishing process.
    pub publisher_id: u64,
    /// The publisher's message counter.
    pub sequence: u64,
    /// When it was published, milliseconds since the Unix epoch.
    pub published_at_ms: u64,
    /// The topic, [`Envelope::TOPIC`] for KV events.
    pub topic: String,
    /// The events, in order.
    pub events: Vec<RouterEvent>,
}

impl Envelope {
    /// The topic of KV events.
    pub const TOPIC: &'static str = "kv-events";
    /// The most events Dynamo puts in one envelope; a publisher splits longer runs.
    pub const MAX_EVENTS: usize = 128;

    /// Appends the envelope's msgpack to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        Self::encode_events(
            self.publisher_id,
            self.sequence,
            self.published_at_ms,
            &self.topic,
            &self.events,
            out,
        );
    }

    /// Appends the msgpack of an envelope of `events` to `out`, the same bytes as
    /// [`Envelope::encode`] without building an `Envelope` (a publisher encodes
    /// slices of the events it already holds, without copying them first).
    pub fn encode_events(
        publisher_id: u64,
        sequence: u64,
        published_at_ms: u64,
        topic: &str,
        events: &[RouterEvent],
        out: &mut Vec<u8>,
    ) {
        let mut payload = Vec::with_capacity(
            64 + events
                .iter()
                .map(|event| 32 + 40 * event.block_count())
                .sum::<usize>(),
        );
        msgpack::write_array_len(&mut payload, events.len());
        for event in events {
            write_router_event(&mut payload, event);
        }
        out.reserve(96 + topic.len() + payload.len());
        msgpack::write_map_len(out, 5, false);
        msgpack::write_str(out, "publisher_id");
        msgpack::write_uint(out, publisher_id);
        msgpack::write_str(out, "sequence");
        msgpack::write_uint(out, sequence);
        msgpack::write_str(out, "published_at");
        msgpack::write_uint(out, published_at_ms);
        msgpack::write_str(out, "topic");
        msgpack::write_str(out, topic);
        msgpack::write_str(out, "payload");
        msgpack::write_bin(out, &payload);
    }

    /// The envelope's msgpack.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Decodes an envelope. Unknown keys are ignored at every level.
    pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Self, WireError> {
        if bytes.len() > limits.max_payload_bytes {
            return Err(WireError::Oversized {
                what: "payload_bytes",
                got: bytes.len(),
                limit: limits.max_payload_bytes,
            });
        }
        let mut reader = Reader::new(bytes);
        let (mut publisher_id, mut sequence, mut published_at_ms) = (None, None, None);
        let mut topic = None;
        let mut payload = None;
        for _ in 0..reader.map_len()? {
            if !reader.at_str() {
                reader.skip()?;
                reader.skip()?;
                continue;
            }
            let key = reader.key()?;
            match key.bytes {
                b"publisher_id" => publisher_id = Some(reader.int()?.bits()),
                b"sequence" => sequence = Some(reader.int()?.bits()),
                b"published_at" => published_at_ms = Some(reader.int()?.bits()),
                b"topic" => topic = Some(reader.str()?),
                b"payload" => payload = Some((reader.position(), reader.bin()?)),
                _ => skip_value_of(key, &mut reader)?,
            }
        }
        if !reader.is_at_end() {
            return Err(reader.malformed());
        }
        let missing = |field| WireError::MissingField { field };
        let (payload_offset, payload) = payload.ok_or(missing("payload"))?;
        let events = decode_router_events(payload, limits).map_err(|error| match error {
            // Offsets count from the envelope's start, not the payload's.
            WireError::MalformedMsgpack { offset } => WireError::MalformedMsgpack {
                offset: payload_offset + offset,
            },
            WireError::UnexpectedType { offset, expected } => WireError::UnexpectedType {
                offset: payload_offset + offset,
                expected,
            },
            other => other,
        })?;
        Ok(Envelope {
            publisher_id: publisher_id.ok_or(missing("publisher_id"))?,
            sequence: sequence.ok_or(missing("sequence"))?,
            published_at_ms: published_at_ms.unwrap_or(0),
            topic: topic.unwrap_or(Self::TOPIC).to_string(),
            events,
        })
    }
}

fn write_opt_hash(out: &mut Vec<u8>, hash: Option<SequenceHash>) {
    match hash {
        Some(hash) => msgpack::write_uint(out, hash.get()),
        None => msgpack::write_nil(out),
    }
}

/// A `RouterEvent` as rmp-serde's named encoding writes it: structs as maps, the data as
/// `{"stored": {..}}` or the string `"cleared"`.
fn write_router_event(out: &mut Vec<u8>, event: &RouterEvent) {
    msgpack::write_map_len(out, 3, false);
    msgpack::write_str(out, "worker_id");
    msgpack::write_uint(out, event.worker_id.get());
    msgpack::write_str(out, "storage_tier");
    msgpack::write_str(out, storage_tier_name(event.storage_tier()));
    msgpack::write_str(out, "event");
    msgpack::write_map_len(out, 3, false);
    msgpack::write_str(out, "event_id");
    msgpack::write_uint(out, event.event.event_id);
    msgpack::write_str(out, "dp_rank");
    msgpack::write_uint(out, u64::from(event.event.dp_rank));
    msgpack::write_str(out, "data");
    match &event.event.data {
        KvCacheEventData::Stored {
            parent_hash,
            blocks,
            ..
        } => {
            msgpack::write_map_len(out, 1, false);
            msgpack::write_str(out, "stored");
            msgpack::write_map_len(out, 2, false);
            msgpack::write_str(out, "parent_hash");
            write_opt_hash(out, *parent_hash);
            msgpack::write_str(out, "blocks");
            msgpack::write_array_len(out, blocks.len());
            // At most 42 bytes a block: the map header and keys, two 9-byte integers.
            out.reserve(blocks.len() * (BLOCK_HEAD.len() + TOKENS_HASH_KEY.len() + 18));
            for block in blocks {
                // The bytes `write_map_len(2)` and `write_str` would write, as constants.
                out.extend_from_slice(BLOCK_HEAD);
                msgpack::write_uint(out, block.block_hash.get());
                out.extend_from_slice(TOKENS_HASH_KEY);
                msgpack::write_uint(out, block.tokens_hash.get());
            }
        }
        KvCacheEventData::Removed { block_hashes, .. } => {
            msgpack::write_map_len(out, 1, false);
            msgpack::write_str(out, "removed");
            msgpack::write_map_len(out, 1, false);
            msgpack::write_str(out, "block_hashes");
            msgpack::write_array_len(out, block_hashes.len());
            for hash in block_hashes {
                msgpack::write_uint(out, hash.get());
            }
        }
        KvCacheEventData::Cleared => msgpack::write_str(out, "cleared"),
    }
}

/// Skips a map entry whose key is not a string; whether the next key is a string.
fn string_key_next(reader: &mut Reader<'_>) -> Result<bool, WireError> {
    if reader.at_str() {
        return Ok(true);
    }
    reader.skip()?;
    reader.skip()?;
    Ok(false)
}

fn decode_router_events(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<RouterEvent>, WireError> {
    let mut reader = Reader::new(payload);
    let count = reader.array_len()?;
    if count > limits.max_events {
        return Err(WireError::Oversized {
            what: "events",
            got: count,
            limit: limits.max_events,
        });
    }
    reader.check_count(count, 1)?;
    let mut blocks_left = limits.max_blocks;
    let mut events = Vec::with_capacity(count);
    for _ in 0..count {
        events.push(decode_router_event(&mut reader, limits, &mut blocks_left)?);
    }
    if !reader.is_at_end() {
        return Err(reader.malformed());
    }
    Ok(events)
}

/// Event data before the tier is known (the tier may come after it in the map).
enum Data {
    Stored(Option<SequenceHash>, Vec<StoredBlock>),
    Removed(Vec<SequenceHash>),
    Cleared,
}

fn decode_router_event(
    reader: &mut Reader<'_>,
    limits: &DecodeLimits,
    blocks_left: &mut usize,
) -> Result<RouterEvent, WireError> {
    let (mut worker_id, mut tier, mut event) = (None, Tier::Device, None);
    for _ in 0..reader.map_len()? {
        if !string_key_next(reader)? {
            continue;
        }
        let key = reader.key()?;
        match key.bytes {
            b"worker_id" => worker_id = Some(reader.int()?.bits()),
            b"storage_tier" => {
                if !reader.try_nil()? {
                    tier = tier_of_key(reader.key()?)?;
                }
            }
            b"event" => event = Some(decode_event(reader, limits, blocks_left)?),
            _ => skip_value_of(key, reader)?,
        }
    }
    let worker_id = worker_id.ok_or(WireError::MissingField { field: "worker_id" })?;
    let (event_id, dp_rank, data) = event.ok_or(WireError::MissingField { field: "event" })?;
    let data = match data {
        Data::Stored(parent_hash, blocks) => KvCacheEventData::Stored {
            parent_hash,
            blocks,
            tier,
        },
        Data::Removed(block_hashes) => KvCacheEventData::Removed { block_hashes, tier },
        Data::Cleared => KvCacheEventData::Cleared,
    };
    Ok(RouterEvent {
        worker_id: WorkerId::new(worker_id),
        event: KvCacheEvent {
            event_id,
            dp_rank,
            data,
        },
    })
}

fn decode_event(
    reader: &mut Reader<'_>,
    limits: &DecodeLimits,
    blocks_left: &mut usize,
) -> Result<(u64, u32, Data), WireError> {
    let (mut event_id, mut dp_rank, mut data) = (None, 0, None);
    for _ in 0..reader.map_len()? {
        if !string_key_next(reader)? {
            continue;
        }
        let key = reader.key()?;
        match key.bytes {
            b"event_id" => event_id = Some(reader.int()?.bits()),
            b"dp_rank" => dp_rank = reader.u32("dp_rank")?,
            b"data" => data = Some(decode_data(reader, limits, blocks_left)?),
            _ => skip_value_of(key, reader)?,
        }
    }
    Ok((
        event_id.ok_or(WireError::MissingField { field: "event_id" })?,
        dp_rank,
        data.ok_or(WireError::MissingField { field: "data" })?,
    ))
}

fn take_blocks(
    reader: &mut Reader<'_>,
    limits: &DecodeLimits,
    blocks_left: &mut usize,
) -> Result<usize, WireError> {
    let len = reader.array_len()?;
    if len > *blocks_left {
        return Err(WireError::Oversized {
            what: "blocks",
            got: (limits.max_blocks - *blocks_left).saturating_add(len),
            limit: limits.max_blocks,
        });
    }
    *blocks_left -= len;
    reader.check_count(len, 1)?;
    Ok(len)
}

fn decode_data(
    reader: &mut Reader<'_>,
    limits: &DecodeLimits,
    blocks_left: &mut usize,
) -> Result<Data, WireError> {
    if reader.at_str() {
        let name = reader.key()?;
        return match name.bytes {
            b"cleared" => Ok(Data::Cleared),
            _ => Err(WireError::UnknownEventType {
                name: bounded_name(name.text()?),
            }),
        };
    }
    let entries = reader.map_len()?;
    let mut data = None;
    for _ in 0..entries {
        if !string_key_next(reader)? {
            continue;
        }
        let kind = reader.key()?;
        if data.is_some() {
            // An externally tagged enum has one key; more are ignored.
            skip_value_of(kind, reader)?;
            continue;
        }
        data = Some(match kind.bytes {
            b"stored" => decode_stored(reader, limits, blocks_left)?,
            b"removed" => {
                let mut hashes = None;
                for _ in 0..reader.map_len()? {
                    if !string_key_next(reader)? {
                        continue;
                    }
                    let key = reader.key()?;
                    if key.bytes != b"block_hashes" {
                        skip_value_of(key, reader)?;
                        continue;
                    }
                    let len = take_blocks(reader, limits, blocks_left)?;
                    let mut list = Vec::with_capacity(len);
                    for _ in 0..len {
                        list.push(SequenceHash::new(reader.int()?.bits()));
                    }
                    hashes = Some(list);
                }
                Data::Removed(hashes.ok_or(WireError::MissingField {
                    field: "block_hashes",
                })?)
            }
            _ => {
                return Err(WireError::UnknownEventType {
                    name: bounded_name(kind.text()?),
                })
            }
        });
    }
    data.ok_or(WireError::MissingField { field: "data" })
}

fn decode_stored(
    reader: &mut Reader<'_>,
    limits: &DecodeLimits,
    blocks_left: &mut usize,
) -> Result<Data, WireError> {
    let (mut parent, mut blocks) = (None, None);
    for _ in 0..reader.map_len()? {
        if !string_key_next(reader)? {
            continue;
        }
        let key = reader.key()?;
        match key.bytes {
            b"parent_hash" => {
                parent = if reader.try_nil()? {
                    None
                } else {
                    Some(SequenceHash::new(reader.int()?.bits()))
                }
            }
            b"blocks" => {
                let len = take_blocks(reader, limits, blocks_left)?;
                let mut list = Vec::with_capacity(len);
                for _ in 0..len {
                    list.push(decode_block(reader)?);
                }
                blocks = Some(list);
            }
            _ => skip_value_of(key, reader)?,
        }
    }
    Ok(Data::Stored(
        parent,
        blocks.ok_or(WireError::MissingField { field: "blocks" })?,
    ))
}

/// A block's map header and first key as every encoder of this format writes them
/// (kvtwin's, and rmp-serde's for Dynamo's struct): two entries, `block_hash` first.
const BLOCK_HEAD: &[u8] = b"\x82\xaablock_hash";

/// The second key of a block as those encoders write it.
const TOKENS_HASH_KEY: &[u8] = b"\xabtokens_hash";

fn decode_block(reader: &mut Reader<'_>) -> Result<StoredBlock, WireError> {
    // Blocks are most of an envelope's bytes, and nearly always in the shape above: two
    // byte compares and two integers. Anything else (another order, more keys, other
    // widths) goes back to where the block began and takes the general path, which
    // reads the same bytes to the same result or the same error.
    let start = reader.position();
    if reader.eat(BLOCK_HEAD) {
        let block_hash = reader.int()?.bits();
        if reader.eat(TOKENS_HASH_KEY) {
            let tokens_hash = reader.int()?.bits();
            return Ok(StoredBlock {
                block_hash: SequenceHash::new(block_hash),
                tokens_hash: LocalBlockHash::new(tokens_hash),
            });
        }
        reader.rewind(start);
    }
    let (mut block_hash, mut tokens_hash) = (None, None);
    for _ in 0..reader.map_len()? {
        if !string_key_next(reader)? {
            continue;
        }
        let key = reader.key()?;
        match key.bytes {
            b"block_hash" => block_hash = Some(reader.int()?.bits()),
            b"tokens_hash" => tokens_hash = Some(reader.int()?.bits()),
            _ => skip_value_of(key, reader)?,
        }
    }
    Ok(StoredBlock {
        block_hash: SequenceHash::new(block_hash.ok_or(WireError::MissingField {
            field: "block_hash",
        })?),
        tokens_hash: LocalBlockHash::new(tokens_hash.ok_or(WireError::MissingField {
            field: "tokens_hash",
        })?),
    })
}

#[cfg(test)]
mod tests;
