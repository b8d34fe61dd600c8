//! kvtwin as vLLM's KV cache tier (issue 31): two engines of scripts/engines (65 blocks
//! of 32 tokens, 64 usable), one started with kvtwin's connector (`cluster.py up
//! --connector`: 8 MiB of host memory written through to a 128 MiB disk tier that
//! outlives the engine, the package built into the engines' venv first when its
//! sources changed) and one without, are sent the same 100 greedy requests one
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
//! The connector publishes its tiers in the engine's own KV events (medium CPU for its
//! host memory, DISK for its disk tier), and `kvtwin router`, following the engine's
//! event stream, counts blocks per tier: after the 100 requests its counts of the
//! engine's CPU and DISK blocks equal what the connector says its tiers hold (its
//! `vllm:kvtwin_blocks` gauge), with the host memory (8 MiB, 128 blocks) too small for
//! the 200 prompt blocks, so evictions from it are published too. The connector's
//! external hits by tier (`vllm:kvtwin_external_hit_tokens_total`) add up to the
//! engine's own count, and the twin of the engine with the same tiers
//! (`kvtwin_sim::vllm::connector`), sent the same requests, predicts both within 1 %.
//!
//! Then the connector's engine is killed (SIGKILL, a crash) and, while it is down, one
//! byte of one block on disk is flipped: the 6th block of the first prompt, found
//! through the disk tier's journal. Started again on the same directory, its host
//! memory empty, it is sent each prompt once more with new tokens of its own:
//! - the nine untouched prompts come back from disk: 640 tokens cached each;
//! - the first stops at the flipped block: the connector reports its load failed and
//!   logs why, and vLLM (`kv_load_failure_policy: recompute`, as `cluster.py` starts
//!   it) says it computed the 15 blocks from there (480 tokens) again; its usage still
//!   counts the 640 tokens it first found cached, vLLM's account of the request;
//! - every output token is still the engine's without the connector;
//! - the bad copy left the disk tier and the recompute saved the block again: the first
//!   prompt, sent once more, comes back whole.
//!
//! Needs the engines' venv (`scripts/engines/cluster.py setup`); skips with the reason
//! without it, fails instead with `CI=true`.

mod common;

use common::engines::{external_hits, greedy, Cluster, EngineOptions};
use common::{http, listening_on, Draw, Process};
use kvtwin::block::BlockIdentity;
use kvtwin::ids::RequestId;
use kvtwin::tokens::{compute_local_hashes, HashSeed};
use kvtwin_connector::journal::Journal;
use kvtwin_sim::vllm::{
    ConnectorTiers, TwinStore, VllmCacheConfig, VllmRequest, VllmScheduler, VllmSchedulerConfig,
};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const PROMPTS: usize = 10;
const PREFIX_TOKENS: usize = 640;
const OWN_TOKENS: usize = 20;
const REQUESTS: usize = 100;
/// The block of the first prompt flipped on disk while the engine is down.
const FLIPPED_BLOCK: usize = 5;
/// The disk tier's slot: the block and its trailer, to the next 4 KiB.
const SLOT_BYTES: usize = 65536 + 4096;

fn prefixes() -> Vec<Vec<u32>> {
    let mut draw = Draw(31);
    (0..PROMPTS)
        .map(|_| draw.tokens(PREFIX_TOKENS as u64))
        .collect()
}

fn workload() -> Vec<Vec<u32>> {
    let mut draw = Draw(31);
    let prefixes: Vec<Vec<u32>> = (0..PROMPTS)
        .map(|_| draw.tokens(PREFIX_TOKENS as u64))
        .collect();
    assert_eq!(prefixes, self::prefixes());
    (0..REQUESTS)
        .map(|i| {
            let mut prompt = prefixes[i % PROMPTS].clone();
            prompt.extend(draw.tokens(OWN_TOKENS as u64));
            prompt
        })
        .collect()
}

