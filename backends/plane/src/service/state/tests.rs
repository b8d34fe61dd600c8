//! RouterState tests: routing, counting by reason and per rank, restarts, the budget.

use super::*;
use kvtwin::tokens::compute_local_hashes;

fn stored(worker: u64, event_id: u64, parent: Option<u64>, blocks: &[(u64, u64)]) -> WorkerEvent {
    crate::wire::worker::stored_event(worker, event_id, parent, blocks, Tier::Device)
}

#[test]
fn routes_to_the_longest_overlap_whatever_the_engine_hashes() {
    let mut state = RouterState::new(4);
    // Worker 1 holds tokens-hashes 10, 20, 30; worker 2 holds 10, 20 under other
    // engine hashes.
    assert_eq!(
        state.apply_batch(&[
            stored(1, 0, None, &[(0x11, 10), (0x12, 20), (0x13, 30)]),
            stored(2, 0, None, &[(0x21, 10)]),
            stored(2, 1, Some(0x21), &[(0x22, 20)]),
        ]),
        3
    );
    let query: Vec<LocalBlockHash> = [10, 20, 30, 40].map(LocalBlockHash::new).to_vec();
    let answer = state.route(&query);
    assert_eq!(answer.worker.map(|w| w.worker), Some(WorkerId::new(1)));
    let scores: Vec<(u64, u32)> = answer
        .overlaps
        .iter()
        .map(|o| (o.worker.worker.get(), o.blocks))
        .collect();
    assert_eq!(scores, [(1, 3), (2, 2)]);
    // No overlap: the worker with the fewest cached blocks.
    let answer = state.route(&[LocalBlockHash::new(99)]);
    assert_eq!(answer.worker.map(|w| w.worker), Some(WorkerId::new(2)));
}

#[test]
fn refused_events_are_counted_by_reason_and_the_rest_applied() {
    let mut state = RouterState::new(4);
    let applied = state.apply_batch(&[
        stored(1, 0, Some(0xdead), &[(0x1, 1)]),
        stored(1, 1, None, &[(0x2, 2)]),
    ]);
    assert_eq!(applied, 1);
    assert_eq!(state.metrics().dropped().get("unknown_parent"), Some(&1));
    assert_eq!(state.workers()[0].blocks, [1, 0, 0, 0]);
    assert_eq!(state.workers()[0].last_event_id, Some(1));
    state.restart_worker(WorkerId::new(1));
    // Cleared, but the row stays to say it restarted.
    let rows = state.workers();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].blocks, [0; 4]);
    assert_eq!(rows[0].last_event_id, None);
    assert_eq!(rows[0].integrity.restarts, 1);
    assert_eq!(rows[0].integrity.dropped, 1);
    assert_eq!(state.indexer().pairs(), 0);
    assert!(state
        .render_metrics()
        .contains("kvtwin_router_engine_restarts_total 1\n"));
}

#[test]
fn a_restarted_rank_is_cleared_and_the_other_ranks_kept() {
    let mut state = RouterState::new(4);
    let ranked = |dp_rank, engine| WorkerEvent {
        dp_rank,
        ..stored(1, 0, None, &[(engine, 10)])
    };
    state.apply_batch(&[ranked(0, 0xa), ranked(1, 0xb)]);
    assert_eq!(state.indexer().pairs(), 2);
    state.restart_ranks(WorkerId::new(1), &[1]);
    let restarts: Vec<(u32, u64, u64)> = state
        .workers()
        .iter()
        .map(|w| (w.key.dp_rank, w.blocks[0], w.integrity.restarts))
        .collect();
    assert_eq!(restarts, [(0, 1, 0), (1, 0, 1)]);
    assert_eq!(state.indexer().pairs(), 1);
    // The new run's first event follows the clear without an id gap.
    state.apply_batch(&[ranked(1, 0xc)]);
    assert_eq!(state.indexer().stats().event_id_gaps, 0);
    let rank1 = state.workers()[1].integrity;
    assert_eq!((rank1.gaps, rank1.out_of_order, rank1.events), (0, 0, 2));
    assert_eq!(state.metrics().restarts, 1);
}

#[test]
fn a_budget_bounds_the_index_and_the_engine_hashes_and_counts_per_rank() {
    let limits = RouterLimits {
        budget: IndexBudget {
            max_blocks_per_worker: Some(8),
            ..IndexBudget::UNBOUNDED
        },
        worker_capacity_blocks: Some(100),
        max_worker_ranks: 2,
    };
    let mut state = RouterState::with_limits(4, limits);
    // One flooding rank: 3,000 fresh single-block chains, no removals.
    let events: Vec<WorkerEvent> = (0..3000)
        .map(|i| stored(1, i, None, &[(0x1000 + i, 10_000 + i)]))
        .collect();
    state.apply_batch(&events);
    let row = &state.workers()[0];
    assert_eq!(row.indexed_blocks, 8);
    assert_eq!(row.evictions.evicted_blocks, 2992);
    assert_eq!(row.blocks, [3000, 0, 0, 0]);
    assert_eq!(row.over_declared, Some(true));
    assert!(state.indexer().distinct_blocks() <= 8);
    // Swept down to twice the indexed blocks plus the slack, at most.
    let hashes = state.workers.values().next().unwrap().hashes.len();
    assert!(
        hashes <= 2 * 8 + SWEEP_SLACK + 1,
        "{hashes} engine hashes kept"
    );
    // Removing evicted blocks and storing under one are no drops.
    state.apply_batch(&[WorkerEvent {
        event_id: 3000,
        data: crate::wire::WorkerEventData::Removed {
            hashes: vec![0x1000, 0x1001],
            tier: Tier::Device,
        },
        ..stored(1, 0, None, &[])
    }]);
    state.apply_batch(&[stored(1, 3001, Some(0x1002), &[(0x9, 9)])]);
    let row = &state.workers()[0];
    assert_eq!(row.integrity.dropped, 0);
    assert_eq!(row.evictions.evicted_removals, 2);
    assert_eq!(row.evictions.stored_under_evicted, 1);
    assert_eq!(row.blocks, [2998, 0, 0, 0]);
    // Ranks past the limit are dropped, by reason.
    state.apply_batch(&[
        stored(2, 0, None, &[(0x1, 1)]),
        stored(3, 0, None, &[(0x1, 1)]),
    ]);
    assert_eq!(state.workers().len(), 2);
    assert_eq!(
        state.metrics().dropped().get("too_many_worker_ranks"),
        Some(&1)
    );
    let text = state.render_metrics();
    assert!(
        text.contains("kvtwin_router_evicted_blocks_total{worker_id=\"1\",dp_rank=\"0\"} 2992\n")
    );
    assert!(text.contains("# TYPE kvtwin_router_evicted_blocks counter\n"));
    assert!(text.contains("kvtwin_router_worker_over_declared{worker_id=\"1\",dp_rank=\"0\"} 1\n"));
    // A restart keeps the rank's eviction counts.
    state.restart_worker(WorkerId::new(1));
    assert_eq!(state.workers()[0].evictions.evicted_blocks, 2992);
    assert_eq!(state.workers()[0].indexed_blocks, 0);
}

