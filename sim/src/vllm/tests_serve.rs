//! The twin cluster in time: the router's choice as the front door makes it (prefix
//! affinity, load, the seeded tie-break), and times from the compute model.

use super::tests::{configs, BLOCK};
use super::*;
use crate::compute::table::BesideDecode;
use crate::compute::ComputeModel;
use kvtwin::ids::WorkerId;
use kvtwin::router::scheduler::SchedulerConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// 1 ms per prefilled token, 10 ms a decode step: times that are easy to add up.
fn linear() -> ComputeModel {
    ComputeModel::Linear {
        prefill_ns_per_token: 1_000_000,
        decode_ns_per_token: 10_000_000,
    }
}

fn cluster(engines: u64, num_gpu_blocks: u32) -> TwinCluster {
    let (scheduler, cache) = configs(2048, num_gpu_blocks);
    TwinCluster::new(TwinClusterConfig {
        workers: (1..=engines).map(WorkerId::new).collect(),
        scheduler,
        cache,
        connector: None,
        routing: SchedulerConfig::default(),
        compute: linear(),
        engine_compute: BTreeMap::new(),
        seed: 0,
    })
}

/// A request of `family`'s `shared` blocks, then `own` blocks of its own and `tail`
/// more tokens, arriving at `at_ms`, generating `outputs` tokens.
fn request(
    index: usize,
    at_ms: u64,
    family: u64,
    shared: u64,
    own: u64,
    outputs: u64,
) -> TwinRequest {
    let ids: Vec<u64> = (0..shared)
        .map(|b| family * 1000 + b)
        .chain((0..own).map(|b| 1_000_000 + index as u64 * 1000 + b))
        .collect();
    TwinRequest::from_hash_ids(
        index,
        Duration::from_millis(at_ms),
        &ids,
        (shared + own) * BLOCK,
        outputs,
        BLOCK,
    )
}

fn served(run: &TwinRun, index: usize) -> &TwinServed {
    run.served[index].as_ref().expect("served")
}

#[test]
fn a_lone_request_takes_its_prefill_then_one_decode_step_a_token() {
    let run = cluster(1, 65).serve(&[request(0, 0, 1, 4, 0, 3)], TwinArrivals::Open);
    let one = served(&run, 0);
    // 128 tokens prefilled at 1 ms each; the first token comes with that step.
    assert_eq!(one.ttft, Duration::from_millis(128));
    // Two more tokens, one 10 ms decode step each.
    assert_eq!(one.itl, Some(Duration::from_millis(10)));
    assert_eq!(one.e2e, Duration::from_millis(148));
    assert_eq!(run.steps, 3);
    assert_eq!(run.makespan, Duration::from_millis(148));
}

#[test]
fn a_shared_prefix_goes_back_to_the_engine_holding_it_and_is_found_cached() {
    // Far apart in time: each request is alone, so only the prefix decides.
    let requests: Vec<TwinRequest> = (0..6)
        .map(|i| request(i, i as u64 * 10_000, (i % 2) as u64, 8, 1, 2))
        .collect();
    let run = cluster(2, 65).serve(&requests, TwinArrivals::Open);
    for i in 2..6 {
        assert_eq!(
            served(&run, i).worker,
            served(&run, i % 2).worker,
            "request {i}"
        );
        assert_eq!(served(&run, i).overlap_blocks, 8, "request {i}");
        assert_eq!(served(&run, i).cached_tokens, 8 * BLOCK, "request {i}");
    }
    assert_eq!(served(&run, 0).cached_tokens, 0);
    // The second family found nothing of its own anywhere: the engine the first family
    // did not load is cheaper (its blocks count against the first engine only while its
    // request runs, and it ran alone, so the tie-break decided; both ways keep affinity).
    assert_eq!(run.requests_per_worker().values().sum::<u64>(), 6);
}

