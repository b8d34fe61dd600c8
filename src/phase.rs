//! The phase class of a block: what the request that produced it was doing.
//!
//! Owns: [`Phase`], shared by the priority eviction policy (`pool::policy`) and the MRDN
//! wire frame's `tier` byte (`wire`), so both speak one vocabulary (seed 004).
//! Never: decide eviction order itself; the policy does.

use serde::{Deserialize, Serialize};

/// What a block holds, as far as eviction and offload care.
///
/// `ThinkComplete` blocks belong to reasoning that has finished (the request passed its
/// ExitThink point): they will not be re-read and are the first to evict and offload.
/// `ThinkActive` blocks belong to reasoning in progress. `OutputCritical` blocks are
/// prompt and answer blocks; losing them is what users notice.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
pub enum Phase {
    /// Finished reasoning: known cold.
    ThinkComplete,
    /// Reasoning still running.
    ThinkActive,
    /// Prompt and answer blocks (the default).
    #[default]
    OutputCritical,
}

impl Phase {
    /// All phases, coldest first: the order in which the priority policy evicts.
    pub const COLDEST_FIRST: [Phase; 3] = [
        Phase::ThinkComplete,
        Phase::ThinkActive,
        Phase::OutputCritical,
    ];

    /// Eviction rank: 0 is evicted first.
    #[inline]
    pub const fn eviction_rank(self) -> usize {
        match self {
            Phase::ThinkComplete => 0,
            Phase::ThinkActive => 1,
            Phase::OutputCritical => 2,
        }
    }

    /// The byte this phase has on the wire (MRDN v1 `tier` field).
    ///
    /// The three codes (3, 5, 6) are pairwise two bits apart, so a single flipped bit in
    /// the header's tier byte never turns one valid phase into another: the frame's
    /// checksum covers only the body, and this keeps single-bit corruption detectable.
    #[inline]
    pub const fn to_wire(self) -> u8 {
        match self {
            Phase::ThinkComplete => 0b011,
            Phase::ThinkActive => 0b101,
            Phase::OutputCritical => 0b110,
        }
    }

    /// The phase a wire byte names, if any.
    #[inline]
    pub const fn from_wire(byte: u8) -> Option<Phase> {
        match byte {
            0b011 => Some(Phase::ThinkComplete),
            0b101 => Some(Phase::ThinkActive),
            0b110 => Some(Phase::OutputCritical),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_round_trip_and_unknown_bytes_are_rejected() {
        for phase in Phase::COLDEST_FIRST {
            assert_eq!(Phase::from_wire(phase.to_wire()), Some(phase));
        }
        assert_eq!(Phase::from_wire(0), None);
        assert_eq!(Phase::from_wire(255), None);
    }

    #[test]
    fn no_single_bit_flip_maps_one_wire_phase_to_another() {
        for phase in Phase::COLDEST_FIRST {
            for bit in 0..8 {
                assert_eq!(Phase::from_wire(phase.to_wire() ^ (1 << bit)), None);
            }
        }
    }

    #[test]
    fn coldest_first_is_sorted_by_rank() {
        let ranks: Vec<usize> = Phase::COLDEST_FIRST
            .iter()
            .map(|p| p.eviction_rank())
            .collect();
        assert_eq!(ranks, vec![0, 1, 2]);
    }
}
