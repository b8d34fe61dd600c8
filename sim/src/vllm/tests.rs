//! The vLLM twin against what vLLM's code does, case by case: a repeated prompt
//! recomputing its last block, tail-first eviction, hits taken out of the free queue,
//! admission of the whole sequence, preemption of the last running request, chunked
//! prefill storing blocks as chunks fill.

use super::*;
use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::{RequestId, SequenceHash};
use kvtwin::tokens::{compute_local_hashes, HashSeed};

pub(super) const BLOCK: u64 = 32;

/// A twin's configuration: vLLM's defaults but for the token budget and the cache's
/// blocks (one of them the null block).
pub(super) fn configs(
    max_num_batched_tokens: u64,
    num_gpu_blocks: u32,
) -> (VllmSchedulerConfig, VllmCacheConfig) {
    let scheduler = VllmSchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        reserve_full_isl: true,
    };
    let cache = VllmCacheConfig {
        num_gpu_blocks,
        block_size: BLOCK,
        max_model_len: 2048,
        watermark: 0.0,
    };
    (scheduler, cache)
}

fn engine(num_gpu_blocks: u32, max_num_batched_tokens: u64) -> VllmScheduler {
    let (scheduler, cache) = configs(max_num_batched_tokens, num_gpu_blocks);
    VllmScheduler::new(scheduler, cache)
}

/// `len` tokens counting up from `first`.
fn tokens(first: u32, len: u32) -> Vec<u32> {
    (first..first + len).collect()
}

fn identities(tokens: &[u32]) -> Vec<BlockIdentity> {
    BlockIdentity::chain(&compute_local_hashes(
        tokens,
        BLOCK as usize,
        HashSeed::default(),
    ))
}

fn hashes(tokens: &[u32]) -> Vec<SequenceHash> {
    identities(tokens)
        .iter()
        .map(|identity| identity.sequence_hash)
        .collect()
}

/// A request for `prompt` that generates `outputs` (their tokens known up front).
fn request(id: u64, prompt: &[u32], outputs: &[u32]) -> VllmRequest {
    let sequence: Vec<u32> = prompt.iter().chain(outputs).copied().collect();
    VllmRequest::new(
        RequestId::new(id),
        identities(&sequence),
        prompt.len() as u64,
        outputs.len() as u64,
    )
}

/// Steps until nothing is left; every step's outcome.
fn run_all(engine: &mut VllmScheduler) -> Vec<StepOutcome> {
    let mut steps = Vec::new();
    while engine.num_unfinished() > 0 {
        steps.push(engine.step().expect("a step with work to do"));
        assert!(steps.len() < 10_000, "the engine does not finish");
    }
    steps
}

/// Runs one request alone: its finish and its events.
fn serve(
    engine: &mut VllmScheduler,
    request: VllmRequest,
) -> (FinishedRequest, Vec<KvCacheEventData>) {
    engine.add_request(request);
    let steps = run_all(engine);
    let finished = steps
        .iter()
        .flat_map(|step| step.finished.clone())
        .collect::<Vec<_>>();
    assert_eq!(finished.len(), 1);
    let events = steps.into_iter().flat_map(|step| step.events).collect();
    (finished[0], events)
}

/// (parent, stored hashes) of each `Stored`, and the hash of each `Removed`, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Stored(Option<SequenceHash>, Vec<SequenceHash>),
    Removed(SequenceHash),
}

fn seen(events: &[KvCacheEventData]) -> Vec<Seen> {
    events
        .iter()
        .flat_map(|event| match event {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                ..
            } => vec![Seen::Stored(
                *parent_hash,
                blocks.iter().map(|block| block.block_hash).collect(),
            )],
            KvCacheEventData::Removed { block_hashes, .. } => block_hashes
                .iter()
                .map(|hash| Seen::Removed(*hash))
                .collect(),
            KvCacheEventData::Cleared => panic!("the twin never clears"),
        })
        .collect()
}

