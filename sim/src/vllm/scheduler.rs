//! vLLM V1's scheduler (`Scheduler.schedule` and `update_from_output` in
//! `vllm/v1/core/sched/scheduler.py`) as the CPU engines of scripts/engines run it:
//! synchronous (the CPU platform turns async scheduling off), first come first served,
//! no speculative decoding, no encoder inputs. With kvtwin's connector
//! ([`VllmScheduler::with_connector`], the twin of its store in `connector.rs`), a
//! waiting request's prefix hit goes on with what the store holds
//! (`get_num_new_matched_tokens`, the tokens computed as external ones by
//! `allocate_slots`), the step loads those blocks before its pass and saves the prompt
//! blocks it fills after it (`build_connector_meta`'s plan: first-scheduled requests,
//! then the others).
//!
//! Owns: the waiting queue, the running list, the requests and the [`VllmKvCache`].
//! One step: running requests first, in order, each given the tokens it still lacks
//! (capped by `long_prefill_token_threshold` when others are eligible, and by the
//! step's token budget); when its slots cannot be allocated the last running request
//! is preempted (its blocks freed, its computed tokens dropped, back at the front of
//! the waiting queue) until they can, or until it preempted itself. Then, if nobody was
//! preempted, waiting requests in order while `max_num_seqs` allows: a prefix lookup on
//! the first try, the rest of the prompt (chunked to the budget, or the queue stops if
//! chunked prefill is off and it does not fit), admitted only if its whole sequence
//! fits (`scheduler_reserve_full_isl`). After the step every request that computed all
//! its tokens samples one; one that reached `max_tokens` finishes and frees its blocks,
//! in the order the step scheduled them. Never: time anything (the caller prices a step
//! with its compute model), or hash tokens.

use super::cache::{ComputedBlocks, VllmCacheConfig, VllmKvCache};
use super::connector::{Loaded, TwinStore};
use super::request::{RequestStatus, VllmRequest};
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::RequestId;
use std::collections::{BTreeMap, VecDeque};

/// The scheduler's settings (vLLM's `SchedulerConfig` fields this model reads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VllmSchedulerConfig {
    /// Requests running at once (`max_num_seqs`).
    pub max_num_seqs: usize,
    /// Tokens one step schedules (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u64,
    /// Whether a prompt may be split across steps.
    pub enable_chunked_prefill: bool,
    /// Most tokens one request gets in a step while others are eligible (0: no cap).
    pub long_prefill_token_threshold: u64,
    /// Admit a waiting request only if its whole sequence fits
    /// (`scheduler_reserve_full_isl`, on by default).
    pub reserve_full_isl: bool,
}

/// One request's share of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledRequest {
    /// The request.
    pub id: RequestId,
    /// Tokens computed for it in this step.
    pub tokens: u64,
    /// Tokens already in its KV cache before the step (prefix hits included).
    pub context: u64,
    /// Whether the step computes prompt tokens for it (a prefill or one of its chunks).
    pub prefill: bool,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutcome {
    /// The requests it computed, in scheduling order.
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests preempted by it.
    pub preempted: Vec<RequestId>,
    /// Requests that sampled a token in it (their first, after their prompt's last
    /// chunk, or a decode), in scheduling order; the finished ones included.
    pub sampled: Vec<RequestId>,
    /// Requests that generated their last token in it, in order.
    pub finished: Vec<FinishedRequest>,
    /// The KV events it queued, in order.
    pub events: Vec<KvCacheEventData>,
}

/// A request that finished, with what its usage would report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinishedRequest {
    /// The request.
    pub id: RequestId,
    /// Prompt tokens found cached when it was first scheduled.
    pub cached_tokens: u64,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Of `cached_tokens`, those the connector's store held beyond the engine's own
    /// hit (0 without a connector).
    pub external_tokens: u64,
    /// Blocks the connector loaded for it, by tier.
    pub loaded: Loaded,
}

/// The connector's side of the scheduler: its store and what it follows per request.
#[derive(Debug)]
struct Connector {
    store: TwinStore,
    /// Per request: prompt blocks planned for saving so far.
    saved_upto: BTreeMap<RequestId, usize>,
    /// Per request: external tokens when it was first scheduled, and the blocks loaded
    /// for it (every time it was admitted).
    external: BTreeMap<RequestId, (u64, Loaded)>,
    /// Loads planned by this step's admissions, in order: (request, its own hit's
    /// tokens, external tokens).
    pending_loads: Vec<(RequestId, u64, u64)>,
}

/// The scheduler; see the module documentation.
#[derive(Debug)]
pub struct VllmScheduler {
    config: VllmSchedulerConfig,
    cache: VllmKvCache,
    requests: BTreeMap<RequestId, VllmRequest>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    connector: Option<Connector>,
}

impl VllmScheduler {
    /// An idle engine.
    pub fn new(config: VllmSchedulerConfig, cache: VllmCacheConfig) -> Self {
        Self {
            config,
            cache: VllmKvCache::new(cache),
            requests: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            connector: None,
        }
    }

