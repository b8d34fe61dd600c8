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
//! Its token budget is 128 tokens a step (`--max-num-batched-tokens`), under most
//! prompts, so chunked prefill splits them even one at a time. Then, its cache reset,
//! the same engine is sent 200 more from four clients at once (each sends its next
//! request when its last one is answered): prompts of up to 416 tokens share steps in
//! chunks. Which step a request joins is the machine's timing: the twin joins each a
//! step after the answer that sent it, and, apart, follows the engine's steps (its event
//! batches, read off its stream and stamped with the engine's clock, say where each
//! request that stores a block joined), so that what is compared is the cache. The twin
//! following the engine must find within 1 % of the engine's total of cached tokens (the
//! acceptance), the fixed lag within 3 % (printed against 1 %), and every request that
//! differs is printed.
//!
//! Last, `kvtwin profile --engine` measures the same engine (a small grid, two repeats):
//! Dynamo's planner tables, a `Table` compute model that validates, and every repeat.
//!
//! Needs the engines' venv (`scripts/engines/cluster.py setup`); skips with the reason
//! without it, fails instead with `CI=true`.

mod common;

use common::engines::{Cluster, EngineOptions};
use common::{http, Draw};
use kvtwin_plane::wire::engine::{EngineDecoder, EngineEvent};
use kvtwin_plane::zmq::{SubscriberConfig, SubscriberItem, ZmqSubscriber};
use kvtwin_sim::vllm::compare::{self, ServedRequest};
use kvtwin_sim::vllm::follow;
use kvtwin_sim::vllm::{VllmCacheConfig, VllmSchedulerConfig};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REQUESTS: usize = 200;
const CONCURRENT_REQUESTS: usize = 200;
const CLIENTS: usize = 4;
const BLOCK: usize = 32;
/// The engine's token budget per step (`--max-num-batched-tokens`): under most prompts'
/// length, so chunked prefill is at work even one request at a time (vLLM wants it no
/// smaller than `max_num_seqs`).
const TOKEN_BUDGET: u64 = 128;
/// vLLM's default `max_num_seqs` for its API server on CPU (`EngineArgs`).
const MAX_NUM_SEQS: usize = 128;

/// What one request sends: its prompt and its output count.
fn workload() -> Vec<(Vec<u32>, u64)> {
    shaped_workload(20_261_127, REQUESTS, 200, 16)
}

/// `requests` prompts of shared system prompts (64 to 256 tokens) and 1 to `user_max`
/// tokens of their own, one in five an exact repeat of an earlier one, with 1 to
/// `outputs_max` outputs each.
fn shaped_workload(
    seed: u64,
    requests: usize,
    user_max: u64,
    outputs_max: u64,
) -> Vec<(Vec<u32>, u64)> {
    let mut draw = Draw(seed);
    let systems: Vec<Vec<u32>> = [64, 96, 128, 160, 224, 256]
        .iter()
        .map(|&n| draw.tokens(n))
        .collect();
    let mut sent: Vec<(Vec<u32>, u64)> = Vec::new();
    for _ in 0..requests {
        let roll = draw.between(0, 99);
        let prompt = if roll < 20 && !sent.is_empty() {
            // An exact repeat of an earlier prompt.
            let earlier = draw.between(0, sent.len() as u64 - 1) as usize;
            sent[earlier].0.clone()
        } else {
            let system = &systems[draw.between(0, systems.len() as u64 - 1) as usize];
            let mut prompt = system.clone();
            let user = draw.between(1, user_max);
            prompt.extend(draw.tokens(user));
            prompt
        };
        sent.push((prompt, draw.between(1, outputs_max)));
    }
    sent
}

/// One batch of the engine's events with its stamp (`KVEventBatch.ts`, seconds since
/// the Unix epoch, taken at the end of the step).
type Stamped = (f64, Vec<compare::EngineEvent>);