#[test]
fn a_repeated_prompt_finds_all_but_its_last_block_and_stores_that_again() {
    // ENGINES.md: "224 of a 256-token prompt's tokens are reported cached", and the
    // last block is stored again under the same hash with no BlockRemoved between.
    let mut engine = engine(65, 2048);
    let prompt = tokens(1000, 256);
    let h = hashes(&prompt);
    let (first, events) = serve(&mut engine, request(1, &prompt, &tokens(9000, 8)));
    assert_eq!(first.cached_tokens, 0);
    assert_eq!(seen(&events), [Seen::Stored(None, h.clone())]);
    let (second, events) = serve(&mut engine, request(2, &prompt, &tokens(9000, 8)));
    assert_eq!(second.cached_tokens, 224);
    assert_eq!(seen(&events), [Seen::Stored(Some(h[6]), vec![h[7]])]);
    // Both copies of the last block are cached; a lookup finds the first.
    let cached = engine.cache().pool().cached_hashes();
    assert_eq!(cached.iter().find(|(hash, _)| *hash == h[7]).unwrap().1, 2);
    assert_eq!(engine.cache().pool().get_cached_block(h[7]), Some(8));
    assert_eq!(engine.cache().stats().queries, 512);
    assert_eq!(engine.cache().stats().hits, 224);
}

#[test]
fn a_finished_request_is_evicted_tail_first_after_the_blocks_nobody_cached() {
    // 10 usable blocks. A: 3 prompt blocks and a decode block (97 tokens computed).
    let mut engine = engine(11, 2048);
    let a = tokens(100, 96);
    let (_, events) = serve(&mut engine, request(1, &a, &tokens(5000, 2)));
    let ha = hashes(&a);
    assert_eq!(seen(&events), [Seen::Stored(None, ha.clone())]);
    // Freed: the uncached decode block to the front, A's blocks to the back, tail first.
    assert_eq!(
        engine.cache().pool().free_queue(),
        [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]
    );
    // B takes the 7 blocks that were never cached: nothing is evicted.
    let b = tokens(2000, 224);
    let (_, events) = serve(&mut engine, request(2, &b, &tokens(5000, 1)));
    assert_eq!(seen(&events), [Seen::Stored(None, hashes(&b))]);
    // C needs 2 blocks: A's last two go, its first stays.
    let c = tokens(3000, 64);
    let (_, events) = serve(&mut engine, request(3, &c, &tokens(5000, 1)));
    assert_eq!(
        seen(&events),
        [
            Seen::Removed(ha[2]),
            Seen::Removed(ha[1]),
            Seen::Stored(None, hashes(&c))
        ]
    );
    let (again, _) = serve(&mut engine, request(4, &a, &tokens(5000, 1)));
    assert_eq!(again.cached_tokens, 32);
}

#[test]
fn a_hit_leaves_the_free_queue_before_the_request_takes_new_blocks() {
    // 4 usable blocks; A's two blocks sit at the front of the queue once B ran.
    let mut engine = engine(5, 2048);
    let a = tokens(100, 64);
    serve(&mut engine, request(1, &a, &tokens(7000, 1)));
    let b = tokens(500, 64);
    serve(&mut engine, request(2, &b, &tokens(7000, 1)));
    assert_eq!(engine.cache().pool().free_queue(), [2, 1, 4, 3]);
    // A's prompt plus a block: its two blocks are hits (taken out of the queue), its
    // third comes from the front of what is left (B's tail block, evicted).
    let longer: Vec<u32> = a.iter().copied().chain(tokens(900, 32)).collect();
    let (finished, events) = serve(&mut engine, request(3, &longer, &tokens(7000, 1)));
    assert_eq!(finished.cached_tokens, 64);
    let ha = hashes(&longer);
    let hb = hashes(&b);
    assert_eq!(
        seen(&events),
        [Seen::Removed(hb[1]), Seen::Stored(Some(ha[1]), vec![ha[2]])]
    );
}