#[test]
fn simultaneous_fresh_prompts_spread_by_the_load_the_router_holds() {
    // Four fresh prompts at the same instant: each dispatch adds its blocks to its
    // engine's load, so the next goes to the other one.
    let requests: Vec<TwinRequest> = (0..4)
        .map(|i| request(i, 0, 10 + i as u64, 4, 0, 4))
        .collect();
    let run = cluster(2, 65).serve(&requests, TwinArrivals::Open);
    let counts = run.requests_per_worker();
    assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![2, 2]);
    // Each engine starts its first step on the first prompt it gets (128 ms); the
    // second joins its next step beside the first one's decode (128 + 10 ms).
    for i in 0..2 {
        assert_eq!(
            served(&run, i).ttft,
            Duration::from_millis(128),
            "request {i}"
        );
    }
    for i in 2..4 {
        assert_eq!(
            served(&run, i).ttft,
            Duration::from_millis(128 + 138),
            "request {i}"
        );
    }
}

#[test]
fn a_request_arriving_mid_step_waits_for_the_next_one() {
    let requests = vec![request(0, 0, 1, 4, 0, 2), request(1, 50, 2, 2, 0, 1)];
    let run = cluster(1, 65).serve(&requests, TwinArrivals::Open);
    // The first step (128 ms) is under way at 50 ms; the second request joins the next
    // step, beside the first request's decode: 64 ms of prefill and a 10 ms decode.
    assert_eq!(
        served(&run, 1).ttft,
        Duration::from_millis(128 - 50 + 64 + 10)
    );
}

#[test]
fn one_trace_gives_one_run() {
    let requests: Vec<TwinRequest> = (0..40)
        .map(|i| {
            request(
                i,
                (i as u64 * 37) % 400,
                (i % 5) as u64,
                6,
                (i % 3) as u64,
                8,
            )
        })
        .collect();
    let a = cluster(2, 33).serve(&requests, TwinArrivals::Open);
    let b = cluster(2, 33).serve(&requests, TwinArrivals::Open);
    assert_eq!(a, b);
    assert!(a.served.iter().all(Option::is_some));
}

#[test]
fn a_prompt_longer_than_the_cache_is_never_served_and_the_run_still_ends() {
    // First come first served: the prompt that can never fit holds the head of the
    // waiting queue, and the one behind it waits with it, as in vLLM's scheduler.
    let requests = vec![request(0, 0, 1, 40, 0, 2), request(1, 5, 2, 2, 0, 2)];
    let run = cluster(1, 17).serve(&requests, TwinArrivals::Open);
    assert_eq!(run.served, vec![None, None]);
    // On two engines the router sends the second one elsewhere (the first's blocks
    // count as load), where it is served.
    let run = cluster(2, 17).serve(&requests, TwinArrivals::Open);
    assert!(run.served[0].is_none());
    assert!(run.served[1].is_some());
}

#[test]
fn a_closed_loop_sends_each_next_request_when_an_answer_is_in() {
    // Two clients, four requests all dated 0: the third and fourth come only as the
    // first two end (each alone on an engine: 128 ms of prefill, one 10 ms decode).
    let requests: Vec<TwinRequest> = (0..4)
        .map(|i| request(i, 0, 20 + i as u64, 4, 0, 2))
        .collect();
    let closed = TwinArrivals::Closed {
        clients: 2,
        think: Duration::from_millis(1),
    };
    let run = cluster(2, 65).serve(&requests, closed);
    for i in 0..4 {
        // Each request finds an idle engine and waits for nobody.
        assert_eq!(
            served(&run, i).ttft,
            Duration::from_millis(128),
            "request {i}"
        );
        assert_eq!(
            served(&run, i).e2e,
            Duration::from_millis(138),
            "request {i}"
        );
    }
    // Two rounds of 138 ms and the 1 ms between them.
    assert_eq!(run.makespan, Duration::from_millis(138 + 1 + 138));
    // Open, all four come at once and two wait behind the others' steps.
    let open = cluster(2, 65).serve(&requests, TwinArrivals::Open);
    assert!(open
        .served
        .iter()
        .flatten()
        .any(|s| s.ttft > Duration::from_millis(128)));
}

