//! kvtwin as vLLM's KV cache tier (issue 31): two engines of scripts/engines (65 blocks
//! of 32 tokens, 64 usable), one started with kvtwin's connector (`cluster.py up
//! --connector`: 64 MiB of host memory, the package built into the engines' venv first
//! when its sources changed) and one without, are sent the same 100 greedy requests one
//! at a time: 10 prompts of 640 tokens (20 blocks), each request one of them followed by
//! 20 tokens of its own, the prompts in turn, so each comes back after the other nine
//! have pushed it out of the engine's own cache (200 blocks between two uses).
//!
//! - Every output token is the same with and without the connector.
//! - Without it, no request finds anything cached (the workload does evict).
//! - With it, every request after the first round finds its prompt's 640 tokens in
//!   kvtwin's tiers: its usage counts them cached, and the engine's own metric of
//!   external hits (`vllm:external_prefix_cache_hits_total`) adds up to 90 × 640.
//!
//! Needs the engines' venv (`scripts/engines/cluster.py setup`); skips with the reason
//! without it, fails instead with `CI=true`.

mod common;

use common::engines::{Cluster, EngineOptions};
use common::{http, Draw};
use serde_json::{json, Value};

const PROMPTS: usize = 10;
const PREFIX_TOKENS: usize = 640;
const OWN_TOKENS: usize = 20;
const REQUESTS: usize = 100;

fn workload() -> Vec<Vec<u32>> {
    let mut draw = Draw(31);
    let prefixes: Vec<Vec<u32>> = (0..PROMPTS)
        .map(|_| draw.tokens(PREFIX_TOKENS as u64))
        .collect();
    (0..REQUESTS)
        .map(|i| {
            let mut prompt = prefixes[i % PROMPTS].clone();
            prompt.extend(draw.tokens(OWN_TOKENS as u64));
            prompt
        })
        .collect()
}

/// One greedy answer: its 8 output token ids and the prompt tokens found cached.
fn complete(cluster: &Cluster, prompt: &[u32]) -> (Vec<u64>, u64) {
    let engine = cluster.engine(1);
    let body = json!({
        "model": cluster.model,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
        "return_token_ids": true,
    });
    let (status, text) = http(
        &engine.address,
        "POST",
        "/v1/completions",
        &body.to_string(),
    );
    assert_eq!(status, 200, "{}: {text}", engine.url);
    let answer: Value = serde_json::from_str(&text).unwrap();
    let tokens = answer["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids: {text}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (tokens, cached)
}

/// The engine's `vllm:external_prefix_cache_hits_total`.
fn external_hits(cluster: &Cluster) -> f64 {
    let (status, text) = http(&cluster.engine(1).address, "GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .find(|line| line.starts_with("vllm:external_prefix_cache_hits_total"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no vllm:external_prefix_cache_hits_total in /metrics"))
}

#[test]
fn outputs_are_the_same_with_the_connector_and_evicted_prefixes_come_back_from_it() {
    let test = "outputs_are_the_same_with_the_connector_and_evicted_prefixes_come_back_from_it";
    let with = EngineOptions {
        connector: Some(r#"{"host_bytes": 67108864}"#.to_string()),
        ..EngineOptions::default()
    };
    // Both at once: each start is a minute or two of the same waiting.
    let (with_connector, without) = std::thread::scope(|scope| {
        let with_connector = scope.spawn(|| Cluster::start_or_skip(test, 1, &with));
        let without = Cluster::start_or_skip(test, 1, &EngineOptions::default());
        (with_connector.join().unwrap(), without)
    });
    let (Some(with_connector), Some(without)) = (with_connector, without) else {
        return;
    };
    let prompts = workload();
    let mut differing = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (tokens, cached) = complete(&with_connector, prompt);
        let (plain_tokens, plain_cached) = complete(&without, prompt);
        if tokens != plain_tokens {
            differing.push(format!("#{i}: {tokens:?} against {plain_tokens:?}"));
        }
        assert_eq!(plain_cached, 0, "request {i}: the workload must evict");
        let expected = if i < PROMPTS { 0 } else { PREFIX_TOKENS as u64 };
        assert_eq!(
            cached, expected,
            "request {i}: cached tokens with the connector"
        );
    }
    assert!(
        differing.is_empty(),
        "{} of {REQUESTS} answers differ with the connector:\n{}",
        differing.len(),
        differing.join("\n")
    );
    let hits = external_hits(&with_connector);
    assert_eq!(hits, ((REQUESTS - PROMPTS) * PREFIX_TOKENS) as f64);
    assert_eq!(external_hits(&without), 0.0);
}
