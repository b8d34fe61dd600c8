//! Continuous batching on each worker.
//!
//! Owns: [`PassInFlight`] and the forward pass: one pass at a time per worker holds every
//! decoding sequence (one token each) and prefill chunks of the oldest prompts up to the
//! token budget ([`crate::scenario::Batching`]); the compute model times it, and first
//! tokens land when its prefill part ends. Generated tokens take device blocks as they
//! go; when none is free, the worker's newest running request is preempted (recompute:
//! its blocks go back, and it prefills its prompt and the tokens generated so far again
//! when a request finishes). Blocks filled by generated tokens are cached when the
//! worker does so, and reasoning blocks cool at their request's ExitThink point.
//! Decode-only passes are planned several steps at a time while no step could be seen.
//! Never: route, or touch another worker (a handoff goes through `disagg`).

use super::worker::{cacheable_blocks, Live, State};
use super::{Cluster, Pool, Wakeup};
use crate::compute::{dynosim_decode_step_nanos, ComputeModel, Pass};
use crate::scenario::Batching;
use kvtwin::block::{BlockIdentity, Reset};
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
use kvtwin::phase::Phase;
use kvtwin::pool::{BlockChain, MutableBlock};

/// The forward pass running now on a worker.
///
/// A pass of decodes only may stand for several consecutive passes (steps) with the same
/// members when every step but the last is *silent*: each member gains a token without
/// finishing, without needing a block, and without any other change a scheduler could
/// see. Such steps are applied together when the pass ends, which is what makes long
/// decode phases cheap to simulate. The plan stops at the first step that ends at or
/// after the next arrival, and before the worker's next transfer deadline: nothing can
/// touch the worker before its last step, so the run is step for step the one an
/// engine doing one pass at a time produces (a test compares both).
///
/// Disaggregated, a handoff landing on a decode worker touches it too, and one not yet
/// sent may be sent and land within a plan. So a decode worker's plan also stops at the
/// first step that ends at or after the next event that could send a handoff or land
/// one: the fabric's next deadline, and the end of any prefill worker's pass or its next
/// transfer deadline (which may start a pass). Stopping early only splits the steps into
/// more events.
#[derive(Debug)]
pub(super) struct PassInFlight {
    /// Requests in it, with the tokens each processes.
    pub(super) members: Vec<(usize, u64)>,
    /// When its prefill part ends.
    pub(super) first_token_at: Timestamp,
    /// When its last step ends.
    pub(super) ends_at: Timestamp,
    /// Steps it stands for (1 for an ordinary pass).
    pub(super) steps: usize,
    /// When its first step ends, and the decodes and their context in it: the plan's
    /// other steps follow from them (see [`Self::first_step_ending_at_or_after`]).
    pub(super) first_step_ends_at: Timestamp,
    pub(super) decodes: u64,
    pub(super) decode_context: u64,
}

impl PassInFlight {
    /// The end of the first of its planned steps that ends at or after `at`, and the
    /// steps up to it (all of them if none does), timed as the plan timed them.
    pub(super) fn first_step_ending_at_or_after(
        &self,
        at: Timestamp,
        compute: &ComputeModel,
        device_capacity_tokens: u64,
    ) -> (Timestamp, usize) {
        let mut context = self.decode_context;
        let (mut end, mut steps) = (self.first_step_ends_at, 1);
        while steps < self.steps && end < at {
            context += self.decodes;
            // A pass of decodes only takes one decode step (`ComputeModel::pass`).
            // Timed as the plan timed it (`SilentSteps::run`).
            end = end.saturating_add_nanos(compute.decode_step_nanos(
                self.decodes,
                context,
                device_capacity_tokens,
            ));
            steps += 1;
        }
        (end, steps)
    }
}

/// The silent decode steps a pass of decodes only may plan after its first step.
struct SilentSteps {
    /// The end of the first step.
    first_end: Timestamp,
    /// Steps every member can take silently (the plan takes at most these).
    silent: u64,
    /// No step starts at or after it.
    horizon: Option<Timestamp>,
    /// Every step ends before it.
    deadline: Option<Timestamp>,
    /// KV tokens the members attend to in the first step, together.
    context: u64,
    /// The members (each decodes a token a step).
    decodes: u64,
}

