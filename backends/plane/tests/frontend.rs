//! The router as a front door, against mock engines (`frontend::mock`: vLLM's endpoints,
//! a prefix cache publishing vLLM's events, faults on demand) over real sockets: answers
//! pass through, the router's view equals the engines' caches, load spreads fresh
//! prompts, a failing engine's requests go elsewhere, a dead one is marked down within
//! seconds and comes back, engines come and go at run time, traffic is recorded.
//! The same behaviours against real vLLM engines: tui/tests/engines_*.rs.

mod support;

use kvtwin::ids::WorkerId;
use kvtwin_plane::service::auth::Access;
use kvtwin_plane::service::frontend::engine_client::EngineTimeouts;
use kvtwin_plane::service::frontend::health::HealthConfig;
use kvtwin_plane::service::frontend::mock::{Fault, MockConfig, MockEngine};
use kvtwin_plane::service::frontend::trace::{TraceRecorder, TraceRow};
use kvtwin_plane::service::frontend::{Frontend, FrontendConfig};
use kvtwin_plane::service::http::{self, lock, SharedState, Transport};
use kvtwin_plane::service::state::{EngineHealth, RouterState};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{http_with, json as parse_json};

const BLOCK: usize = 32;

/// A router fronting `engines` (id, mock), on its own runtime; stops when dropped.
struct Router {
    addr: SocketAddr,
    state: SharedState,
    frontend: Arc<Frontend>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn config() -> FrontendConfig {
    FrontendConfig {
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
    }
}

fn router(engines: &[(u64, &MockEngine)], recorder: Option<TraceRecorder>) -> Router {
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK)));
    let frontend = Frontend::new(state.clone(), config(), None, recorder);
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
    let app = http::app_full(state.clone(), Access::default(), Some(frontend.clone()));
    let checks = frontend.clone();
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let (stop_checks, checks_stopped) = tokio::sync::oneshot::channel::<()>();
            let health = tokio::spawn(checks.run_health_checks(async {
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
        frontend,
        _stop: stop,
    };
    wait_until("every engine up", || {
        let state = lock(&router.state);
        state.serving().engines_up() == engines.len()
    });
    router
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(15), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `body`; (status, head, body with any chunked encoding undone).
fn post(router: &Router, path: &str, body: &Value) -> (u16, String, String) {
    let (status, head, body) = http_with(router.addr, "POST", path, Some(&body.to_string()), &[]);
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (status, head, if chunked { dechunk(&body) } else { body })
}

/// A chunked HTTP/1.1 body's data (what the client library would hand over).
fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        raw = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The worker a response names.
fn served_by(head: &str) -> u64 {
    head.lines()
        .find_map(|line| line.strip_prefix("x-kvtwin-worker: "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no x-kvtwin-worker in {head}"))
}

/// `blocks` blocks of a prefix shared by family `family`, then a suffix unique to `k`.
fn prompt(family: u32, blocks: usize, k: u32) -> Vec<u32> {
    let mut tokens: Vec<u32> = (0..(blocks * BLOCK) as u32)
        .map(|t| 1000 * family + t)
        .collect();
    tokens.extend((0..BLOCK as u32 + 5).map(|t| 500_000 + 100 * k + t));
    tokens
}

fn engine() -> MockEngine {
    MockEngine::start(MockConfig::default()).unwrap()
}

/// Blocks the router holds for `worker`.
fn router_blocks(router: &Router, worker: u64) -> u64 {
    lock(&router.state)
        .workers()
        .iter()
        .filter(|row| row.key.worker.get() == worker)
        .map(|row| row.blocks.iter().sum::<u64>())
        .sum()
}

#[test]
fn answers_pass_through_and_the_router_sees_what_each_cache_holds() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], None);
    for k in 0..12u32 {
        let tokens = prompt(k % 3, 3, k);
        let body = json!({"model": "tiny", "prompt": tokens, "max_tokens": 4});
        let (status, head, answer) = post(&router, "/v1/completions", &body);
        assert_eq!(status, 200, "{answer}");
        let answer = parse_json(&answer);
        assert_eq!(answer["choices"][0]["text"], "xxxx");
        let worker = served_by(&head);
        let overlap = lock(&router.state)
            .routes_since(0)
            .0
            .last()
            .and_then(|route| {
                route
                    .candidates
                    .iter()
                    .find(|c| c.worker == worker)
                    .map(|c| c.score)
            })
            .unwrap();
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(overlap * BLOCK as u64, cached, "request {k} on {worker}");
        wait_until("the router caught up with both caches", || {
            router_blocks(&router, 1) == one.cached_blocks() as u64
                && router_blocks(&router, 2) == two.cached_blocks() as u64
        });
    }
    assert_eq!(one.served() + two.served(), 12);
    let metrics = lock(&router.state).render_metrics();
    assert!(
        metrics.contains("kvtwin_router_request_success_total{worker_id=\"1\"}"),
        "{metrics}"
    );
}

#[test]
fn streams_pass_through_timed_and_the_usage_chunk_is_shown_only_when_asked() {
    let one = engine();
    let router = router(&[(1, &one)], None);
    let body = json!({"model": "tiny", "prompt": prompt(0, 2, 0), "max_tokens": 5, "stream": true});
    let (status, head, stream) = post(&router, "/v1/completions", &body);
    assert_eq!(status, 200);
    assert!(head.contains("text/event-stream"), "{head}");
    let events: Vec<&str> = stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    assert_eq!(events.len(), 6, "5 tokens and [DONE]: {stream}");
    assert_eq!(events.last(), Some(&"[DONE]"));
    assert!(!stream.contains("\"usage\""), "{stream}");
    // The engine was asked for the usage on the client's behalf.
    assert_eq!(one.requests()[0]["stream_options"]["include_usage"], true);
    let mut asking = body.clone();
    asking["stream_options"] = json!({"include_usage": true});
    let (_, _, stream) = post(&router, "/v1/completions", &asking);
    assert!(stream.contains("\"cached_tokens\""), "{stream}");
    let state = lock(&router.state);
    let totals = state.serving().totals();
    assert_eq!(totals.succeeded, 2);
    assert_eq!(totals.ttft.count(), 2);
    assert_eq!(totals.itl.count(), 8);
    assert_eq!(totals.generation_tokens, 10);
    assert_eq!(state.serving().inflight(), 0);
}

#[test]
fn chat_is_proxied_and_bad_requests_are_refused_in_vllms_shape() {
    let one = engine();
    let router = router(&[(1, &one)], None);
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2});
    let (status, _, answer) = post(&router, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(parse_json(&answer)["object"], "chat.completion");
    assert_eq!(one.requests()[0], chat);
    let (status, _, answer) = post(&router, "/v1/completions", &json!({"prompt": ["a", "b"]}));
    assert_eq!(status, 400);
    let error = parse_json(&answer);
    assert_eq!(error["error"]["code"], 400);
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`prompt`"));
    let (status, _, answer) = post(
        &router,
        "/v1/completions",
        &json!({"model": "other", "prompt": [1]}),
    );
    assert_eq!(status, 404, "{answer}");
    let (status, _, models) = http_with(router.addr, "GET", "/v1/models", None, &[]);
    assert_eq!(status, 200);
    assert_eq!(parse_json(&models)["data"][0]["id"], "tiny");
    assert_eq!(
        one.requests().len(),
        1,
        "refused requests never reach the engine"
    );
}

