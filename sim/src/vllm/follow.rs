//! The twin of an engine that served several clients at once, each request joining at
//! the step the engine's own event batches show it joined.
//!
//! From several clients, which step a request joins is the machine's timing (how long
//! its answer took to reach the client and the next request to come back), not the
//! engine's cache; a loaded machine makes requests join later or together, and those
//! that join while another prefills the same prefix share its blocks
//! ([`super::compare::compare_closed_loop`] models the join as a fixed lag in steps).
//! vLLM publishes one batch of KV events per step that has any (`Scheduler.
//! update_from_output` publishes what the step's `schedule` queued, and `allocate_slots`
//! caches a request's full blocks the step it schedules them), so the batches say when
//! each request that stored a block joined. [`compare_following`] steps the twin with
//! the engine: before each step it tries every way the requests sent and not yet joined
//! could join (on copies of the twin, [`VllmScheduler::try_clone`]; two or three joining
//! together in every order, since requests sent together reach a loaded engine in
//! either order) and takes one whose step publishes the engine's next batch (the order
//! inside a step aside), or nothing (an engine step without events, such as a decode
//! inside a block). Among those, the
//! fewest join before they are due and the most that are due: a client sends its next
//! request when the twin answers its last one, due `join_lag_steps` steps later
//! ([`super::compare::compare_closed_loop`]'s model). So a request whose first step
//! stores a block joins where the engine's batch shows it, and one whose first step
//! stores none joins when it is due. A join a step off shows only later, when the steps
//! it shifted no longer make the batches: then the search goes back to the latest step
//! that had another way, and so on ([`MAX_RETRIES`] ways at most); out of ways, it takes
//! the furthest it got and departs there, with the option nearest to the next few
//! batches (counted: a step of its own, and the batches it passed over or only came
//! near). A departed twin is out of step until a step of its makes one of the engine's
//! batches again; until then the batches say nothing about where requests joined, and
//! every request joins when it is due, as in the fixed lag's model. (Left to prefer
//! quiet steps, a twin out of step held requests back for hundreds of steps, since
//! their joins matched no batch, and served them into a cache the engine never had:
//! 3.41 % of the cached tokens apart on CI's run of 2026-12-07.) Given the engine's
//! clock ([`EngineClock`]: the batches' stamps, the clients' send and answer times), a
//! request in step joins only after the batches stamped before it was sent and after
//! the requests answered before it was sent have finished: that places the joins the
//! batches cannot (a request whose first step stores nothing) no earlier than the engine
//! can have taken them, where the due step of the closed loop put them steps early on a
//! loaded machine (a capture of 303 batches under two busy loops: 51 made without the
//! clock, all 303 with it). The twin's cache
//! decides everything else: which blocks each request finds, which it evicts, what the
//! batch holds; what the comparison measures is the cache model, the timing taken out.
//!
//! Owns: [`compare_following`], [`FollowedComparison`], [`EngineClock`] and the split of
//! an engine's batches after its last `AllBlocksCleared` ([`engine_batches_after_reset`]).
//! Never: talk to an engine, time anything, or let the engine decide what the twin
//! caches.

use super::compare::{
    flatten, partial_prefills, twin_request, BlockEvent, CachedTokens, ClosedLoopComparison,
    EngineEvent, EngineStream, ServedRequest,
};
use super::scheduler::{StepOutcome, VllmScheduler};
use super::{VllmCacheConfig, VllmSchedulerConfig};
use std::collections::{BTreeMap, VecDeque};

/// How many of the engine's batches past the next one a twin step's events are looked
/// for in when the next one is not made: a batch the twin never makes is passed over
/// rather than holding the twin up for the rest of the run.
const LOOKAHEAD_BATCHES: usize = 8;

/// Of the requests sent and not yet joined, how many (the first sent) may join at one
/// step: every subset of them is tried, so the count is bounded (2^6 copies a step).
/// Subsets join in the order of sending; a request may still overtake an earlier one
/// by joining without it.
const MAX_CANDIDATES: usize = 6;

/// The twin beside an engine, requests joining where the engine's batches put them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowedComparison {
    /// Cached tokens per request, and the twin's preemptions, partial prefills and
    /// requests it could never serve.
    pub closed: ClosedLoopComparison,
    /// The engine's batches (its steps that published events) compared.
    pub engine_batches: usize,
    /// Of them, those a twin step published exactly.
    pub matched_batches: usize,
    /// Of them, those no twin step made exactly: passed over, or taken for the
    /// nearest a departing step made.
    pub missed_batches: usize,
    /// Twin steps that published events matching none of the engine's next batches.
    pub unmatched_steps: usize,
    /// Engine hashes the batches named without storing them first (a capture that
    /// missed events).
    pub unknown_hashes: u64,
}

