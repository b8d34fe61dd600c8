//! `kvtwin bench serve`'s library against mock engines (`frontend::mock`) behind a router
//! (as in `frontend.rs`) or alone, over real sockets: every request is counted once, the
//! hit ratio is what the engines reported (the router sums the same usage), requests per
//! worker are what each engine received, a trace's shared prefixes hit, and failures are
//! counted by reason (an engine's 500, a hang past the deadline, a closed port, a
//! router's token).

use kvtwin::ids::WorkerId;
use kvtwin_plane::bench::serve::{
    run_serve_bench, Arrivals, RequestRecord, ServeConfig, ServeError, ServeReport, Synthetic,
    TraceReplay, Workload,
};
use kvtwin_plane::service::auth::{Access, AuthToken};
use kvtwin_plane::service::frontend::engine_client::EngineTimeouts;
use kvtwin_plane::service::frontend::health::HealthConfig;
use kvtwin_plane::service::frontend::mock::{Fault, MockConfig, MockEngine};
use kvtwin_plane::service::frontend::{Frontend, FrontendConfig};
use kvtwin_plane::service::http::{self, lock, SharedState, Transport};
use kvtwin_plane::service::state::RouterState;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BLOCK: usize = 32;

/// A router fronting mock engines on its own runtime; stops when dropped.
struct Router {
    addr: SocketAddr,
    state: SharedState,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Router {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn router(engines: &[(u64, &MockEngine)], access: Access) -> Router {
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK)));
    let config = FrontendConfig {
        timeouts: EngineTimeouts {
            first_byte: Duration::from_secs(2),
            idle: Duration::from_secs(2),
            ..EngineTimeouts::default()
        },
        health: HealthConfig {
            period: Duration::from_millis(200),
            ..HealthConfig::default()
        },
        ..FrontendConfig::default()
    };
    let frontend = Frontend::new(state.clone(), config, None, None);
    for (id, engine) in engines {
        let events = engine.events();
        frontend
            .add_engine(
                WorkerId::new(*id),
                &engine.url(),
                events
                    .as_ref()
                    .map(|(live, replay)| (live.as_str(), Some(replay.as_str()))),
            )
            .unwrap();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = http::app_full(state.clone(), access, Some(frontend.clone()));
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let (stop_checks, checks_stopped) = tokio::sync::oneshot::channel::<()>();
            let health = tokio::spawn(frontend.run_health_checks(async {
                let _ = checks_stopped.await;
            }));
            let _ = http::serve_app(listener, app, Transport::Plain, async {
                let _ = stopped.await;
            })
            .await;
            let _ = stop_checks.send(());
            let _ = health.await;
        });
    });
    let router = Router {
        addr,
        state,
        _stop: stop,
    };
    let start = Instant::now();
    while lock(&router.state).serving().engines_up() < engines.len() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "engines never up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    router
}

fn engine() -> MockEngine {
    MockEngine::start(MockConfig::default()).unwrap()
}

fn synthetic(requests: u64, arrivals: Arrivals) -> Workload {
    Workload::Synthetic(Synthetic {
        requests,
        prefixes: 3,
        prefix_tokens: 64,
        suffix_tokens: 40,
        max_tokens: 4,
        arrivals,
    })
}

fn config(url: String, workload: Workload) -> ServeConfig {
    ServeConfig {
        url,
        model: None,
        token: None,
        stream: true,
        concurrency: 4,
        timeout: Duration::from_secs(10),
        pinned: None,
        seed: 3,
        workload,
    }
}

/// Runs `config` on a runtime of its own; the report and every record handed over.
fn bench(config: &ServeConfig) -> Result<(ServeReport, Vec<RequestRecord>), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut records = Vec::new();
    let report = runtime.block_on(run_serve_bench(config, &mut |record| {
        records.push(record.clone());
        Ok(())
    }))?;
    Ok((report, records))
}