/// A measured table (prefill 1 ms a token from 64 ms, decode 10 ms a step at any batch)
/// whose single steps strayed from its figures by `step_spread`.
fn measured(step_spread: Vec<f64>) -> ComputeModel {
    ComputeModel::Table(crate::compute::table::TableModel {
        name: "measured".into(),
        gpus: 1,
        kv_bytes_per_token: 0,
        max_kv_tokens: 0,
        prefill_isl: vec![64, 128],
        prefill_ms: vec![128.0, 192.0],
        decode: vec![crate::compute::table::DecodeCurve {
            context: 128,
            batch: vec![1, 4],
            ms: vec![10.0, 10.0],
        }],
        step_spread,
        request_overhead_ms: 0.0,
        request_overhead_busy_ms: 0.0,
        arrival_stretch_ms: 0.0,
        stalls: Vec::new(),
        prefill_beside_decode: Vec::new(),
    })
}

/// Two closed-loop clients on one engine, 40 alike requests, each request's ITL.
fn two_clients(compute: ComputeModel, seed: u64) -> (TwinRun, Vec<Duration>) {
    let run = closed_loop(compute, 2, 40, seed);
    let itls = run.served.iter().flatten().filter_map(|s| s.itl).collect();
    (run, itls)
}

#[test]
fn steps_drawn_from_the_measured_spread_pull_closed_loop_clients_out_of_phase() {
    // Without a spread the two clients stay in phase: every answer sees the same steps,
    // so there are at most a few distinct ITLs, and the run never changes with the seed.
    let (fixed, itls) = two_clients(measured(Vec::new()), 1);
    let mut distinct = itls.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() <= 3, "{distinct:?}");
    assert_eq!(two_clients(measured(Vec::new()), 2).0, fixed);
    // With one, every step takes 0.5 to 1.5 times its figure: ITLs spread out, each
    // within those bounds of the figures, the same seed gives the same run, another
    // seed another.
    let spread = || measured(vec![0.5, 1.0, 1.5]);
    let (varied, itls) = two_clients(spread(), 1);
    let mut distinct = itls.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() > 20, "{} distinct ITLs", distinct.len());
    assert_eq!(two_clients(spread(), 1).0, varied);
    assert_ne!(two_clients(spread(), 2).0, varied);
    assert!(varied.served.iter().all(Option::is_some));
    // A step's time stays between half and 1.5 times the slowest figure (a prefill of
    // the 32-token tail beside a decode: 64 + 32 + 10 = 106 ms).
    for itl in itls {
        assert!(itl >= Duration::from_millis(5), "{itl:?}");
        assert!(itl <= Duration::from_millis(159), "{itl:?}");
    }
}

/// [`measured`] with its prefills `overhead_ms` shorter and that time a request overhead
/// instead: the same lone request, less of it on the engine.
fn split(overhead_ms: f64) -> ComputeModel {
    let ComputeModel::Table(mut table) = measured(Vec::new()) else {
        unreachable!("measured is a table")
    };
    for ms in &mut table.prefill_ms {
        *ms -= overhead_ms;
    }
    table.request_overhead_ms = overhead_ms;
    ComputeModel::Table(table)
}

/// `clients` closed-loop clients on one engine, `requests` alike requests.
fn closed_loop(compute: ComputeModel, clients: usize, requests: usize, seed: u64) -> TwinRun {
    let (scheduler, cache) = configs(2048, 65);
    let twin = TwinCluster::new(TwinClusterConfig {
        workers: vec![WorkerId::new(1)],
        scheduler,
        cache,
        connector: None,
        routing: SchedulerConfig::default(),
        compute,
        engine_compute: BTreeMap::new(),
        seed,
    });
    let requests: Vec<TwinRequest> = (0..requests).map(|i| request(i, 0, 1, 4, 1, 8)).collect();
    twin.serve(
        &requests,
        TwinArrivals::Closed {
            clients,
            think: Duration::ZERO,
        },
    )
}