impl SilentSteps {
    /// The end of the last planned step and the steps planned, the first included;
    /// `step_nanos(context)` times one step.
    #[inline]
    fn run(&self, step_nanos: impl Fn(u64) -> u64) -> (Timestamp, usize) {
        let (mut end, mut steps, mut context) = (self.first_end, 1, self.context);
        for _ in 0..self.silent {
            if self.horizon.is_some_and(|horizon| end >= horizon) {
                break;
            }
            context += self.decodes;
            // A pass of decodes only takes one decode step (`ComputeModel::pass`).
            let next = end.saturating_add_nanos(step_nanos(context));
            if self.deadline.is_some_and(|deadline| next >= deadline) {
                break;
            }
            (end, steps) = (next, steps + 1);
        }
        (end, steps)
    }
}

/// Steps one decode pass may stand for at most.
pub(super) const MAX_PLANNED_STEPS: usize = 512;

/// Steps a decoding request can take after the current one that are silent: it neither
/// finishes nor needs another block for the token after (see `PassInFlight`).
pub(super) fn silent_steps(
    live: &Live,
    state: Option<&State>,
    block_size: u64,
    batching: Batching,
    cache_output_blocks: bool,
) -> u64 {
    let Some(State::Decoding { held, extra, .. }) = state else {
        return 0;
    };
    let (input, output, generated) = (
        live.request.input_tokens,
        live.request.output_tokens,
        live.generated,
    );
    // Step j leaves `generated + j` tokens: silent while that is under `output` and the
    // token after still fits the blocks held.
    let by_output = output.saturating_sub(generated + 1);
    let by_blocks = if batching.decode_blocks {
        ((held.len() + extra.len()) as u64 * block_size).saturating_sub(input + generated + 1)
    } else {
        u64::MAX
    };
    // A step that fills a block registers it when generated blocks are cached, and the
    // step that ends the reasoning cools its blocks: both are seen by the pool.
    let by_fill = if cache_output_blocks {
        block_size - 1 - (input + generated - 1) % block_size
    } else {
        u64::MAX
    };
    let think = live.request.think_tokens;
    let by_think = if think > generated {
        think - generated - 1
    } else {
        u64::MAX
    };
    by_output.min(by_blocks).min(by_fill).min(by_think)
}

/// Whether the decode step that brings request `live` to `generated` tokens changes more
/// than token counts: it fills a block that is then cached, or it ends the reasoning.
pub(super) fn step_is_visible(
    live: &Live,
    generated: u64,
    block_size: u64,
    cache_output_blocks: bool,
) -> bool {
    let computed = live.request.input_tokens + generated - 1;
    (cache_output_blocks && computed.is_multiple_of(block_size))
        || (live.request.think_tokens > 0 && generated == live.request.think_tokens)
}

/// The token hash of the `index`-th block filled by request `id`'s generated tokens:
/// unique in the run (the top bit keeps it apart from prompt hashes, which are trace ids
/// or generator counters well below it), so such blocks are shared by no other request.
pub(super) fn output_local_hash(id: RequestId, index: usize) -> LocalBlockHash {
    LocalBlockHash::new(1 << 63 | (id.get() & ((1 << 43) - 1)) << 20 | (index as u64 & 0xf_ffff))
}

