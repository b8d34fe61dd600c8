//! Blocks an engine keeps apart stay apart in the router: the same tokens stored plain,
//! under a cache salt (sent in the first block's `extra_keys` only, as vLLM sends it,
//! and inherited by a later batch continuing the chain) and under a LoRA adapter reach
//! the index through the source's decoder, and `POST /v1/route` with and without
//! `cache_salt` / `lora_name` sees overlaps only from blocks of its own kind.

mod support;

use kvtwin::ids::WorkerId;
use kvtwin_plane::service::source::{BatchDecoder, EventNumbering, VllmDecoder};
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::wire::extra_keys::ExtraKey;
use kvtwin_plane::wire::{
    BlockStored, EngineBatch, EngineDecoder, EngineEvent, EngineFormat, RawBatch,
};
use std::sync::{Arc, Mutex};
use support::{http as request, json, start};

const BLOCK: usize = 4;

/// Two blocks of the same tokens for every worker.
fn tokens() -> Vec<u32> {
    (100..100 + 2 * BLOCK as u32).collect()
}

fn raw(events: Vec<EngineEvent>) -> RawBatch {
    let batch = EngineBatch::new(0, 0.0, events, Some(0));
    RawBatch {
        topic: Vec::new(),
        seq: 0,
        payload: batch.to_payload(&EngineFormat::Vllm0_33.options()),
        replayed: false,
    }
}

fn key(text: &str) -> ExtraKey {
    ExtraKey::Str(text.to_string())
}

/// Decodes each batch as worker `worker`'s source does and applies it.
fn feed(state: &mut RouterState, worker: u64, batches: Vec<RawBatch>) {
    let mut decoder = VllmDecoder::new(EngineDecoder::default(), Some(state.block_size_setting()));
    let mut numbering = EventNumbering::default();
    for batch in batches {
        let mut skipped = Vec::new();
        let mut events = decoder
            .decode(WorkerId::new(worker), &batch, &mut skipped)
            .unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        numbering.number(&mut events);
        assert_eq!(state.apply_batch(&events), events.len());
    }
}

fn route(addr: std::net::SocketAddr, extra: &str) -> serde_json::Value {
    let body = format!("{{\"tokens\":{:?}{extra}}}", tokens());
    let (status, text) = request(addr, "POST", "/v1/route", Some(&body));
    assert_eq!(status, 200, "{text}");
    json(&text)
}

#[test]
fn salted_and_adapter_blocks_match_only_requests_of_their_own_salt_and_adapter() {
    let mut state = RouterState::new(BLOCK);
    let all = tokens();
    // Worker 1: plain.
    feed(
        &mut state,
        1,
        vec![raw(vec![EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![11, 12],
            token_ids: all.clone(),
            block_size: BLOCK as u32,
            extra_keys: Some(vec![None, None]),
            ..BlockStored::default()
        })])],
    );
    // Worker 2: salted. The first batch stores the request's first block with the salt
    // in its keys (tagged the way Dynamo's frontend tags it); the second continues the
    // chain with no salt anywhere.
    feed(
        &mut state,
        2,
        vec![
            raw(vec![EngineEvent::BlockStored(BlockStored {
                block_hashes: vec![21],
                token_ids: all[..BLOCK].to_vec(),
                block_size: BLOCK as u32,
                extra_keys: Some(vec![Some(vec![key("dynamo-cache-salt:tenant-a")])]),
                ..BlockStored::default()
            })]),
            raw(vec![EngineEvent::BlockStored(BlockStored {
                block_hashes: vec![22],
                parent_block_hash: Some(21),
                token_ids: all[BLOCK..].to_vec(),
                block_size: BLOCK as u32,
                ..BlockStored::default()
            })]),
        ],
    );
    // Worker 3: a LoRA adapter, its name in every block's keys.
    feed(
        &mut state,
        3,
        vec![raw(vec![EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![31, 32],
            token_ids: all.clone(),
            block_size: BLOCK as u32,
            lora_name: Some("adapter".into()),
            extra_keys: Some(vec![Some(vec![key("adapter")]), Some(vec![key("adapter")])]),
            ..BlockStored::default()
        })])],
    );
    // Worker 4: the adapter and a salt, given as a field of its own.
    feed(
        &mut state,
        4,
        vec![raw(vec![EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![41, 42],
            token_ids: all.clone(),
            block_size: BLOCK as u32,
            lora_name: Some("adapter".into()),
            cache_salt: Some("tenant-a".into()),
            ..BlockStored::default()
        })])],
    );
    let (addr, _stop) = start(Arc::new(Mutex::new(state)));

    let overlaps = |extra: &str| route(addr, extra)["overlaps"].clone();
    assert_eq!(overlaps(""), serde_json::json!({"1": 2}));
    assert_eq!(
        overlaps(",\"cache_salt\":\"tenant-a\""),
        serde_json::json!({"2": 2})
    );
    assert_eq!(
        overlaps(",\"lora_name\":\"adapter\""),
        serde_json::json!({"3": 2})
    );
    assert_eq!(
        overlaps(",\"lora_name\":\"adapter\",\"cache_salt\":\"tenant-a\""),
        serde_json::json!({"4": 2})
    );
    assert_eq!(
        overlaps(",\"cache_salt\":\"tenant-b\""),
        serde_json::json!({})
    );
    // Empty strings are absent, as in Dynamo.
    assert_eq!(
        overlaps(",\"cache_salt\":\"\",\"lora_name\":\"\""),
        serde_json::json!({"1": 2})
    );
    assert_eq!(route(addr, ",\"cache_salt\":\"tenant-a\"")["worker"], 2);

    // Hashes cannot be keyed after the fact.
    let (status, text) = request(
        addr,
        "POST",
        "/v1/route",
        Some("{\"local_hashes\":[1],\"cache_salt\":\"x\"}"),
    );
    assert_eq!(status, 400, "{text}");
}

#[test]
fn a_router_state_hashes_requests_as_the_proxy_needs_them() {
    let state = RouterState::new(BLOCK);
    let plain = state.hash_request(&tokens(), None, None).unwrap();
    assert_eq!(plain, state.hash_tokens(&tokens()));
    let salted = state
        .hash_request(&tokens(), None, Some("tenant-a"))
        .unwrap();
    let lora = state
        .hash_request(&tokens(), Some("adapter"), None)
        .unwrap();
    assert_eq!(plain.len(), 2);
    assert!(plain.iter().zip(&salted).all(|(a, b)| a != b));
    assert!(lora.iter().zip(&salted).all(|(a, b)| a != b));
}