impl FollowedComparison {
    /// Whether every batch of the engine was made, and nothing else.
    pub fn in_step(&self) -> bool {
        self.matched_batches == self.engine_batches && self.unmatched_steps == 0
    }
}

/// The batches after the last `AllBlocksCleared` of `batches` (the events of the batch
/// that holds it after it): what an engine did since its prefix cache was reset.
pub fn engine_batches_after_reset(batches: &[Vec<EngineEvent>]) -> Vec<Vec<EngineEvent>> {
    engine_batches_after_reset_indexed(batches)
        .into_iter()
        .map(|(_, batch)| batch)
        .collect()
}

/// [`engine_batches_after_reset`], each batch with its index in `batches` (to carry
/// what else is known of it, such as its stamp for an [`EngineClock`]).
pub fn engine_batches_after_reset_indexed(
    batches: &[Vec<EngineEvent>],
) -> Vec<(usize, Vec<EngineEvent>)> {
    let last_reset = batches.iter().enumerate().rev().find_map(|(b, batch)| {
        batch
            .iter()
            .rposition(|event| matches!(event, EngineEvent::Cleared))
            .map(|e| (b, e))
    });
    match last_reset {
        None => batches.iter().cloned().enumerate().collect(),
        Some((b, e)) => std::iter::once((b, batches[b][e + 1..].to_vec()))
            .chain((b + 1..).zip(batches[b + 1..].iter().cloned()))
            .filter(|(_, batch)| !batch.is_empty())
            .collect(),
    }
}

/// When the engine published each batch, and when each request was sent and answered,
/// on one clock (seconds; the same machine's wall clock on both sides). vLLM stamps a
/// batch (`KVEventBatch.ts`, `time.time()`) in `Scheduler.update_from_output`, at the
/// end of the step that queued its events and freed the requests it finished. So a
/// request sent after a batch's stamp joined after that batch's step, and one sent
/// after another's answer came back joined after that one finished. Under load a
/// client's next request reaches the engine steps after the answer that sent it, and a
/// step that publishes nothing (decodes inside a block, a prompt all cached) tells no
/// one when it ran: without the clock the twin joins such requests when the closed loop
/// says they are due, early, and frees its cached blocks into the free queue in
/// another order than the engine's (which it evicts from, later, in that order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineClock {
    /// Per batch, in the order given to [`compare_following`] (empty ones included).
    pub batch_ts: Vec<f64>,
    /// Per request, in the order of sending: when it was sent.
    pub sent_at: Vec<f64>,
    /// Per request: when its answer came back whole.
    pub answered_at: Vec<f64>,
}

/// What the clock says of each request's join: the twin must have made this many of
/// the kept batches, and finished the requests answered before it was sent, before it
/// joins. Without a clock, nothing.
#[derive(Clone, Debug, Default)]
struct JoinBounds {
    /// Per request: kept batches stamped before it was sent.
    batches_before: Vec<usize>,
    /// The requests with an answer time, first answered first.
    answer_order: Vec<usize>,
    /// Per request: how many of `answer_order` were answered before it was sent.
    answered_before: Vec<usize>,
}

impl JoinBounds {
    /// `kept`: the indices into `clock.batch_ts` of the batches compared, in order. A
    /// request, answer or batch without a time bounds nothing.
    fn new(clock: &EngineClock, kept: &[usize], requests: usize) -> Self {
        let stamps: Vec<f64> = kept
            .iter()
            .map(|&index| clock.batch_ts.get(index).copied().unwrap_or(f64::INFINITY))
            .collect();
        let sent = |request: usize| clock.sent_at.get(request).copied();
        let answered = |request: usize| clock.answered_at.get(request).copied();
        let mut answer_order: Vec<usize> = (0..requests)
            .filter(|&request| answered(request).is_some_and(f64::is_finite))
            .collect();
        answer_order.sort_by(|&a, &b| answered(a).partial_cmp(&answered(b)).expect("finite"));
        Self {
            batches_before: (0..requests)
                .map(|request| match sent(request) {
                    // Stamps are in step order; one out of order ends the count.
                    Some(sent) => stamps.iter().take_while(|&&ts| ts < sent).count(),
                    None => 0,
                })
                .collect(),
            answered_before: (0..requests)
                .map(|request| match sent(request) {
                    Some(sent) => {
                        answer_order.partition_point(|&other| answered(other) < Some(sent))
                    }
                    None => 0,
                })
                .collect(),
            answer_order,
        }
    }