#[test]
fn shared_prefixes_through_the_router_count_hits_and_workers_as_the_engines_report() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], Access::default());
    let (report, records) = bench(&config(router.url(), synthetic(24, Arrivals::Closed))).unwrap();
    let json = report.to_json();
    assert_eq!(json["model"], "tiny", "found in /v1/models");
    assert_eq!((report.requests, report.succeeded), (24, 24), "{json}");
    assert_eq!(report.failed_total(), 0, "{json}");
    let mut indices: Vec<u64> = records.iter().map(|r| r.index).collect();
    indices.sort_unstable();
    assert_eq!(
        indices,
        (0..24).collect::<Vec<_>>(),
        "one record per request"
    );
    // Each engine received what the router says it served.
    let received: BTreeMap<u64, u64> = [(1, one.requests().len()), (2, two.requests().len())]
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(worker, count)| (worker, count as u64))
        .collect();
    assert_eq!(report.workers, received, "{json}");
    assert_eq!(report.without_worker, 0);
    // The engines' usage, as the router summed it, is the bench's.
    let totals = lock(&router.state).serving().totals().clone();
    assert_eq!(report.prompt_tokens, 24 * 104);
    assert_eq!(report.prompt_tokens, totals.prompt_tokens);
    assert_eq!(report.cached_tokens, totals.cached_tokens, "{json}");
    assert_eq!(report.requests_with_cached, 24);
    // Three prefixes of two blocks: each misses at most once per engine and in the
    // first wave of four; every other request finds its two blocks.
    assert!(report.cached_tokens >= 64 * 12, "{json}");
    assert!(records
        .iter()
        .all(|r| r.cached_tokens.is_some_and(|c| c % 32 == 0 && c <= 64)));
    let ratio = report.hit_ratio().unwrap();
    assert_eq!(ratio, report.cached_tokens as f64 / (24.0 * 104.0));
    assert_eq!(json["hit_ratio"], ratio);
    // Streamed: a first token each, three gaps each, usage's output tokens.
    assert_eq!(report.ttft.samples, 24);
    assert_eq!(report.itl.samples, 72);
    assert_eq!(report.output_tokens, 96);
    assert!(report.ttft.p50 <= report.e2e.p50);
    for field in ["ttft_ms", "itl_ms", "e2e_ms"] {
        let summary = &json[field];
        assert!(summary["p50"].as_f64().unwrap() > 0.0, "{field}: {json}");
        assert!(summary["p50"].as_f64() <= summary["p99"].as_f64(), "{json}");
    }
    assert!(json["requests_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    // The --out line of a request.
    let line = records[0].to_json();
    assert_eq!(line["outcome"], "ok");
    assert_eq!(line["status"], 200);
    assert_eq!(line["itl_ms"].as_array().unwrap().len(), 3);

    // Whole answers, in an open loop: no stream timing, usage's tokens, arrival lag.
    let mut whole = config(
        router.url(),
        synthetic(6, Arrivals::Poisson { rate_per_s: 50.0 }),
    );
    whole.stream = false;
    whole.seed = 4;
    let (report, _) = bench(&whole).unwrap();
    assert_eq!((report.requests, report.succeeded), (6, 6));
    assert_eq!(report.ttft.samples, 0);
    assert_eq!(report.output_tokens, 24);
    assert_eq!(report.lag.unwrap().samples, 6);
    assert_eq!(report.to_json()["rate_per_s"], 50.0);
}

/// Writes a trace file.
fn trace_file(rows: &[(u64, u64, &[u64])]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for (timestamp, input_length, hash_ids) in rows {
        writeln!(
            file,
            "{{\"timestamp\":{timestamp},\"input_length\":{input_length},\"output_length\":2,\
             \"hash_ids\":{hash_ids:?}}}"
        )
        .unwrap();
    }
    file.flush().unwrap();
    file
}

fn replay(path: &std::path::Path) -> Workload {
    Workload::Trace(TraceReplay {
        path: path.to_path_buf(),
        block_size: BLOCK as u32,
        speedup: 1.0,
        limit: None,
    })
}

#[test]
fn a_trace_replayed_shares_the_prefixes_its_hash_ids_share() {
    // One engine, one request at a time: its cache answers exactly. Rows 2 and 3 share
    // ids 1, 2 with row 1 (two full blocks); row 5 repeats row 4 whole, and a prompt
    // cached whole recomputes its last block.
    let trace = trace_file(&[
        (1000, 80, &[1, 2, 3]),
        (1010, 96, &[1, 2, 4]),
        (1020, 90, &[1, 2, 3]),
        (1030, 64, &[5, 6]),
        (1040, 64, &[5, 6]),
    ]);
    let alone = engine();
    let mut direct = config(alone.url(), replay(trace.path()));
    direct.concurrency = 1;
    let (report, mut records) = bench(&direct).unwrap();
    assert_eq!((report.requests, report.succeeded), (5, 5));
    records.sort_by_key(|r| r.index);
    let cached: Vec<Option<u64>> = records.iter().map(|r| r.cached_tokens).collect();
    assert_eq!(cached, [Some(0), Some(64), Some(64), Some(0), Some(32)]);
    let lines: Vec<Option<u64>> = records.iter().map(|r| r.line).collect();
    assert_eq!(lines, [Some(1), Some(2), Some(3), Some(4), Some(5)]);
    assert_eq!(report.prompt_tokens, 80 + 96 + 90 + 64 + 64);
    assert_eq!(report.without_worker, 5, "an engine names no worker");
    let sent: Vec<usize> = alone
        .requests()
        .iter()
        .map(|r| r["prompt"].as_array().unwrap().len())
        .collect();
    assert_eq!(sent, [80, 96, 90, 64, 64]);
    assert!(alone
        .requests()
        .iter()
        .all(|r| r["max_tokens"] == 2 && r["ignore_eos"] == true));
    // Arrivals followed the timestamps (10 ms apart).
    assert!(records[4].started >= Duration::from_millis(40));

    // Through a router to two engines, spaced so the router sees each row's blocks
    // before the next: every row is sent, and the shared prefixes hit.
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], Access::default());
    let spaced = trace_file(&[
        (0, 80, &[1, 2, 3]),
        (300, 96, &[1, 2, 4]),
        (600, 90, &[1, 2, 3]),
        (900, 64, &[5, 6]),
    ]);
    let (report, _) = bench(&config(router.url(), replay(spaced.path()))).unwrap();
    assert_eq!((report.requests, report.succeeded), (4, 4));
    assert_eq!(report.workers.values().sum::<u64>(), 4);
    assert_eq!(report.cached_tokens, 128, "{}", report.to_json());
}