#[test]
fn a_request_overhead_delays_requests_on_their_way_but_not_their_engines_steps() {
    // One client: every request sees an idle engine; moving 40 ms of each prefill onto
    // the way there changes no TTFT and no end to end time.
    let whole = closed_loop(measured(Vec::new()), 1, 24, 1);
    let halves = closed_loop(split(40.0), 1, 24, 1);
    let ttfts = |run: &TwinRun| -> Vec<(Duration, Duration)> {
        run.served
            .iter()
            .flatten()
            .map(|s| (s.ttft, s.e2e))
            .collect()
    };
    assert_eq!(ttfts(&whole), ttfts(&halves));
    assert_eq!(whole.makespan, halves.makespan);
    assert!(ttfts(&halves)
        .iter()
        .all(|(ttft, _)| *ttft >= Duration::from_millis(40)));
    // Each reaches an idle engine 40 ms after it came and is scheduled at once: what is
    // left of its TTFT is its prefill, as without the overhead less those 40 ms.
    for (whole, halves) in whole
        .served
        .iter()
        .flatten()
        .zip(halves.served.iter().flatten())
    {
        assert_eq!(halves.scheduled, Duration::from_millis(40));
        assert_eq!(whole.scheduled, Duration::ZERO);
        assert_eq!(
            halves.ttft - halves.scheduled + Duration::from_millis(40),
            whole.ttft
        );
    }
    // Four clients: while one request is on its way the engine steps for the others,
    // so the same work ends sooner.
    let whole = closed_loop(measured(Vec::new()), 4, 24, 1);
    let halves = closed_loop(split(40.0), 4, 24, 1);
    assert!(
        halves.makespan < whole.makespan,
        "{:?} then {:?}",
        whole.makespan,
        halves.makespan
    );
    assert_eq!(halves.served.iter().flatten().count(), 24);
    // No overhead is the run as before, exactly.
    assert_eq!(closed_loop(split(0.0), 4, 24, 1), whole);
}

/// [`measured`] stalling `ms` on a `share` of its passes.
fn stalling(ms: f64, share: f64) -> ComputeModel {
    let ComputeModel::Table(mut table) = measured(Vec::new()) else {
        unreachable!("measured is a table")
    };
    table.stalls = vec![crate::compute::table::Stall { ms, share }];
    ComputeModel::Table(table)
}

#[test]
fn stalled_passes_lengthen_the_requests_they_befall_and_no_others() {
    let fixed = closed_loop(measured(Vec::new()), 1, 40, 1);
    let times = |run: &TwinRun| -> Vec<(Duration, Duration)> {
        run.served
            .iter()
            .flatten()
            .map(|s| (s.ttft, s.e2e))
            .collect()
    };
    // Every pass stalled 100 ms: each of a lone request's 8 passes (a prefill, then 7
    // decode steps) takes 100 ms more.
    let always = closed_loop(stalling(100.0, 1.0), 1, 40, 1);
    for ((ttft, e2e), (stalled_ttft, stalled_e2e)) in times(&fixed).into_iter().zip(times(&always))
    {
        assert_eq!(stalled_ttft, ttft + Duration::from_millis(100));
        assert_eq!(stalled_e2e, e2e + Duration::from_millis(800));
    }
    // One pass in ten: some requests stall, most do not, each by whole stalls; the same
    // seed gives the same run.
    let sometimes = closed_loop(stalling(100.0, 0.1), 1, 40, 1);
    let extra: Vec<u128> = times(&fixed)
        .into_iter()
        .zip(times(&sometimes))
        .map(|((_, e2e), (_, stalled))| (stalled - e2e).as_millis())
        .collect();
    assert!(extra.iter().all(|ms| ms % 100 == 0), "{extra:?}");
    let stalled = extra.iter().filter(|&&ms| ms > 0).count();
    assert!(
        (5..=35).contains(&stalled),
        "{stalled} of 40 stalled: {extra:?}"
    );
    assert_eq!(closed_loop(stalling(100.0, 0.1), 1, 40, 1), sometimes);
    // No stalls is the run as before, draw for draw.
    assert_eq!(
        closed_loop(stalling(100.0, 0.0), 1, 40, 1).served,
        fixed.served
    );
}