    /// Whether `request` may join `state`'s twin now.
    fn allow(&self, state: &State, request: usize) -> bool {
        let made = state.out_of_step
            || self
                .batches_before
                .get(request)
                .is_none_or(|&before| state.cursor >= before);
        let answered = self.answered_before.get(request).copied().unwrap_or(0);
        made && self.answer_order[..answered]
            .iter()
            .all(|&other| state.cached.get(other).is_some_and(Option::is_some))
    }
}

/// One way the next step could go: who joins, and what the step does.
struct Candidate {
    /// Who joins, in the order they join.
    joins: Vec<usize>,
    /// Pairs of `joins` out of the order of sending.
    inversions: usize,
    fork: VllmScheduler,
    step: StepOutcome,
    /// The step's events, one entry per block, sorted as the engine's batches are.
    events: Vec<BlockEvent>,
}

/// How an option stands against the engine's next batches; less is better. `Next` and
/// `Quiet` keep the twin in step; the others are departures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// It makes the next batch.
    Next,
    /// It publishes nothing.
    Quiet,
    /// It makes the batch this many past the next.
    Later(usize),
    /// It makes none of the next few: the nearest by events differing (missing from it
    /// or made beside it), the batches before it, and whether any event is in both.
    Apart {
        differing: usize,
        skipped: usize,
        shared: bool,
    },
}

impl Rank {
    fn in_step(self) -> bool {
        matches!(self, Rank::Next | Rank::Quiet)
    }
}

/// Choices kept to return to: the last this many steps that had more than one way to
/// stay in step (a join a step off shows within a few dozen steps, when a decode it
/// shifted fills a block).
const MAX_CHOICE_POINTS: usize = 48;

/// Ways tried, after one step finds no way to stay in step, before the furthest the
/// search got is taken with a departure.
const MAX_RETRIES: usize = 4_000;

/// Where the twin is: its engine, who is sent and due, where in the engine's batches,
/// and the tally.
struct State {
    twin: VllmScheduler,
    /// Sent and not yet joined, in order of sending, each with the step it is due at.
    sent: Vec<(usize, u64)>,
    /// The next request to send.
    next: usize,
    step_number: u64,
    /// The engine's next batch.
    cursor: usize,
    cached: Vec<Option<u64>>,
    preemptions: u64,
    partial_prefills: u64,
    matched_batches: usize,
    missed_batches: usize,
    unmatched_steps: usize,
    /// Departed, and no step since has made one of the engine's batches: every request
    /// joins when it is due.
    out_of_step: bool,
}

impl State {
    fn copy(&self) -> Self {
        Self {
            twin: self
                .twin
                .try_clone()
                .expect("the followed twin has no connector"),
            sent: self.sent.clone(),
            cached: self.cached.clone(),
            ..*self
        }
    }

    fn done(&self) -> bool {
        self.twin.num_unfinished() == 0 && self.sent.is_empty()
    }

    /// Of the requests due, how many `option` leaves waiting when the twin is out of
    /// step (none counts in step: the batches say when a request joined).
    fn due_left_out(&self, option: &Candidate) -> usize {
        if !self.out_of_step {
            return 0;
        }
        self.sent
            .iter()
            .filter(|(index, due)| *due <= self.step_number && !option.joins.contains(index))
            .count()
    }

