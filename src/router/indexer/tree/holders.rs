//! Who holds a run: worker slots with their tiers, as a sorted list and as a bit mask,
//! and the one change an event makes to them.
//!
//! Owns: [`Holder`], [`HolderSet`], [`HolderMask`] and [`HolderChange`].
//! Never: looks at blocks or the tree; a run's holders are one value the tree keeps.

use smallvec::SmallVec;

const TIER_BITS: u32 = 4;

/// A worker slot and the tiers (bit per `Tier::index`) it holds a run in, packed in 32
/// bits so that holder sets of up to four workers live inside the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::router::indexer) struct Holder(u32);

impl Holder {
    /// The largest slot a holder can name.
    pub(in crate::router::indexer) const MAX_SLOT: u32 = u32::MAX >> TIER_BITS;

    pub(in crate::router::indexer) fn new(slot: u32, tiers: u8) -> Self {
        debug_assert!(slot <= Self::MAX_SLOT && tiers != 0 && u32::from(tiers) < 1 << TIER_BITS);
        Holder(slot << TIER_BITS | u32::from(tiers))
    }

    pub(in crate::router::indexer) fn slot(self) -> u32 {
        self.0 >> TIER_BITS
    }

    pub(in crate::router::indexer) fn tiers(self) -> u8 {
        (self.0 & ((1 << TIER_BITS) - 1)) as u8
    }
}

/// The holders of a run, sorted by slot.
pub(in crate::router::indexer) type HolderSet = SmallVec<[Holder; 4]>;

/// One slot's tiers set anew on a stretch of a run (0: the slot no longer holds it): the
/// only change an event makes to a holder set. Applied in place, never by building the
/// new set (for a prefix many workers share, the set is on the heap: a new one per
/// event was an allocation and a free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::router::indexer) struct HolderChange {
    pub(in crate::router::indexer) slot: u32,
    pub(in crate::router::indexer) tiers: u8,
}

impl HolderChange {
    /// `holders` with the change made, in slot order.
    fn applied<'a>(self, holders: &'a [Holder]) -> impl Iterator<Item = Holder> + 'a {
        let at = holders.partition_point(|h| h.slot() < self.slot);
        let after = at + usize::from(holders.get(at).is_some_and(|h| h.slot() == self.slot));
        let own = (self.tiers != 0).then(|| Holder::new(self.slot, self.tiers));
        holders[..at]
            .iter()
            .copied()
            .chain(own)
            .chain(holders[after..].iter().copied())
    }

    /// Whether `other` is exactly `holders` with the change made.
    pub(in crate::router::indexer) fn gives(self, holders: &[Holder], other: &[Holder]) -> bool {
        self.applied(holders).eq(other.iter().copied())
    }

    /// Makes the change to `holders`.
    pub(super) fn apply(self, holders: &mut HolderSet) {
        let at = holders.partition_point(|h| h.slot() < self.slot);
        let present = holders.get(at).is_some_and(|h| h.slot() == self.slot);
        match (present, self.tiers) {
            (true, 0) => {
                holders.remove(at);
            }
            (true, tiers) => holders[at] = Holder::new(self.slot, tiers),
            (false, 0) => {}
            (false, tiers) => holders.insert(at, Holder::new(self.slot, tiers)),
        }
    }
}

/// A run's holders as a bit per slot, when every slot is under 64 and every holder has
/// the same tiers (most clusters, most runs): a query then intersects its candidates with
/// one AND and never reads the holder list, which for shared prefixes is on the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::router::indexer) struct HolderMask {
    /// Bit `s` set: slot `s` holds the run.
    pub(in crate::router::indexer) slots: u64,
    /// The tiers every holder holds it in.
    pub(in crate::router::indexer) tiers: u8,
    /// Whether the mask describes the holders exactly; if not, use the list.
    pub(in crate::router::indexer) exact: bool,
}

impl Default for HolderMask {
    /// The mask of no holders.
    fn default() -> Self {
        HolderMask::of(&[])
    }
}

impl HolderMask {
    pub(super) fn of(holders: &[Holder]) -> Self {
        let tiers = holders.first().map_or(0, |h| h.tiers());
        let exact = holders.iter().all(|h| h.slot() < 64 && h.tiers() == tiers);
        let slots = if exact {
            holders.iter().fold(0, |mask, h| mask | 1 << h.slot())
        } else {
            0
        };
        HolderMask {
            slots,
            tiers,
            exact,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The change made by hand on a sorted map of slot to tiers.
    fn reference(holders: &[Holder], change: HolderChange) -> Vec<Holder> {
        let mut map: std::collections::BTreeMap<u32, u8> =
            holders.iter().map(|h| (h.slot(), h.tiers())).collect();
        if change.tiers == 0 {
            map.remove(&change.slot);
        } else {
            map.insert(change.slot, change.tiers);
        }
        map.into_iter()
            .map(|(slot, tiers)| Holder::new(slot, tiers))
            .collect()
    }

    proptest! {
        /// Applying a change in place, reading it applied, and recognising its result all
        /// agree with making it on a map, for sets inline and spilled.
        #[test]
        fn a_change_in_place_is_the_change_made_on_a_map(
            slots in proptest::collection::btree_map(0u32..80, 1u8..16, 0..10),
            slot in 0u32..80,
            tiers in 0u8..16,
        ) {
            let holders: HolderSet = slots.iter().map(|(s, t)| Holder::new(*s, *t)).collect();
            let change = HolderChange { slot, tiers };
            let expected = reference(&holders, change);
            prop_assert_eq!(change.applied(&holders).collect::<Vec<_>>(), expected.clone());
            prop_assert!(change.gives(&holders, &expected));
            let mut in_place = holders.clone();
            change.apply(&mut in_place);
            prop_assert_eq!(in_place.to_vec(), expected.clone());
            // Any other set is not what the change gives.
            let mut other = expected.clone();
            match other.pop() {
                Some(_) => prop_assert!(!change.gives(&holders, &other)),
                None => prop_assert!(!change.gives(&holders, &[Holder::new(81, 1)])),
            }
        }
    }
}
