//! The twin beside a real vLLM engine that served the same requests: one at a time
//! (prompt tokens found cached, request by request, and the KV event streams, block by
//! block), or from a fixed number of clients at once (cached tokens per request and in
//! total: which step a request joins is the engine's timing, not its cache's).
//!
//! Owns: [`ServedRequest`] and [`EngineEvent`] (what a capture of a real engine gives:
//! each request's prompt, the outputs the engine generated and its reported cached
//! tokens; the engine's events with its own hashes and the token ids they carry), the
//! translation of engine hashes into kvtwin's chained hashes through those token ids,
//! [`compare_one_at_a_time`], [`compare_closed_loop`] and [`compare_timed`] (the same
//! clients on the twin in time, on the engine's own profile). Both streams are flattened to one entry per block
//! (a `Stored` of several blocks is the same as one per block, each the parent of the
//! next), so batching never counts as a difference. Never: talk to an engine (the
//! capture is the caller's), or time anything.

use super::request::VllmRequest;
use super::scheduler::VllmScheduler;
use super::{VllmCacheConfig, VllmSchedulerConfig};
use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::{RequestId, SequenceHash};
use kvtwin::tokens::{
    chain_sequence_hash, compute_local_hash, compute_local_hashes, HashSeed, Token,
};
use std::collections::{BTreeMap, VecDeque};

/// One request a real engine served: what it was sent, what it generated, and the
/// prompt tokens it reported cached (`usage.prompt_tokens_details.cached_tokens`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedRequest {
    /// The prompt's token ids.
    pub prompt: Vec<Token>,
    /// The token ids it generated (`return_token_ids`), `max_tokens` of them.
    pub outputs: Vec<Token>,
    /// Prompt tokens the engine found cached.
    pub cached_tokens: u64,
}

impl ServedRequest {
    /// The prompt followed by the outputs: the tokens whose blocks the request fills.
    pub fn sequence(&self) -> Vec<Token> {
        self.prompt.iter().chain(&self.outputs).copied().collect()
    }
}

/// One KV event of a real engine, with the engine's own block hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    /// `BlockStored`: `hashes` are the blocks of `token_ids`, in order, the first one's
    /// parent `parent`.
    Stored {
        /// The engine hash of the block before the first.
        parent: Option<u64>,
        /// The engine hashes of the stored blocks.
        hashes: Vec<u64>,
        /// Their tokens, `block_size` a block.
        token_ids: Vec<Token>,
    },
    /// `BlockRemoved`.
    Removed {
        /// The engine hashes of the removed blocks.
        hashes: Vec<u64>,
    },
    /// `AllBlocksCleared`.
    Cleared,
}

/// One block's event, in kvtwin's chained hashes (equal prefixes, equal hashes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlockEvent {
    /// A block was cached after `parent`.
    Stored {
        /// The block before it.
        parent: Option<SequenceHash>,
        /// The block.
        block: SequenceHash,
    },
    /// A block stopped being cached.
    Removed(SequenceHash),
    /// Everything was dropped.
    Cleared,
}

/// Where the two streams first differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The position in the flattened streams.
    pub position: usize,
    /// The request (index into the requests) the twin was serving there, if any.
    pub request: Option<usize>,
    /// The twin's event there (`None`: its stream ended).
    pub twin: Option<BlockEvent>,
    /// The engine's event there (`None`: its stream ended).
    pub engine: Option<BlockEvent>,
}

/// One request's cached tokens, engine and twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedTokens {
    /// What the engine reported.
    pub engine: u64,
    /// What the twin found.
    pub twin: u64,
}

/// The comparison; see [`compare_one_at_a_time`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comparison {
    /// Per request, in order.
    pub cached: Vec<CachedTokens>,
    /// The twin's flattened events.
    pub twin_events: usize,
    /// The engine's flattened events.
    pub engine_events: usize,
    /// Where the streams first differ; `None` when they are equal.
    pub divergence: Option<Divergence>,
    /// Requests after which the blocks the engine's events say it holds differ from the
    /// twin's (each hash with how many blocks hold it).
    pub held_differs_after: Vec<usize>,
    /// Engine `Removed` of hashes it never stored (or a `Stored` whose parent it never
    /// stored): the capture missed events.
    pub unknown_hashes: u64,
}

impl Comparison {
    /// Requests whose cached tokens differ.
    pub fn cached_mismatches(&self) -> usize {
        self.cached.iter().filter(|c| c.engine != c.twin).count()
    }

    /// Whether the twin agreed with the engine on everything.
    pub fn exact(&self) -> bool {
        self.cached_mismatches() == 0
            && self.divergence.is_none()
            && self.held_differs_after.is_empty()
            && self.unknown_hashes == 0
    }
}

