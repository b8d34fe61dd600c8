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
use kvtwin::router::Router;
use kvtwin::tier::Tier;
use std::collections::{BTreeMap, BTreeSet};

/// Whether the router's view of each worker is that worker's pools: it lists no block
/// the worker does not hold (in exactly the tiers it holds it), and every block a prefix
/// lookup can reach on the worker (its whole prefix held, in some tier). A block whose
/// prefix left the worker may be missing from a view rebuilt from a snapshot: no query
/// could use it. Without faults the view is the pools exactly. A worker that is down (or
/// gone) must have no view at all.
pub fn router_view_matches_pools(cluster: &Cluster<'_>) -> bool {
    cluster
        .workers()
        .all(|worker| worker_view_matches_pools(cluster.router(), &worker))
}

fn worker_view_matches_pools(router: &Router, worker: &WorkerView<'_>) -> bool {
    let view = router.indexer().blocks_of(worker.key);
    if !worker.serving {
        return view.is_empty();
    }
    let pools = registered_tiers(worker.manager);
    let reachable: BTreeSet<SequenceHash> = worker
        .manager
        .reachable_blocks()
        .into_iter()
        .map(|(identity, _)| identity.sequence_hash)
        .collect();
    view.iter()
        .all(|(hash, tiers)| pools.get(hash) == Some(tiers))
        && reachable
            .iter()
            .all(|hash| view.get(hash) == pools.get(hash))
}

/// Every registered block of `manager`'s pools, with the tiers holding it as a bit set
/// (bit `Tier::index`), as the router's indexer keeps them.
fn registered_tiers<H: Hardware>(manager: &Manager<H>) -> BTreeMap<SequenceHash, u8> {
    let mut pools: BTreeMap<SequenceHash, u8> = BTreeMap::new();
    for tier in Tier::ALL {
        if let Some(pool) = manager.pool(tier) {
            for hash in pool.snapshot().registered.into_keys() {
                *pools.entry(hash).or_default() |= 1 << tier.index();
            }
        }
    }
    pools
}

/// Whether replaying each worker's events rebuilt every tier's registry: no block the
/// pools lack, and every block a prefix lookup can reach (exactly the pools' blocks,
/// unless a snapshot left out some that none can reach; see
/// `Manager::publish_snapshot`).
pub fn rebuild_matches_pools(cluster: &Cluster<'_>) -> bool {
    cluster.workers().all(|worker| {
        let reachable: BTreeSet<(SequenceHash, Tier)> = worker
            .manager
            .reachable_blocks()
            .into_iter()
            .map(|(identity, tier)| (identity.sequence_hash, tier))
            .collect();
        Tier::ALL.iter().all(|tier| {
            let replica = worker.replica.hashes(*tier);
            match worker.manager.pool(*tier) {
                Some(pool) => {
                    let pools: BTreeSet<SequenceHash> =
                        pool.snapshot().registered.into_keys().collect();
                    replica.is_subset(&pools)
                        && pools
                            .difference(&replica)
                            .all(|hash| !reachable.contains(&(*hash, *tier)))
                }
                None => replica.is_empty(),
            }
        })
    })
}
