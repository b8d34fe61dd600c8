//! Workloads: the requests a run replays.
//!
//! Owns: [`Request`], the synthetic generators of multi-turn conversations
//! ([`ConversationSpec`]) and of reasoning conversations ([`ReasoningSpec`]); the
//! Mooncake trace readers live in [`crate::mooncake`] and are re-exported here.
//! Synthetic workloads draw from one ChaCha stream seeded by the run seed, so the same
//! seed gives the same requests.
//! Never: read a clock, or iterate anything unordered.

use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

pub use crate::mooncake::{
    read_mooncake_trace, MooncakeTraceReader, TraceCheck, TraceError, TraceInput, TraceMismatch,
    TraceRead,
};

/// One inference request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Its id (arrival order).
    pub id: RequestId,
    /// When it arrives.
    pub arrival: Timestamp,
    /// Its prompt's full blocks, first block first.
    pub blocks: Vec<BlockIdentity>,
    /// Prompt tokens (the last block may be partial, so this can exceed blocks × size).
    pub input_tokens: u64,
    /// Tokens to generate.
    pub output_tokens: u64,
    /// Of the output tokens, how many come first as reasoning, before the answer (0: no
    /// reasoning phase). The blocks holding them are `ThinkActive` while the request
    /// reasons and `ThinkComplete` once it answers (seed 004's ExitThink point).
    pub think_tokens: u64,
}

/// Multi-turn conversations sharing a few system prompts: each conversation starts at a
/// Poisson arrival, every turn resends the whole history plus a new user message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationSpec {
    /// Conversations in the run.
    pub conversations: u32,
    /// Distinct system prompts they share.
    pub system_prompts: u32,
    /// Blocks of each system prompt.
    pub system_prompt_blocks: u32,
    /// Turns per conversation, inclusive range.
    pub turns: (u32, u32),
    /// New blocks per turn (user message plus the previous answer), inclusive range.
    pub blocks_per_turn: (u32, u32),
    /// Tokens generated per turn, inclusive range.
    pub output_tokens: (u32, u32),
    /// Mean time between conversation starts.
    pub mean_interarrival_ms: u64,
    /// Mean time between a conversation's turns.
    pub mean_think_time_ms: u64,
}

fn exponential_ns(rng: &mut ChaCha8Rng, mean_ms: u64) -> u64 {
    // Inverse CDF of the exponential distribution; 1 - u is in (0, 1].
    let u: f64 = rng.gen();
    let sample = -(1.0 - u).ln() * mean_ms as f64 * 1e6;
    sample.min(u64::MAX as f64 / 4.0) as u64
}

fn range(rng: &mut ChaCha8Rng, (low, high): (u32, u32)) -> u32 {
    rng.gen_range(low.min(high)..=high.max(low))
}

impl ConversationSpec {
    /// The requests, ordered by arrival (ties by conversation, then turn).
    pub fn generate(&self, seed: u64, block_size_tokens: usize) -> Vec<Request> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let prompts = system_prompts(self.system_prompts, self.system_prompt_blocks);
        let mut next_local = 1u64 << 48;
        let mut requests = Vec::new();
        let mut start_ns = 0u64;
        for _ in 0..self.conversations {
            start_ns += exponential_ns(&mut rng, self.mean_interarrival_ms);
            let prompt = &prompts[rng.gen_range(0..prompts.len())];
            let mut history = prompt.clone();
            let mut at = start_ns;
            for turn in 0..range(&mut rng, self.turns) {
                if turn > 0 {
                    at += exponential_ns(&mut rng, self.mean_think_time_ms);
                }
                for _ in 0..range(&mut rng, self.blocks_per_turn) {
                    let next =
                        BlockIdentity::chained(history.last(), LocalBlockHash::new(next_local));
                    next_local += 1;
                    history.push(next);
                }
                let input_tokens = (history.len() * block_size_tokens) as u64;
                let output_tokens = u64::from(range(&mut rng, self.output_tokens));
                requests.push((
                    at,
                    Request {
                        id: RequestId::new(0),
                        arrival: Timestamp::from_nanos(at),
                        blocks: history.clone(),
                        input_tokens,
                        output_tokens,
                        think_tokens: 0,
                    },
                ));
            }
        }
        in_arrival_order(requests)
    }
}

/// Requests dated by their arrival, sorted by it (ties keep their order) and numbered.
fn in_arrival_order(mut requests: Vec<(u64, Request)>) -> Vec<Request> {
    requests.sort_by_key(|(at, _)| *at);
    requests
        .into_iter()
        .enumerate()
        .map(|(i, (_, mut request))| {
            request.id = RequestId::new(i as u64);
            request
        })
        .collect()
}

/// The system prompts conversations share: `count` chains of `blocks` blocks.
fn system_prompts(count: u32, blocks: u32) -> Vec<Vec<BlockIdentity>> {
    (0..count.max(1))
        .map(|p| {
            let locals: Vec<LocalBlockHash> = (0..blocks)
                .map(|i| LocalBlockHash::new((u64::from(p) << 32) | u64::from(i)))
                .collect();
            BlockIdentity::chain(&locals)
        })
        .collect()
}

