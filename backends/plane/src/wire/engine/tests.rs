//! The engine batch codec against msgspec's own bytes (the vLLM event classes of each
//! version re-declared and encoded with msgspec 0.22), and its refusals.

use super::*;
use crate::wire::frames::ReplayLayout;
use crate::wire::msgpack::{
    write_array_len, write_bin, write_f64, write_map_len, write_str, write_uint,
};

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn tokens() -> Vec<u32> {
    let mut tokens: Vec<u32> = (1..=8).collect();
    tokens.extend([70_000, 130_000, 5, 6, 7, 8, 9, 10]);
    tokens
}

const BIG: u64 = 18_364_758_544_493_064_720;

fn decode(bytes: &[u8]) -> Result<EngineBatch, WireError> {
    EngineDecoder::default().decode_payload(11, bytes)
}

fn stored(event: &EngineEvent) -> &BlockStored {
    match event {
        EngineEvent::BlockStored(stored) => stored,
        other => panic!("not stored: {other:?}"),
    }
}

fn removed(event: &EngineEvent) -> &BlockRemoved {
    match event {
        EngineEvent::BlockRemoved(removed) => removed,
        other => panic!("not removed: {other:?}"),
    }
}

const VLLM_0_9: &str = "92cb41d954fc401000009396ab426c6f636b53746f72656492fbcf7fffffffffffffffc0dc00100102030405060708ce00011170ce0001fbd005060708090a08c092ac426c6f636b52656d6f76656491fb91b0416c6c426c6f636b73436c6561726564";
const VLLM_0_10: &str = "93cb3ff80000000000009397ab426c6f636b53746f72656492ffcd012cd2ffff63c0dc00100102030405060708ce00011170ce0001fbd005060708090a0803a347505593ac426c6f636b52656d6f76656491cd012ca363707591b0416c6c426c6f636b73436c656172656401";
const VLLM_0_11: &str = "93cb4000000000000000969aab426c6f636b53746f72656492cffedcba987654321007cffedcba9876543210dc00100102030405060708ce00011170ce0001fbd005060708090a08c0a3475055c0c0c09aab426c6f636b53746f7265649109079800010203040506070801aa4350555f50494e4e4544a66d794c6f7261c0c09aab426c6f636b53746f726564910ac098000102030405060708c0c0c09192a3696d67030194ac426c6f636b52656d6f76656491cffedcba9876543210a3475055c094ac426c6f636b52656d6f7665649109aa4350555f50494e4e45440291b0416c6c426c6f636b73436c656172656400";
const VLLM_0_24_BYTES: &str = "93cb4008000000000000938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708ce00011170ce0001fbd005060708090aaa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6eaa73657373696f6e5f6964d92873737373737373737373737373737373737373737373737373737373737373737373737373737373b36c6f6f6b61686561645f746f6b656e5f69647392010284a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa66d656469756da44449534ba86c6f63616c697479a56c6f63616c81a474797065b0416c6c426c6f636b73436c656172656403";
const VLLM_0_24: &str = "93cb40080000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cffedcba987654321007b1706172656e745f626c6f636b5f6861736805a9746f6b656e5f696473dc00100102030405060708ce00011170ce0001fbd005060708090aaa626c6f636b5f73697a6508a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65d92861616161616161616161616161616161616161616161616161616161616161616161616161616161a967726f75705f6964780083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cffedcba9876543210a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656402";
const SGLANG: &str = "93cb40100000000000009387a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392fed38000000000000000b1706172656e745f626c6f636b5f68617368fda9746f6b656e5f696473dc00100102030405060708ce00011170ce0001fbd005060708090aaa626c6f636b5f73697a6508a76c6f72615f6964c0a66d656469756da347505583a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391fea66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";
const EXACT_0_10: &str = "93cb3ff80000000000009397ab426c6f636b53746f72656492ffcd012cd2ffff63c0dc00100102030405060708ce00011170ce0001fbd005060708090a0803a347505593ac426c6f636b52656d6f76656491cd012ca343505591b0416c6c426c6f636b73436c656172656401";
const EXACT_0_11: &str = "93cb4000000000000000959aab426c6f636b53746f72656492cffedcba987654321007cffedcba9876543210dc00100102030405060708ce00011170ce0001fbd005060708090a08c0a3475055c0c0c09aab426c6f636b53746f7265649109079800010203040506070801a845585445524e414ca66d794c6f7261c00494ac426c6f636b52656d6f76656491cffedcba9876543210a44449534bc094ac426c6f636b52656d6f7665649109a34350550291b0416c6c426c6f636b73436c6561726564c0";
const EXACT_0_24_B32: &str = "93cb40080000000000009387a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c420fedcba9876543210000000000000000000000000000000000000000000000000c4200000000000000001000000000000000000000000000000000000000000000000b1706172656e745f626c6f636b5f68617368c4200000000000000002000000000000000000000000000000000000000000000000a9746f6b656e5f696473dc00100102030405060708ce00011170ce0001fbd005060708090aaa626c6f636b5f73697a6508a76c6f72615f6964c0a66d656469756da347505583a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420fedcba9876543210000000000000000000000000000000000000000000000000a66d656469756da343505581a474797065b0416c6c426c6f636b73436c656172656407";

