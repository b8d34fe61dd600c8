//! Tests of `dynamo.rs`: the JSON and envelope shapes, errors, and the decoders' fast
//! paths against their general reading.

use super::*;

fn stored_event() -> RouterEvent {
    RouterEvent {
        worker_id: WorkerId::new(123),
        event: KvCacheEvent {
            event_id: 7,
            dp_rank: 0,
            data: KvCacheEventData::Stored {
                parent_hash: Some(SequenceHash::new(4369)),
                blocks: vec![StoredBlock {
                    block_hash: SequenceHash::new(18_364_758_544_493_064_720),
                    tokens_hash: LocalBlockHash::new(42),
                }],
                tier: Tier::Device,
            },
        },
    }
}

#[test]
fn the_json_of_wire_md_decodes_and_encodes_byte_for_byte() {
    let text = r#"{"worker_id":123,"storage_tier":"device","event":{"event_id":7,"dp_rank":0,"data":{"stored":{"parent_hash":4369,"blocks":[{"block_hash":18364758544493064720,"tokens_hash":42}]}}}}"#;
    let event = RouterEvent::from_json(text.as_bytes(), &DecodeLimits::default()).unwrap();
    assert_eq!(event, stored_event());
    assert_eq!(String::from_utf8(event.to_json()).unwrap(), text);
}