#[test]
fn fresh_prompts_at_concurrency_four_spread_over_two_engines() {
    let slow = MockConfig {
        per_token: Duration::from_millis(15),
        capacity_blocks: 16,
        ..MockConfig::default()
    };
    let (one, two) = (
        MockEngine::start(slow.clone()).unwrap(),
        MockEngine::start(slow).unwrap(),
    );
    let router = router(&[(1, &one), (2, &two)], None);
    // Fill both caches first.
    for k in 0..8 {
        let body = json!({"prompt": prompt(100 + k, 4, k), "max_tokens": 1});
        assert_eq!(post(&router, "/v1/completions", &body).0, 200);
    }
    let counts = Arc::new(Mutex::new([0u32; 3]));
    std::thread::scope(|scope| {
        for lane in 0..4u32 {
            let counts = counts.clone();
            let router = &router;
            scope.spawn(move || {
                for k in 0..5u32 {
                    let fresh = 200 + lane * 10 + k;
                    let body = json!({"prompt": prompt(fresh, 4, k), "max_tokens": 8});
                    let (status, head, answer) = post(router, "/v1/completions", &body);
                    assert_eq!(status, 200, "{answer}");
                    counts.lock().unwrap()[served_by(&head) as usize] += 1;
                }
            });
        }
    });
    let counts = *counts.lock().unwrap();
    assert_eq!(counts[1] + counts[2], 20);
    assert!(counts[1] >= 7 && counts[2] >= 7, "{counts:?}");
}