#[test]
fn the_last_running_request_is_preempted_when_a_decode_needs_a_block() {
    // 4 usable blocks; two 64-token prompts fill them, and each decode needs a third.
    let mut engine = engine(5, 2048);
    let (a, b) = (tokens(100, 64), tokens(500, 64));
    engine.add_request(request(1, &a, &tokens(7000, 3)));
    engine.add_request(request(2, &b, &tokens(8000, 3)));
    let first = engine.step().unwrap();
    assert_eq!(first.scheduled.len(), 2, "both fit: {first:?}");
    let second = engine.step().unwrap();
    assert_eq!(second.preempted, [RequestId::new(2)]);
    assert_eq!(second.scheduled.len(), 1);
    // B's blocks went back tail first, and A's decode block took B's tail.
    let hb = hashes(&b);
    assert_eq!(seen(&second.events), [Seen::Removed(hb[1])]);
    let rest = run_all(&mut engine);
    let finished: Vec<_> = rest.iter().flat_map(|step| step.finished.clone()).collect();
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[0].id, RequestId::new(1));
    // B keeps the cached tokens of its first scheduling (none) and counts one preemption.
    assert_eq!(finished[1].id, RequestId::new(2));
    assert_eq!(finished[1].cached_tokens, 0);
    assert_eq!(finished[1].preemptions, 1);
}

#[test]
fn a_waiting_request_is_admitted_only_when_its_whole_prompt_fits() {
    // 4 usable blocks; A holds 3 while it decodes, B's 64 tokens need 2.
    let mut engine = engine(5, 2048);
    engine.add_request(request(1, &tokens(100, 96), &tokens(7000, 4)));
    let first = engine.step().unwrap();
    assert_eq!(first.scheduled.len(), 1);
    engine.add_request(request(2, &tokens(500, 64), &tokens(8000, 1)));
    let second = engine.step().unwrap();
    // A's decode takes the fourth block; B does not fit beside it.
    assert_eq!(second.scheduled.len(), 1);
    assert!(second.preempted.is_empty());
    let rest = run_all(&mut engine);
    let order: Vec<_> = rest
        .iter()
        .flat_map(|step| step.finished.iter().map(|done| done.id.get()))
        .collect();
    assert_eq!(order, [1, 2]);
}

#[test]
fn chunked_prefill_stores_each_chunks_full_blocks_as_it_is_scheduled() {
    let mut engine = engine(65, 64);
    let prompt = tokens(100, 160);
    let h = hashes(&prompt);
    engine.add_request(request(1, &prompt, &tokens(7000, 1)));
    let steps = run_all(&mut engine);
    let chunks: Vec<u64> = steps.iter().map(|step| step.scheduled[0].tokens).collect();
    assert_eq!(chunks, [64, 64, 32]);
    assert!(steps[0].scheduled[0].prefill && steps[2].scheduled[0].prefill);
    let stored: Vec<_> = steps.iter().map(|step| seen(&step.events)).collect();
    assert_eq!(
        stored,
        [
            vec![Seen::Stored(None, h[..2].to_vec())],
            vec![Seen::Stored(Some(h[1]), h[2..4].to_vec())],
            vec![Seen::Stored(Some(h[3]), h[4..].to_vec())],
        ]
    );
    assert_eq!(steps[2].finished.len(), 1);
}

#[test]
fn output_blocks_are_cached_as_the_outputs_fill_them() {
    // 40 prompt tokens and 30 outputs: 69 tokens computed, blocks 0 and 1 full.
    let mut engine = engine(65, 2048);
    let prompt = tokens(100, 40);
    let outputs = tokens(6000, 30);
    let sequence: Vec<u32> = prompt.iter().chain(&outputs).copied().collect();
    let h = hashes(&sequence);
    let (_, events) = serve(&mut engine, request(1, &prompt, &outputs));
    assert_eq!(
        seen(&events),
        [
            Seen::Stored(None, vec![h[0]]),
            Seen::Stored(Some(h[0]), vec![h[1]])
        ]
    );
}