/// Translates an engine's events into [`BlockEvent`]s, chaining kvtwin's hashes of each
/// block's token ids; counts hashes it cannot place.
#[derive(Clone, Debug, Default)]
pub struct EngineStream {
    block_size: usize,
    /// Engine hash → kvtwin's; one entry per engine hash ever stored (a removed block may
    /// be stored again under the same hash).
    known: BTreeMap<u64, SequenceHash>,
    events: Vec<BlockEvent>,
    unknown: u64,
}

impl EngineStream {
    /// An empty stream of `block_size`-token blocks.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    /// Appends `event`.
    pub fn push(&mut self, event: &EngineEvent) {
        match event {
            EngineEvent::Stored {
                parent,
                hashes,
                token_ids,
            } => {
                let mut parent = match parent {
                    None => None,
                    Some(hash) => match self.known.get(hash) {
                        Some(known) => Some(*known),
                        None => {
                            self.unknown += 1;
                            Some(SequenceHash::new(*hash))
                        }
                    },
                };
                for (hash, tokens) in hashes.iter().zip(token_ids.chunks(self.block_size)) {
                    let local = compute_local_hash(tokens, HashSeed::default());
                    let block = chain_sequence_hash(parent, local);
                    self.known.insert(*hash, block);
                    self.events.push(BlockEvent::Stored { parent, block });
                    parent = Some(block);
                }
            }
            EngineEvent::Removed { hashes } => {
                for hash in hashes {
                    match self.known.get(hash) {
                        Some(block) => self.events.push(BlockEvent::Removed(*block)),
                        None => self.unknown += 1,
                    }
                }
            }
            EngineEvent::Cleared => self.events.push(BlockEvent::Cleared),
        }
    }

    /// The flattened events so far.
    pub fn events(&self) -> &[BlockEvent] {
        &self.events
    }

    /// Engine hashes it could not place so far (a `Removed` of a hash never stored, a
    /// `Stored` whose parent was never stored).
    pub fn unknown(&self) -> u64 {
        self.unknown
    }
}

/// Flattens the twin's events.
pub fn flatten(events: &[KvCacheEventData]) -> Vec<BlockEvent> {
    let mut out = Vec::new();
    for event in events {
        match event {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                ..
            } => {
                let mut parent = *parent_hash;
                for block in blocks {
                    out.push(BlockEvent::Stored {
                        parent,
                        block: block.block_hash,
                    });
                    parent = Some(block.block_hash);
                }
            }
            KvCacheEventData::Removed { block_hashes, .. } => {
                out.extend(block_hashes.iter().map(|hash| BlockEvent::Removed(*hash)));
            }
            KvCacheEventData::Cleared => out.push(BlockEvent::Cleared),
        }
    }
    out
}

/// What a stream says is cached: each hash with the number of blocks holding it.
pub fn held(events: &[BlockEvent]) -> BTreeMap<SequenceHash, usize> {
    let mut held = BTreeMap::new();
    for event in events {
        apply(&mut held, event);
    }
    held
}

/// Applies one event to what a stream says is cached.
fn apply(held: &mut BTreeMap<SequenceHash, usize>, event: &BlockEvent) {
    match event {
        BlockEvent::Stored { block, .. } => *held.entry(*block).or_default() += 1,
        BlockEvent::Removed(block) => {
            if let Some(count) = held.get_mut(block) {
                *count -= 1;
                if *count == 0 {
                    held.remove(block);
                }
            }
        }
        BlockEvent::Cleared => held.clear(),
    }
}

