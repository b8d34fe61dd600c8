//! Property tests of every decoder and encoder of this module: arbitrary bytes and
//! mutated valid messages never panic (they decode or give a typed error), and every
//! encoding decodes back to what it can carry.

use super::dynamo::{Envelope, RouterEvent};
use super::engine::{
    ArrayFields, BatchShape, BlockRemoved, BlockStored, EncodeOptions, EngineBatch, EngineDecoder,
    EngineEvent, EngineFormat, EventEncoding, HashEncoding, MapHeader,
};
use super::extra_keys::{BlockExtraKeys, ExtraKey};
use super::frames::{LiveMessage, ReplayReply, ReplayRequest};
use super::{DecodeLimits, DropCounters, WireError};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
use kvtwin::tier::Tier;
use proptest::prelude::*;

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

/// One extra key: a string, an `[identifier, offset]` item, or a raw value that is
/// neither (bytes, a number, a bool, nil, an array of another shape).
fn extra_key() -> impl Strategy<Value = ExtraKey> {
    prop_oneof![
        "[a-z0-9:-]{0,70}".prop_map(ExtraKey::Str),
        ("[a-z0-9]{0,20}", any::<i64>()).prop_map(|(id, offset)| ExtraKey::Item { id, offset }),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(|bytes| {
            let mut raw = vec![0xc4, bytes.len() as u8];
            raw.extend(bytes);
            ExtraKey::Raw(raw)
        }),
        any::<u8>().prop_map(|n| ExtraKey::Raw(vec![n & 0x7f])),
        Just(ExtraKey::Raw(vec![0xc3])),
        Just(ExtraKey::Raw(vec![0xc0])),
        Just(ExtraKey::Raw(vec![0x92, 0x01, 0x02])),
        any::<u64>().prop_map(|bits| {
            let mut raw = vec![0xcb];
            raw.extend(bits.to_be_bytes());
            ExtraKey::Raw(raw)
        }),
    ]
}

fn extra_keys() -> impl Strategy<Value = Option<BlockExtraKeys>> {
    prop::option::of(prop::collection::vec(
        prop::option::of(prop::collection::vec(extra_key(), 0..4)),
        0..4,
    ))
}

fn kind() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        Just("full_attention".to_string()),
        Just("sliding_window".to_string()),
        Just("mamba".to_string()),
        "[a-z_]{0,12}",
    ])
}

fn stored() -> impl Strategy<Value = BlockStored> {
    (
        (
            prop::collection::vec(any::<u64>(), 0..6),
            any::<Option<u64>>(),
            prop::collection::vec(any::<u32>(), 0..40),
            any::<u32>(),
            any::<Option<u64>>(),
        ),
        (
            prop::option::of(tier()),
            prop::option::of("[a-zA-Z0-9_é]{0,40}"),
            extra_keys(),
            prop::option::of("[a-z:-]{0,30}"),
            any::<Option<u32>>(),
            kind(),
        ),
    )
        .prop_map(
            |(
                (block_hashes, parent, token_ids, block_size, lora_id),
                (medium, lora_name, extra_keys, cache_salt, group, kind),
            )| {
                BlockStored {
                    block_hashes,
                    parent_block_hash: parent,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                    lora_name,
                    extra_keys,
                    cache_salt,
                    group_idx: group,
                    kv_cache_spec_kind: kind,
                }
            },
        )
}

fn event() -> impl Strategy<Value = EngineEvent> {
    prop_oneof![
        4 => stored().prop_map(EngineEvent::BlockStored),
        3 => (
            prop::collection::vec(any::<u64>(), 0..6),
            prop::option::of(tier()),
            any::<Option<u32>>(),
            kind(),
        )
            .prop_map(|(block_hashes, medium, group_idx, kv_cache_spec_kind)| {
                EngineEvent::BlockRemoved(BlockRemoved {
                    block_hashes,
                    medium,
                    group_idx,
                    kv_cache_spec_kind,
                })
            }),
        1 => Just(EngineEvent::AllBlocksCleared),
    ]
}

fn batch() -> impl Strategy<Value = EngineBatch> {
    (
        any::<u64>(),
        // Any float but NaN, which is not equal to itself.
        any::<f64>().prop_filter("not NaN", |ts| !ts.is_nan()),
        prop::collection::vec(event(), 0..8),
        any::<Option<u32>>(),
    )
        .prop_map(|(seq, ts, events, dp_rank)| EngineBatch::new(seq, ts, events, dp_rank))
}