#[test]
fn removed_and_cleared_have_dynamos_shapes() {
    let removed = RouterEvent {
        worker_id: WorkerId::new(1),
        event: KvCacheEvent {
            event_id: 2,
            dp_rank: 3,
            data: KvCacheEventData::Removed {
                block_hashes: vec![SequenceHash::new(5)],
                tier: Tier::Host,
            },
        },
    };
    let json = String::from_utf8(removed.to_json()).unwrap();
    assert!(json.contains(r#""storage_tier":"host_pinned""#), "{json}");
    assert!(
        json.contains(r#""data":{"removed":{"block_hashes":[5]}}"#),
        "{json}"
    );
    let cleared = RouterEvent {
        event: KvCacheEvent {
            data: KvCacheEventData::Cleared,
            ..removed.event.clone()
        },
        ..removed.clone()
    };
    let json = String::from_utf8(cleared.to_json()).unwrap();
    assert!(json.contains(r#""data":"cleared""#), "{json}");
    let limits = DecodeLimits::default();
    for event in [removed, cleared] {
        assert_eq!(
            RouterEvent::from_json(&event.to_json(), &limits).unwrap(),
            event
        );
    }
}

#[test]
fn old_dynamo_json_without_tier_or_rank_and_with_extra_keys_decodes() {
    let text = r#"{"worker_id":9,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":null}],"lora_name":"x"}},"extra":1}}"#;
    let event = RouterEvent::from_json(text.as_bytes(), &DecodeLimits::default()).unwrap();
    assert_eq!(event.event.dp_rank, 0);
    assert_eq!(event.storage_tier(), Tier::Device);
    assert!(matches!(
        event.event.data,
        KvCacheEventData::Stored { parent_hash: None, ref blocks, .. } if blocks.len() == 1
    ));
}

#[test]
fn json_errors_have_their_own_reasons() {
    let limits = DecodeLimits::default();
    let reason = |text: &str| {
        RouterEvent::from_json(text.as_bytes(), &limits)
            .unwrap_err()
            .reason()
    };
    assert_eq!(reason("{"), "bad_json");
    assert_eq!(
        reason(
            r#"{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"blocks":[{"block_hash":-1,"tokens_hash":2}]}}}}"#
        ),
        "bad_json"
    );
    assert_eq!(
        reason(r#"{"worker_id":1,"storage_tier":"tape","event":{"event_id":1,"data":"cleared"}}"#),
        "unknown_storage_tier"
    );
    assert_eq!(
        reason(r#"{"worker_id":1,"event":{"event_id":1,"data":{"moved":{}}}}"#),
        "unknown_event_type"
    );
    assert_eq!(
        reason(r#"{"worker_id":1,"event":{"event_id":1,"data":"flushed"}}"#),
        "unknown_event_type"
    );
    let small = DecodeLimits {
        max_blocks: 0,
        ..limits
    };
    assert_eq!(
        RouterEvent::from_json(&stored_event().to_json(), &small)
            .unwrap_err()
            .reason(),
        "oversized"
    );
}

/// A block map of `entries`, each a key and either an integer or a string value.
fn block_bytes(entries: &[(&str, Result<u64, &str>)]) -> Vec<u8> {
    let mut out = Vec::new();
    msgpack::write_map_len(&mut out, entries.len(), false);
    for (key, value) in entries {
        msgpack::write_str(&mut out, key);
        match value {
            Ok(number) => msgpack::write_uint(&mut out, *number),
            Err(text) => msgpack::write_str(&mut out, text),
        }
    }
    out
}

#[test]
fn a_block_decodes_alike_in_the_common_shape_and_any_other() {
    let decode = |bytes: &[u8]| {
        let mut reader = Reader::new(bytes);
        decode_block(&mut reader).map(|block| {
            assert!(reader.is_at_end(), "the whole block is read");
            (block.block_hash.get(), block.tokens_hash.get())
        })
    };
    let (big, small) = (u64::MAX - 3, 5);
    // The shape the fast path takes, with 64-bit and one-byte integers.
    let common = block_bytes(&[("block_hash", Ok(big)), ("tokens_hash", Ok(small))]);
    assert!(common.starts_with(BLOCK_HEAD), "the fast path's shape");
    // ... which is what the envelope encoder writes, from its constants.
    let mut event = stored_event();
    if let KvCacheEventData::Stored { blocks, .. } = &mut event.event.data {
        blocks[0] = StoredBlock {
            block_hash: SequenceHash::new(big),
            tokens_hash: LocalBlockHash::new(small),
        };
    }
    let mut encoded = Vec::new();
    Envelope::encode_events(1, 0, 0, Envelope::TOPIC, &[event], &mut encoded);
    assert!(encoded
        .windows(common.len())
        .any(|w| w == common.as_slice()));
    assert_eq!(decode(&common), Ok((big, small)));
    // Other orders and extra keys take the general path to the same block.
    for entries in [
        vec![("tokens_hash", Ok(small)), ("block_hash", Ok(big))],
        vec![
            ("block_hash", Ok(big)),
            ("mm_extra_info", Ok(1)),
            ("tokens_hash", Ok(small)),
        ],
        vec![
            ("block_hash", Ok(big)),
            ("tokens_hash", Ok(small)),
            ("extra", Err("x")),
        ],
    ] {
        assert_eq!(
            decode(&block_bytes(&entries)),
            Ok((big, small)),
            "{entries:?}"
        );
    }
    // Errors name the same offset either way: a string where the hash should be
    // (after the 12 bytes of map header and first key), a block cut short.
    let bad = block_bytes(&[("block_hash", Err("x")), ("tokens_hash", Ok(small))]);
    assert_eq!(
        decode(&bad),
        Err(WireError::UnexpectedType {
            offset: BLOCK_HEAD.len(),
            expected: "an integer"
        })
    );
    assert_eq!(
        decode(&common[..BLOCK_HEAD.len() + 4]),
        Err(WireError::MalformedMsgpack {
            offset: BLOCK_HEAD.len()
        })
    );
    let missing = block_bytes(&[("block_hash", Ok(big)), ("other", Ok(small))]);
    assert_eq!(
        decode(&missing),
        Err(WireError::MissingField {
            field: "tokens_hash"
        })
    );
}

#[test]
fn unknown_keys_and_names_are_still_checked_as_utf8() {
    let limits = DecodeLimits::default();
    let not_utf8 = "\u{0}\u{0}";
    // A block with an extra key, a storage tier and a data kind, each first written
    // with a placeholder name, then made invalid UTF-8 in place.
    let envelope_with = |key: &str, tier: &str, kind: &str| {
        let mut payload = Vec::new();
        msgpack::write_array_len(&mut payload, 1);
        msgpack::write_map_len(&mut payload, 3, false);
        msgpack::write_str(&mut payload, "worker_id");
        msgpack::write_uint(&mut payload, 1);
        msgpack::write_str(&mut payload, "storage_tier");
        msgpack::write_str(&mut payload, tier);
        msgpack::write_str(&mut payload, "event");
        msgpack::write_map_len(&mut payload, 2, false);
        msgpack::write_str(&mut payload, "event_id");
        msgpack::write_uint(&mut payload, 1);
        msgpack::write_str(&mut payload, "data");
        msgpack::write_map_len(&mut payload, 1, false);
        msgpack::write_str(&mut payload, kind);
        msgpack::write_map_len(&mut payload, 2, false);
        msgpack::write_str(&mut payload, "parent_hash");
        msgpack::write_nil(&mut payload);
        msgpack::write_str(&mut payload, "blocks");
        msgpack::write_array_len(&mut payload, 1);
        payload.extend(block_bytes(&[
            ("block_hash", Ok(1)),
            (key, Ok(2)),
            ("tokens_hash", Ok(3)),
        ]));
        // The placeholder's two NUL bytes become 0xff 0xfe: not UTF-8.
        if let Some(at) = payload.windows(2).position(|w| w == [0, 0]) {
            payload[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
        }
        let mut out = Vec::new();
        msgpack::write_map_len(&mut out, 3, false);
        msgpack::write_str(&mut out, "publisher_id");
        msgpack::write_uint(&mut out, 1);
        msgpack::write_str(&mut out, "sequence");
        msgpack::write_uint(&mut out, 0);
        msgpack::write_str(&mut out, "payload");
        msgpack::write_bin(&mut out, &payload);
        out
    };
    let decoded = Envelope::decode(&envelope_with("extra", "host_pinned", "stored"), &limits);
    assert_eq!(decoded.unwrap().events[0].storage_tier(), Tier::Host);
    for (key, tier, kind) in [
        (not_utf8, "device", "stored"),
        ("extra", not_utf8, "stored"),
        ("extra", "device", not_utf8),
    ] {
        let error = Envelope::decode(&envelope_with(key, tier, kind), &limits).unwrap_err();
        assert!(
            matches!(error, WireError::MalformedMsgpack { .. }),
            "{key:?} {tier:?} {kind:?}: {error:?}"
        );
    }
    let error = Envelope::decode(&envelope_with("extra", "tape", "stored"), &limits);
    assert!(matches!(error, Err(WireError::UnknownStorageTier { ref name }) if name == "tape"));
    let error = Envelope::decode(&envelope_with("extra", "device", "moved"), &limits);
    assert!(matches!(error, Err(WireError::UnknownEventType { ref name }) if name == "moved"));
}

#[test]
fn envelopes_round_trip_and_name_their_fields() {
    let envelope = Envelope {
        publisher_id: 77,
        sequence: 3,
        published_at_ms: 1_700_000_000_000,
        topic: Envelope::TOPIC.to_string(),
        events: vec![stored_event()],
    };
    let bytes = envelope.to_bytes();
    assert_eq!(bytes[0], 0x85, "a five-key map");
    assert_eq!(
        Envelope::decode(&bytes, &DecodeLimits::default()).unwrap(),
        envelope
    );
    let mut truncated = bytes.clone();
    truncated.pop();
    assert_eq!(
        Envelope::decode(&truncated, &DecodeLimits::default())
            .unwrap_err()
            .reason(),
        "malformed_msgpack"
    );
}
