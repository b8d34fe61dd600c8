//! One request as vLLM's scheduler and KV cache manager see it (`vllm/v1/request.py`):
//! its token counts, status and the identities of its full blocks.
//!
//! Owns: [`VllmRequest`] and [`RequestStatus`]. The identities of every full block the
//! request's sequence will have (prompt and outputs) are given up front: a trace knows
//! the prompt's, the outputs' are the engine's answer (or made up, for a trace that
//! does not carry them). vLLM hashes a block when its tokens exist, so only the first
//! `num_tokens / block_size` are visible ([`VllmRequest::block_hashes`]). Never: decide
//! anything (`cache`, `scheduler`).

use kvtwin::block::BlockIdentity;
use kvtwin::ids::RequestId;

/// Where a request is in the scheduler (`RequestStatus`, the states this model uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    /// In the waiting queue, never scheduled.
    Waiting,
    /// Scheduled at least once and holding blocks.
    Running,
    /// Preempted: its blocks freed, back at the front of the waiting queue.
    Preempted,
    /// Generated its last token; its blocks are freed.
    Finished,
}

/// A request; see the module documentation.
#[derive(Clone, Debug)]
pub struct VllmRequest {
    /// Its id (arrival order breaks no ties here: queues keep their own order).
    pub id: RequestId,
    /// Identities of the full blocks of prompt + `max_tokens` outputs, first first.
    pub blocks: Vec<BlockIdentity>,
    /// Prompt tokens.
    pub num_prompt_tokens: u64,
    /// Output tokens it generates before it finishes (`max_tokens`, `ignore_eos`).
    pub max_tokens: u64,
    /// Output tokens generated so far.
    pub num_output_tokens: u64,
    /// Tokens whose KV is computed (or found cached).
    pub num_computed_tokens: u64,
    /// Where it is.
    pub status: RequestStatus,
    /// Prompt tokens found in the prefix cache when it was first scheduled (vLLM's
    /// `num_cached_tokens`, the `cached_tokens` of its usage); `None` before that.
    pub num_cached_tokens: Option<u64>,
    /// Times it was preempted.
    pub num_preemptions: u32,
}

impl VllmRequest {
    /// A waiting request of `num_prompt_tokens` that will generate `max_tokens`, its
    /// full blocks (prompt and outputs) identified by `blocks`.
    pub fn new(
        id: RequestId,
        blocks: Vec<BlockIdentity>,
        num_prompt_tokens: u64,
        max_tokens: u64,
    ) -> Self {
        Self {
            id,
            blocks,
            num_prompt_tokens,
            max_tokens,
            num_output_tokens: 0,
            num_computed_tokens: 0,
            status: RequestStatus::Waiting,
            num_cached_tokens: None,
            num_preemptions: 0,
        }
    }

    /// Tokens of its sequence so far: the prompt and the outputs generated.
    pub fn num_tokens(&self) -> u64 {
        self.num_prompt_tokens + self.num_output_tokens
    }

    /// The identities vLLM has computed by now: one per full block of `num_tokens`.
    pub fn block_hashes(&self, block_size: u64) -> &[BlockIdentity] {
        let known = usize::try_from(self.num_tokens() / block_size).unwrap_or(usize::MAX);
        &self.blocks[..known.min(self.blocks.len())]
    }

    /// Whether it has generated all its outputs.
    pub fn is_done(&self) -> bool {
        self.num_output_tokens >= self.max_tokens
    }
}