impl Cluster<'_> {
    /// Starts worker `w`'s next forward pass if none is running and there is work: every
    /// decoding sequence generates one token, and prefill chunks fill the rest of the
    /// token budget, oldest request first (chunked prefill), up to `max_seqs` sequences.
    pub(super) fn start_pass(&mut self, w: usize) {
        if self.workers[w].pass.is_some() {
            return;
        }
        let handoff_horizon = self.handoff_horizon(w);
        let worker = &mut self.workers[w];
        let batching = self.shape.batching;
        let mut pass = Pass::default();
        // The buffer of the last pass, emptied (no allocation per pass).
        let mut members = std::mem::take(&mut worker.spare_members);
        // Every decoding sequence is counted, so that a pass that could not take them all
        // is known not to be decodes-only (see the plan below).
        let mut decoding = 0;
        for (i, state) in &worker.states {
            if let State::Decoding { context, .. } = state {
                decoding += 1;
                if members.len() < batching.max_seqs {
                    pass.decodes += 1;
                    pass.decode_context += context;
                    members.push((*i, 1));
                }
            }
        }
        let mut budget = (batching.max_batch_tokens as u64).saturating_sub(pass.decodes);
        for i in &worker.prefill_queue {
            if budget == 0 || members.len() >= batching.max_seqs {
                break;
            }
            let Some(State::Prefilling {
                remaining, cached, ..
            }) = worker.states.get(i)
            else {
                continue;
            };
            let chunk = if batching.chunked_prefill {
                (*remaining).min(budget)
            } else if *remaining <= budget || pass.prefills.is_empty() {
                // Unchunked: a prompt goes whole (alone if it exceeds the budget).
                *remaining
            } else {
                break;
            };
            pass.prefills.push((chunk, *cached));
            members.push((*i, chunk));
            budget = budget.saturating_sub(chunk);
            // Its first pass: how long it queued (for blocks, a transfer, or the pass).
            if let Some(live) = self.requests.live.get_mut(i) {
                if live.scheduled_at.is_none() {
                    live.scheduled_at = Some(self.now);
                    self.tally.queueing.push(
                        self.now
                            .saturating_duration_since(live.request.arrival)
                            .as_nanos() as u64,
                    );
                }
            }
        }
        if members.is_empty() {
            worker.spare_members = members;
            return;
        }
        let time = self
            .shape
            .compute
            .pass(&pass, self.shape.device_capacity_tokens);
        let (mut end, mut steps) = (self.now.saturating_add(time.total), 1);
        let first_step_end = end;
        if batching.plan_decode_steps
            && pass.prefills.is_empty()
            && worker.prefill_queue.is_empty()
            && decoding == members.len()
        {
            // Decodes only, all of them: plan the silent steps that follow (see
            // `PassInFlight`): none starts at or after the next arrival (or, on a decode
            // worker, the next event that could hand it a request), and each ends before
            // the worker's next transfer deadline.
            let silent = members
                .iter()
                .map(|(i, _)| {
                    silent_steps(
                        &self.requests.live[i],
                        worker.states.get(i),
                        self.shape.block_size,
                        batching,
                        self.shape.cache_output_blocks,
                    )
                })
                .min()
                .unwrap_or(0)
                .min((MAX_PLANNED_STEPS - 1) as u64);
            let deadline = worker.poll_at.first().copied();
            // No step starts at or after the first of these.
            let horizon = [
                self.requests.next_arrival,
                handoff_horizon,
                self.faults.disruptions.range(self.now..).next().copied(),
            ]
            .into_iter()
            .flatten()
            .min();
            let capacity = self.shape.device_capacity_tokens;
            let plan = SilentSteps {
                first_end: end,
                silent,
                horizon,
                deadline,
                context: pass.decode_context,
                decodes: pass.decodes,
            };
            // One loop per model: millions of steps a run, each one model's few flops.
            (end, steps) =
                match &self.shape.compute {
                    ComputeModel::Dynosim => plan
                        .run(|context| dynosim_decode_step_nanos(plan.decodes, context, capacity)),
                    compute => plan
                        .run(|context| compute.decode_step_nanos(plan.decodes, context, capacity)),
                };
        }
        worker.pass = Some(PassInFlight {
            members,
            first_token_at: self.now.saturating_add(time.prefill),
            ends_at: end,
            steps,
            first_step_ends_at: first_step_end,
            decodes: pass.decodes,
            decode_context: pass.decode_context,
        });
        let epoch = worker.epoch;
        self.queue.push(end, Wakeup::PassDone(w, epoch));
    }

    /// For decode worker `w`, disaggregated: the earliest time something may send it a
    /// handoff or land one (see `PassInFlight`); `None` for other workers, or when
    /// nothing is pending anywhere.
    pub(super) fn handoff_horizon(&self, w: usize) -> Option<Timestamp> {
        let disagg = self.disagg.as_ref()?;
        if disagg.is_in(w, Pool::Prefill) {
            return None;
        }
        let prefill = disagg
            .members(Pool::Prefill)
            .iter()
            .map(|p| &self.workers[*p])
            .filter(|p| p.up)
            .flat_map(|p| {
                let pass = p.pass.as_ref().map(|pass| pass.ends_at);
                pass.into_iter().chain(p.poll_at.first().copied())
            });
        disagg
            .fabric
            .next_deadline()
            .into_iter()
            .chain(prefill)
            .min()
    }

    /// Applies worker `w`'s finished pass: prefill chunks advance (a finished prompt
    /// registers its blocks, and its first token counts from the end of the pass's
    /// prefill part), decoding sequences gain a token (a finished one releases its
    /// blocks).
    pub(super) fn pass_done(&mut self, w: usize) {
        let Some(pass) = self.workers[w].pass.take() else {
            return;
        };
        self.tally.passes += pass.steps as u64;
        // The silent steps first: a token each, nothing else (see `PassInFlight`).
        let silent = (pass.steps - 1) as u64;
        if silent > 0 {
            for (i, _) in &pass.members {
                if let (Some(live), Some(State::Decoding { context, .. })) = (
                    self.requests.live.get_mut(i),
                    self.workers[w].states.get_mut(i),
                ) {
                    live.generated += silent;
                    *context += silent;
                }
            }
        }
        let mut finished = false;
        let mut members = pass.members;
        for (i, tokens) in members.drain(..) {
            let worker = &mut self.workers[w];
            // The common case in place: a decoding sequence that goes on and has room
            // for its next token, or gets a block for it without preempting anyone.
            if let Some(State::Decoding {
                held,
                extra,
                context,
            }) = worker.states.get_mut(&i)
            {
                let live = self
                    .requests
                    .live
                    .get_mut(&i)
                    .expect("a decoding request is in flight");
                let generated = live.generated + 1;
                if generated < live.request.output_tokens
                    && !step_is_visible(
                        live,
                        generated,
                        self.shape.block_size,
                        self.shape.cache_output_blocks,
                    )
                {
                    let next = live.request.input_tokens + generated;
                    let needed = if self.shape.batching.decode_blocks {
                        (next + 1).div_ceil(self.shape.block_size) as usize
                    } else {
                        0
                    };
                    let room = held.len() + extra.len() >= needed
                        || match worker.manager.allocate(1, self.now) {
                            Ok(mut block) => {
                                extra.append(&mut block);
                                held.len() + extra.len() >= needed
                            }
                            Err(_) => false,
                        };
                    if room {
                        live.generated = generated;
                        *context = next;
                        continue;
                    }
                }
            }
            match worker.states.remove(&i) {
                Some(State::Prefilling {
                    mut held,
                    mut computing,
                    remaining,
                    cached,
                }) if remaining > tokens => {
                    // Blocks filled by the chunks so far are registered now, as an
                    // engine's prefix cache does: a request arriving meanwhile can hit
                    // them.
                    let request = &self.requests.live[&i].request;
                    let cacheable = cacheable_blocks(
                        request,
                        self.shape.block_size,
                        self.shape.cache_partial_blocks,
                    );
                    let full =
                        (((cached + tokens) / self.shape.block_size) as usize).min(cacheable);
                    if full > held.len() {
                        let done = full - held.len();
                        let complete = computing
                            .drain(..done)
                            .zip(&request.blocks[held.len()..full])
                            .map(|(block, identity)| block.apply_identity(*identity))
                            .collect();
                        held.extend(worker.manager.register(complete, self.now));
                    }
                    worker.states.insert(
                        i,
                        State::Prefilling {
                            held,
                            computing,
                            remaining: remaining - tokens,
                            cached: cached + tokens,
                        },
                    );
                }
                Some(State::Prefilling {
                    mut held,
                    mut computing,
                    ..
                }) => {
                    worker.prefill_queue.retain(|queued| *queued != i);
                    let live = self
                        .requests
                        .live
                        .get_mut(&i)
                        .expect("a prefilling request is in flight");
                    let request = &live.request;
                    // A partial last block that is not cached stays the request's own,
                    // like the blocks of generated tokens.
                    let cacheable = cacheable_blocks(
                        request,
                        self.shape.block_size,
                        self.shape.cache_partial_blocks,
                    );
                    let own = computing
                        .split_off(cacheable.saturating_sub(held.len()).min(computing.len()));
                    let complete = computing
                        .into_iter()
                        .zip(&request.blocks[held.len()..cacheable])
                        .map(|(block, identity)| block.apply_identity(*identity))
                        .collect();
                    held.extend(worker.manager.register(complete, self.now));
                    if live.first_token_at.is_none() {
                        live.first_token_at = Some(pass.first_token_at);
                        self.tally.ttft.push(
                            pass.first_token_at
                                .saturating_duration_since(request.arrival)
                                .as_nanos() as u64,
                        );
                    }
                    // The prefill pass produces the next token.
                    live.generated += 1;
                    // Disaggregated, a prefill worker hands the request to the decode pool
                    // (unless that token was all it asked for).
                    if live.generated < live.request.output_tokens && self.is_prefill_worker(w) {
                        self.hand_off(w, i, held, own);
                    } else {
                        finished |= self.decoded(w, i, held, own);
                    }
                }
                Some(State::Decoding { held, extra, .. }) => {
                    if let Some(live) = self.requests.live.get_mut(&i) {
                        live.generated += 1;
                    }
                    finished |= self.decoded(w, i, held, extra);
                }
                Some(other) => {
                    worker.states.insert(i, other);
                }
                None => {}
            }
        }
        self.workers[w].spare_members = members;
        if finished {
            self.retry_waiting(w);
        }
    }

    /// Request `i` on worker `w` has one more token: done, or decoding on with a block
    /// for the next token if it needs one (preempting the worker's newest running
    /// request when none is free). Returns whether it is done.
    pub(super) fn decoded(
        &mut self,
        w: usize,
        i: usize,
        mut held: BlockChain,
        mut extra: Vec<MutableBlock<Reset>>,
    ) -> bool {
        let live = &self.requests.live[&i];
        let (input, output) = (live.request.input_tokens, live.request.output_tokens);
        if live.generated >= output {
            drop(extra);
            self.end_thinking(w, i);
            self.finish(w, i, held);
            return true;
        }
        let context = input + live.generated;
        // Room for the next token: prompt and generated tokens so far, plus one.
        let needed = if self.shape.batching.decode_blocks {
            (context + 1).div_ceil(self.shape.block_size) as usize
        } else {
            0
        };
        while held.len() + extra.len() < needed {
            let worker = &mut self.workers[w];
            match worker.manager.allocate(1, self.now) {
                Ok(mut block) => extra.append(&mut block),
                Err(_) => {
                    let newest = worker
                        .states
                        .iter()
                        .rev()
                        .find(|(_, s)| {
                            matches!(s, State::Decoding { .. } | State::Prefilling { .. })
                        })
                        .map(|(j, _)| *j)
                        .filter(|j| *j > i);
                    match newest {
                        Some(j) => self.preempt(w, j),
                        None => {
                            // It is the newest itself: it steps back.
                            drop(extra);
                            worker.manager.device().release(held);
                            self.preempted(w, i);
                            return false;
                        }
                    }
                }
            }
        }
        if self.shape.cache_output_blocks {
            self.cache_filled_output_blocks(w, i, &mut held, &mut extra);
        }
        self.end_thinking(w, i);
        self.workers[w].states.insert(
            i,
            State::Decoding {
                held,
                extra,
                context,
            },
        );
        false
    }

    /// Registers the blocks of request `i` that its generated tokens have filled, as an
    /// engine with prefix caching does once the token that fills a block is computed
    /// (every token but the newest). `held` holds the registered blocks in order, prompt
    /// first; `extra` the rest, the next to fill first. Reasoning blocks (every token a
    /// prompt or reasoning token) are tagged `ThinkActive`, or `ThinkComplete` once the
    /// request answers.
    pub(super) fn cache_filled_output_blocks(
        &mut self,
        w: usize,
        i: usize,
        held: &mut BlockChain,
        extra: &mut Vec<MutableBlock<Reset>>,
    ) {
        let block_size = self.shape.block_size;
        let Some(live) = self.requests.live.get_mut(&i) else {
            return;
        };
        let request = &live.request;
        let (id, input, think) = (request.id, request.input_tokens, request.think_tokens);
        let prompt = cacheable_blocks(request, block_size, false);
        let prompt_last = request.blocks[..prompt].last().copied();
        let computed = input + live.generated - 1;
        let full = (computed / block_size) as usize;
        let count = full.saturating_sub(held.len()).min(extra.len());
        if count == 0 {
            return;
        }
        // Registered blocks are the prompt's, then outputs' (a worker that did not get
        // the whole prompt registered caches nothing of the output).
        let Some(first) = held.len().checked_sub(prompt) else {
            return;
        };
        while live.output_identities.len() < first + count {
            let index = live.output_identities.len();
            let parent = match index {
                0 => prompt_last.as_ref(),
                _ => live.output_identities.last(),
            };
            let identity = BlockIdentity::chained(parent, output_local_hash(id, index));
            live.output_identities.push(identity);
        }
        let complete = extra
            .drain(..count)
            .zip(&live.output_identities[first..first + count])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        let manager = &mut self.workers[w].manager;
        held.extend(manager.register(complete, self.now));
        self.tally.output_blocks_cached += count as u64;
        // Reasoning blocks: the output blocks that end within the reasoning tokens.
        let reasoning_end = input + think;
        let mut new_think = Vec::new();
        for index in first..first + count {
            let block_end = (prompt + index + 1) as u64 * block_size;
            if block_end <= reasoning_end && index == live.think_blocks.len() {
                let hash = live.output_identities[index].sequence_hash;
                live.think_blocks.push(hash);
                new_think.push(hash);
            }
        }
        if !new_think.is_empty() {
            let phase = if live.thinking_done {
                Phase::ThinkComplete
            } else {
                Phase::ThinkActive
            };
            manager.set_phase(&new_think, phase, self.now);
        }
    }

    /// At request `i`'s ExitThink point (its reasoning tokens all generated), tags its
    /// reasoning blocks `ThinkComplete`: never read again, the first the priority policy
    /// evicts and writes back (seed 004).
    pub(super) fn end_thinking(&mut self, w: usize, i: usize) {
        let Some(live) = self.requests.live.get_mut(&i) else {
            return;
        };
        let think = live.request.think_tokens;
        if think == 0 || live.thinking_done || live.generated < think {
            return;
        }
        live.thinking_done = true;
        if !live.think_blocks.is_empty() {
            let cooled = self.workers[w].manager.set_phase(
                &live.think_blocks,
                Phase::ThinkComplete,
                self.now,
            );
            self.tally.think_blocks_cooled += cooled as u64;
        }
    }

    /// Takes request `j` off worker `w`'s device (recompute preemption): its blocks go
    /// back and it waits at the head of the worker's queue to prefill its prompt and
    /// generated tokens again.
    pub(super) fn preempt(&mut self, w: usize, j: usize) {
        let worker = &mut self.workers[w];
        match worker.states.remove(&j) {
            Some(State::Decoding { held, extra, .. }) => {
                drop(extra);
                worker.manager.device().release(held);
            }
            Some(State::Prefilling {
                held, computing, ..
            }) => {
                drop(computing);
                worker.manager.device().release(held);
                worker.prefill_queue.retain(|queued| *queued != j);
            }
            Some(other) => {
                worker.states.insert(j, other);
                return;
            }
            None => return,
        }
        self.preempted(w, j);
    }

    pub(super) fn preempted(&mut self, w: usize, j: usize) {
        self.tally.preemptions += 1;
        self.workers[w].waiting.push_front(j);
    }
}