/// Multi-turn conversations with a reasoning model: every turn thinks, then answers.
///
/// As reasoning models are served (DeepSeek-R1, Qwen3 and others drop the reasoning from
/// the history), the next turn's prompt is the history plus the previous *answer* and a
/// new user message, never the reasoning: the KV of reasoning tokens is never read
/// again once the request answers. That is the traffic a phase-aware eviction policy is
/// for (seed 004): with generated blocks cached, LRU keeps dead reasoning blocks as long
/// as the prompt prefixes that later turns hit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningSpec {
    /// Conversations in the run.
    pub conversations: u32,
    /// Distinct system prompts they share.
    pub system_prompts: u32,
    /// Blocks of each system prompt.
    pub system_prompt_blocks: u32,
    /// Turns per conversation, inclusive range.
    pub turns: (u32, u32),
    /// Blocks of each new user message, inclusive range.
    pub user_blocks: (u32, u32),
    /// Reasoning tokens per turn, inclusive range.
    pub think_tokens: (u32, u32),
    /// Answer tokens per turn, inclusive range (at least 1).
    pub answer_tokens: (u32, u32),
    /// Mean time between conversation starts.
    pub mean_interarrival_ms: u64,
    /// Mean time between a turn's arrival and the next one's (the user reading and
    /// typing; the model's own time does not delay the next turn).
    pub mean_turn_gap_ms: u64,
}

impl ReasoningSpec {
    /// The requests, ordered by arrival (ties by conversation, then turn). The previous
    /// answer enters the next prompt as whole blocks of new tokens (its last partial
    /// block is dropped, as the turn's user message starts a new block).
    pub fn generate(&self, seed: u64, block_size_tokens: usize) -> Vec<Request> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let prompts = system_prompts(self.system_prompts, self.system_prompt_blocks);
        let block_size = block_size_tokens.max(1) as u64;
        let mut next_local = 1u64 << 48;
        let mut requests = Vec::new();
        let mut start_ns = 0u64;
        for _ in 0..self.conversations {
            start_ns += exponential_ns(&mut rng, self.mean_interarrival_ms);
            let prompt = &prompts[rng.gen_range(0..prompts.len())];
            let mut history = prompt.clone();
            let mut at = start_ns;
            let mut answer_blocks = 0;
            for turn in 0..range(&mut rng, self.turns) {
                if turn > 0 {
                    at += exponential_ns(&mut rng, self.mean_turn_gap_ms);
                }
                let user = range(&mut rng, self.user_blocks);
                for _ in 0..answer_blocks + u64::from(user) {
                    let next =
                        BlockIdentity::chained(history.last(), LocalBlockHash::new(next_local));
                    next_local += 1;
                    history.push(next);
                }
                let think_tokens = u64::from(range(&mut rng, self.think_tokens));
                let answer_tokens = u64::from(range(&mut rng, self.answer_tokens).max(1));
                answer_blocks = answer_tokens / block_size;
                requests.push((
                    at,
                    Request {
                        id: RequestId::new(0),
                        arrival: Timestamp::from_nanos(at),
                        blocks: history.clone(),
                        input_tokens: history.len() as u64 * block_size,
                        output_tokens: think_tokens + answer_tokens,
                        think_tokens,
                    },
                ));
            }
        }
        in_arrival_order(requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ConversationSpec {
        ConversationSpec {
            conversations: 20,
            system_prompts: 3,
            system_prompt_blocks: 4,
            turns: (1, 4),
            blocks_per_turn: (1, 3),
            output_tokens: (10, 100),
            mean_interarrival_ms: 100,
            mean_think_time_ms: 1_000,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_requests_and_another_seed_does_not() {
        assert_eq!(spec().generate(7, 16), spec().generate(7, 16));
        assert_ne!(spec().generate(7, 16), spec().generate(8, 16));
    }

    #[test]
    fn conversations_share_system_prompts_and_grow_their_history() {
        let requests = spec().generate(1, 16);
        assert!(requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let first_blocks: std::collections::BTreeSet<_> =
            requests.iter().map(|r| r.blocks[0].sequence_hash).collect();
        assert!(first_blocks.len() <= 3);
        for request in &requests {
            for pair in request.blocks.windows(2) {
                assert_eq!(pair[1].parent, Some(pair[0].sequence_hash));
            }
        }
    }

    fn reasoning() -> ReasoningSpec {
        ReasoningSpec {
            conversations: 30,
            system_prompts: 2,
            system_prompt_blocks: 3,
            turns: (2, 4),
            user_blocks: (1, 2),
            think_tokens: (40, 80),
            answer_tokens: (20, 50),
            mean_interarrival_ms: 100,
            mean_turn_gap_ms: 1_000,
        }
    }

    #[test]
    fn reasoning_turns_think_then_answer_and_carry_the_answer_not_the_reasoning() {
        let requests = reasoning().generate(3, 16);
        assert_eq!(requests, reasoning().generate(3, 16));
        assert!(requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        for request in &requests {
            assert!((40..=80).contains(&request.think_tokens));
            let answer = request.output_tokens - request.think_tokens;
            assert!((20..=50).contains(&answer), "{request:?}");
            assert_eq!(request.input_tokens, request.blocks.len() as u64 * 16);
        }
        // A later turn extends an earlier turn's prompt by the earlier answer's whole
        // blocks plus one or two user blocks: nothing of the reasoning.
        let mut extended = 0;
        for (i, later) in requests.iter().enumerate() {
            let Some(earlier) = requests[..i].iter().rev().find(|r| {
                r.blocks.len() < later.blocks.len()
                    && later.blocks[r.blocks.len() - 1] == *r.blocks.last().unwrap()
            }) else {
                continue;
            };
            let answer_blocks = (earlier.output_tokens - earlier.think_tokens) / 16;
            let added = (later.blocks.len() - earlier.blocks.len()) as u64;
            assert!(
                (answer_blocks + 1..=answer_blocks + 2).contains(&added),
                "{added} blocks after an answer of {answer_blocks}"
            );
            extended += 1;
        }
        assert!(extended >= 30, "{extended} follow-up turns");
    }
}
