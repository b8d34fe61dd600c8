//! The front door's state: load in the choice, health, capacity, what is counted.

use super::*;
use crate::wire::WorkerEvent;
use kvtwin::tier::Tier;

fn stored(worker: u64, event_id: u64, parent: Option<u64>, blocks: &[(u64, u64)]) -> WorkerEvent {
    crate::wire::worker::stored_event(worker, event_id, parent, blocks, Tier::Device)
}

fn w(worker: u64) -> WorkerId {
    WorkerId::new(worker)
}

fn state_with_engines(engines: u64) -> RouterState {
    let mut state = RouterState::new(4);
    for worker in 1..=engines {
        state.add_engine(w(worker), &format!("http://127.0.0.1:{}", 8000 + worker));
        state.set_engine_health(w(worker), EngineHealth::Up);
    }
    state
}

fn served(prompt_tokens: u64, cached_tokens: u64) -> Outcome {
    Outcome::Served(Served {
        prompt_tokens,
        cached_tokens,
        generation_tokens: 8,
        ttft: Some(Duration::from_millis(40)),
        itl: vec![Duration::from_millis(20); 7],
        e2e: Duration::from_millis(200),
    })
}

#[test]
fn fresh_prompts_spread_over_engines_whose_caches_are_full() {
    let mut state = state_with_engines(2);
    // Both caches full of other prompts: no overlap for a fresh one anywhere.
    state.apply_batch(&[
        stored(1, 0, None, &[(0x11, 100), (0x12, 101)]),
        stored(2, 0, None, &[(0x21, 200), (0x22, 201), (0x23, 202)]),
    ]);
    let mut per_worker = BTreeMap::new();
    let mut running = Vec::new();
    for prompt in 0..20u64 {
        let query: Vec<LocalBlockHash> = (0..8)
            .map(|b| LocalBlockHash::new(1000 * prompt + b))
            .collect();
        let dispatch = state.dispatch(&query, 32, None, &[], None).unwrap();
        *per_worker.entry(dispatch.worker.worker.get()).or_insert(0) += 1;
        running.push(dispatch.request);
        // Four in flight at a time.
        if running.len() == 4 {
            let done = running.remove(0);
            state.finish_request(done, &served(32, 0));
        }
    }
    assert_eq!(per_worker.values().sum::<u32>(), 20);
    assert!(
        per_worker.values().all(|n| *n >= 7),
        "both engines take a share: {per_worker:?}"
    );
}

#[test]
fn overlap_wins_over_a_small_load_and_load_wins_over_a_small_overlap() {
    let mut state = state_with_engines(2);
    state.apply_batch(&[stored(1, 0, None, &[(0x11, 10), (0x12, 20), (0x13, 30)])]);
    let query: Vec<LocalBlockHash> = [10, 20, 30, 40].map(LocalBlockHash::new).to_vec();
    let first = state.dispatch(&query, 16, None, &[], None).unwrap();
    assert_eq!(first.worker.worker, w(1), "3 blocks cached there");
    assert_eq!(first.overlap_blocks, 3);
    // Worker 1 now runs 4 blocks: 1 left to prefill + 4 there against 4 + 0 on 2.
    let second = state.dispatch(&query, 16, None, &[], None).unwrap();
    assert_eq!(second.worker.worker, w(2));
    let summary = state.serving().engine(w(1)).unwrap();
    assert_eq!((summary.active_requests, summary.active_blocks), (1, 4));
}

#[test]
fn a_down_engine_takes_nothing_and_a_gone_one_loses_its_blocks_without_a_restart() {
    let mut state = state_with_engines(2);
    state.apply_batch(&[stored(1, 0, None, &[(0x11, 10), (0x12, 20)])]);
    let blocks = |state: &RouterState| {
        let row = state
            .workers()
            .into_iter()
            .find(|r| r.key.worker == w(1))
            .unwrap();
        (row.blocks, row.integrity.restarts)
    };
    // Down (timed out): not routed to, its cache as the router saw it kept.
    assert!(state.set_engine_health(
        w(1),
        EngineHealth::Down {
            reason: "timed out".into()
        }
    ));
    assert_eq!(blocks(&state), ([2, 0, 0, 0], 0));
    // Gone (its port refuses): its cache with it.
    state.mark_engine_gone(w(1), "connection refused".into());
    assert_eq!(
        blocks(&state),
        ([0; 4], 0),
        "cleared, and no restart counted"
    );
    for _ in 0..10 {
        let dispatch = state
            .dispatch(&[LocalBlockHash::new(10)], 8, None, &[], None)
            .unwrap();
        assert_eq!(dispatch.worker.worker, w(2));
        state.finish_request(dispatch.request, &served(8, 0));
    }
    assert!(state.readiness().is_ok());
    state.set_engine_health(
        w(2),
        EngineHealth::Down {
            reason: "timed out".into(),
        },
    );
    let error = state.dispatch(&[], 8, None, &[], None).unwrap_err();
    assert_eq!(error.reason(), "no_engine_up");
    assert!(error.to_string().contains("connection refused"), "{error}");
    let why = state.readiness().unwrap_err();
    assert!(why.contains("engine 1 down: connection refused"), "{why}");
    // Up again: routed to again.
    state.set_engine_health(w(1), EngineHealth::Up);
    assert_eq!(
        state
            .dispatch(&[], 8, None, &[], None)
            .unwrap()
            .worker
            .worker,
        w(1)
    );
}

