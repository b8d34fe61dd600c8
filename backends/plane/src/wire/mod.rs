//! Untrusted wire formats of the event plane: decoders that never panic and encoders that
//! write exactly what the engines write (WIRE.md).
//!
//! Owns: [`engine`] (vLLM / SGLang KV event batches: msgpack payloads in the map and the
//! array encodings of every engine version WIRE.md lists, and their encoder),
//! [`frames`] (the ZMQ message frames of the live stream and of the replay protocol, and
//! the raw batch a transport carries), [`worker`] (`WorkerEvent`: a worker's event in its
//! engine's hashes, what the router service takes),
//! [`dynamo`] (Dynamo's `RouterEvent` as JSON and the Dynamo 1.6 msgpack envelope),
//! [`normalize`] (an engine stream's events as Dynamo indexes them: KV cache groups left
//! out, salts carried along chains by [`salts`]), [`convert`] (engine batches to the router's `WorkerEvent`s and to `RouterEvent`s, what
//! a relay does, and `RouterEvent`s back to router input), [`WireError`] with a stable
//! reason per variant, [`DropCounters`] (drops by reason) and [`DecodeLimits`].
//!
//! Invariants: every decoder is total: any byte string gives `Ok` or a typed `Err`, never
//! a panic, an unbounded allocation (allocations are capped by the input's length and by
//! [`DecodeLimits`]) or unbounded recursion (msgpack values are skipped iteratively).
//! Decoding a batch allocates the output vectors only, never per block.
//! Never: own a socket, a thread or a clock (`crate::zmq` and the NATS side carry the
//! bytes), apply an event to a router (`crate::service` does), or import any other module
//! of the plane: it is the plane's bottom layer (wire ← zmq, nats ← service).

pub mod convert;
pub mod dynamo;
pub mod engine;
pub mod extra_keys;
pub mod frames;
mod msgpack;
pub mod normalize;
pub mod salts;
pub mod worker;

#[cfg(test)]
mod proptests;

pub use dynamo::{Envelope, RouterEvent};
pub use engine::{
    BlockRemoved, BlockStored, EncodeOptions, EngineBatch, EngineDecoder, EngineEvent,
    EngineFormat, SkippedEvent, UnknownEvents,
};
pub use frames::{
    FrameError, LiveMessage, RawBatch, ReplayLayout, ReplayReply, ReplayRequest, END_OF_REPLAY,
};
pub use worker::{WorkerEvent, WorkerEventData};

/// Bounds on what one message may make the decoder allocate. Exceeding any is
/// [`WireError::Oversized`]: the message is refused whole, never truncated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Bytes of one payload (a msgpack batch, a JSON event, an envelope).
    pub max_payload_bytes: usize,
    /// Events in one batch or envelope.
    pub max_events: usize,
    /// Block hashes in one batch, all events together.
    pub max_blocks: usize,
    /// Token ids in one batch, all events together.
    pub max_tokens: usize,
}

impl Default for DecodeLimits {
    /// Far above what an engine step emits (vLLM publishes one batch per step), far below
    /// what would hurt a router: 16 MiB of payload decodes into at most ~100 MiB.
    fn default() -> Self {
        Self {
            max_payload_bytes: 16 << 20,
            max_events: 1 << 16,
            max_blocks: 1 << 20,
            max_tokens: 1 << 24,
        }
    }
}