#[test]
fn vllm_0_9_pairs_and_short_arrays_with_signed_hashes() {
    let batch = decode(&hex(VLLM_0_9)).unwrap();
    assert_eq!(
        (batch.seq, batch.ts, batch.dp_rank),
        (11, 1_700_000_000.25, None)
    );
    let first = stored(&batch.events[0]);
    assert_eq!(first.block_hashes, [(-5i64) as u64, i64::MAX as u64]);
    assert_eq!(first.parent_block_hash, None);
    assert_eq!(first.token_ids, tokens());
    assert_eq!(
        (first.block_size, first.lora_id, first.medium),
        (8, None, None)
    );
    assert_eq!(first.tier(), Tier::Device);
    assert_eq!(removed(&batch.events[1]).block_hashes, [(-5i64) as u64]);
    assert_eq!(batch.events[2], EngineEvent::AllBlocksCleared);
    assert!(batch.skipped.is_empty());
}

#[test]
fn vllm_0_10_arrays_carry_medium_case_insensitively_and_the_rank() {
    let batch = decode(&hex(VLLM_0_10)).unwrap();
    assert_eq!(batch.dp_rank, Some(1));
    let first = stored(&batch.events[0]);
    assert_eq!(first.block_hashes, [u64::MAX, 300]);
    assert_eq!(first.parent_block_hash, Some((-40_000i64) as u64));
    assert_eq!((first.lora_id, first.medium), (Some(3), Some(Tier::Device)));
    // "cpu", lowercase, as one connector sends it.
    assert_eq!(removed(&batch.events[1]).medium, Some(Tier::Host));
}

#[test]
fn vllm_0_11_arrays_with_every_field_and_opaque_extra_keys() {
    let batch = decode(&hex(VLLM_0_11)).unwrap();
    assert_eq!(batch.events.len(), 6);
    let first = stored(&batch.events[0]);
    assert_eq!(
        (first.block_hashes.as_slice(), first.parent_block_hash),
        (&[BIG, 7][..], Some(BIG))
    );
    let lora = stored(&batch.events[1]);
    assert_eq!(lora.lora_name.as_deref(), Some("myLora"));
    assert_eq!((lora.lora_id, lora.medium), (Some(1), Some(Tier::Host)));
    let grouped = stored(&batch.events[2]);
    assert_eq!((grouped.group_idx, grouped.medium), (Some(1), None));
    assert_eq!(removed(&batch.events[4]).group_idx, Some(2));
    assert_eq!(batch.dp_rank, Some(0));
}