#[test]
fn failures_are_counted_by_reason_and_every_request_ends_within_its_deadline() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], Access::default());
    one.set_fault(Fault::Status(500));
    let fresh = Workload::Synthetic(Synthetic {
        requests: 10,
        prefixes: 0,
        prefix_tokens: 0,
        suffix_tokens: 40,
        max_tokens: 2,
        arrivals: Arrivals::Closed,
    });
    let mut run = config(router.url(), fresh.clone());
    run.concurrency = 2;
    let (report, records) = bench(&run).unwrap();
    assert_eq!(report.requests, 10);
    let failed_500 = report.failed.get("http_500").copied().unwrap_or(0);
    assert_eq!(
        failed_500,
        one.requests().len() as u64,
        "{}",
        report.to_json()
    );
    assert_eq!(report.succeeded, two.served());
    assert_eq!(report.succeeded + failed_500, 10);
    assert!(records
        .iter()
        .filter(|r| !r.succeeded())
        .all(|r| r.status == Some(500) && r.worker == Some(1)));
    // Straight to the failing engine, all of them.
    let (report, _) = bench(&ServeConfig {
        url: one.url(),
        ..run.clone()
    })
    .unwrap();
    assert_eq!(report.failed.get("http_500"), Some(&10));

    // Engines that never answer: each request ends at its deadline, as a timeout.
    one.set_fault(Fault::Hang);
    two.set_fault(Fault::Hang);
    let mut hung = config(router.url(), fresh.clone());
    hung.timeout = Duration::from_millis(300);
    hung.concurrency = 4;
    if let Workload::Synthetic(spec) = &mut hung.workload {
        spec.requests = 4;
    }
    let started = Instant::now();
    let (report, records) = bench(&hung).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        report.failed.get("timeout"),
        Some(&4),
        "{}",
        report.to_json()
    );
    assert_eq!(report.succeeded, 0);
    assert!(records.iter().all(|r| r.e2e >= Duration::from_millis(300)));

    // A closed port: connection errors, not an error of the run.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (report, _) = bench(&ServeConfig {
        url: format!("http://{closed}"),
        model: Some("tiny".into()),
        ..hung.clone()
    })
    .unwrap();
    assert_eq!(report.failed.get("connect_error"), Some(&4));
    // Without --model the model list is needed, and its failure is the run's.
    let error = bench(&ServeConfig {
        url: format!("http://{closed}"),
        ..hung
    })
    .unwrap_err();
    assert!(matches!(error, ServeError::Models { .. }), "{error}");
}

#[test]
fn a_router_behind_a_token_needs_it_and_takes_it() {
    let one = engine();
    let token = AuthToken::from_text("s3cret-token").unwrap().unwrap();
    let router = router(
        &[(1, &one)],
        Access {
            token: Some(token.clone()),
            ..Access::default()
        },
    );
    let mut run = config(router.url(), synthetic(3, Arrivals::Closed));
    let error = bench(&run).unwrap_err();
    assert!(error.to_string().contains("401"), "{error}");
    assert!(error.to_string().contains("--router-token-file"), "{error}");
    run.token = Some(token);
    let (report, _) = bench(&run).unwrap();
    assert_eq!((report.requests, report.succeeded), (3, 3));
}