/// Why a message (or one event of it) was refused. Each variant has a stable
/// [`reason`](WireError::reason) for counters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Not the number of frames the message kind has.
    #[error("{frames} frames, expected {expected}")]
    FrameCount {
        /// Frames received.
        frames: usize,
        /// What was expected.
        expected: &'static str,
    },
    /// A sequence frame that is not 8 bytes.
    #[error("sequence frame of {len} bytes, expected 8")]
    BadSequenceFrame {
        /// Its length.
        len: usize,
    },
    /// A replay message without its empty delimiter frame.
    #[error("replay message without the empty delimiter frame")]
    ReplayDelimiter,
    /// Bytes that are not msgpack: truncated, a reserved marker, invalid UTF-8 in a string,
    /// or bytes left after the value.
    #[error("malformed msgpack at byte {offset}")]
    MalformedMsgpack {
        /// Where reading stopped.
        offset: usize,
    },
    /// Well-formed msgpack of the wrong type where a field needs another.
    #[error("msgpack at byte {offset}: expected {expected}")]
    UnexpectedType {
        /// Where the value starts.
        offset: usize,
        /// What the field needs.
        expected: &'static str,
    },
    /// A batch array with fewer than its two leading elements (timestamp, events).
    #[error("batch of {len} elements, expected [ts, events] or [ts, events, dp_rank]")]
    BatchShape {
        /// Its length.
        len: usize,
    },
    /// A required field is absent.
    #[error("missing field {field}")]
    MissingField {
        /// Which.
        field: &'static str,
    },
    /// An event whose type tag this decoder does not know.
    #[error("unknown event type {name:?}")]
    UnknownEventType {
        /// The tag (at most 64 bytes of it).
        name: String,
    },
    /// A `medium` that maps to no tier (WIRE.md: count it, never guess).
    #[error("unknown medium {name:?}")]
    UnknownMedium {
        /// The medium (at most 64 bytes of it).
        name: String,
    },
    /// A Dynamo `storage_tier` that is none of `device`, `host_pinned`, `disk`,
    /// `external`.
    #[error("unknown storage tier {name:?}")]
    UnknownStorageTier {
        /// The tier (at most 64 bytes of it).
        name: String,
    },
    /// A binary block hash that is not 32 bytes.
    #[error("block hash of {len} bytes, expected an integer or 32 bytes")]
    BadHashWidth {
        /// Its length.
        len: usize,
    },
    /// An integer outside its field's range (a negative or over-wide token id, block
    /// size, rank).
    #[error("integer out of range for {field}")]
    IntegerRange {
        /// Which field.
        field: &'static str,
    },
    /// A message over one of the [`DecodeLimits`].
    #[error("oversized: {what} {got} over the limit of {limit}")]
    Oversized {
        /// Which limit (`payload_bytes`, `events`, `blocks`, `tokens`).
        what: &'static str,
        /// How many the message has (at least).
        got: usize,
        /// The limit.
        limit: usize,
    },
    /// Not valid JSON of a `RouterEvent`.
    #[error("bad JSON: {message}")]
    BadJson {
        /// serde_json's description, with line and column.
        message: String,
    },
    /// A `BlockStored` whose token ids are not `block_size` per block hash, so no block's
    /// tokens hash can be computed.
    #[error("{tokens} token ids for {blocks} blocks of {block_size}")]
    TokenCountMismatch {
        /// Block hashes in the event.
        blocks: usize,
        /// Its block size.
        block_size: u32,
        /// Token ids in the event.
        tokens: usize,
    },
}

impl WireError {
    /// Every reason, in variant order: the index of [`DropCounters`].
    pub const REASONS: [&'static str; 15] = [
        "frame_count",
        "sequence_width",
        "replay_delimiter",
        "malformed_msgpack",
        "unexpected_type",
        "batch_shape",
        "missing_field",
        "unknown_event_type",
        "unknown_medium",
        "unknown_storage_tier",
        "bad_hash_width",
        "integer_out_of_range",
        "oversized",
        "bad_json",
        "token_count_mismatch",
    ];