/// The twin's own events as an engine would publish them: its own hashes (any values
/// unique per block) and the tokens of each block.
fn as_engine_events(requests: &[compare::ServedRequest]) -> Vec<compare::EngineEvent> {
    let mut engine = engine(65, 2048);
    let mut out = Vec::new();
    for (index, served) in requests.iter().enumerate() {
        let sequence = served.sequence();
        let ids = identities(&sequence);
        engine.add_request(request(index as u64, &served.prompt, &served.outputs));
        for step in run_all(&mut engine) {
            for event in step.events {
                // An engine hash: the kvtwin hash scrambled, so a mapping is needed.
                let engine_hash = |hash: SequenceHash| hash.get().rotate_left(17) ^ 0x5555;
                let block_of = |hash: SequenceHash| {
                    let at = ids.iter().position(|id| id.sequence_hash == hash).unwrap();
                    sequence[at * BLOCK as usize..(at + 1) * BLOCK as usize].to_vec()
                };
                out.push(match event {
                    KvCacheEventData::Stored {
                        parent_hash,
                        blocks,
                        ..
                    } => compare::EngineEvent::Stored {
                        parent: parent_hash.map(engine_hash),
                        hashes: blocks.iter().map(|b| engine_hash(b.block_hash)).collect(),
                        token_ids: blocks.iter().flat_map(|b| block_of(b.block_hash)).collect(),
                    },
                    KvCacheEventData::Removed { block_hashes, .. } => {
                        compare::EngineEvent::Removed {
                            hashes: block_hashes.into_iter().map(engine_hash).collect(),
                        }
                    }
                    KvCacheEventData::Cleared => compare::EngineEvent::Cleared,
                });
            }
        }
    }
    out
}

#[test]
fn the_comparison_is_exact_on_its_own_stream_and_names_the_first_difference() {
    let shared = tokens(100, 96);
    let served: Vec<compare::ServedRequest> = (0..12u32)
        .map(|i| {
            let prompt: Vec<u32> = shared
                .iter()
                .copied()
                .chain(tokens(1000 + 100 * (i % 4), 40 + i))
                .collect();
            compare::ServedRequest {
                prompt,
                outputs: tokens(50_000 + i * 64, 20 + i),
                cached_tokens: 0,
            }
        })
        .collect();
    let events = as_engine_events(&served);
    let (scheduler, cache) = configs(2048, 65);
    let first = compare::compare_one_at_a_time(scheduler, cache, &served, &events);
    // The engine "reported" 0 cached tokens: every repeat of the shared prefix differs.
    assert!(first.divergence.is_none(), "{first:?}");
    assert!(first.held_differs_after.is_empty());
    assert_eq!(first.unknown_hashes, 0);
    assert!(first.cached_mismatches() > 0);
    let served: Vec<_> = served
        .into_iter()
        .zip(&first.cached)
        .map(|(mut served, cached)| {
            served.cached_tokens = cached.twin;
            served
        })
        .collect();
    let exact = compare::compare_one_at_a_time(scheduler, cache, &served, &events);
    assert!(exact.exact(), "{exact:?}");
    // One event dropped from the engine's stream: found, with the request it fell in.
    let mut missing = events.clone();
    let removed_at = missing
        .iter()
        .position(|event| matches!(event, compare::EngineEvent::Removed { .. }))
        .unwrap_or(missing.len() / 2);
    missing.remove(removed_at);
    let broken = compare::compare_one_at_a_time(scheduler, cache, &served, &missing);
    assert!(!broken.exact());
    let divergence = broken.divergence.expect("a missing event");
    assert!(divergence.request.is_some());
}