/// Serves `requests` one at a time on a twin built from `scheduler` and `cache` (each
/// request's outputs are the engine's, so output blocks hash alike) and compares it
/// with what the engine reported and published.
pub fn compare_one_at_a_time(
    scheduler: VllmSchedulerConfig,
    cache: VllmCacheConfig,
    requests: &[ServedRequest],
    engine_events: &[EngineEvent],
) -> Comparison {
    let block_size = usize::try_from(cache.block_size).unwrap_or(usize::MAX);
    let mut engine = EngineStream::new(block_size);
    for event in engine_events {
        engine.push(event);
    }
    let mut twin = VllmScheduler::new(scheduler, cache);
    let mut twin_events = Vec::new();
    // The twin's stream position at the end of each request.
    let mut ends = Vec::with_capacity(requests.len());
    let mut cached = Vec::with_capacity(requests.len());
    let mut held_differs_after = Vec::new();
    // What the engine's stream holds, up to the twin's position so far.
    let mut engine_held = BTreeMap::new();
    let mut applied = 0;
    for (index, served) in requests.iter().enumerate() {
        twin.add_request(twin_request(index, served, block_size));
        let mut twin_cached = 0;
        while twin.num_unfinished() > 0 {
            let Some(step) = twin.step() else {
                // Nothing fits (a request longer than the cache): the engine would have
                // refused it too; leave it.
                break;
            };
            twin_events.extend(flatten(&step.events));
            if let Some(done) = step.finished.first() {
                twin_cached = done.cached_tokens;
            }
        }
        cached.push(CachedTokens {
            engine: served.cached_tokens,
            twin: twin_cached,
        });
        ends.push(twin_events.len());
        let twin_held: BTreeMap<SequenceHash, usize> =
            twin.cache().pool().cached_hashes().into_iter().collect();
        let upto = twin_events.len().min(engine.events().len());
        for event in &engine.events()[applied..upto.max(applied)] {
            apply(&mut engine_held, event);
        }
        applied = applied.max(upto);
        if engine_held != twin_held {
            held_differs_after.push(index);
        }
    }
    let divergence = first_divergence(&twin_events, engine.events()).map(|position| Divergence {
        position,
        request: ends.iter().position(|&end| position < end),
        twin: twin_events.get(position).copied(),
        engine: engine.events().get(position).copied(),
    });
    Comparison {
        cached,
        twin_events: twin_events.len(),
        engine_events: engine.events().len(),
        divergence,
        held_differs_after,
        unknown_hashes: engine.unknown,
    }
}

/// The twin of `clients` closed-loop clients (each sends its next request when its last
/// one is answered) against an engine that served `requests` that way, in that order of
/// sending; see [`compare_closed_loop`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosedLoopComparison {
    /// Per request, in order of sending.
    pub cached: Vec<CachedTokens>,
    /// Requests the twin preempted (recomputed), counted once per preemption.
    pub twin_preemptions: u64,
    /// Requests the twin could never schedule (longer than its cache): their `twin`
    /// cached tokens are 0.
    pub twin_unserved: usize,
    /// Prefill chunks the twin scheduled short of their prompt's end (the token budget
    /// or other requests took the rest of the step): chunked prefill at work.
    pub twin_partial_prefills: u64,
}

impl ClosedLoopComparison {
    /// Prompt tokens found cached in all, (engine, twin).
    pub fn totals(&self) -> (u64, u64) {
        self.cached
            .iter()
            .fold((0, 0), |(e, t), c| (e + c.engine, t + c.twin))
    }

    /// |twin - engine| / engine of the totals (0 when both are 0).
    pub fn total_error(&self) -> f64 {
        let (engine, twin) = self.totals();
        if engine == 0 {
            return if twin == 0 { 0.0 } else { f64::INFINITY };
        }
        (twin as f64 - engine as f64).abs() / engine as f64
    }
}

/// Serves `requests` on a twin as `clients` closed-loop clients would: the first
/// `clients` requests wait at the start, and each answer sends the next request in
/// order, which the engine sees `join_lag_steps` steps after the step that answered
/// (a real engine schedules its next step as soon as one ends, before the answer has
/// crossed its API server, the client and back: 1 step on the engines of
/// scripts/engines). Steps are the unit of time: a step's duration does not change what
/// a cache holds, only which step a request joins, and the lag is that model.
pub fn compare_closed_loop(
    scheduler: VllmSchedulerConfig,
    cache: VllmCacheConfig,
    requests: &[ServedRequest],
    clients: usize,
    join_lag_steps: usize,
) -> ClosedLoopComparison {
    let block_size = usize::try_from(cache.block_size).unwrap_or(usize::MAX);
    let mut twin = VllmScheduler::new(scheduler, cache);
    let mut twin_cached = vec![None; requests.len()];
    let mut twin_preemptions = 0;
    let mut twin_partial_prefills = 0;
    let mut next = 0;
    // Requests sent and not yet seen by the engine: (the step they join before, index).
    let mut in_transit: VecDeque<(u64, usize)> = VecDeque::new();
    for index in 0..clients.min(requests.len()) {
        in_transit.push_back((0, index));
        next = index + 1;
    }
    let mut step_number = 0_u64;
    loop {
        while in_transit.front().is_some_and(|&(at, _)| at <= step_number) {
            let (_, index) = in_transit.pop_front().expect("a request in transit");
            let served = &requests[index];
            twin.add_request(twin_request(index, served, block_size));
        }
        if twin.num_unfinished() == 0 && in_transit.is_empty() {
            break;
        }
        let Some(step) = twin.step() else {
            if let Some(&(at, _)) = in_transit.front() {
                // Idle until the next request arrives.
                step_number = step_number.max(at);
                continue;
            }
            // Nothing fits and nothing is coming: what is left could never be served.
            break;
        };
        step_number += 1;
        twin_preemptions += step.preempted.len() as u64;
        twin_partial_prefills += partial_prefills(&step, requests);
        for done in &step.finished {
            let index = usize::try_from(done.id.get()).unwrap_or(usize::MAX);
            if let Some(slot) = twin_cached.get_mut(index) {
                *slot = Some(done.cached_tokens);
            }
            if next < requests.len() {
                in_transit.push_back((step_number + join_lag_steps as u64, next));
                next += 1;
            }
        }
    }
    let twin_unserved = twin_cached.iter().filter(|c| c.is_none()).count();
    ClosedLoopComparison {
        cached: requests
            .iter()
            .zip(&twin_cached)
            .map(|(served, twin)| CachedTokens {
                engine: served.cached_tokens,
                twin: twin.unwrap_or(0),
            })
            .collect(),
        twin_preemptions,
        twin_unserved,
        twin_partial_prefills,
    }
}

