//! The twin of a real vLLM engine, block for block (issue 30's first acceptance item):
//! one engine of scripts/engines (65 blocks of 32 tokens, 64 usable) is sent 200
//! requests one at a time: shared system prompts, exact repeats, conversations that
//! carry the previous answer, prompts ending inside a block, 1 to 16 output tokens, so
//! the cache evicts on most requests. The engine's KV events are read off its ZMQ
//! stream (replayed from the start), its cached tokens from each answer's usage, its
//! outputs from `return_token_ids`. The twin (`kvtwin_sim::vllm`) serves the same
//! requests: every request's cached tokens, the flattened event stream and the blocks
//! held after every request must be the engine's.
//!
//! Needs the engines' venv (`scripts/engines/cluster.py setup`); skips with the reason
//! without it, fails instead with `CI=true`.

mod common;

use common::engines::{Cluster, EngineOptions};
use common::http;
use kvtwin_plane::wire::engine::{EngineDecoder, EngineEvent};
use kvtwin_plane::zmq::{SubscriberConfig, SubscriberItem, ZmqSubscriber};
use kvtwin_sim::vllm::compare::{self, ServedRequest};
use kvtwin_sim::vllm::{VllmCacheConfig, VllmSchedulerConfig};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REQUESTS: usize = 200;
const BLOCK: usize = 32;

/// A small deterministic generator (SplitMix64): the workload is the same every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    fn tokens(&mut self, n: u64) -> Vec<u32> {
        (0..n).map(|_| self.between(10, 31_000) as u32).collect()
    }
}

/// What one request sends: its prompt and its output count.
fn workload() -> Vec<(Vec<u32>, u64)> {
    let mut draw = Draw(20_261_127);
    let systems: Vec<Vec<u32>> = [64, 96, 128, 160, 224, 256]
        .iter()
        .map(|&n| draw.tokens(n))
        .collect();
    let mut sent: Vec<(Vec<u32>, u64)> = Vec::new();
    for _ in 0..REQUESTS {
        let roll = draw.between(0, 99);
        let prompt = if roll < 20 && !sent.is_empty() {
            // An exact repeat of an earlier prompt.
            let earlier = draw.between(0, sent.len() as u64 - 1) as usize;
            sent[earlier].0.clone()
        } else {
            let system = &systems[draw.between(0, systems.len() as u64 - 1) as usize];
            let mut prompt = system.clone();
            let user = draw.between(1, 200);
            prompt.extend(draw.tokens(user));
            prompt
        };
        sent.push((prompt, draw.between(1, 16)));
    }
    sent
}