#[test]
fn one_closed_loop_client_is_the_one_at_a_time_run_and_more_clients_share_prefixes_in_flight() {
    // Eight prompts sharing 3 blocks: with one client each finds the shared blocks
    // cached by the one before. With four at once, the first four are admitted in one
    // step and still only the first finds nothing: `allocate_slots` caches a request's
    // full blocks when it is scheduled, before they are computed, so the next lookup of
    // the same step hits them (vLLM's `Scheduler.schedule` does the same).
    let shared = tokens(100, 96);
    let served: Vec<compare::ServedRequest> = (0..8u32)
        .map(|i| compare::ServedRequest {
            prompt: shared
                .iter()
                .copied()
                .chain(tokens(1000 + 100 * i, 40))
                .collect(),
            outputs: tokens(50_000 + i * 64, 4),
            cached_tokens: 0,
        })
        .collect();
    let (scheduler, cache) = configs(2048, 65);
    let events = as_engine_events(&served);
    let sequential = compare::compare_one_at_a_time(scheduler, cache, &served, &events);
    let one_client = compare::compare_closed_loop(scheduler, cache, &served, 1, 0);
    let twin = |cached: &[compare::CachedTokens]| cached.iter().map(|c| c.twin).collect::<Vec<_>>();
    assert_eq!(twin(&one_client.cached), twin(&sequential.cached));
    assert_eq!(twin(&one_client.cached)[0], 0);
    assert!(twin(&one_client.cached)[1..].iter().all(|&c| c == 96));
    assert_eq!(
        (one_client.twin_preemptions, one_client.twin_unserved),
        (0, 0)
    );

    let four = compare::compare_closed_loop(scheduler, cache, &served, 4, 1);
    assert_eq!(twin(&four.cached), twin(&sequential.cached));
    // The engine said 0 everywhere: the error of the totals is the twin's whole total.
    assert_eq!(four.totals(), (0, 7 * 96));
    assert!(four.total_error().is_infinite());
}

#[test]
fn closed_loop_clients_that_outgrow_the_cache_are_preempted_and_all_still_served() {
    // 8 usable blocks; each request needs 2 prompt blocks and grows into a third and a
    // fourth while decoding, so four at once must preempt.
    let served: Vec<compare::ServedRequest> = (0..12u32)
        .map(|i| compare::ServedRequest {
            prompt: tokens(1000 + 100 * i, 60),
            outputs: tokens(50_000 + i * 128, 60),
            cached_tokens: 0,
        })
        .collect();
    let (scheduler, cache) = configs(64, 9);
    let four = compare::compare_closed_loop(scheduler, cache, &served, 4, 1);
    assert!(four.twin_preemptions > 0, "{four:?}");
    // 60-token prompts under a 64-token budget, four at a time: chunks.
    assert!(four.twin_partial_prefills > 0, "{four:?}");
    assert_eq!(four.twin_unserved, 0);
    assert_eq!(four.cached.len(), 12);
    // A request longer than the whole cache is never served and is said so.
    let mut too_long = served.clone();
    too_long[5].prompt = tokens(9000, 400);
    let stuck = compare::compare_closed_loop(scheduler, cache, &too_long, 4, 1);
    assert!(stuck.twin_unserved >= 1, "{stuck:?}");
}

/// An engine of `num_gpu_blocks` with kvtwin's connector in front of `memory_blocks` of
/// host memory written through to `disk_blocks` on disk.
fn with_connector(num_gpu_blocks: u32, memory_blocks: usize, disk_blocks: usize) -> VllmScheduler {
    let (scheduler, cache) = configs(2048, num_gpu_blocks);
    let tiers = ConnectorTiers {
        memory_blocks,
        disk_blocks,
    };
    VllmScheduler::with_connector(
        scheduler,
        cache,
        TwinStore::new(tiers, BLOCK as usize).unwrap(),
    )
}