fn options() -> impl Strategy<Value = EncodeOptions> {
    let formats = EngineFormat::ALL.map(EngineFormat::options).to_vec();
    let free = (
        prop::sample::select(vec![BatchShape::Pair, BatchShape::Triple]),
        prop::sample::select(vec![
            EventEncoding::Array(ArrayFields::ThroughLoraId),
            EventEncoding::Array(ArrayFields::ThroughMedium),
            EventEncoding::Array(ArrayFields::All),
            EventEncoding::Map(MapHeader::Smallest),
            EventEncoding::Map(MapHeader::Map16),
        ]),
        prop::sample::select(vec![
            HashEncoding::Unsigned,
            HashEncoding::Signed,
            HashEncoding::Bytes32,
        ]),
    )
        .prop_map(|(batch, events, hashes)| EncodeOptions {
            batch,
            events,
            hashes,
        });
    prop_oneof![prop::sample::select(formats), free]
}

fn router_event() -> impl Strategy<Value = RouterEvent> {
    let data = prop_oneof![
        (
            any::<Option<u64>>(),
            prop::collection::vec((any::<u64>(), any::<u64>()), 0..6),
            tier()
        )
            .prop_map(|(parent, blocks, tier)| KvCacheEventData::Stored {
                parent_hash: parent.map(SequenceHash::new),
                blocks: blocks
                    .into_iter()
                    .map(|(block, tokens)| StoredBlock {
                        block_hash: SequenceHash::new(block),
                        tokens_hash: LocalBlockHash::new(tokens),
                    })
                    .collect(),
                tier,
            }),
        (prop::collection::vec(any::<u64>(), 0..6), tier()).prop_map(|(hashes, tier)| {
            KvCacheEventData::Removed {
                block_hashes: hashes.into_iter().map(SequenceHash::new).collect(),
                tier,
            }
        }),
        Just(KvCacheEventData::Cleared),
    ];
    (any::<u64>(), any::<u64>(), any::<u32>(), data).prop_map(
        |(worker, event_id, dp_rank, data)| RouterEvent {
            worker_id: WorkerId::new(worker),
            event: KvCacheEvent {
                event_id,
                dp_rank,
                data,
            },
        },
    )
}

/// One edit of a valid message.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Insert { at: usize, byte: u8 },
    Remove { at: usize },
    Truncate { at: usize },
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Remove { at }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ];
    prop::collection::vec(one, 1..4)
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len();
        match *mutation {
            Mutation::Flip { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
            Mutation::Set { at, byte } if len > 0 => bytes[at % len] = byte,
            Mutation::Insert { at, byte } => bytes.insert(at % (len + 1), byte),
            Mutation::Remove { at } if len > 0 => {
                bytes.remove(at % len);
            }
            Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
            _ => {}
        }
    }
    bytes
}