#[test]
fn queries_of_tokens_hash_full_blocks_only() {
    let state = RouterState::new(4);
    assert_eq!(state.hash_tokens(&[1, 2, 3, 4, 5, 6]).len(), 1);
    assert_eq!(
        state.hash_tokens(&[1, 2, 3, 4]),
        compute_local_hashes(&[1, 2, 3, 4], 4, HashSeed::new(DEFAULT_HASH_SEED))
    );
}

#[test]
fn the_apply_observer_sees_each_event_applied_whole_and_no_other() {
    let mut state = RouterState::new(4);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let previous = state.set_apply_observer(Some(Box::new(move |event: &WorkerEvent| {
        record.lock().unwrap().push(event.event_id);
    })));
    assert!(previous.is_none());
    state.apply_batch(&[
        stored(1, 0, None, &[(0x1, 1)]),
        stored(1, 1, Some(0xdead), &[(0x2, 2)]),
        stored(1, 2, Some(0x1), &[(0x3, 3)]),
    ]);
    assert_eq!(*seen.lock().unwrap(), [0, 2]);
    assert!(state.set_apply_observer(None).is_some());
    state.apply_batch(&[stored(1, 3, Some(0x3), &[(0x4, 4)])]);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn event_id_gaps_and_out_of_order_ids_are_counted_per_rank_as_occurrences() {
    let mut state = RouterState::new(4);
    state.apply_batch(&[
        stored(1, 0, None, &[(0x1, 1)]),
        stored(1, 1, Some(0x1), &[(0x2, 2)]),
        // Ids 2 to 4 missing: one gap.
        stored(1, 5, Some(0x2), &[(0x3, 3)]),
        // Back to 3: out of order (applied anyway).
        stored(1, 3, Some(0x3), &[(0x4, 4)]),
        // 6 follows the highest seen (5).
        stored(1, 6, Some(0x4), &[(0x5, 5)]),
        stored(2, 10, None, &[(0x9, 9)]),
    ]);
    let rows = state.workers();
    let one = rows[0].integrity;
    assert_eq!((one.events, one.gaps, one.out_of_order), (5, 1, 1));
    assert_eq!(rows[0].last_event_id, Some(6));
    // A rank's first event is no gap, whatever its id.
    assert_eq!(rows[1].integrity.gaps, 0);
}

#[test]
fn sources_attribute_what_they_see_and_the_global_counts_follow() {
    let mut state = RouterState::new(4);
    let one = WorkerId::new(1);
    state.apply_batch(&[WorkerEvent {
        dp_rank: 2,
        ..stored(1, 0, None, &[(0x1, 1)])
    }]);
    state.note_gaps(one, 2);
    state.note_lost(one, 3);
    state.drop_for(one, "block_size_mismatch");
    state.drop_for(one, "malformed_msgpack");
    state.note_reconnects(&[one, WorkerId::new(7)], 1);
    state.note_replayed(4);
    let rows = state.workers();
    // Worker 1's only rank is 2; worker 7, never seen, gets rank 0.
    let keys: Vec<(u64, u32)> = rows
        .iter()
        .map(|w| (w.key.worker.get(), w.key.dp_rank))
        .collect();
    assert_eq!(keys, [(1, 2), (7, 0)]);
    let integrity = rows[0].integrity;
    assert_eq!(
        (
            integrity.gaps,
            integrity.lost_batches,
            integrity.block_size_mismatches,
            integrity.dropped,
            integrity.reconnects
        ),
        (2, 3, 1, 2, 1)
    );
    assert_eq!(rows[1].integrity.reconnects, 1);
    let metrics = state.metrics();
    assert_eq!(
        (
            metrics.gaps,
            metrics.lost_batches,
            metrics.dropped_total(),
            metrics.reconnects,
            metrics.replayed
        ),
        (2, 3, 2, 1, 4)
    );
    // A restart clears the blocks and keeps the counts.
    let before = state.change_seq();
    state.restart_worker(one);
    assert!(state.change_seq() > before);
    let after = state.workers()[0].integrity;
    assert_eq!(after.restarts, 1);
    assert_eq!(after.gaps, 2);
    assert_eq!(state.workers_changed_since(before).len(), 1);
}