    /// Every option for the next step, best first, each with its rank.
    fn ranked(
        &self,
        requests: &[ServedRequest],
        block_size: usize,
        batches: &[Vec<BlockEvent>],
        bounds: &JoinBounds,
    ) -> Vec<(Rank, Candidate)> {
        let window = &batches[self.cursor.min(batches.len())..];
        // Out of step, those that leave no due request waiting first. Then in step
        // (`None` sorts first); then the fewest joining before they are due and the most
        // that are due; then the rank; then the nearest to the order of sending.
        let key = |rank: Rank, option: &Candidate| {
            let early = self
                .sent
                .iter()
                .filter(|(index, due)| *due > self.step_number && option.joins.contains(index))
                .count();
            // Departures: the nearest to the engine's batches first.
            let departure = (!rank.in_step()).then_some(rank);
            (
                self.due_left_out(option),
                departure,
                early,
                std::cmp::Reverse(option.joins.len() - early),
                rank,
                option.inversions,
            )
        };
        // A request the engine's clock says was sent after a batch the twin has not made
        // (in step: out of step the cursor says nothing of the engine's time), or after
        // an answer the twin has not given, cannot join yet. If then nothing can step,
        // the twin is behind the engine in a way the clock cannot mend: any sent may.
        let joinable: Vec<(usize, u64)> = self
            .sent
            .iter()
            .copied()
            .filter(|&(index, _)| bounds.allow(self, index))
            .collect();
        let mut found = options(&self.twin, &joinable, requests, block_size);
        if found.is_empty() && joinable.len() < self.sent.len() {
            found = options(&self.twin, &self.sent, requests, block_size);
        }
        let mut ranked: Vec<(Rank, Candidate)> = found
            .into_iter()
            .map(|option| (rank(&option, window), option))
            .collect();
        ranked.sort_by_key(|(a, x)| key(*a, x));
        ranked
    }

    /// Takes `option` as the next step.
    fn take(&mut self, rank: Rank, option: Candidate, requests: &[ServedRequest], lag: u64) {
        match rank {
            Rank::Next => {
                self.out_of_step = false;
                self.matched_batches += 1;
                self.cursor += 1;
            }
            Rank::Later(skipped) => {
                self.out_of_step = false;
                self.matched_batches += 1;
                self.missed_batches += skipped;
                self.cursor += skipped + 1;
            }
            Rank::Quiet => {}
            Rank::Apart {
                skipped, shared, ..
            } => {
                self.unmatched_steps += 1;
                self.out_of_step = true;
                // Taken for the batch it is nearest to, when it made any of it: the twin
                // stays in step with the engine's stream, if not with its steps.
                if shared {
                    self.missed_batches += skipped + 1;
                    self.cursor += skipped + 1;
                }
            }
        }
        self.sent.retain(|(index, _)| !option.joins.contains(index));
        self.step_number += 1;
        self.twin = option.fork;
        let step = option.step;
        self.preemptions += step.preempted.len() as u64;
        self.partial_prefills += partial_prefills(&step, requests);
        for done in &step.finished {
            let index = usize::try_from(done.id.get()).unwrap_or(usize::MAX);
            if let Some(slot) = self.cached.get_mut(index) {
                *slot = Some(done.cached_tokens);
            }
            if self.next < requests.len() {
                self.sent.push((self.next, self.step_number + lag));
                self.next += 1;
            }
        }
    }
}