    /// An idle engine with kvtwin's connector in front of `store`.
    pub fn with_connector(
        config: VllmSchedulerConfig,
        cache: VllmCacheConfig,
        store: TwinStore,
    ) -> Self {
        Self {
            connector: Some(Connector {
                store,
                saved_upto: BTreeMap::new(),
                external: BTreeMap::new(),
                pending_loads: Vec::new(),
            }),
            ..Self::new(config, cache)
        }
    }

    /// A copy to try a step on (what a request joining now would do), or `None` for an
    /// engine with a connector: its store's manager is not copied.
    pub fn try_clone(&self) -> Option<Self> {
        self.connector.is_none().then(|| Self {
            config: self.config,
            cache: self.cache.clone(),
            requests: self.requests.clone(),
            waiting: self.waiting.clone(),
            running: self.running.clone(),
            connector: None,
        })
    }

    /// The connector's store, if the engine has one.
    pub fn store(&self) -> Option<&TwinStore> {
        self.connector.as_ref().map(|c| &c.store)
    }

    /// Its KV cache.
    pub fn cache(&self) -> &VllmKvCache {
        &self.cache
    }

    /// Queues `request` at the back of the waiting queue.
    pub fn add_request(&mut self, request: VllmRequest) {
        self.waiting.push_back(request.id);
        self.requests.insert(request.id, request);
    }

    /// Requests waiting and running.
    pub fn num_unfinished(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// A request not yet finished.
    pub fn request(&self, id: RequestId) -> Option<&VllmRequest> {
        self.requests.get(&id)
    }

    /// Schedules one step, runs it (every scheduled token is computed) and applies its
    /// outputs; `None` when nothing could be scheduled.
    pub fn step(&mut self) -> Option<StepOutcome> {
        let (scheduled, preempted) = self.schedule();
        if scheduled.is_empty() {
            let events = self.cache.take_events();
            debug_assert!(events.is_empty() || !preempted.is_empty());
            return None;
        }
        self.connector_step(&scheduled);
        let (sampled, finished) = self.update_from_output(&scheduled);
        Some(StepOutcome {
            scheduled,
            preempted,
            sampled,
            finished,
            events: self.cache.take_events(),
        })
    }

    fn schedule(&mut self) -> (Vec<ScheduledRequest>, Vec<RequestId>) {
        let mut scheduled = Vec::new();
        let mut preempted = Vec::new();
        let mut budget = self.config.max_num_batched_tokens;
        let eligible = self.running.len() + self.waiting.len();
        let threshold = if eligible > 1 {
            self.config.long_prefill_token_threshold
        } else {
            0
        };
        let max_model_len = self.cache.config().max_model_len;

        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let id = self.running[index];
            let request = &self.requests[&id];
            let mut tokens = request.num_tokens() - request.num_computed_tokens;
            if 0 < threshold && threshold < tokens {
                tokens = threshold;
            }
            tokens = tokens
                .min(budget)
                .min(max_model_len.saturating_sub(request.num_computed_tokens + 1));
            if tokens == 0 {
                index += 1;
                continue;
            }
            let allocated = loop {
                let request = &self.requests[&id];
                let empty = ComputedBlocks::default();
                if self
                    .cache
                    .allocate_slots(request, tokens, &empty, true, false, 0)
                    .is_some()
                {
                    break true;
                }
                let Some(victim) = self.running.pop() else {
                    break false;
                };
                self.preempt(victim);
                preempted.push(victim);
                if victim == id {
                    break false;
                }
            };
            if !allocated {
                break;
            }
            let request = &self.requests[&id];
            scheduled.push(ScheduledRequest {
                id,
                tokens,
                context: request.num_computed_tokens,
                prefill: request.num_computed_tokens < request.num_prompt_tokens,
            });
            budget -= tokens;
            index += 1;
        }

        if preempted.is_empty() {
            while budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let request = &self.requests[&id];
                let (hits, computed, external) = if request.num_computed_tokens == 0 {
                    let hits = self.cache.get_computed_blocks(request);
                    let block_size = self.cache.config().block_size;
                    let external = self.connector.as_ref().map_or(0, |c| {
                        let prompt = usize::try_from(request.num_prompt_tokens / block_size)
                            .unwrap_or(usize::MAX)
                            .min(request.blocks.len());
                        c.store.matched_tokens(
                            &request.blocks[..prompt],
                            request.num_prompt_tokens,
                            hits.tokens,
                            block_size,
                        )
                    });
                    let tokens = hits.tokens + external;
                    (hits, tokens, external)
                } else {
                    (ComputedBlocks::default(), request.num_computed_tokens, 0)
                };
                let mut tokens = request.num_tokens() - computed;
                if 0 < threshold && threshold < tokens {
                    tokens = threshold;
                }
                if !self.config.enable_chunked_prefill && tokens > budget {
                    break;
                }
                tokens = tokens.min(budget);
                let has_running = !self.running.is_empty();
                if self
                    .cache
                    .allocate_slots(
                        request,
                        tokens,
                        &hits,
                        has_running,
                        self.config.reserve_full_isl,
                        external,
                    )
                    .is_none()
                {
                    break;
                }
                let looked_up = request.num_computed_tokens == 0;
                if looked_up {
                    let request = &self.requests[&id];
                    self.cache.record_prefix_cache_stats(request, hits.tokens);
                }
                self.waiting.pop_front();
                self.running.push(id);
                let request = self.requests.get_mut(&id).expect("a waiting request");
                if request.num_preemptions == 0 {
                    request.num_cached_tokens = Some(hits.tokens + external);
                }
                if let Some(connector) = &mut self.connector {
                    if external > 0 {
                        connector
                            .external
                            .entry(id)
                            .or_insert((external, Loaded::default()));
                        connector.pending_loads.push((id, hits.tokens, external));
                    }
                }
                request.status = RequestStatus::Running;
                request.num_computed_tokens = computed;
                scheduled.push(ScheduledRequest {
                    id,
                    tokens,
                    context: computed,
                    prefill: computed < request.num_prompt_tokens,
                });
                budget -= tokens;
            }
        }