/// The engine's events, read off its stream by a thread until dropped.
struct Capture {
    events: Arc<Mutex<Vec<compare::EngineEvent>>>,
    batches: Arc<Mutex<(u64, Instant)>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    fn start(events_endpoint: &str, replay_endpoint: &str) -> Self {
        let mut subscriber = ZmqSubscriber::new(SubscriberConfig::new(
            events_endpoint,
            Some(replay_endpoint),
        ))
        .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(Mutex::new((0, Instant::now())));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, seen, stopping) = (events.clone(), batches.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let decoder = EngineDecoder::default();
            while !stopping.load(Ordering::Relaxed) {
                let item = match subscriber.next(Duration::from_millis(50)) {
                    Ok(Some(item)) => item,
                    Ok(None) => continue,
                    Err(error) => panic!("the engine's stream: {error}"),
                };
                let batch = match item {
                    SubscriberItem::Batch(batch) => batch,
                    other => panic!("the engine's stream lost events: {other:?}"),
                };
                let decoded = decoder.decode_payload(batch.seq, &batch.payload).unwrap();
                let mut sink = sink.lock().unwrap();
                for event in decoded.events {
                    sink.push(match event {
                        EngineEvent::BlockStored(stored) => compare::EngineEvent::Stored {
                            parent: stored.parent_block_hash,
                            hashes: stored.block_hashes,
                            token_ids: stored.token_ids,
                        },
                        EngineEvent::BlockRemoved(removed) => compare::EngineEvent::Removed {
                            hashes: removed.block_hashes,
                        },
                        EngineEvent::AllBlocksCleared => compare::EngineEvent::Cleared,
                    });
                }
                let mut seen = seen.lock().unwrap();
                *seen = (seen.0 + 1, Instant::now());
            }
        });
        Self {
            events,
            batches,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until no batch has come for `quiet` (at most 30 s), then the events.
    fn settled(mut self, quiet: Duration) -> Vec<compare::EngineEvent> {
        let start = Instant::now();
        while self.batches.lock().unwrap().1.elapsed() < quiet {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the stream never settled"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

fn complete(address: &str, model: &str, prompt: &[u32], max_tokens: u64) -> (Vec<u32>, u64) {
    let body = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "return_token_ids": true,
    });
    let (status, answer) = http(address, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    let outputs: Vec<u32> = answer["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids: {answer}"))
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(outputs.len() as u64, max_tokens, "{answer}");
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens: {answer}"));
    (outputs, cached)
}

#[test]
fn the_twin_caches_and_evicts_what_a_real_engine_does_request_for_request() {
    let test = "the_twin_caches_and_evicts_what_a_real_engine_does_request_for_request";
    let options = EngineOptions::default();
    let Some(cluster) = Cluster::start_or_skip(test, 1, &options) else {
        return;
    };
    let engine = cluster.engine(1);
    let capture = Capture::start(&engine.events_endpoint, &engine.replay_endpoint);
    let mut served = Vec::with_capacity(REQUESTS);
    let mut previous: Option<(Vec<u32>, Vec<u32>)> = None;
    let mut draw = Draw(7);
    for (mut prompt, max_tokens) in workload() {
        // One in five continues the last conversation: its prompt and answer, then more.
        if let Some((last_prompt, last_outputs)) = previous.take() {
            if draw.between(0, 4) == 0 && last_prompt.len() + last_outputs.len() < 1200 {
                prompt = last_prompt.into_iter().chain(last_outputs).collect();
                let more = draw.between(1, 40);
                prompt.extend(draw.tokens(more));
            }
        }
        let (outputs, cached_tokens) =
            complete(&engine.address, &cluster.model, &prompt, max_tokens);
        previous = Some((prompt.clone(), outputs.clone()));
        served.push(ServedRequest {
            prompt,
            outputs,
            cached_tokens,
        });
    }
    let events = capture.settled(Duration::from_secs(1));

    let scheduler = VllmSchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 2048,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        reserve_full_isl: true,
    };
    let cache = VllmCacheConfig {
        num_gpu_blocks: options.blocks,
        block_size: BLOCK as u64,
        max_model_len: 2048,
        watermark: 0.0,
    };
    let result = compare::compare_one_at_a_time(scheduler, cache, &served, &events);
    let hits: u64 = served.iter().map(|s| s.cached_tokens).sum();
    let removed = events
        .iter()
        .filter(|e| matches!(e, compare::EngineEvent::Removed { .. }))
        .count();
    eprintln!(
        "{REQUESTS} requests: engine cached {hits} tokens, {} events ({removed} removals); \
         twin {} events, {} cached-token mismatches, divergence {:?}, held differs after {:?}",
        result.engine_events,
        result.twin_events,
        result.cached_mismatches(),
        result.divergence,
        result.held_differs_after,
    );
    // The workload must exercise what it claims: hits, repeats, evictions.
    assert!(hits > 0 && removed > REQUESTS / 2, "too gentle a workload");
    let mismatches: Vec<String> = served
        .iter()
        .zip(&result.cached)
        .enumerate()
        .filter(|(_, (_, c))| c.engine != c.twin)
        .take(10)
        .map(|(i, (s, c))| {
            format!(
                "request {i} ({} prompt tokens): engine {} cached, twin {}",
                s.prompt.len(),
                c.engine,
                c.twin
            )
        })
        .collect();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert_eq!(result.unknown_hashes, 0);
    assert_eq!(result.divergence, None);
    assert!(result.held_differs_after.is_empty());
    assert!(result.exact());
}