/// A decoded batch re-encodes losslessly in the map encoding: whatever the decoder
/// accepts, the encoder can carry.
fn check_reencodes(batch: EngineBatch) -> Result<(), TestCaseError> {
    let full = EngineFormat::Vllm0_24.options();
    let mut expected = batch;
    expected.skipped.clear();
    let mut again = EngineDecoder::default()
        .decode_payload(expected.seq, &expected.to_payload(&full))
        .map_err(|error| TestCaseError::fail(format!("{error}")))?;
    // A mutated timestamp may be NaN, which equals nothing: compare its bits.
    prop_assert_eq!(again.ts.to_bits(), expected.ts.to_bits());
    (again.ts, expected.ts) = (0.0, 0.0);
    prop_assert_eq!(again, expected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn engine_batches_round_trip_through_every_encoding(batch in batch(), options in options()) {
        let payload = batch.to_payload(&options);
        let decoded = EngineDecoder::default().decode_payload(batch.seq, &payload);
        prop_assert_eq!(decoded, Ok(batch.as_encoded_by(&options)));
    }

    #[test]
    fn arbitrary_bytes_never_panic_an_engine_decoder(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        seq in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let decoder = EngineDecoder::default();
        if let Ok(batch) = decoder.decode_payload(0, &bytes) {
            check_reencodes(batch)?;
        }
        let live: [&[u8]; 3] = [b"", &seq, &bytes];
        let _ = decoder.decode_live(&live);
        let replay: [&[u8]; 3] = [b"", &seq, &bytes];
        let _ = decoder.decode_replay(&replay);
    }

    #[test]
    fn mutated_engine_batches_decode_or_give_a_typed_error(
        batch in batch(),
        options in options(),
        edits in mutations(),
    ) {
        let bytes = mutate(batch.to_payload(&options), &edits);
        let mut counters = DropCounters::new();
        match EngineDecoder::default().decode_payload(batch.seq, &bytes) {
            Ok(decoded) => {
                for skipped in &decoded.skipped {
                    prop_assert!(skipped.error.is_per_event());
                }
                check_reencodes(decoded)?;
            }
            Err(error) => counters.record(&error),
        }
        prop_assert!(counters.total() <= 1);
    }

    #[test]
    fn arbitrary_frames_never_panic_the_frame_parsers(
        frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..6),
    ) {
        if let Ok(message) = LiveMessage::parse(&frames) {
            let again = message.to_frames();
            prop_assert_eq!(LiveMessage::parse(&again), Ok(message));
        }
        if let Ok(request) = ReplayRequest::parse(&frames) {
            prop_assert_eq!(ReplayRequest::parse(&request.to_frames()), Ok(request));
        }
        if let Ok(reply) = ReplayReply::parse(&frames) {
            let again = reply.to_frames();
            prop_assert_eq!(ReplayReply::parse(&again), Ok(reply));
        }
    }

    #[test]
    fn router_events_round_trip_through_json(event in router_event()) {
        let json = event.to_json();
        prop_assert_eq!(RouterEvent::from_json(&json, &DecodeLimits::default()), Ok(event));
    }

    #[test]
    fn envelopes_round_trip_through_msgpack(
        events in prop::collection::vec(router_event(), 0..6),
        publisher_id in any::<u64>(),
        sequence in any::<u64>(),
        published_at_ms in any::<u64>(),
    ) {
        let envelope = Envelope {
            publisher_id,
            sequence,
            published_at_ms,
            topic: Envelope::TOPIC.to_string(),
            events,
        };
        let bytes = envelope.to_bytes();
        prop_assert_eq!(Envelope::decode(&bytes, &DecodeLimits::default()), Ok(envelope));
    }

    #[test]
    fn mutated_and_arbitrary_dynamo_messages_never_panic(
        event in router_event(),
        edits in mutations(),
        noise in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let limits = DecodeLimits::default();
        let _ = RouterEvent::from_json(&mutate(event.to_json(), &edits), &limits);
        let _ = RouterEvent::from_json(&noise, &limits);
        let envelope = Envelope {
            publisher_id: 1,
            sequence: 2,
            published_at_ms: 3,
            topic: Envelope::TOPIC.to_string(),
            events: vec![event],
        };
        if let Ok(decoded) = Envelope::decode(&mutate(envelope.to_bytes(), &edits), &limits) {
            // Whatever decodes re-encodes to itself.
            prop_assert_eq!(Envelope::decode(&decoded.to_bytes(), &limits), Ok(decoded));
        }
        let _ = Envelope::decode(&noise, &limits);
    }

    #[test]
    fn relayed_events_equal_the_direct_conversion(
        blocks in prop::collection::vec(any::<u64>(), 0..5),
        block_size in 1u32..5,
        tokens in prop::collection::vec(any::<u32>(), 20),
        lora_name in prop::option::of("[a-z]{1,8}"),
        medium in prop::option::of(tier()),
        first_id in any::<u64>(),
        keys in extra_keys(),
        cache_salt in prop::option::of("[a-z]{0,8}"),
    ) {
        let needed = blocks.len() * block_size as usize;
        let stored = BlockStored {
            token_ids: tokens[..needed].to_vec(),
            block_hashes: blocks,
            block_size,
            lora_name,
            medium,
            extra_keys: keys,
            cache_salt,
            ..BlockStored::default()
        };
        let batch = EngineBatch::new(0, 0.0, vec![EngineEvent::BlockStored(stored)], Some(1));
        let (mut routed, mut direct, mut next) = (Vec::new(), Vec::new(), first_id);
        batch.router_events(WorkerId::new(5), &mut next, &mut routed).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        batch.worker_events(WorkerId::new(5), &mut direct).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(next, first_id.wrapping_add(1));
        let mut expected = direct[0].clone();
        expected.event_id = first_id;
        prop_assert_eq!(&routed[0].to_worker_event(), &expected);
        // And through the wire: JSON, then the worker event.
        let json = routed[0].to_json();
        let back = RouterEvent::from_json(&json, &DecodeLimits::default())
            .map(|event| event.to_worker_event());
        prop_assert_eq!(back, Ok::<_, WireError>(expected));
    }
}

proptest! {
    /// Extra keys never merge: a block with any extra key the engine sent hashes apart
    /// from the same tokens without it, unless the key is only the adapter's name (which
    /// seeds instead) or the salt of a request's first block (likewise).
    #[test]
    fn a_block_with_extra_keys_never_shares_the_plain_blocks_hash(
        tokens in prop::collection::vec(any::<u32>(), 4),
        keys in prop::collection::vec(extra_key(), 1..4),
    ) {
        let plain = BlockStored {
            block_hashes: vec![1],
            token_ids: tokens.clone(),
            block_size: 4,
            parent_block_hash: Some(9),
            ..BlockStored::default()
        };
        let keyed = BlockStored {
            extra_keys: Some(vec![Some(keys)]),
            ..plain.clone()
        };
        let hash = |stored: BlockStored| {
            let batch = EngineBatch::new(0, 0.0, vec![EngineEvent::BlockStored(stored)], None);
            let mut out = Vec::new();
            batch.worker_events(WorkerId::new(1), &mut out).map(|()| out)
        };
        let (plain, keyed) = (hash(plain), hash(keyed));
        prop_assert!(plain.is_ok() && keyed.is_ok());
        prop_assert_ne!(plain.unwrap()[0].data.clone(), keyed.unwrap()[0].data.clone());
    }
}