/// The engine's samples of `metric` whose labels hold `label` (e.g. `tier="cpu"`),
/// summed; 0 when it has none.
fn metric_sum(cluster: &Cluster, metric: &str, label: &str) -> f64 {
    let (status, text) = http(&cluster.engine(1).address, "GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What `router` counts of engine 1's blocks: (device, host, disk).
fn router_tiers(router: &str) -> (u64, u64, u64) {
    let (status, text) = http(router, "GET", "/v1/workers", "");
    assert_eq!(status, 200, "{text}");
    let workers: Value = serde_json::from_str(&text).unwrap();
    let worker = workers["workers"]
        .as_array()
        .and_then(|all| all.iter().find(|w| w["worker"] == 1))
        .unwrap_or_else(|| panic!("the router knows no worker 1: {text}"));
    let count = |tier: &str| worker["blocks"][tier].as_u64().unwrap_or(0);
    (count("device"), count("host"), count("disk"))
}

/// What the twin of the connector's engine (`sim/src/vllm`: vLLM's scheduler and cache
/// of 65 blocks, kvtwin's connector in front of 128 blocks of host memory, 8 MiB of
/// 64 KiB blocks, and 2,048 on disk, 128 MiB) loads for `prompts` sent one at a time,
/// 8 outputs each: external hit tokens from host memory and from disk.
fn twin_hits_by_tier(prompts: &[Vec<u32>]) -> (u64, u64) {
    let scheduler = VllmSchedulerConfig {
        max_num_seqs: 128,
        max_num_batched_tokens: 2048,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        reserve_full_isl: true,
    };
    let cache = VllmCacheConfig {
        num_gpu_blocks: 65,
        block_size: 32,
        max_model_len: 2048,
        watermark: 0.0,
    };
    let tiers = ConnectorTiers {
        memory_blocks: 128,
        disk_blocks: 2048,
    };
    let store = TwinStore::new(tiers, 32).unwrap();
    let mut engine = VllmScheduler::with_connector(scheduler, cache, store);
    let (mut memory, mut disk) = (0, 0);
    for (i, prompt) in prompts.iter().enumerate() {
        let locals = compute_local_hashes(prompt, 32, HashSeed::default());
        engine.add_request(VllmRequest::new(
            RequestId::new(i as u64),
            BlockIdentity::chain(&locals),
            prompt.len() as u64,
            8,
        ));
        while engine.num_unfinished() > 0 {
            let step = engine.step().expect("the twin steps while it has work");
            for done in step.finished {
                memory += done.loaded.memory * 32;
                disk += done.loaded.disk * 32;
            }
        }
    }
    (memory, disk)
}

/// The router's CPU and DISK counts of the connector's engine against the connector's
/// own gauges, once they agree or after 30 s. Both learn of the store's changes with
/// the engine's next step (copies to disk land after the step that saved them), so
/// each look first sends `settle`, a prompt whose blocks the store holds already.
fn tiers_agree(cluster: &Cluster, router: &str, settle: &[u32]) -> ((u64, u64, u64), (u64, u64)) {
    let start = Instant::now();
    loop {
        greedy(cluster, 1, settle);
        let counted = router_tiers(router);
        let held = (
            metric_sum(cluster, "vllm:kvtwin_blocks", "tier=\"cpu\"") as u64,
            metric_sum(cluster, "vllm:kvtwin_blocks", "tier=\"disk\"") as u64,
        );
        if (counted.1, counted.2) == held || start.elapsed() > Duration::from_secs(30) {
            return (counted, held);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Flips one byte of the data of `prompt`'s block `block` in the disk tier in `dir`
/// (its slot read from the journal); the extent file's own checksum and the
/// connector's BLAKE3 both refuse it now.
fn flip_on_disk(dir: &Path, prompt: &[u32], block: usize) {
    let locals = compute_local_hashes(prompt, 32, HashSeed::default());
    let hash = BlockIdentity::chain(&locals)[block].sequence_hash;
    let (entries, _) = Journal::read(dir, None).expect("the disk tier's journal");
    let entry = entries
        .iter()
        .find(|entry| entry.identity.sequence_hash == hash)
        .unwrap_or_else(|| {
            panic!(
                "block {block} is not in the journal ({} entries)",
                entries.len()
            )
        });
    let path = dir.join(kvtwin_backends::host::KEPT_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[entry.slot.index() * SLOT_BYTES + 1000] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
}

#[test]
fn outputs_are_the_same_with_the_connector_and_evicted_prefixes_come_back_from_it() {
    let test = "outputs_are_the_same_with_the_connector_and_evicted_prefixes_come_back_from_it";
    let disk = tempfile::tempdir().unwrap();
    let with = EngineOptions {
        connector: Some(
            json!({
                "host_bytes": 8 << 20,
                "disk_bytes": 128 << 20,
                "disk_dir": disk.path(),
            })
            .to_string(),
        ),
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
    // A router following the connector's engine: its events and the connector's.
    let engine = with_connector.engine(1);
    let router = Process::start(&[
        "router",
        "--engine",
        &format!("1={}", engine.url),
        "--zmq",
        &format!(
            "1={},replay={}",
            engine.events_endpoint, engine.replay_endpoint
        ),
        "--block-size",
        "32",
        "--listen",
        "127.0.0.1:0",
    ]);
    let router_address = listening_on(&router);
    let prompts = workload();
    let mut differing = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let (tokens, cached) = greedy(&with_connector, 1, prompt);
        let (plain_tokens, plain_cached) = greedy(&without, 1, prompt);
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
    let hits = external_hits(&with_connector, 1);
    assert_eq!(hits, ((REQUESTS - PROMPTS) * PREFIX_TOKENS) as f64);
    assert_eq!(external_hits(&without, 1), 0.0);
    // The same hits, by the tier that served them.
    let by_tier: Vec<f64> = ["cpu", "disk"]
        .iter()
        .map(|tier| {
            metric_sum(
                &with_connector,
                "vllm:kvtwin_external_hit_tokens_total",
                &format!("tier=\"{tier}\""),
            )
        })
        .collect();
    eprintln!(
        "external hit tokens: {} from host memory, {} from disk",
        by_tier[0], by_tier[1]
    );
    assert_eq!(by_tier[0] + by_tier[1], hits);
    // The twin, given the same requests and the same tiers, predicts those hits by tier.
    let (twin_memory, twin_disk) = twin_hits_by_tier(&prompts);
    eprintln!(
        "the twin's external hit tokens: {twin_memory} from host memory, {twin_disk} from disk"
    );
    for (tier, real, twin) in [
        ("host memory", by_tier[0], twin_memory as f64),
        ("disk", by_tier[1], twin_disk as f64),
    ] {
        assert!(
            (twin - real).abs() <= 0.01 * real,
            "{tier}: the twin predicts {twin} external hit tokens, the connector served {real}"
        );
    }
    // The router counts the connector's tiers as the connector does: all 200 prompt
    // blocks on disk, host memory's 128 at most, none a block the engine does not hold.
    let mut settle = prompts[0][..PREFIX_TOKENS].to_vec();
    settle.extend(Draw(33).tokens(OWN_TOKENS as u64));
    let (counted, held) = tiers_agree(&with_connector, &router_address, &settle);
    eprintln!("router: {counted:?} (device, host, disk); connector: {held:?} (host, disk)");
    assert_eq!(
        (counted.1, counted.2),
        held,
        "the router's CPU and DISK counts"
    );
    assert_eq!(
        held.1,
        (PROMPTS * PREFIX_TOKENS / 32) as u64,
        "every prompt block on disk"
    );
    assert!(held.0 > 0 && held.0 <= 128, "host memory holds {}", held.0);
    assert!(
        counted.0 > 0 && counted.0 <= 65,
        "the engine's own blocks: {}",
        counted.0
    );
    drop(router);

    // A crash, a block flipped on disk while the engine is down, a restart.
    with_connector.kill(1);
    let prefixes = prefixes();
    flip_on_disk(disk.path(), &prefixes[0], FLIPPED_BLOCK);
    with_connector.restart(1);
    let mut draw = Draw(32);
    for (p, prefix) in prefixes.iter().enumerate() {
        let mut prompt = prefix.clone();
        prompt.extend(draw.tokens(OWN_TOKENS as u64));
        let (tokens, cached) = greedy(&with_connector, 1, &prompt);
        let (plain_tokens, _) = greedy(&without, 1, &prompt);
        assert_eq!(tokens, plain_tokens, "prompt {p} after the restart");
        assert_eq!(cached, PREFIX_TOKENS as u64, "prompt {p} after the restart");
    }
    let log = std::fs::read_to_string(&with_connector.engine(1).log).unwrap();
    let recomputed = PREFIX_TOKENS - FLIPPED_BLOCK * 32;
    assert!(
        log.contains(&format!("loaded {FLIPPED_BLOCK} of 20 blocks")) && log.contains("corrupt"),
        "the connector's engine log says nothing of the flipped block"
    );
    assert!(
        log.contains(&format!(
            "Recovered from KV load failure: 1 request(s) rescheduled ({recomputed} tokens affected)"
        )),
        "vLLM did not say it computed the blocks from the flipped one again"
    );
    assert!(
        log.contains("the disk tier in") && log.contains("kept 200 blocks"),
        "the connector's engine log says nothing of the 200 blocks the disk tier kept"
    );
    // The flipped block left the disk tier, and the engine's recompute saved it again:
    // the first prompt comes back whole.
    let mut prompt = prefixes[0].clone();
    prompt.extend(draw.tokens(OWN_TOKENS as u64));
    let (tokens, cached) = greedy(&with_connector, 1, &prompt);
    assert_eq!(tokens, greedy(&without, 1, &prompt).0);
    assert_eq!(
        cached, PREFIX_TOKENS as u64,
        "the first prompt, saved again"
    );
    // The restarted engine's own count: vLLM counts a request's external hits when it
    // schedules it, before any load, so the first prompt's 640 count twice, once for
    // the failed load and once for the whole one.
    let hits = external_hits(&with_connector, 1);
    assert_eq!(hits, ((PROMPTS + 1) * PREFIX_TOKENS) as f64);
}