/// Serves `prompt` (with 2 outputs) alone; how it finished.
fn serve_alone(engine: &mut VllmScheduler, id: u64, prompt: &[u32]) -> FinishedRequest {
    engine.add_request(request(id, prompt, &[1, 2]));
    let finished: Vec<FinishedRequest> = run_all(engine)
        .into_iter()
        .flat_map(|s| s.finished)
        .collect();
    assert_eq!(finished.len(), 1);
    finished[0]
}

#[test]
fn the_connector_serves_what_the_engine_evicted_from_memory_then_from_disk() {
    // An engine of 8 usable blocks; the connector's host memory holds 6, its disk 32.
    let mut engine = with_connector(9, 6, 32);
    let a = tokens(1000, 4 * BLOCK as u32 + 5);
    let b = tokens(2000, 7 * BLOCK as u32 + 5);
    let first = serve_alone(&mut engine, 0, &a);
    assert_eq!((first.cached_tokens, first.external_tokens), (0, 0));
    // B takes all 8 of the engine's blocks (A's among them), and its 7 prompt blocks
    // push A's 4 out of host memory (6 blocks); the disk keeps all 11.
    let b_first = serve_alone(&mut engine, 1, &b);
    assert_eq!(b_first.external_tokens, 0);
    assert_eq!(engine.store().unwrap().blocks_by_tier(), (6, 11));
    // A again: nothing of it in the engine, all 4 full blocks on disk only: read from
    // there (a load does not promote), and its save finds them held.
    let again = serve_alone(&mut engine, 2, &a);
    assert_eq!(again.cached_tokens, 4 * BLOCK);
    assert_eq!(again.external_tokens, 4 * BLOCK);
    assert_eq!((again.loaded.memory, again.loaded.disk), (0, 4));
    assert_eq!(engine.store().unwrap().blocks_by_tier(), (6, 11));
    // B again: A's 5 blocks took B's last 5 from the engine (freed tail first, taken
    // first), so the engine finds B's first 3 itself and the store gives the other 4.
    // Host memory holds B1-B5 and B7: B's save came in two runs of at most 6, and the
    // second evicted the first's tail, B6 (kvtwin releases a chain tail first, so its
    // tail is the least recent). The load's run in memory is B4 and B5; from B6 on the
    // lookup goes on in the tier below, so B7 is read from disk too.
    let b_again = serve_alone(&mut engine, 3, &b);
    assert_eq!(b_again.cached_tokens, 7 * BLOCK);
    assert_eq!(b_again.external_tokens, 4 * BLOCK);
    assert_eq!((b_again.loaded.memory, b_again.loaded.disk), (2, 2));
}

#[test]
fn the_connector_leaves_the_last_prompt_token_to_compute() {
    let mut engine = with_connector(9, 16, 0);
    // A prompt of exactly 4 blocks: the store offers 3 at most (the 4th holds the token
    // that samples the first output), and B in between evicted it from the engine.
    let a = tokens(1000, 4 * BLOCK as u32);
    serve_alone(&mut engine, 0, &a);
    serve_alone(&mut engine, 1, &tokens(2000, 7 * BLOCK as u32));
    let again = serve_alone(&mut engine, 2, &a);
    assert_eq!(again.cached_tokens, 3 * BLOCK);
    assert_eq!(again.external_tokens, 3 * BLOCK);
    assert_eq!((again.loaded.memory, again.loaded.disk), (3, 0));
    // Without a connector nothing comes back.
    let mut plain = engine_without_connector();
    serve_alone(&mut plain, 0, &a);
    serve_alone(&mut plain, 1, &tokens(2000, 7 * BLOCK as u32));
    let plain_again = serve_alone(&mut plain, 2, &a);
    assert_eq!(plain_again.external_tokens, 0);
    assert_eq!(plain_again.cached_tokens, 0);
}

fn engine_without_connector() -> VllmScheduler {
    engine(9, 2048)
}
