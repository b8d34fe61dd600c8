//! Storage tiers: where a block's bytes live.
//!
//! Owns: [`Tier`] (Dynamo's G1–G4) and its order. A lower tier is larger and slower;
//! offload moves blocks down, onboarding moves them back to `Device`.
//! Never: hold pools or policies (the manager does).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A memory tier, fastest first. The derive order is the order of the tiers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum Tier {
    /// GPU memory (G1): the only tier attention reads from.
    Device,
    /// Host DRAM, pinned where possible (G2).
    Host,
    /// Local SSD (G3).
    Disk,
    /// Remote memory or storage reached over a fabric (G4).
    Remote,
}

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::Remote];

    /// Index into per-tier arrays.
    #[inline]
    pub const fn index(self) -> usize {
        match self {
            Tier::Device => 0,
            Tier::Host => 1,
            Tier::Disk => 2,
            Tier::Remote => 3,
        }
    }

    /// Lower-case name used in reports and on the wire (`device`, `host`, `disk`, `remote`).
    pub const fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::Remote => "remote",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_ordered_fastest_first_and_indexed_densely() {
        let mut sorted = Tier::ALL;
        sorted.sort();
        assert_eq!(sorted, Tier::ALL);
        for (i, tier) in Tier::ALL.iter().enumerate() {
            assert_eq!(tier.index(), i);
        }
        assert_eq!(Tier::Disk.to_string(), "disk");
    }
}