#[test]
fn vllm_0_24_maps_with_32_byte_hashes_and_unknown_keys() {
    let batch = decode(&hex(VLLM_0_24_BYTES)).unwrap();
    let first = stored(&batch.events[0]);
    // The first 8 bytes of 00 01 02 .. 1f, big-endian.
    assert_eq!(first.block_hashes, [0x0001_0203_0405_0607]);
    assert_eq!((first.block_size, first.token_ids.len()), (16, 16));
    assert_eq!(removed(&batch.events[1]).medium, Some(Tier::Disk));
    assert_eq!(batch.dp_rank, Some(3));
    let plain = decode(&hex(VLLM_0_24)).unwrap();
    let first = stored(&plain.events[0]);
    assert_eq!(first.lora_name.as_deref(), Some("a".repeat(40).as_str()));
    assert_eq!(
        (first.group_idx, first.parent_block_hash),
        (Some(0), Some(5))
    );
}

#[test]
fn sglang_maps_with_negative_hashes() {
    let batch = decode(&hex(SGLANG)).unwrap();
    let first = stored(&batch.events[0]);
    assert_eq!(first.block_hashes, [(-2i64) as u64, 1 << 63]);
    assert_eq!(first.parent_block_hash, Some((-3i64) as u64));
}

#[test]
fn the_encoder_writes_msgspecs_bytes_for_each_version() {
    let bytes32 = EncodeOptions {
        batch: BatchShape::Triple,
        events: EventEncoding::Map(MapHeader::Smallest),
        hashes: HashEncoding::Bytes32,
    };
    let cases = [
        (VLLM_0_9, EngineFormat::Vllm0_9.options()),
        (EXACT_0_10, EngineFormat::Vllm0_10.options()),
        (EXACT_0_11, EngineFormat::Vllm0_11.options()),
        (VLLM_0_24, EngineFormat::Vllm0_24.options()),
        (SGLANG, EngineFormat::Sglang.options()),
        (EXACT_0_24_B32, bytes32),
    ];
    for (golden, options) in cases {
        let bytes = hex(golden);
        let batch = decode(&bytes).unwrap();
        assert_eq!(batch.to_payload(&options), bytes, "{options:?}");
    }
    let exact = decode(&hex(EXACT_0_11)).unwrap();
    assert_eq!(exact.dp_rank, None, "nil rank in a three-element batch");
    assert_eq!(stored(&exact.events[1]).medium, Some(Tier::Remote));
}

#[test]
fn vllm_0_33_writes_map16_headers_for_few_keys() {
    let batch = decode(&hex(VLLM_0_24)).unwrap();
    let options = EngineFormat::Vllm0_33.options();
    let bytes = batch.to_payload(&options);
    // [ts, [event, ...], rank]: the first event's header follows the array headers.
    assert_eq!(&bytes[..2], &[0x93, 0xcb]);
    assert_eq!(&bytes[10..12], &[0x93, 0xde]);
    assert_eq!(decode(&bytes).unwrap(), batch.as_encoded_by(&options));
}

/// Writes one event's msgpack.
type WriteEvent<'a> = &'a dyn Fn(&mut Vec<u8>);