/// Serves `requests` on the twin in time as `clients` closed-loop clients would
/// (`super::serve::TwinCluster`, one engine): each step priced by `compute` (the
/// engine's own profile, `kvtwin profile --engine`), each next request sent when an
/// answer is in and reaching the engine the profile's request overhead later, so a
/// request joins the step the engine's speed puts it in rather than a fixed number of
/// steps after the answer that sent it ([`compare_closed_loop`]'s model). Prefill chunks
/// are not counted (`twin_partial_prefills` is 0).
pub fn compare_timed(
    scheduler: VllmSchedulerConfig,
    cache: VllmCacheConfig,
    requests: &[ServedRequest],
    clients: usize,
    compute: crate::compute::ComputeModel,
    seed: u64,
) -> ClosedLoopComparison {
    use super::serve::{TwinArrivals, TwinCluster, TwinClusterConfig, TwinRequest};
    let block_size = cache.block_size.max(1);
    let twin_requests: Vec<TwinRequest> = requests
        .iter()
        .enumerate()
        .map(|(index, served)| {
            let blocks = BlockIdentity::chain(&compute_local_hashes(
                &served.prompt,
                usize::try_from(block_size).unwrap_or(usize::MAX),
                HashSeed::default(),
            ));
            TwinRequest::new(
                index,
                std::time::Duration::ZERO,
                &blocks,
                served.prompt.len() as u64,
                served.outputs.len().max(1) as u64,
                block_size,
            )
        })
        .collect();
    let worker = kvtwin::ids::WorkerId::new(1);
    let run = TwinCluster::new(TwinClusterConfig {
        workers: vec![worker],
        scheduler,
        cache,
        connector: None,
        routing: kvtwin::router::scheduler::SchedulerConfig::default(),
        compute,
        engine_compute: BTreeMap::new(),
        seed,
    })
    .serve(
        &twin_requests,
        TwinArrivals::Closed {
            clients,
            think: std::time::Duration::ZERO,
        },
    );
    ClosedLoopComparison {
        cached: requests
            .iter()
            .zip(&run.served)
            .map(|(served, twin)| CachedTokens {
                engine: served.cached_tokens,
                twin: twin.as_ref().map_or(0, |t| t.cached_tokens),
            })
            .collect(),
        twin_preemptions: run
            .served
            .iter()
            .flatten()
            .map(|t| u64::from(t.preemptions))
            .sum(),
        twin_unserved: run.served.iter().filter(|t| t.is_none()).count(),
        twin_partial_prefills: 0,
    }
}

/// The twin's request for `served`, the `index`th: its prompt and the engine's outputs,
/// hashed into blocks (so output blocks hash alike in both).
/// Prefill chunks `step` scheduled short of their prompt's end (request ids are indices
/// into `requests`).
pub(super) fn partial_prefills(step: &super::StepOutcome, requests: &[ServedRequest]) -> u64 {
    step.scheduled
        .iter()
        .filter(|s| {
            let index = usize::try_from(s.id.get()).unwrap_or(usize::MAX);
            s.prefill
                && requests
                    .get(index)
                    .is_some_and(|r| s.context + s.tokens < r.prompt.len() as u64)
        })
        .count() as u64
}

pub(super) fn twin_request(index: usize, served: &ServedRequest, block_size: usize) -> VllmRequest {
    let sequence = served.sequence();
    let identities = BlockIdentity::chain(&compute_local_hashes(
        &sequence,
        block_size,
        HashSeed::default(),
    ));
    VllmRequest::new(
        RequestId::new(index as u64),
        identities,
        served.prompt.len() as u64,
        served.outputs.len().max(1) as u64,
    )
}

fn first_divergence(twin: &[BlockEvent], engine: &[BlockEvent]) -> Option<usize> {
    let common = twin.len().min(engine.len());
    (0..common)
        .find(|&i| twin[i] != engine[i])
        .or((twin.len() != engine.len()).then_some(common))
}
