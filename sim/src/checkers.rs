//! Checkers of a simulated cluster, outside the system they check (as TigerBeetle keeps
//! its state checker): they read a [`Cluster`] through its public view and say whether
//! what must hold does.
//!
//! Owns: the end-of-run checks every report carries ([`router_view_matches_pools`],
//! [`rebuild_matches_pools`]), callable at any instant of a run too.
//! Never: change the cluster, or be needed for it to run.

use crate::cluster::{Cluster, WorkerView};
use kvtwin::hardware::Hardware;
use kvtwin::ids::SequenceHash;
use kvtwin::manager::Manager;
use kvtwin::tier::Tier;

/// Whether the router's view of each worker is that worker's pools: it lists no block
/// the worker does not hold (in exactly the tiers it holds it), and every block a prefix
/// lookup can reach on the worker (its whole prefix held, in some tier). A block whose
/// prefix left the worker may be missing from a view rebuilt from a snapshot: no query
/// could use it. Without faults the view is the pools exactly. A worker that is down (or
/// gone) must have no view at all.
pub fn router_view_matches_pools(cluster: &Cluster<'_>) -> bool {
    // Every view in one walk of the index; sorted vectors and binary searches: these
    // checks end every report, and they were a tenth of a simulation (issue 33).
    let mut views = cluster.router().indexer().blocks_by_worker();
    cluster.workers().all(|worker| {
        let view = views.remove(&worker.key).unwrap_or_default();
        worker_view_matches_pools(&view, &worker)
    })
}

/// `view`: the router's blocks of `worker`, sorted by hash.
fn worker_view_matches_pools(view: &[(SequenceHash, u8)], worker: &WorkerView<'_>) -> bool {
    if !worker.serving {
        return view.is_empty();
    }
    let pools = registered_tiers(worker.manager);
    let tiers_in = |of: &[(SequenceHash, u8)], hash: SequenceHash| {
        of.binary_search_by_key(&hash, |(h, _)| *h)
            .ok()
            .map(|i| of[i].1)
    };
    view.iter()
        .all(|(hash, tiers)| tiers_in(&pools, *hash) == Some(*tiers))
        && worker
            .manager
            .reachable_blocks()
            .iter()
            .all(|(identity, _)| {
                let hash = identity.sequence_hash;
                tiers_in(view, hash) == tiers_in(&pools, hash)
            })
}

/// Every registered block of `manager`'s pools, with the tiers holding it as a bit set
/// (bit `Tier::index`), as the router's indexer keeps them; sorted by hash.
fn registered_tiers<H: Hardware>(manager: &Manager<H>) -> Vec<(SequenceHash, u8)> {
    let mut held: Vec<(SequenceHash, u8)> = Vec::new();
    for tier in Tier::ALL {
        if let Some(pool) = manager.pool(tier) {
            held.extend(
                pool.registered_identities()
                    .into_iter()
                    .map(|identity| (identity.sequence_hash, 1 << tier.index())),
            );
        }
    }
    held.sort_unstable();
    let mut merged: Vec<(SequenceHash, u8)> = Vec::with_capacity(held.len());
    for (hash, bit) in held {
        match merged.last_mut() {
            Some((last, tiers)) if *last == hash => *tiers |= bit,
            _ => merged.push((hash, bit)),
        }
    }
    merged
}

/// Whether replaying each worker's events rebuilt every tier's registry: no block the
/// pools lack, and every block a prefix lookup can reach (exactly the pools' blocks,
/// unless a snapshot left out some that none can reach; see
/// `Manager::publish_snapshot`).
pub fn rebuild_matches_pools(cluster: &Cluster<'_>) -> bool {
    cluster.workers().all(|worker| {
        let mut reachable: Vec<(SequenceHash, Tier)> = worker
            .manager
            .reachable_blocks()
            .into_iter()
            .map(|(identity, tier)| (identity.sequence_hash, tier))
            .collect();
        reachable.sort_unstable();
        Tier::ALL.iter().all(|tier| {
            let replica = &worker.replica;
            match worker.manager.pool(*tier) {
                Some(pool) => {
                    let mut in_both = 0;
                    let mut missing_are_unreachable = true;
                    for identity in pool.registered_identities() {
                        let hash = identity.sequence_hash;
                        if replica.contains(*tier, hash) {
                            in_both += 1;
                        } else if reachable.binary_search(&(hash, *tier)).is_ok() {
                            missing_are_unreachable = false;
                        }
                    }
                    // Every hash of the replica is one of the pool's.
                    in_both == replica.count(*tier) && missing_are_unreachable
                }
                None => replica.count(*tier) == 0,
            }
        })
    })
}