#[test]
fn a_busy_engine_slows_only_the_requests_that_come_while_it_steps() {
    let with_busy = |busy_ms: f64| {
        let ComputeModel::Table(mut table) = split(10.0) else {
            unreachable!("split is a table")
        };
        table.request_overhead_busy_ms = busy_ms;
        ComputeModel::Table(table)
    };
    // One client: every request finds its engine idle, so the busy figure never counts.
    assert_eq!(
        closed_loop(with_busy(30.0), 1, 24, 1),
        closed_loop(split(10.0), 1, 24, 1)
    );
    // Two: a request that comes while the other's steps run reaches the engine 20 ms
    // later than it would have reached an idle one (two clients in phase send theirs
    // together, to an engine that has just gone idle: about half come while it steps).
    let alone = closed_loop(split(10.0), 2, 24, 1);
    let busy = closed_loop(with_busy(30.0), 2, 24, 1);
    let ttfts =
        |run: &TwinRun| -> Vec<Duration> { run.served.iter().flatten().map(|s| s.ttft).collect() };
    assert_eq!(ttfts(&busy).len(), 24);
    let slower = ttfts(&alone)
        .iter()
        .zip(ttfts(&busy))
        .filter(|(alone, busy)| busy > *alone)
        .count();
    assert!(slower >= 8, "{slower} of 24 slower");
    assert!(busy.makespan > alone.makespan);
    // A busy figure under the overhead alone is the overhead alone.
    assert_eq!(closed_loop(with_busy(5.0), 2, 24, 1), alone);
}

/// One engine of 65 blocks under `table`, seed 0.
fn one_engine(table: crate::compute::table::TableModel) -> TwinCluster {
    let (scheduler, cache) = configs(2048, 65);
    TwinCluster::new(TwinClusterConfig {
        workers: vec![WorkerId::new(1)],
        scheduler,
        cache,
        connector: None,
        routing: SchedulerConfig::default(),
        compute: ComputeModel::Table(table),
        engine_compute: BTreeMap::new(),
        seed: 0,
    })
}

#[test]
fn a_request_coming_to_a_stepping_engine_lengthens_the_step_in_flight_by_the_stretch() {
    let stretched = |stretch_ms: f64| {
        let ComputeModel::Table(mut table) = measured(Vec::new()) else {
            unreachable!("measured is a table")
        };
        table.arrival_stretch_ms = stretch_ms;
        one_engine(table)
    };
    // The first comes to an idle engine: nothing to stretch.
    let first = [request(0, 0, 1, 0, 2, 3)];
    assert_eq!(
        stretched(7.0).serve(&first, TwinArrivals::Open),
        stretched(0.0).serve(&first, TwinArrivals::Open)
    );
    // The second comes 5 ms into the first's prefill: that pass ends 7 ms later, and
    // with it the first's first token and everything after.
    let both = [request(0, 0, 1, 0, 2, 3), request(1, 5, 2, 0, 2, 3)];
    let plain = stretched(0.0).serve(&both, TwinArrivals::Open);
    let slowed = stretched(7.0).serve(&both, TwinArrivals::Open);
    let ms = Duration::from_millis;
    assert_eq!(served(&slowed, 0).ttft, served(&plain, 0).ttft + ms(7));
    assert_eq!(served(&slowed, 0).e2e, served(&plain, 0).e2e + ms(7));
    assert_eq!(served(&slowed, 1).ttft, served(&plain, 1).ttft + ms(7));
    assert_eq!(slowed.makespan, plain.makespan + ms(7));
}