/// The engine's events, read off its stream by a thread until stopped, batch by batch
/// (one per engine step that published any).
struct Capture {
    batches: Arc<Mutex<Vec<Stamped>>>,
    last_batch: Arc<Mutex<Instant>>,
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
        let batches = Arc::new(Mutex::new(Vec::new()));
        let last_batch = Arc::new(Mutex::new(Instant::now()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, seen, stopping) = (batches.clone(), last_batch.clone(), stop.clone());
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
                let ts = decoded.ts;
                let events = decoded
                    .events
                    .into_iter()
                    .map(|event| match event {
                        EngineEvent::BlockStored(stored) => compare::EngineEvent::Stored {
                            parent: stored.parent_block_hash,
                            hashes: stored.block_hashes,
                            token_ids: stored.token_ids,
                        },
                        EngineEvent::BlockRemoved(removed) => compare::EngineEvent::Removed {
                            hashes: removed.block_hashes,
                        },
                        EngineEvent::AllBlocksCleared => compare::EngineEvent::Cleared,
                    })
                    .collect();
                sink.lock().unwrap().push((ts, events));
                *seen.lock().unwrap() = Instant::now();
            }
        });
        Self {
            batches,
            last_batch,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until the events name at least `blocks` blocks (a `Stored` or `Removed` of
    /// n blocks counts n, as the comparison flattens them) and then no batch has come
    /// for `quiet`, at most 60 s in all; then the events so far. The count is what the
    /// twin published for the same requests: an engine whose publisher lags its answers
    /// (a loaded machine delays its thread by seconds) is waited for, not cut short, and
    /// one that published fewer is compared once the time is up.
    fn settled(&self, blocks: usize, quiet: Duration) -> Vec<compare::EngineEvent> {
        let start = Instant::now();
        let flattened = |batches: &[Stamped]| -> usize {
            batches
                .iter()
                .flat_map(|(_, events)| events)
                .map(|event| match event {
                    compare::EngineEvent::Stored { hashes, .. } => hashes.len(),
                    compare::EngineEvent::Removed { hashes } => hashes.len(),
                    compare::EngineEvent::Cleared => 1,
                })
                .sum()
        };
        while start.elapsed() < Duration::from_secs(60)
            && (flattened(&self.batches.lock().unwrap()) < blocks
                || self.last_batch.lock().unwrap().elapsed() < quiet)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let batches = self.batches.lock().unwrap();
        batches
            .iter()
            .flat_map(|(_, events)| events.clone())
            .collect()
    }

    /// Waits (at most 60 s) for the batch that stores a block of `tokens` (a request
    /// sent after all the others were answered, so the engine published their events
    /// before it); the batches before that one.
    fn batches_before(&self, tokens: &[u32]) -> Vec<Stamped> {
        let start = Instant::now();
        loop {
            {
                let batches = self.batches.lock().unwrap();
                let marked = batches.iter().position(|(_, batch)| {
                    batch.iter().any(|event| {
                        matches!(event, compare::EngineEvent::Stored { token_ids, .. }
                            if token_ids.starts_with(&tokens[..BLOCK]))
                    })
                });
                if let Some(marked) = marked {
                    return batches[..marked].to_vec();
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the engine never published the marking request's block"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
    let options = EngineOptions {
        vllm_args: vec![format!("--max-num-batched-tokens={TOKEN_BUDGET}")],
        ..EngineOptions::default()
    };
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
    let scheduler = VllmSchedulerConfig {
        max_num_seqs: MAX_NUM_SEQS,
        max_num_batched_tokens: TOKEN_BUDGET,
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
    // The twin alone first: how many block events to wait for.
    let expected = compare::compare_one_at_a_time(scheduler, cache, &served, &[]).twin_events;
    let events = capture.settled(expected, Duration::from_secs(1));
    // Served before the comparison: the comparison's verdicts come last, so a failure in
    // one phase still shows the other's figures.
    let (concurrent, times) = serve_concurrently(&engine.address, &cluster.model);
    // A request of its own after them marks the end of their batches.
    let marker = Draw(30).tokens(2 * BLOCK as u64);
    complete(&engine.address, &cluster.model, &marker, 1);
    let (stamps, unstamped): (Vec<f64>, Vec<_>) =
        capture.batches_before(&marker).into_iter().unzip();
    let after_reset = follow::engine_batches_after_reset_indexed(&unstamped);
    let clock = follow::EngineClock {
        batch_ts: after_reset
            .iter()
            .map(|&(index, _)| stamps[index])
            .collect(),
        sent_at: times.iter().map(|&(sent, _)| sent).collect(),
        answered_at: times.iter().map(|&(_, answered)| answered).collect(),
    };
    let concurrent_batches: Vec<_> = after_reset.into_iter().map(|(_, batch)| batch).collect();
    drop(capture);
    let profile_dir = tempfile::tempdir().unwrap();
    let profile = profile_engine(&engine.url, profile_dir.path());
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

    // The twin of the four clients, each request joining a step after the answer that
    // sent it, and how much that lag matters.
    let closed = compare::compare_closed_loop(scheduler, cache, &concurrent, CLIENTS, 1);
    let by_lag: Vec<String> = (0..4)
        .map(|lag| {
            let c = compare::compare_closed_loop(scheduler, cache, &concurrent, CLIENTS, lag);
            format!("lag {lag}: {:.2} %", 100.0 * c.total_error())
        })
        .collect();
    eprintln!(
        "the twin joining requests a fixed lag after their answers: {}",
        by_lag.join(", ")
    );
    // The twin in time: the engine's own profile (measured above) decides which step
    // each request joins.
    let compute: kvtwin_sim::compute::ComputeModel =
        kvtwin_sim::ron_file::load(&profile_dir.path().join("compute.ron")).unwrap();
    let timed = compare::compare_timed(scheduler, cache, &concurrent, CLIENTS, compute, 0);
    let (_, timed_total) = timed.totals();
    eprintln!(
        "the twin in time (the engine's profile): {timed_total} tokens ({:.2} % apart), {} \
         requests differ",
        100.0 * timed.total_error(),
        timed.cached.iter().filter(|c| c.engine != c.twin).count()
    );
    // The twin following the engine's steps: each request joins where the engine's
    // batches show it did; on a quiet machine it makes every batch, step for step. With
    // the engine's clock, no request joins before a batch stamped before it was sent;
    // without it, a request whose joining published nothing joins when the closed
    // loop says it is due.
    let following = |clock| {
        let followed = follow::compare_following(
            scheduler,
            cache,
            &concurrent,
            CLIENTS,
            1,
            &concurrent_batches,
            clock,
        );
        eprintln!(
            "the twin following the engine's {} batches ({}): {} made, {} not, {} steps of \
             its own; {} tokens ({:.2} % apart), {} requests differ",
            followed.engine_batches,
            if clock.is_some() {
                "its clock"
            } else {
                "no clock"
            },
            followed.matched_batches,
            followed.missed_batches,
            followed.unmatched_steps,
            followed.closed.totals().1,
            100.0 * followed.closed.total_error(),
            followed
                .closed
                .cached
                .iter()
                .filter(|c| c.engine != c.twin)
                .count()
        );
        followed
    };
    following(None);
    let followed = following(Some(&clock));
    let (engine_total, twin_total) = closed.totals();
    let differences: Vec<String> = concurrent
        .iter()
        .zip(&closed.cached)
        .enumerate()
        .filter(|(_, (_, c))| c.engine != c.twin)
        .map(|(i, (s, c))| format!("#{i} ({}): {}/{}", s.prompt.len(), c.engine, c.twin))
        .collect();
    eprintln!(
        "{CONCURRENT_REQUESTS} requests from {CLIENTS} clients: engine cached {engine_total} \
         tokens, twin {twin_total} ({:.2} % apart); {} requests differ (#index (prompt): \
         engine/twin): {}; twin: {} partial prefills, {} preemptions, {} unserved",
        100.0 * closed.total_error(),
        differences.len(),
        differences.join(" "),
        closed.twin_partial_prefills,
        closed.twin_preemptions,
        closed.twin_unserved,
    );

    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert_eq!(result.unknown_hashes, 0);
    assert_eq!(result.divergence, None);
    assert!(result.held_differs_after.is_empty());
    assert!(result.exact());

    assert!(engine_total > 0, "no hits from {CLIENTS} clients");
    assert!(
        closed.twin_partial_prefills > 0,
        "chunked prefill never split a prompt"
    );
    assert_eq!(closed.twin_unserved, 0);
    assert_eq!(followed.unknown_hashes, 0, "the capture missed events");
    assert!(followed.matched_batches > 0, "{followed:?}");
    // The acceptance's target, 1 %, is asserted on the twin following the engine with its
    // clock: which step a request joins is the machine's timing, which the clock tells.
    // Before the clock that follower read 0.10 to 2.33 % (CI's run of 2026-12-07: 3.41 %,
    // out of step after 65 of 277 batches); with it, thirteen runs on this VM (nine beside
    // two busy loops or a release build) read 0.00 to 0.64 %, seven of them following
    // every batch the engine made (BENCHMARKS.md). The fixed lag predicts the steps
    // without looking at the engine: 0.00 to 1.78 % on this VM, 1.47 and 1.67 % in CI's
    // runs of 2026-11-28, so it is held to 3 % and its side of 1 % printed.
    for (model, error, bound) in [
        ("a fixed lag", closed.total_error(), 0.03),
        (
            "following the engine with its clock",
            followed.closed.total_error(),
            0.01,
        ),
    ] {
        let side = if error <= 0.01 { "within" } else { "OUTSIDE" };
        eprintln!("cached tokens from {CLIENTS} clients, the twin on {model}: {side} the acceptance's 1 %");
        assert!(
            error <= bound,
            "total cached tokens, the twin on {model}: {:.2} % apart (bound {:.0} %)",
            100.0 * error,
            100.0 * bound
        );
    }

    check_profile(&profile, profile_dir.path());
}

/// Runs `kvtwin profile --engine` on the engine; its output.
fn profile_engine(url: &str, out: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["profile", "--engine", url, "--out"])
        .arg(out)
        .args([
            "--isl",
            "32,256,1024",
            "--context",
            "128,512",
            "--batch",
            "1,4",
        ])
        .args(["--repeats", "2", "--osl", "8"])
        .output()
        .expect("kvtwin runs")
}

/// What `kvtwin profile --engine` wrote: the points asked for that fit (4 × 520 tokens
/// does not fit 2,048), each measured twice, a compute table that validates, and
/// Dynamo's files.
fn check_profile(output: &std::process::Output, dir: &std::path::Path) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("kvtwin profile --engine:\n{stdout}{stderr}");
    assert!(output.status.success(), "{stderr}");
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("engine_profile.json")).unwrap())
            .unwrap();
    assert_eq!(raw["num_gpu_blocks"], 65);
    assert_eq!(raw["block_size"], 32);
    let prefill = raw["prefill"].as_array().unwrap();
    assert_eq!(prefill.len(), 3);
    let decode = raw["decode"].as_array().unwrap();
    let points: Vec<(u64, u64)> = decode
        .iter()
        .map(|p| (p["context"].as_u64().unwrap(), p["batch"].as_u64().unwrap()))
        .collect();
    assert_eq!(points, [(128, 1), (128, 4), (512, 1)]);
    assert_eq!(raw["decode_skipped"], json!(["4×512"]));
    for point in prefill.iter().chain(decode) {
        let ms = point["ms"].as_array().unwrap();
        assert_eq!(ms.len(), 2, "{point}");
        assert!(ms.iter().all(|m| m.as_f64().unwrap() > 0.0), "{point}");
    }
    // vLLM keeps its own inter-token latency: the decode figures are the engine's, the
    // overhead was probed beside a decode, and its gaps were read for stalls.
    assert_eq!(raw["decode_from_engine"], true, "{raw}");
    assert!(
        raw["request_overhead_beside_decode"]["ms"]
            .as_array()
            .is_some_and(|ms| !ms.is_empty()),
        "{raw}"
    );
    // Prompts of 1,024 tokens probed beside 1 and 4 answers, and the answer beside one
    // probe watched against windows without one.
    let beside = &raw["prefill_beside_decode"];
    assert_eq!(beside["isl"], 1024, "{beside}");
    let decodes: Vec<u64> = beside["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["decodes"].as_u64().unwrap())
        .collect();
    assert_eq!(decodes, [1, 4]);
    for point in beside["points"].as_array().unwrap() {
        let ms = point["engine"]["ms"].as_array().unwrap();
        assert!(
            !ms.is_empty() && ms.iter().all(|m| m.as_f64().unwrap() > 0.0),
            "{point}"
        );
    }
    // The answer's steps in windows with a probe and without (the table's
    // arrival_stretch_ms). A loaded machine can spoil every probe window of the extra
    // rounds: CI's run of 2026-12-07, and 5 of 7 runs here beside two busy loops, found
    // none (likely: vLLM's API server counts the answer's gaps as its output handler
    // reaches them, and a starved one moves them out of the window). The profile then
    // leaves the stretch out, 0 in the table, which is checked below instead; on a quiet
    // machine both kinds are measured (every quiet run here).
    let stretch_measured = ["steps_excess_with_probe", "steps_excess_without"]
        .iter()
        .all(|side| {
            beside[side]["ms"]
                .as_array()
                .is_some_and(|ms| !ms.is_empty())
        });
    if !stretch_measured {
        eprintln!(
            "NOTE: no clean window beside one decode (a loaded machine): the profile \
             leaves arrival_stretch_ms out: {beside}"
        );
    }
    assert!(
        raw["decode_gaps"].as_f64().is_some_and(|gaps| gaps > 0.0),
        "{raw}"
    );
    assert!(raw["stalls"].is_array(), "{raw}");
    let compute = std::fs::read_to_string(dir.join("compute.ron")).unwrap();
    match ron::from_str::<kvtwin_sim::compute::ComputeModel>(&compute).unwrap() {
        kvtwin_sim::compute::ComputeModel::Table(table) => {
            table.validate().unwrap();
            if !stretch_measured {
                assert_eq!(table.arrival_stretch_ms, 0.0, "a stretch nothing measured");
            }
            assert_eq!(table.max_kv_tokens, 2048);
            assert_eq!(table.prefill_isl, [32, 256, 1024]);
            let decodes: Vec<u64> = table
                .prefill_beside_decode
                .iter()
                .map(|b| b.decodes)
                .collect();
            assert_eq!(decodes, [1, 4]);
        }
        other => panic!("not a table: {other:?}"),
    }
    for file in [
        "prefill_raw_data.json",
        "decode_raw_data.json",
        "selected_prefill_interpolation/raw_data.npz",
        "selected_decode_interpolation/raw_data.npz",
    ] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
}

/// Resets the engine's prefix cache, then sends [`CONCURRENT_REQUESTS`] from
/// [`CLIENTS`] closed-loop clients; what each was served, in order of sending.
/// What each request was served, and when it was sent and answered (seconds since the
/// Unix epoch, the clock the engine stamps its event batches with).
fn serve_concurrently(address: &str, model: &str) -> (Vec<ServedRequest>, Vec<(f64, f64)>) {
    let (status, answer) = http(address, "POST", "/reset_prefix_cache", "");
    assert_eq!(status, 200, "reset_prefix_cache: {answer}");
    // 1 to 160 tokens of their own: four of the longest (13 blocks with their outputs)
    // fit the 64 blocks at once, so the engine rarely has to preempt.
    let requests = Arc::new(shaped_workload(20_261_128, CONCURRENT_REQUESTS, 160, 24));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let served = Arc::new(Mutex::new(vec![None; CONCURRENT_REQUESTS]));
    let times = Arc::new(Mutex::new(vec![(0.0, 0.0); CONCURRENT_REQUESTS]));
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is past 1970")
            .as_secs_f64()
    };
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (requests, next, served, times) = (
                requests.clone(),
                next.clone(),
                served.clone(),
                times.clone(),
            );
            let (address, model) = (address.to_string(), model.to_string());
            std::thread::spawn(move || loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                let Some((prompt, max_tokens)) = requests.get(index) else {
                    break;
                };
                let sent = now();
                let (outputs, cached_tokens) = complete(&address, &model, prompt, *max_tokens);
                times.lock().unwrap()[index] = (sent, now());
                served.lock().unwrap()[index] = Some(ServedRequest {
                    prompt: prompt.clone(),
                    outputs,
                    cached_tokens,
                });
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client");
    }
    let served = std::mem::take(&mut *served.lock().unwrap());
    let served = served
        .into_iter()
        .map(|s| s.expect("every request answered"))
        .collect();
    let times = std::mem::take(&mut *times.lock().unwrap());
    (served, times)
}
