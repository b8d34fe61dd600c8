//! Identifiers, hashes and time: every id in kvtwin is a `Copy` newtype defined here, once.
//!
//! Owns: `BlockId`, `WorkerId`, `WorkerWithDpRank`, `TransferId`, `RequestId`,
//! `LocalBlockHash`, `SequenceHash`, `Timestamp`. The fields are private so that an id of one kind can never
//! be passed where another is expected; constructors and accessors are explicit.
//! Never: compute hashes (see `tokens`), read a clock, or allocate.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name($inner);

        impl $name {
            /// Wraps a raw value.
            #[inline]
            pub const fn new(raw: $inner) -> Self {
                Self(raw)
            }

            /// The raw value.
            #[inline]
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_newtype!(
    /// Index of a block inside one tier's pool; stable for the life of the pool.
    BlockId(u32)
);
id_newtype!(
    /// One worker (engine instance) of a cluster, as the router knows it.
    WorkerId(u64)
);
/// One data-parallel rank of a worker: what the router indexes and routes to (Dynamo's
/// `WorkerWithDpRank`). A worker without data parallelism is its rank 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerWithDpRank {
    /// The worker.
    pub worker: WorkerId,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

id_newtype!(
    /// One transfer submitted to a `Hardware`; unique per manager.
    TransferId(u64)
);
id_newtype!(
    /// One inference request, as the driver names it.
    RequestId(u64)
);
id_newtype!(
    /// Hash of the tokens of one full block alone (xxh3-64, seed 1337 or the LoRA seed).
    /// Dynamo calls it `LocalBlockHash` / `tokens_hash`.
    LocalBlockHash(u64)
);
id_newtype!(
    /// Hash of a block chained with all blocks before it: equal sequence hashes mean an
    /// identical prefix. Dynamo's `ExternalSequenceBlockHash`; the registry key.
    SequenceHash(u64)
);

impl BlockId {
    /// The index into per-block arrays.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// Nanoseconds since the epoch of the clock that produced it (the simulation start, or a
/// real backend's start). An integer so that it prints, stores in RON and compares across
/// runs exactly.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The clock's epoch.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The latest representable time; used as "never".
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `nanos` after the epoch.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + span`, saturating at [`Timestamp::MAX`].
    #[inline]
    pub fn saturating_add(self, span: Duration) -> Self {
        let nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }

    /// `self + nanos`, saturating at [`Timestamp::MAX`].
    #[inline]
    pub fn saturating_add_nanos(self, nanos: u64) -> Self {
        Self(self.0.saturating_add(nanos))
    }

    /// The span from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ns)", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_arithmetic_saturates() {
        let t = Timestamp::from_nanos(10);
        assert_eq!(t.saturating_add(Duration::from_nanos(5)).as_nanos(), 15);
        assert_eq!(
            Timestamp::MAX.saturating_add(Duration::from_secs(1)),
            Timestamp::MAX
        );
        assert_eq!(
            t.saturating_duration_since(Timestamp::from_nanos(20)),
            Duration::ZERO
        );
        assert_eq!(
            Timestamp::from_nanos(1_500_000_000).to_string(),
            "1.500000000s"
        );
    }

    #[test]
    fn ids_round_trip_and_print() {
        let id = SequenceHash::new(42);
        assert_eq!(id.get(), 42);
        assert_eq!(format!("{id:?}"), "SequenceHash(42)");
        assert_eq!(BlockId::new(7).index(), 7);
    }
}
