//! Checkers of a simulated cluster, outside the system they check (as TigerBeetle keeps
//! its state checker): they read a [`Cluster`] through its public view and say whether
//! what must hold does.
//!
//! Owns: the end-of-run checks every report carries ([`router_view_matches_pools`],
//! [`rebuild_matches_pools`]), callable at any instant of a run too.
//! Never: change the cluster, or be needed for it to run.

use crate::cluster::Cluster;
use crate::ledger::{EventLedger, TierFingerprint};
use kvtwin::events::RegistryReplica;
use kvtwin::hardware::Hardware;
use kvtwin::ids::SequenceHash;
use kvtwin::manager::Manager;
use kvtwin::tier::Tier;
use rustc_hash::FxHashMap;

/// Whether the router's view of each worker is that worker's pools: it lists no block
/// the worker does not hold (in exactly the tiers it holds it), and every block a prefix
/// lookup can reach on the worker (its whole prefix held, in some tier). A block whose
/// prefix left the worker may be missing from a view rebuilt from a snapshot: no query
/// could use it. Without faults the view is the pools exactly. A worker that is down (or
/// gone) must have no view at all.
pub fn router_view_matches_pools(cluster: &Cluster<'_>) -> bool {
    end_of_run_checks(cluster).1
}

/// Whether replaying each worker's events rebuilt every tier's registry: no block the
/// pools lack, and every block a prefix lookup can reach (exactly the pools' blocks,
/// unless a snapshot left out some that none can reach; see
/// `Manager::publish_snapshot`).
pub fn rebuild_matches_pools(cluster: &Cluster<'_>) -> bool {
    end_of_run_checks(cluster).0
}

/// Both end-of-run checks, [`rebuild_matches_pools`] and [`router_view_matches_pools`]
/// in that order, reading each worker's pools once and every view in one walk of the
/// index: these checks end every report, and they were a tenth of a simulation
/// (issue 33).
pub fn end_of_run_checks(cluster: &Cluster<'_>) -> (bool, bool) {
    let mut views = cluster.router().indexer().blocks_by_worker();
    let (mut rebuilt, mut viewed) = (true, true);
    for worker in cluster.workers() {
        let view = views.remove(&worker.key).unwrap_or_default();
        let held = HeldBlocks::of(worker.manager);
        rebuilt = rebuilt && rebuild_matches(worker.ledger, &held);
        viewed = viewed
            && if worker.serving {
                view_matches(&view, &held)
            } else {
                view.is_empty()
            };
    }
    (rebuilt, viewed)
}

/// A registered block of a worker's pools, as the checks see it.
struct Held {
    /// The tiers holding it, as a bit set (bit `Tier::index`), as the router's indexer
    /// keeps them.
    tiers: u8,
    parent: Option<SequenceHash>,
    /// Whether a prefix lookup can reach it (its whole prefix is held, in some tier);
    /// `None` until worked out.
    reachable: Option<bool>,
}

/// Every registered block of one worker's pools, by hash. Only looked up and counted,
/// never listed: its order is the hash map's and must not reach a report.
struct HeldBlocks {
    blocks: FxHashMap<SequenceHash, Held>,
    /// How many of them are reachable.
    reachable: usize,
}

impl HeldBlocks {
    fn of<H: Hardware>(manager: &Manager<H>) -> Self {
        let mut blocks: FxHashMap<SequenceHash, Held> = FxHashMap::default();
        for tier in Tier::ALL {
            if let Some(pool) = manager.pool(tier) {
                pool.visit_registered(|identity| {
                    let held = blocks.entry(identity.sequence_hash).or_insert(Held {
                        tiers: 0,
                        parent: identity.parent,
                        reachable: None,
                    });
                    held.tiers |= 1 << tier.index();
                });
            }
        }
        // A block is reachable when it has no parent or a held, reachable one. Walk up
        // from each block to a root, a parent not held or a block already worked out;
        // every block walked shares that answer. Each block is walked once.
        let hashes: Vec<SequenceHash> = blocks.keys().copied().collect();
        let mut walked: Vec<SequenceHash> = Vec::new();
        let mut reachable = 0;
        for hash in hashes {
            let mut next = Some(hash);
            let answer = loop {
                let Some(h) = next else { break true };
                let Some(held) = blocks.get(&h) else {
                    break false;
                };
                if let Some(known) = held.reachable {
                    break known;
                }
                if walked.len() > blocks.len() {
                    // A parent loop: no chain of hashes makes one, but never spin.
                    break false;
                }
                walked.push(h);
                next = held.parent;
            };
            for h in walked.drain(..) {
                if let Some(held) = blocks.get_mut(&h) {
                    held.reachable = Some(answer);
                }
                reachable += usize::from(answer);
            }
        }
        Self { blocks, reachable }
    }
}

impl Held {
    fn is_reachable(&self) -> bool {
        self.reachable == Some(true)
    }
}

/// `view`: the router's blocks of one worker, sorted by hash. Every block it lists is
/// held in exactly those tiers, and it lists every reachable block.
fn view_matches(view: &[(SequenceHash, u8)], held: &HeldBlocks) -> bool {
    let mut reachable_listed = 0;
    for (i, (hash, tiers)) in view.iter().enumerate() {
        if i > 0 && view[i - 1].0 == *hash {
            return false;
        }
        match held.blocks.get(hash) {
            Some(block) if block.tiers == *tiers => {
                reachable_listed += usize::from(block.is_reachable());
            }
            _ => return false,
        }
    }
    reachable_listed == held.reachable
}

/// The ledger's blocks are the pools': as fingerprints (no snapshot yet), the multiset
/// of each tier is the set the pools register there; as a replica, every hash of it is
/// held in its tier, and every reachable block is in it, in each of its tiers.
fn rebuild_matches(ledger: &EventLedger, held: &HeldBlocks) -> bool {
    match ledger {
        EventLedger::Fingerprint(tiers) => {
            let mut pools = [TierFingerprint::default(); Tier::ALL.len()];
            for (hash, block) in &held.blocks {
                for tier in Tier::ALL {
                    if block.tiers & (1 << tier.index()) != 0 {
                        pools[tier.index()].add(*hash);
                    }
                }
            }
            *tiers == pools
        }
        EventLedger::Replica(replica) => replica_matches(replica, held),
    }
}

/// Every hash of the replica is held in its tier, and every reachable block is in the
/// replica, in each of its tiers.
fn replica_matches(replica: &RegistryReplica, held: &HeldBlocks) -> bool {
    let mut in_both = [0usize; Tier::ALL.len()];
    for (hash, block) in &held.blocks {
        for tier in Tier::ALL {
            if block.tiers & (1 << tier.index()) == 0 {
                continue;
            }
            if replica.contains(tier, *hash) {
                in_both[tier.index()] += 1;
            } else if block.is_reachable() {
                return false;
            }
        }
    }
    Tier::ALL
        .iter()
        .all(|tier| in_both[tier.index()] == replica.count(*tier))
}