#[test]
fn a_request_whose_engine_is_gone_goes_to_another_and_the_engine_is_marked_down() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], None);
    // Engine 1 holds the prompt's prefix, so the router prefers it.
    let tokens = prompt(7, 3, 0);
    let warm = json!({"prompt": tokens, "max_tokens": 1});
    let (_, head, _) = post(&router, "/v1/completions", &warm);
    let holder = served_by(&head);
    wait_until("the router saw the holder's blocks", || {
        router_blocks(&router, holder) >= 3
    });
    let (dead, alive) = if holder == 1 { (one, two) } else { (two, one) };
    dead.kill();
    let (status, head, answer) = post(&router, "/v1/completions", &warm);
    assert_eq!(status, 200, "{answer}");
    assert_ne!(served_by(&head), holder);
    assert_eq!(alive.served(), 1);
    let state = lock(&router.state);
    let engine = state.serving().engine(WorkerId::new(holder)).unwrap();
    assert!(
        matches!(engine.health, EngineHealth::Down { .. }),
        "{:?}",
        engine.health
    );
    assert_eq!(engine.stats.retried, 1);
    assert_eq!(
        router_blocks_locked(&state, holder),
        0,
        "a dead engine's cache is gone"
    );
    assert_eq!(state.serving().totals().succeeded, 2);
}

fn router_blocks_locked(state: &RouterState, worker: u64) -> u64 {
    state
        .workers()
        .iter()
        .filter(|row| row.key.worker.get() == worker)
        .map(|row| row.blocks.iter().sum::<u64>())
        .sum()
}

#[test]
fn a_stream_cut_mid_way_ends_with_an_error_and_the_health_check_decides_the_engine() {
    let one = engine();
    let router = router(&[(1, &one)], None);
    one.set_fault(Fault::DieAfterChunks(2));
    let body = json!({"prompt": prompt(0, 1, 0), "max_tokens": 10, "stream": true});
    let started = Instant::now();
    let (status, _, stream) = post(&router, "/v1/completions", &body);
    assert_eq!(status, 200);
    let events: Vec<&str> = stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    assert_eq!(events.len(), 4, "two tokens, the error, [DONE]: {stream}");
    let error = parse_json(events[2]);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed mid-stream"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let state = lock(&router.state);
    let totals = state.serving().totals();
    assert_eq!(totals.failed_total(), 1);
    assert_eq!(state.serving().inflight(), 0);
    // A cut connection alone says nothing of the engine: it still answers its check.
    assert_eq!(
        state.serving().engine(WorkerId::new(1)).unwrap().health,
        EngineHealth::Up
    );
}

#[test]
fn a_hung_engine_times_out_and_the_request_is_answered_by_another() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], None);
    one.set_fault(Fault::Hang);
    two.set_fault(Fault::Hang);
    let body = json!({"prompt": prompt(0, 1, 0), "max_tokens": 2});
    // Both hang: two tries of 2 s each, then a 502 naming both.
    let (status, _, answer) = post(&router, "/v1/completions", &body);
    assert_eq!(status, 502, "{answer}");
    let message = parse_json(&answer)["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("engine 1") && message.contains("engine 2"),
        "{message}"
    );
    two.set_fault(Fault::None);
    // One hangs: whichever is tried first, the answer comes from engine 2.
    for _ in 0..3 {
        let (status, head, answer) = post(&router, "/v1/completions", &body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(served_by(&head), 2);
    }
    assert_eq!(lock(&router.state).serving().inflight(), 0);
}