        for step in &scheduled {
            let request = self
                .requests
                .get_mut(&step.id)
                .expect("a scheduled request");
            request.num_computed_tokens += step.tokens;
        }
        (scheduled, preempted)
    }

    /// The connector's worker in this step: the loads its admissions planned, before
    /// the pass, then the saves of the prompt blocks the step filled (its
    /// `build_connector_meta`: first-scheduled requests, then the others, each in
    /// scheduling order; a request that went back saves again from there).
    fn connector_step(&mut self, scheduled: &[ScheduledRequest]) {
        let Some(connector) = &mut self.connector else {
            return;
        };
        let block_size = self.cache.config().block_size.max(1);
        let blocks = |tokens: u64| usize::try_from(tokens / block_size).unwrap_or(usize::MAX);
        for (id, local, external) in std::mem::take(&mut connector.pending_loads) {
            let Some(request) = self.requests.get(&id) else {
                continue;
            };
            let first = blocks(local).min(request.blocks.len());
            let last = (first + blocks(external)).min(request.blocks.len());
            let hashes: Vec<_> = request.blocks[first..last]
                .iter()
                .map(|block| block.sequence_hash)
                .collect();
            let loaded = connector.store.load(&hashes);
            if let Some((_, total)) = connector.external.get_mut(&id) {
                *total += loaded;
            }
        }
        let (first_time, again): (Vec<&ScheduledRequest>, Vec<&ScheduledRequest>) = scheduled
            .iter()
            .partition(|step| !connector.saved_upto.contains_key(&step.id));
        for step in first_time.into_iter().chain(again) {
            let Some(request) = self.requests.get(&step.id) else {
                continue;
            };
            let upto = connector.saved_upto.entry(step.id).or_insert(0);
            *upto = (*upto).min(blocks(step.context));
            let prompt = blocks(request.num_prompt_tokens).min(request.blocks.len());
            let full = blocks(request.num_computed_tokens).min(prompt);
            if full > *upto {
                connector.store.save(&request.blocks[*upto..full]);
                *upto = full;
            }
        }
    }

    /// `_preempt_request`: frees `id`'s blocks and puts it back at the front of the
    /// waiting queue with nothing computed.
    fn preempt(&mut self, id: RequestId) {
        self.cache.free(id);
        let request = self.requests.get_mut(&id).expect("a running request");
        request.status = RequestStatus::Preempted;
        request.num_computed_tokens = 0;
        request.num_preemptions += 1;
        self.waiting.push_front(id);
    }

    /// Every scheduled request that computed all its tokens samples one; those done
    /// finish and free their blocks, in scheduling order.
    /// Returns (the requests that sampled, those that finished).
    fn update_from_output(
        &mut self,
        scheduled: &[ScheduledRequest],
    ) -> (Vec<RequestId>, Vec<FinishedRequest>) {
        let mut sampled = Vec::new();
        let mut finished = Vec::new();
        for step in scheduled {
            let request = self
                .requests
                .get_mut(&step.id)
                .expect("a scheduled request");
            if request.num_computed_tokens < request.num_tokens() {
                // A prefill chunk short of the prompt's end samples nothing.
                continue;
            }
            request.num_output_tokens += 1;
            sampled.push(step.id);
            if !request.is_done() {
                continue;
            }
            request.status = RequestStatus::Finished;
            let (external_tokens, loaded) = match &mut self.connector {
                Some(connector) => {
                    connector.saved_upto.remove(&step.id);
                    connector.external.remove(&step.id).unwrap_or_default()
                }
                None => (0, Loaded::default()),
            };
            finished.push(FinishedRequest {
                id: step.id,
                cached_tokens: request.num_cached_tokens.unwrap_or(0),
                preemptions: request.num_preemptions,
                external_tokens,
                loaded,
            });
            self.running.retain(|&running| running != step.id);
            self.cache.free(step.id);
            self.requests.remove(&step.id);
        }
        (sampled, finished)
    }
}
