//! The `kv-router-workload` checksum (peer-bench's WORKLOAD.md), so kvtwin's router can be
//! checked against Dynamo's indexers on the same file.
//!
//! Owns: [`Checksum`]: per match op, the (worker, score) pairs with score ≥ 1 sorted by
//! worker, folded into `hits`, `sum_max`, `sum_all` and an FNV-1a 64 digest of
//! `u32 LE pair count ‖ (u64 LE worker ‖ u32 LE score)*`.
//! Never: read files (the command line does).

use serde::Serialize;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The checksum of all match results of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Checksum {
    /// Match ops whose best score is at least 1.
    pub hits: u64,
    /// Sum of the best score of every match op.
    pub sum_max: u64,
    /// Sum of all scores of every match op.
    pub sum_all: u64,
    /// FNV-1a 64 of every result, printed as 16 lowercase hex digits.
    #[serde(serialize_with = "hex16")]
    pub digest: u64,
}

fn hex16<S: serde::Serializer>(digest: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{digest:016x}"))
}

impl Default for Checksum {
    fn default() -> Self {
        Self {
            hits: 0,
            sum_max: 0,
            sum_all: 0,
            digest: FNV_OFFSET_BASIS,
        }
    }
}

impl Checksum {
    /// Folds one match result given as (worker, score) pairs in any order; zero scores
    /// are dropped.
    pub fn add(&mut self, pairs: &mut Vec<(u64, u32)>) {
        pairs.retain(|(_, score)| *score > 0);
        pairs.sort_unstable();
        let best = pairs.iter().map(|(_, score)| *score).max().unwrap_or(0);
        self.hits += u64::from(best > 0);
        self.sum_max += u64::from(best);
        self.sum_all += pairs
            .iter()
            .map(|(_, score)| u64::from(*score))
            .sum::<u64>();
        self.fold(&(pairs.len() as u32).to_le_bytes());
        for (worker, score) in pairs.iter() {
            self.fold(&worker.to_le_bytes());
            self.fold(&score.to_le_bytes());
        }
    }

    fn fold(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.digest = (self.digest ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    }

    /// The digest as peer-bench prints it.
    pub fn digest_hex(&self) -> String {
        format!("{:016x}", self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_of_workload_md() {
        let mut checksum = Checksum::default();
        assert_eq!(checksum.digest_hex(), "cbf29ce484222325");
        checksum.add(&mut vec![(7, 0), (3, 2), (1, 5)]);
        checksum.add(&mut vec![]);
        assert_eq!(
            (checksum.hits, checksum.sum_max, checksum.sum_all),
            (1, 5, 7)
        );
        assert_eq!(checksum.digest_hex(), "6ae78ab6ca3e5ac2");
    }
}