#[test]
fn an_engines_own_refusal_is_passed_on_and_not_retried() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], None);
    one.set_fault(Fault::Status(400));
    two.set_fault(Fault::Status(400));
    let (status, head, answer) = post(&router, "/v1/completions", &json!({"prompt": [1, 2]}));
    assert_eq!(status, 400);
    assert!(head.contains("x-kvtwin-worker"), "{head}");
    assert_eq!(parse_json(&answer)["error"]["message"], "mock fault");
    assert_eq!(one.requests().len() + two.requests().len(), 1);
}

#[test]
fn a_pinned_request_is_served_by_its_engine_alone_and_never_elsewhere() {
    let (one, two) = (engine(), engine());
    let router = router(&[(1, &one), (2, &two)], None);
    let pinned = |to: u64| {
        json!({"prompt": prompt(0, 3, 0), "max_tokens": 2,
        "nvext": {"backend_instance_id": to}})
    };
    let (status, head, _) = post(&router, "/v1/completions", &pinned(1));
    assert_eq!((status, served_by(&head)), (200, 1));
    wait_until("the router saw engine 1 store the prompt", || {
        router_blocks(&router, 1) == one.cached_blocks() as u64 && one.cached_blocks() > 0
    });
    // Routing alone sends the same prompt where it is cached; the pin overrules it.
    let (_, head, _) = post(
        &router,
        "/v1/completions",
        &json!({"prompt": prompt(0, 3, 0), "max_tokens": 2}),
    );
    assert_eq!(served_by(&head), 1);
    let (status, head, answer) = post(&router, "/v1/completions", &pinned(2));
    assert_eq!((status, served_by(&head)), (200, 2));
    assert_eq!(
        parse_json(&answer)["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert!(
        two.requests()
            .iter()
            .all(|body| body.get("nvext").is_none()),
        "nvext is the router's, not the engine's"
    );
    let (status, _, answer) = post(&router, "/v1/completions", &pinned(9));
    assert_eq!(status, 404, "{answer}");
    assert_eq!(parse_json(&answer)["error"]["type"], "NotFoundError");
    let bad = json!({"prompt": [1], "nvext": {"backend_instance_id": "one"}});
    let (status, _, answer) = post(&router, "/v1/completions", &bad);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("nvext.backend_instance_id"), "{answer}");
    // A pinned engine's failure is the answer: no other engine is tried.
    two.set_fault(Fault::Hang);
    let before = one.served();
    let (status, _, answer) = post(&router, "/v1/completions", &pinned(2));
    assert_eq!(status, 502, "{answer}");
    assert_eq!(one.served(), before);
    assert_eq!(lock(&router.state).serving().inflight(), 0);
}

#[test]
fn a_killed_engine_is_down_within_seconds_and_up_again_after_its_restart() {
    let (one, two) = (engine(), engine());
    let port = one.port();
    let router = router(&[(1, &one), (2, &two)], None);
    wait_until("ready", || {
        support::http(router.addr, "GET", "/readyz", None).0 == 200
    });
    one.kill();
    let killed = Instant::now();
    wait_until("engine 1 down", || {
        matches!(
            lock(&router.state)
                .serving()
                .engine(WorkerId::new(1))
                .unwrap()
                .health,
            EngineHealth::Down { .. }
        )
    });
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    let (_, workers) = support::http(router.addr, "GET", "/v1/workers", None);
    let workers = parse_json(&workers);
    let row = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["worker"] == 1)
        .unwrap()
        .clone();
    assert_eq!(row["engine"]["health"], "down", "{row}");
    assert!(lock(&router.state)
        .render_metrics()
        .contains("kvtwin_router_engine_up{worker_id=\"1\"} 0"));
    for k in 0..4 {
        let (status, head, _) = post(
            &router,
            "/v1/completions",
            &json!({"prompt": prompt(k, 1, k)}),
        );
        assert_eq!((status, served_by(&head)), (200, 2));
    }
    two.kill();
    wait_until("no engine up", || {
        lock(&router.state).serving().engines_up() == 0
    });
    let (status, why) = support::http(router.addr, "GET", "/readyz", None);
    assert_eq!(status, 503);
    assert!(why.contains("no engine up"), "{why}");
    let (status, _, answer) = post(&router, "/v1/completions", &json!({"prompt": [1]}));
    assert_eq!(status, 503, "{answer}");
    let _back = MockEngine::start_on(MockConfig::default(), port).unwrap();
    wait_until("engine 1 up again", || {
        lock(&router.state).serving().engines_up() == 1
    });
}