/// Serves `requests` (in order of sending, as `clients` closed-loop clients sent them)
/// on a twin built from `scheduler` and `cache`, each request joining where the
/// engine's `batches` (one per step that published events, from the engine's last reset
/// on: [`engine_batches_after_reset`]) put it, and, where they cannot tell, when it is
/// due: `join_lag_steps` after the step that answered the request before it, and no
/// earlier than `clock` allows when it is given (stamps for the batches as given, before
/// [`engine_batches_after_reset`]'s cut is made: see
/// [`engine_batches_after_reset_indexed`]); see the module documentation.
pub fn compare_following(
    scheduler: VllmSchedulerConfig,
    cache: VllmCacheConfig,
    requests: &[ServedRequest],
    clients: usize,
    join_lag_steps: u64,
    batches: &[Vec<EngineEvent>],
    clock: Option<&EngineClock>,
) -> FollowedComparison {
    let block_size = usize::try_from(cache.block_size).unwrap_or(usize::MAX);
    let (batches, kept, unknown_hashes) = translate(block_size, batches);
    let bounds = clock
        .map(|clock| JoinBounds::new(clock, &kept, requests.len()))
        .unwrap_or_default();
    let first = clients.min(requests.len());
    let mut state = State {
        twin: VllmScheduler::new(scheduler, cache),
        sent: (0..first).map(|index| (index, 0)).collect(),
        next: first,
        step_number: 0,
        cursor: 0,
        cached: vec![None; requests.len()],
        preemptions: 0,
        partial_prefills: 0,
        matched_batches: 0,
        missed_batches: 0,
        unmatched_steps: 0,
        out_of_step: false,
    };
    // Steps with other ways to stay in step: the state before, and those ways.
    let mut choices: VecDeque<(State, Vec<(Rank, Candidate)>)> = VecDeque::new();
    // The furthest the search got since the last departure, and its options there.
    let mut furthest: Option<(State, Vec<(Rank, Candidate)>)> = None;
    let mut retries = 0;
    while !state.done() {
        let mut ranked = state.ranked(requests, block_size, &batches, &bounds);
        if ranked.is_empty() {
            // Nothing can be scheduled whoever joins: what is left is never served.
            break;
        }
        if ranked[0].0.in_step() {
            let (rank, option) = ranked.remove(0);
            // Other ways to stay in step, none leaving more due requests waiting.
            let due_left_out = state.due_left_out(&option);
            ranked.retain(|(rank, other)| {
                rank.in_step() && state.due_left_out(other) == due_left_out
            });
            if !ranked.is_empty() {
                if choices.len() == MAX_CHOICE_POINTS {
                    choices.pop_front();
                }
                choices.push_back((state.copy(), ranked));
            }
            state.take(rank, option, requests, join_lag_steps);
            continue;
        }
        // No way to stay in step from here: back to the latest choice with another way.
        // Furthest by batches made: quiet steps taken are not progress.
        if furthest
            .as_ref()
            .is_none_or(|(best, _)| state.cursor > best.cursor)
        {
            furthest = Some((state.copy(), ranked));
        }
        if retries < MAX_RETRIES {
            if let Some((saved, mut others)) = choices.pop_back() {
                retries += 1;
                let (rank, option) = others.remove(0);
                let mut back = if others.is_empty() {
                    saved
                } else {
                    let back = saved.copy();
                    choices.push_back((saved, others));
                    back
                };
                back.take(rank, option, requests, join_lag_steps);
                state = back;
                continue;
            }
        }
        // Out of ways: depart from the furthest point with its best option, counted.
        let (best, mut ranked) = furthest.take().expect("recorded above");
        state = best;
        let (rank, option) = ranked.remove(0);
        state.take(rank, option, requests, join_lag_steps);
        choices.clear();
        retries = 0;
    }
    state.missed_batches += batches.len().saturating_sub(state.cursor);
    let twin_unserved = state.cached.iter().filter(|c| c.is_none()).count();
    FollowedComparison {
        closed: ClosedLoopComparison {
            cached: requests
                .iter()
                .zip(&state.cached)
                .map(|(served, twin)| CachedTokens {
                    engine: served.cached_tokens,
                    twin: twin.unwrap_or(0),
                })
                .collect(),
            twin_preemptions: state.preemptions,
            twin_unserved,
            twin_partial_prefills: state.partial_prefills,
        },
        engine_batches: batches.len(),
        matched_batches: state.matched_batches,
        missed_batches: state.missed_batches,
        unmatched_steps: state.unmatched_steps,
        unknown_hashes,
    }
}

/// The engine's batches in kvtwin's hashes, one entry per block, each sorted (the order of
/// a step's events is not compared); empty ones dropped.
fn translate(
    block_size: usize,
    batches: &[Vec<EngineEvent>],
) -> (Vec<Vec<BlockEvent>>, Vec<usize>, u64) {
    let mut stream = EngineStream::new(block_size);
    let mut out = Vec::with_capacity(batches.len());
    let mut kept = Vec::with_capacity(batches.len());
    for (index, batch) in batches.iter().enumerate() {
        let start = stream.events().len();
        for event in batch {
            stream.push(event);
        }
        let mut events = stream.events()[start..].to_vec();
        events.sort_unstable();
        if !events.is_empty() {
            out.push(events);
            kept.push(index);
        }
    }
    (out, kept, stream.unknown())
}

/// Joins of this many requests or fewer are also tried in every other order: requests
/// sent together reach a loaded engine in either order (two sent 0.1 ms apart were
/// scheduled in reverse on one capture), and the first in the waiting queue takes the
/// step's token budget first. Larger joins keep the order of sending.
const MAX_REORDERED: usize = 3;