/// A batch of `events`, each written by its writer.
fn batch_of(events: &[WriteEvent<'_>], rank: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    write_array_len(&mut out, 3);
    write_f64(&mut out, 0.0);
    write_array_len(&mut out, events.len());
    for write in events {
        write(&mut out);
    }
    match rank {
        Some(rank) => write_uint(&mut out, rank),
        None => out.push(0xc0),
    }
    out
}

fn cleared(out: &mut Vec<u8>) {
    write_map_len(out, 1, false);
    write_str(out, "type");
    write_str(out, "AllBlocksCleared");
}

fn removed_on(medium: &'static str) -> impl Fn(&mut Vec<u8>) {
    move |out| {
        write_map_len(out, 3, false);
        write_str(out, "type");
        write_str(out, "BlockRemoved");
        write_str(out, "block_hashes");
        write_array_len(out, 1);
        write_uint(out, 5);
        write_str(out, "medium");
        write_str(out, medium);
    }
}

fn typed(name: &'static str) -> impl Fn(&mut Vec<u8>) {
    move |out| {
        write_map_len(out, 2, false);
        write_str(out, "type");
        write_str(out, name);
        write_str(out, "block_hashes");
        write_array_len(out, 0);
    }
}

#[test]
fn unknown_types_and_media_skip_the_event_or_reject_the_batch() {
    let tape = removed_on("TAPE");
    let nvme = removed_on("nvme");
    let moved = typed("BlockMoved");
    let bytes = batch_of(&[&cleared, &tape, &moved, &nvme], Some(2));
    let batch = decode(&bytes).unwrap();
    assert_eq!(batch.events.len(), 2);
    assert_eq!(removed(&batch.events[1]).medium, Some(Tier::Disk));
    assert_eq!(
        batch.dp_rank,
        Some(2),
        "the rank after skipped events is read"
    );
    let reasons: Vec<_> = batch
        .skipped
        .iter()
        .map(|s| (s.index, s.error.reason()))
        .collect();
    assert_eq!(reasons, [(1, "unknown_medium"), (2, "unknown_event_type")]);
    let strict = EngineDecoder::new(DecodeLimits::default(), UnknownEvents::Reject);
    assert_eq!(
        strict.decode_payload(0, &bytes),
        Err(WireError::UnknownMedium {
            name: "TAPE".into()
        })
    );
}

#[test]
fn malformed_and_misshapen_batches_have_their_own_reasons() {
    let reason = |bytes: &[u8]| decode(bytes).unwrap_err().reason();
    let good = batch_of(&[&cleared], None);
    assert!(decode(&good).is_ok());
    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert_eq!(reason(&trailing), "malformed_msgpack");
    assert_eq!(reason(&good[..good.len() - 1]), "malformed_msgpack");
    assert_eq!(reason(&[]), "malformed_msgpack");
    assert_eq!(reason(&[0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0]), "batch_shape");
    assert_eq!(reason(&[0xa1, b'x']), "unexpected_type");
    // [ts, events, rank, extra]: a fourth element is ignored.
    let mut four = good.clone();
    four[0] = 0x94;
    four.push(0xa1);
    four.push(b'x');
    assert!(decode(&four).is_ok());
    let untyped = |out: &mut Vec<u8>| {
        write_map_len(out, 1, false);
        write_str(out, "block_hashes");
        write_array_len(out, 0);
    };
    assert_eq!(reason(&batch_of(&[&untyped], None)), "missing_field");
    let no_hashes = |out: &mut Vec<u8>| {
        write_array_len(out, 1);
        write_str(out, "BlockRemoved");
    };
    assert_eq!(reason(&batch_of(&[&no_hashes], None)), "missing_field");
    let short_hash = |out: &mut Vec<u8>| {
        write_array_len(out, 2);
        write_str(out, "BlockRemoved");
        write_array_len(out, 1);
        write_bin(out, &[0; 16]);
    };
    assert_eq!(
        decode(&batch_of(&[&short_hash], None)),
        Err(WireError::BadHashWidth { len: 16 })
    );
    let wide_token = |out: &mut Vec<u8>| {
        write_array_len(out, 5);
        write_str(out, "BlockStored");
        write_array_len(out, 0);
        out.push(0xc0);
        write_array_len(out, 1);
        write_uint(out, 1 << 32);
        write_uint(out, 16);
    };
    assert_eq!(
        reason(&batch_of(&[&wide_token], None)),
        "integer_out_of_range"
    );
    assert_eq!(
        reason(&batch_of(&[&cleared], Some(1 << 40))),
        "integer_out_of_range"
    );
    // Names are compared as bytes; one that matches nothing is still checked as UTF-8.
    let bad_key = |out: &mut Vec<u8>| {
        write_map_len(out, 2, false);
        write_str(out, "type");
        write_str(out, "AllBlocksCleared");
        out.extend_from_slice(&[0xa2, 0xff, 0xfe]);
        out.push(0xc0);
    };
    assert_eq!(reason(&batch_of(&[&bad_key], None)), "malformed_msgpack");
    let bad_tag = |out: &mut Vec<u8>| {
        write_array_len(out, 1);
        out.extend_from_slice(&[0xa2, 0xff, 0xfe]);
    };
    assert_eq!(reason(&batch_of(&[&bad_tag], None)), "malformed_msgpack");
    let not_an_event = |out: &mut Vec<u8>| write_uint(out, 3);
    assert_eq!(reason(&batch_of(&[&not_an_event], None)), "unexpected_type");
}

#[test]
fn limits_refuse_oversized_batches_whole() {
    let bytes = hex(VLLM_0_11);
    let limited = |limits: DecodeLimits| {
        EngineDecoder::new(limits, UnknownEvents::Skip)
            .decode_payload(0, &bytes)
            .unwrap_err()
    };
    let base = DecodeLimits::default();
    for (limits, what) in [
        (
            DecodeLimits {
                max_payload_bytes: 10,
                ..base
            },
            "payload_bytes",
        ),
        (
            DecodeLimits {
                max_events: 5,
                ..base
            },
            "events",
        ),
        (
            DecodeLimits {
                max_blocks: 3,
                ..base
            },
            "blocks",
        ),
        (
            DecodeLimits {
                max_tokens: 20,
                ..base
            },
            "tokens",
        ),
    ] {
        let error = limited(limits);
        assert!(
            matches!(error, WireError::Oversized { what: w, .. } if w == what),
            "{error:?}"
        );
        assert_eq!(error.reason(), "oversized");
    }
    // An events array claiming more elements than there are bytes left.
    let lying = [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdc, 0x10, 0x00, 0xc0];
    assert_eq!(decode(&lying).unwrap_err().reason(), "malformed_msgpack");
}

#[test]
fn live_and_replay_messages_decode_through_their_frames() {
    let payload = hex(VLLM_0_24);
    let decoder = EngineDecoder::default();
    let seq = 9u64.to_be_bytes();
    let live: [&[u8]; 3] = [b"", &seq, &payload];
    let batch = decoder.decode_live(&live).unwrap();
    assert_eq!((batch.seq, batch.events.len()), (9, 3));
    let frames = batch.to_live_frames(b"kv", &EngineFormat::Vllm0_24.options());
    assert_eq!(frames[2], payload);
    assert_eq!(decoder.decode_live(&frames).unwrap(), batch);
    let reply: [&[u8]; 4] = [b"", b"kv", &seq, &payload];
    assert_eq!(decoder.decode_replay(&reply).unwrap(), Some(batch));
    let end = ReplayReply::end_marker(ReplayLayout::Legacy).to_frames();
    assert_eq!(decoder.decode_replay(&end).unwrap(), None);
    assert_eq!(
        decoder.decode_live(&live[..2]).unwrap_err().reason(),
        "frame_count"
    );
}

#[test]
fn a_large_batch_decodes_into_exactly_sized_vectors() {
    // Sanity, not timing: 4,096 events of 8 blocks of 16 tokens. Each event's vectors
    // are allocated once at their final size, so nothing grows per block.
    let events: Vec<EngineEvent> = (0..4096u64)
        .map(|i| {
            EngineEvent::BlockStored(BlockStored {
                block_hashes: (0..8).map(|b| i * 8 + b).collect(),
                parent_block_hash: i.checked_sub(1).map(|p| p * 8 + 7),
                token_ids: (0..128).map(|t| (i as u32) * 128 + t).collect(),
                block_size: 16,
                medium: Some(Tier::Device),
                ..BlockStored::default()
            })
        })
        .collect();
    let batch = EngineBatch::new(1, 2.0, events, Some(0));
    for format in EngineFormat::ALL {
        let options = format.options();
        let decoded = decode(&batch.to_payload(&options)).unwrap();
        assert_eq!(decoded.block_count(), 4096 * 8);
        assert_eq!(decoded.events.capacity(), 4096);
        for event in &decoded.events {
            let stored = stored(event);
            assert_eq!(stored.block_hashes.capacity(), stored.block_hashes.len());
            assert_eq!(stored.token_ids.capacity(), stored.token_ids.len());
        }
        assert_eq!(
            decoded,
            EngineBatch {
                seq: 11,
                ..batch.as_encoded_by(&options)
            }
        );
    }
}