#[test]
fn engines_are_added_and_removed_while_the_router_runs() {
    let one = engine();
    let router = router(&[(1, &one)], None);
    let two = engine();
    let (live, replay) = two.events().unwrap();
    let add = json!({"id": 2, "url": two.url(), "events": live, "replay": replay});
    let (status, _, answer) = post(&router, "/v1/engines", &add);
    assert_eq!(status, 201, "{answer}");
    let (status, _, answer) = post(&router, "/v1/engines", &add);
    assert_eq!(status, 409, "{answer}");
    let (status, _, answer) = post(&router, "/v1/engines", &json!({"id": 3, "url": "ftp://x"}));
    assert_eq!(status, 400, "{answer}");
    wait_until("engine 2 up", || {
        lock(&router.state).serving().engines_up() == 2
    });
    let (_, list) = support::http(router.addr, "GET", "/v1/engines", None);
    let list = parse_json(&list);
    assert_eq!(list["engines"].as_array().unwrap().len(), 2);
    assert_eq!(list["engines"][1]["events"], add["events"]);
    // Engine 2's events reach the index.
    let body = json!({"prompt": prompt(9, 2, 0), "max_tokens": 1});
    for _ in 0..4 {
        assert_eq!(post(&router, "/v1/completions", &body).0, 200);
    }
    let (status, _, _) = http_with(router.addr, "DELETE", "/v1/engines/2", None, &[]);
    assert_eq!(status, 200);
    let (status, _, _) = http_with(router.addr, "DELETE", "/v1/engines/2", None, &[]);
    assert_eq!(status, 404);
    assert!(lock(&router.state)
        .workers()
        .iter()
        .all(|row| row.key.worker.get() == 1));
    wait_until("ready without engine 2", || {
        lock(&router.state).readiness().is_ok()
    });
    for _ in 0..3 {
        let (_, head, _) = post(&router, "/v1/completions", &body);
        assert_eq!(served_by(&head), 1);
    }
    drop(router.frontend.clone());
}

#[test]
fn served_requests_are_recorded_as_a_mooncake_trace() {
    let one = engine();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    let recorder = TraceRecorder::open(&path, 64, 1 << 20).unwrap();
    let router = router(&[(1, &one)], Some(recorder));
    let tokens = prompt(3, 4, 1);
    for stream in [false, true] {
        let body = json!({"prompt": tokens, "max_tokens": 3, "stream": stream});
        assert_eq!(post(&router, "/v1/completions", &body).0, 200);
    }
    // The writer thread counts a row after writing it: wait for the count, so the
    // file is complete and the metric below is not raced.
    wait_until("two rows written", || {
        lock(&router.state)
            .render_metrics()
            .contains("kvtwin_router_trace_rows_written_total 2")
    });
    let rows: Vec<TraceRow> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows[0].input_length, tokens.len() as u64);
    assert_eq!(rows[0].hash_ids.len(), tokens.len().div_ceil(64));
    assert_eq!(rows[0].hash_ids, rows[1].hash_ids);
    assert_eq!(rows[1].output_length, 3);
    assert_eq!(
        rows[1].cached_tokens,
        5 * BLOCK as u64,
        "every full block of the repeat"
    );
    assert!(rows[0].ttft_ms.is_none() && rows[1].ttft_ms.is_some());
    assert!(rows[1].timestamp >= rows[0].timestamp);
    assert_eq!(rows.len(), 2);
}