#[test]
fn an_engine_with_its_own_table_steps_at_its_own_speed() {
    let ComputeModel::Table(mut slow) = measured(Vec::new()) else {
        unreachable!("measured is a table")
    };
    for ms in &mut slow.prefill_ms {
        *ms *= 2.0;
    }
    let twin = |own: BTreeMap<WorkerId, ComputeModel>| {
        let (scheduler, cache) = configs(2048, 65);
        TwinCluster::new(TwinClusterConfig {
            workers: vec![WorkerId::new(1), WorkerId::new(2)],
            scheduler,
            cache,
            connector: None,
            routing: SchedulerConfig::default(),
            compute: measured(Vec::new()),
            engine_compute: own,
            seed: 0,
        })
    };
    // Two fresh prompts at once: the router's load sends one to each engine.
    let requests = [request(0, 0, 1, 0, 2, 3), request(1, 0, 2, 0, 2, 3)];
    let alike = twin(BTreeMap::new()).serve(&requests, TwinArrivals::Open);
    let apart = twin(BTreeMap::from([(
        WorkerId::new(2),
        ComputeModel::Table(slow),
    )]))
    .serve(&requests, TwinArrivals::Open);
    let on = |run: &TwinRun, worker: u64| {
        run.served
            .iter()
            .flatten()
            .find(|s| s.worker == WorkerId::new(worker))
            .expect("each engine serves one")
            .ttft
    };
    assert_eq!(on(&alike, 1), on(&alike, 2));
    assert_eq!(
        on(&apart, 1),
        on(&alike, 1),
        "engine 1 keeps the cluster's table"
    );
    // 64 tokens at 1 ms a token from 64 ms: 128 ms, and twice that on engine 2.
    assert_eq!(on(&alike, 2), Duration::from_millis(128));
    assert_eq!(on(&apart, 2), Duration::from_millis(256));
}

#[test]
fn a_request_reaches_a_busy_engine_after_the_overhead_measured_beside_as_many_requests() {
    let beside = |two_ms: f64| {
        let ComputeModel::Table(mut table) = measured(Vec::new()) else {
            unreachable!("measured is a table")
        };
        table.prefill_beside_decode = [(1, 10.0), (2, two_ms)]
            .into_iter()
            .map(|(decodes, overhead_ms)| BesideDecode {
                decodes,
                factor: 1.0,
                extra_ms: 0.0,
                overhead_ms,
            })
            .collect();
        one_engine(table)
    };
    // The first finds the engine idle; the second comes while it prefills the first
    // (one request held), the third long after, while it decodes both (two held).
    let requests = [
        request(0, 0, 1, 0, 2, 60),
        request(1, 10, 2, 0, 2, 60),
        request(2, 400, 3, 0, 2, 3),
    ];
    let flat = beside(10.0).serve(&requests, TwinArrivals::Open);
    let steep = beside(40.0).serve(&requests, TwinArrivals::Open);
    // Beside one, both tables say 10 ms: the first two are served alike up to the third.
    assert_eq!(served(&flat, 1).scheduled, served(&steep, 1).scheduled);
    assert_eq!(served(&flat, 1).ttft, served(&steep, 1).ttft);
    // Beside two, the steep one says 30 ms more: the third is scheduled that much later,
    // to the next step's start (10 ms decode steps).
    let later = served(&steep, 2).scheduled - served(&flat, 2).scheduled;
    assert!(
        (Duration::from_millis(30)..Duration::from_millis(40)).contains(&later),
        "{later:?}"
    );
}
