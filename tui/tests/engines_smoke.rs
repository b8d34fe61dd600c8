//! One real vLLM engine (`scripts/engines/`): it serves completions, its prefix cache
//! hits as ENGINES.md measured, and its ZMQ stream carries BlockStored frames that
//! kvtwin's own engine decoder reads.
//!
//! Skips with the reason when this machine cannot run the engines, unless
//! `KVTWIN_REQUIRE_ENGINES=1` or `CI=true`. The first run on a machine builds the
//! engines' venv (minutes); later runs take about a minute.

mod common;

use common::engines::{Cluster, EngineOptions};
use common::http;
use kvtwin_plane::wire::engine::{EngineDecoder, EngineEvent};
use serde_json::Value;
use std::time::{Duration, Instant};

/// A completion of `prompt` (token ids) on the engine at `address`; the answer.
fn complete(address: &str, model: &str, prompt: &[u32]) -> Value {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": 4,
        "ignore_eos": true,
    });
    let (status, answer) = http(address, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

#[test]
fn a_real_engine_caches_a_repeated_prompt_and_publishes_its_blocks() {
    let test = "a_real_engine_caches_a_repeated_prompt";
    let Some(cluster) = Cluster::start_or_skip(test, 1, &EngineOptions::default()) else {
        return;
    };
    let engine = cluster.engine(1);
    assert_eq!(cluster.block_size, 32);
    assert!(
        cluster.tokenizer.is_file(),
        "{}",
        cluster.tokenizer.display()
    );

    let context = zmq::Context::new();
    let sub = context.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvtimeo(200).unwrap();
    sub.connect(&engine.events_endpoint).unwrap();
    // The subscription reaches the engine's PUB asynchronously; an idle engine publishes
    // nothing, so nothing is missed while waiting.
    std::thread::sleep(Duration::from_secs(1));

    let prompt: Vec<u32> = (1000..1256).collect();
    let first = complete(&engine.address, &cluster.model, &prompt);
    assert_eq!(first["usage"]["prompt_tokens"], 256, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = complete(&engine.address, &cluster.model, &prompt);
    // vLLM recomputes the last block of a fully cached prompt: 7 of 8 blocks hit.
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"], 224,
        "{second}"
    );

    let decoder = EngineDecoder::default();
    let mut stored = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && stored.len() < 2 {
        let Ok(frames) = sub.recv_multipart(0) else {
            continue;
        };
        let batch = decoder.decode_live(&frames).unwrap();
        assert!(batch.skipped.is_empty(), "{batch:?}");
        stored.extend(batch.events.into_iter().filter_map(|event| match event {
            EngineEvent::BlockStored(stored) => Some(stored),
            _ => None,
        }));
    }
    assert!(stored.len() >= 2, "BlockStored events seen: {stored:?}");
    // The first request stores all 8 blocks, parent first; the repeat stores the
    // recomputed last block again under the same hash.
    let all = &stored[0];
    assert_eq!(all.block_size, 32);
    assert_eq!(all.block_hashes.len(), 8);
    assert_eq!(all.parent_block_hash, None);
    assert_eq!(all.token_ids, prompt);
    let again = &stored[1];
    assert_eq!(again.block_hashes, all.block_hashes[7..]);
    assert_eq!(again.parent_block_hash, Some(all.block_hashes[6]));
    assert_eq!(again.token_ids, prompt[224..]);
}