    /// The position of this error's reason in [`WireError::REASONS`].
    pub const fn index(&self) -> usize {
        match self {
            WireError::FrameCount { .. } => 0,
            WireError::BadSequenceFrame { .. } => 1,
            WireError::ReplayDelimiter => 2,
            WireError::MalformedMsgpack { .. } => 3,
            WireError::UnexpectedType { .. } => 4,
            WireError::BatchShape { .. } => 5,
            WireError::MissingField { .. } => 6,
            WireError::UnknownEventType { .. } => 7,
            WireError::UnknownMedium { .. } => 8,
            WireError::UnknownStorageTier { .. } => 9,
            WireError::BadHashWidth { .. } => 10,
            WireError::IntegerRange { .. } => 11,
            WireError::Oversized { .. } => 12,
            WireError::BadJson { .. } => 13,
            WireError::TokenCountMismatch { .. } => 14,
        }
    }

    /// A stable snake_case label for counters and metrics. The frame reasons are the
    /// same labels as [`FrameError::reason`], so both count in one place.
    pub const fn reason(&self) -> &'static str {
        Self::REASONS[self.index()]
    }

    /// Whether the error concerns one event only: a batch decoder may skip that event
    /// and keep the others ([`UnknownEvents::Skip`]).
    pub const fn is_per_event(&self) -> bool {
        matches!(
            self,
            WireError::UnknownEventType { .. } | WireError::UnknownMedium { .. }
        )
    }
}

impl From<FrameError> for WireError {
    fn from(error: FrameError) -> Self {
        match error {
            FrameError::FrameCount { frames, expected } => {
                WireError::FrameCount { frames, expected }
            }
            FrameError::SequenceWidth(len) => WireError::BadSequenceFrame { len },
            FrameError::Delimiter => WireError::ReplayDelimiter,
        }
    }
}

/// The first bytes of an untrusted name, for an error message (bounded, so a hostile
/// 16 MiB tag does not become a 16 MiB error).
fn bounded_name(name: &str) -> String {
    const MAX: usize = 64;
    if name.len() <= MAX {
        return name.to_string();
    }
    let mut end = MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// Messages or events dropped, by [`WireError::reason`], in the fixed order of
/// [`WireError::REASONS`] (so reports come out the same every time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounters {
    counts: [u64; WireError::REASONS.len()],
}

impl DropCounters {
    /// No drops.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one drop for `error`'s reason.
    pub fn record(&mut self, error: &WireError) {
        self.counts[error.index()] += 1;
    }

    /// Drops counted for `reason` (0 for a label that is not a reason).
    pub fn count(&self, reason: &str) -> u64 {
        WireError::REASONS
            .iter()
            .position(|known| *known == reason)
            .map_or(0, |index| self.counts[index])
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Every reason with its count, zeros included, in [`WireError::REASONS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        WireError::REASONS.iter().copied().zip(self.counts)
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &DropCounters) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_and_match_the_frame_layer() {
        let mut sorted = WireError::REASONS.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), WireError::REASONS.len());
        for frame in [
            FrameError::FrameCount {
                frames: 2,
                expected: "3",
            },
            FrameError::SequenceWidth(4),
            FrameError::Delimiter,
        ] {
            assert_eq!(WireError::from(frame).reason(), frame.reason());
        }
    }

    #[test]
    fn counters_count_by_reason_in_a_fixed_order() {
        let mut counters = DropCounters::new();
        counters.record(&WireError::MalformedMsgpack { offset: 3 });
        counters.record(&WireError::MalformedMsgpack { offset: 9 });
        counters.record(&WireError::UnknownMedium {
            name: "tape".into(),
        });
        assert_eq!(counters.count("malformed_msgpack"), 2);
        assert_eq!(counters.count("unknown_medium"), 1);
        assert_eq!(counters.count("no_such_reason"), 0);
        assert_eq!(counters.total(), 3);
        let mut both = counters;
        both.merge(&counters);
        assert_eq!(both.total(), 6);
        let order: Vec<_> = counters.iter().map(|(reason, _)| reason).collect();
        assert_eq!(order, WireError::REASONS);
    }

    #[test]
    fn names_in_errors_are_bounded_on_a_char_boundary() {
        let long = "é".repeat(100);
        let bounded = bounded_name(&long);
        assert!(bounded.len() <= 64 && long.starts_with(&bounded));
    }
}