#[test]
fn engines_already_tried_and_engines_without_the_model_are_left_out() {
    let mut state = state_with_engines(2);
    state.set_engine_models(w(1), vec!["base".into()], vec!["adapter-a".into()]);
    state.set_engine_models(w(2), vec!["base".into()], vec![]);
    assert!(state.is_adapter("adapter-a"));
    assert!(!state.is_adapter("base"));
    for _ in 0..5 {
        let dispatch = state
            .dispatch(&[], 8, Some("adapter-a"), &[], None)
            .unwrap();
        assert_eq!(dispatch.worker.worker, w(1));
        state.finish_request(dispatch.request, &served(8, 0));
    }
    let error = state
        .dispatch(&[], 8, Some("other"), &[], None)
        .unwrap_err();
    assert_eq!(error.reason(), "unknown_model");
    let retry = state.dispatch(&[], 8, Some("base"), &[w(1)], None).unwrap();
    assert_eq!(retry.worker.worker, w(2));
    let error = state
        .dispatch(&[], 8, None, &[w(1), w(2)], None)
        .unwrap_err();
    assert_eq!(error.reason(), "no_engine_up");
}

#[test]
fn the_inflight_bound_refuses_and_finishing_frees_the_load() {
    let mut state = state_with_engines(1);
    state.configure_serving(ServingConfig {
        max_inflight: 2,
        ..ServingConfig::default()
    });
    state.set_engine_health(w(1), EngineHealth::Up);
    let a = state.dispatch(&[], 64, None, &[], None).unwrap();
    let b = state.dispatch(&[], 64, None, &[], None).unwrap();
    assert_eq!(
        state.dispatch(&[], 64, None, &[], None).unwrap_err(),
        DispatchError::AtCapacity(2)
    );
    state.note_output(a.request, 5);
    assert_eq!(
        state.serving().engine(w(1)).unwrap().active_blocks,
        16 + 2 + 16
    );
    state.finish_request(a.request, &served(64, 32));
    state.finish_request(
        b.request,
        &Outcome::Failed {
            reason: "engine_error",
        },
    );
    // Twice is once.
    state.finish_request(b.request, &served(64, 0));
    let engine = state.serving().engine(w(1)).unwrap();
    assert_eq!((engine.active_requests, engine.active_blocks), (0, 0));
    assert_eq!(engine.stats.succeeded, 1);
    assert_eq!(engine.stats.failed_total(), 1);
    assert_eq!(engine.stats.cached_tokens, 32);
    assert_eq!(engine.stats.ttft.count(), 1);
    assert_eq!(engine.stats.itl.count(), 7);
    let totals = state.serving().totals();
    assert_eq!((totals.dispatched, totals.succeeded), (2, 1));
    assert_eq!(state.serving().inflight(), 0);
}

#[test]
fn an_engine_has_a_row_before_its_first_event_and_none_after_removal() {
    let mut state = state_with_engines(1);
    let rows = state.workers();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].key.worker, w(1));
    state.apply_batch(&[stored(1, 0, None, &[(0x11, 10)])]);
    assert!(state.remove_engine(w(1)));
    assert!(state.workers().is_empty());
    assert_eq!(state.indexer().pairs(), 0);
    assert!(!state.remove_engine(w(1)));
}

#[test]
fn the_prediction_leaves_the_last_token_to_compute_as_vllm_does() {
    // 16 blocks of a 512-token prompt held: vLLM recomputes the last block.
    assert_eq!(predicted_cached_tokens(16, 512, 32), 480);
    // A 552-token prompt: its 17 full blocks may all hit.
    assert_eq!(predicted_cached_tokens(17, 552, 32), 544);
    assert_eq!(predicted_cached_tokens(3, 552, 32), 96);
    assert_eq!(predicted_cached_tokens(1, 31, 32), 0);
    assert_eq!(predicted_cached_tokens(4, 0, 32), 0);
    assert_eq!(predicted_cached_tokens(4, 100, 0), 0);
}