/// `joins` in the order of sending first, then (up to [`MAX_REORDERED`] of them) every
/// other order, each with how many pairs it takes out of the order of sending.
fn orders(joins: &[usize]) -> Vec<(Vec<usize>, usize)> {
    fn permute(rest: &mut Vec<usize>, made: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if rest.is_empty() {
            out.push(made.clone());
            return;
        }
        for at in 0..rest.len() {
            let next = rest.remove(at);
            made.push(next);
            permute(rest, made, out);
            made.pop();
            rest.insert(at, next);
        }
    }
    if joins.len() < 2 || joins.len() > MAX_REORDERED {
        return vec![(joins.to_vec(), 0)];
    }
    // Orders of the positions in `joins`, which is in the order of sending: a pair out
    // of that order is a later position before an earlier one.
    let mut all = Vec::new();
    permute(&mut (0..joins.len()).collect(), &mut Vec::new(), &mut all);
    all.into_iter()
        .map(|positions| {
            let inversions = (0..positions.len())
                .flat_map(|i| (i + 1..positions.len()).map(move |k| (i, k)))
                .filter(|&(i, k)| positions[i] > positions[k])
                .count();
            (positions.iter().map(|&p| joins[p]).collect(), inversions)
        })
        .collect()
}

/// Every way the next step can go: each subset of the first [`MAX_CANDIDATES`] sent
/// requests joining (in order of sending, and small ones in every order: [`orders`])
/// on a copy of the twin, where that step schedules anything.
fn options(
    twin: &VllmScheduler,
    sent: &[(usize, u64)],
    requests: &[ServedRequest],
    block_size: usize,
) -> Vec<Candidate> {
    let candidates = &sent[..sent.len().min(MAX_CANDIDATES)];
    let mut out = Vec::new();
    for mask in 0..1_u32 << candidates.len() {
        let subset: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(bit, _)| mask & (1 << bit) != 0)
            .map(|(_, &(index, _))| index)
            .collect();
        for (joins, inversions) in orders(&subset) {
            // A twin that cannot be copied has no options past those made.
            let Some(option) = option(twin, joins, inversions, requests, block_size) else {
                return out;
            };
            out.extend(option);
        }
    }
    out
}

/// `joins` joining the twin in that order, and its next step: `None` when the twin
/// cannot be copied, `Some(None)` when the step schedules nothing or leaves one of them
/// waiting.
fn option(
    twin: &VllmScheduler,
    joins: Vec<usize>,
    inversions: usize,
    requests: &[ServedRequest],
    block_size: usize,
) -> Option<Option<Candidate>> {
    let mut fork = twin.try_clone()?;
    for &index in &joins {
        fork.add_request(twin_request(index, &requests[index], block_size));
    }
    let Some(step) = fork.step() else {
        return Some(None);
    };
    // A request that joins and waits is the same as one that joins when it is first
    // scheduled (it waits at the back of the queue either way), so only joins that
    // are scheduled at once are ways of their own.
    let scheduled = |index: &usize| {
        step.scheduled
            .iter()
            .any(|s| usize::try_from(s.id.get()).is_ok_and(|id| id == *index))
    };
    if !joins.iter().all(scheduled) {
        return Some(None);
    }
    let mut events = flatten(&step.events);
    events.sort_unstable();
    Some(Some(Candidate {
        joins,
        inversions,
        fork,
        step,
        events,
    }))
}

/// How `option` stands against `window` (the engine's batches from the next on, each
/// sorted: the order of a step's events is not compared).
fn rank(option: &Candidate, window: &[Vec<BlockEvent>]) -> Rank {
    let made = &option.events;
    if made.is_empty() {
        // A step the engine may have taken without publishing anything.
        return Rank::Quiet;
    }
    let nearby = window.iter().take(LOOKAHEAD_BATCHES + 1);
    if let Some(at) = nearby.clone().position(|batch| batch == made) {
        return if at == 0 { Rank::Next } else { Rank::Later(at) };
    }
    nearby
        .enumerate()
        .map(|(skipped, batch)| {
            let (missing, extra) = apart(batch, made);
            let shared = made.len() - extra;
            Rank::Apart {
                differing: missing + extra,
                skipped,
                shared: shared > 0,
            }
        })
        .min()
        .unwrap_or(Rank::Apart {
            differing: made.len(),
            skipped: 0,
            shared: false,
        })
}

/// Of `target`'s events, how many `made` lacks, and how many of `made`'s are not in it
/// (as multisets).
fn apart(target: &[BlockEvent], made: &[BlockEvent]) -> (usize, usize) {
    let mut counts: BTreeMap<&BlockEvent, isize> = BTreeMap::new();
    for event in target {
        *counts.entry(event).or_default() += 1;
    }
    for event in made {
        *counts.entry(event).or_default() -= 1;
    }
    counts.values().fold((0, 0), |(missing, extra), &count| {
        if count > 0 {
            (missing + count.unsigned_abs(), extra)
        } else {
            (missing, extra + count.unsigned_abs())
        }
    })
}
