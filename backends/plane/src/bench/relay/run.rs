//! The relay bench's run: the pipeline set up on loopback, the engines' timed loop, the
//! drain, and the figures.
//!
//! Owns: [`run_relay_bench`]. Never: encode or decode events while the clock runs (the
//! engines' streams are encoded before it starts, in `stream.rs`).

use super::cpu::{runtime, sleep_until, thread_cpu_time, CpuSnapshot, RuntimeThreads};
use super::stream::{observer, stage_costs, Published, Stream, Track};
use super::{
    Pace, RelayBenchConfig, RelayBenchError, RelayBenchReport, Transport, STREAM, SUBJECT,
};
use crate::nats::{
    ConsumeMode, NatsMode, NatsServer, PublisherConfig as NatsPublisherConfig,
    SubscriberConfig as NatsSubscriberConfig,
};
use crate::service::http::{lock, SharedState};
use crate::service::nats_source::{NatsSource, NatsSourceConfig};
use crate::service::relay::{run_relay, NatsFormat, RelayConfig, RelayStats};
use crate::service::state::RouterState;
use crate::wire::DecodeLimits;
use crate::zmq::{PublisherConfig, SubscriberConfig, ZmqPublisher};
use kvtwin::ids::WorkerId;
use kvtwin::stats::LatencySummary;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Runs the bench; see the module documentation.
pub fn run_relay_bench(config: &RelayBenchConfig) -> Result<RelayBenchReport, RelayBenchError> {
    if config.engines == 0 {
        return Err(RelayBenchError::Config("at least one engine"));
    }
    match config.pace {
        Pace::Window { batches: 0 } => {
            return Err(RelayBenchError::Config("a window of 0 batches"))
        }
        Pace::Rate { blocks_per_s: 0 } => {
            return Err(RelayBenchError::Config("a rate of 0 blocks/s"))
        }
        _ => {}
    }
    let server = NatsServer::start()?;
    let epoch = Instant::now();

    // Everything an engine publishes is encoded now, before any clock runs.
    let streams: Vec<Arc<Stream>> = (0..config.engines)
        .map(|engine| Arc::new(Stream::generate(config, engine)))
        .collect();
    let stages = stage_costs(config, &streams[0]);

    let tracks: Arc<Vec<Track>> = Arc::new(
        streams
            .iter()
            .map(|stream| Track {
                stream: stream.clone(),
                applied: AtomicU64::new(0),
                engine: OnceLock::new(),
                applied_at: Mutex::new(Vec::new()),
            })
            .collect(),
    );
    let mut state = RouterState::new(config.synthetic.block_size as usize);
    state.set_apply_observer(Some(observer(tracks.clone(), epoch)));
    let state: SharedState = Arc::new(Mutex::new(state));

    let (nats_mode, consume_mode) = match config.transport {
        Transport::Core => (NatsMode::Core, ConsumeMode::Core),
        Transport::JetStream => (
            NatsMode::JetStream {
                stream: STREAM.to_string(),
            },
            ConsumeMode::Replay {
                stream: STREAM.to_string(),
            },
        ),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };

    // The router: subscribed before anything is published.
    let runtime_threads = RuntimeThreads::default();
    let router_rt = runtime("router-rt", &runtime_threads)?;
    let source = router_rt.block_on(NatsSource::connect(NatsSourceConfig {
        subscriber: NatsSubscriberConfig::new(&server.url(), SUBJECT, consume_mode),
        limits: DecodeLimits::default(),
    }))?;
    router_rt.block_on(source.flush())?;
    let router = router_rt.spawn(source.run(state.clone(), shutdown(stopped.clone())));

    // One publisher and one relay per engine.
    let relay_rt = runtime("relay-rt", &runtime_threads)?;
    let mut publishers = Vec::with_capacity(config.engines);
    let mut relays = Vec::with_capacity(config.engines);
    for engine in 0..config.engines {
        let publisher = ZmqPublisher::bind(&PublisherConfig::new(
            "tcp://127.0.0.1:*",
            Some("tcp://127.0.0.1:*"),
        ))?;
        let worker = WorkerId::new(engine as u64 + 1);
        let relay = RelayConfig {
            worker,
            zmq: SubscriberConfig::new(publisher.endpoint(), publisher.replay_endpoint()),
            nats: NatsPublisherConfig::new(&server.url(), SUBJECT, nats_mode.clone()),
            format: match config.nats_format {
                NatsFormat::Json => NatsFormat::Json,
                NatsFormat::Envelope { .. } => NatsFormat::Envelope {
                    publisher_id: worker.get(),
                },
            },
            limits: DecodeLimits::default(),
            publish_attempts: 1,
            drain_timeout: crate::service::relay::DRAIN_TIMEOUT,
        };
        relays.push(relay_rt.spawn(run_relay(relay, shutdown(stopped.clone()))));
        publishers.push(publisher);
    }

    // Warm-up: every engine's first batch end to end, which also proves every link is
    // up (a relay that joined late gets it from the replay socket).
    for (publisher, stream) in publishers.iter_mut().zip(&streams) {
        publisher.publish(&stream.payloads[0])?;
    }
    let warm_up = Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let applied = tracks
            .iter()
            .filter(|track| track.applied.load(Ordering::Acquire) >= 1)
            .count();
        if applied == config.engines {
            break;
        }
        if started.elapsed() > warm_up {
            let _ = stop.send(true);
            return Err(RelayBenchError::WarmUp {
                applied,
                engines: config.engines,
                waited: warm_up,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    // The run: every engine starts at the same instant.
    let barrier = Arc::new(Barrier::new(config.engines + 1));
    let mut engines = Vec::with_capacity(config.engines);
    for (index, mut publisher) in publishers.into_iter().enumerate() {
        let stream = streams[index].clone();
        let tracks = tracks.clone();
        let barrier = barrier.clone();
        let pace = config.pace;
        let engines_n = config.engines as f64;
        let duration = config.duration;
        let thread = std::thread::Builder::new()
            .name(format!("engine-{index}"))
            .spawn(move || {
                let track = &tracks[index];
                let _ = track.engine.set(std::thread::current());
                let mut published = Published {
                    batches: 1,
                    at: vec![0],
                    ..Published::default()
                };
                barrier.wait();
                let cpu_start = thread_cpu_time();
                let start = Instant::now();
                let end = start + duration;
                let mut scheduled_blocks = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    let k = published.batches;
                    match pace {
                        Pace::Window { batches } => {
                            while k - track.applied.load(Ordering::Acquire) > batches as u64 {
                                // Unparked by the observer; the timeout is a backstop.
                                std::thread::park_timeout(Duration::from_millis(1));
                            }
                        }
                        Pace::Rate { blocks_per_s } => {
                            let per_engine = blocks_per_s as f64 / engines_n;
                            let due = start
                                + Duration::from_secs_f64(scheduled_blocks as f64 / per_engine);
                            sleep_until(due);
                            published.behind_max = published
                                .behind_max
                                .max(Instant::now().saturating_duration_since(due));
                            published
                                .due
                                .push(due.duration_since(epoch).as_nanos() as u64);
                            scheduled_blocks += stream.blocks[(k % stream.len()) as usize];
                        }
                    }
                    let payload = &stream.payloads[(k % stream.len()) as usize];
                    published.at.push(epoch.elapsed().as_nanos() as u64);
                    if let Err(error) = publisher.publish(payload) {
                        published.cpu = thread_cpu_time().saturating_sub(cpu_start);
                        return (published, publisher, Some(error));
                    }
                    published.bytes += payload.len() as u64;
                    published.batches += 1;
                }
                // The publisher lives until the router has everything (its replay socket
                // may still be asked).
                published.cpu = thread_cpu_time().saturating_sub(cpu_start);
                (published, publisher, None)
            })
            .map_err(|source| RelayBenchError::Spawn {
                what: "an engine thread",
                source,
            })?;
        engines.push(thread);
    }
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let cpu_before = CpuSnapshot::take(&pids);
    barrier.wait();
    let mut published = Vec::with_capacity(config.engines);
    let mut keep_alive = Vec::with_capacity(config.engines);
    let mut publish_error = None;
    for thread in engines {
        let (done, publisher, error) = match thread.join() {
            Ok(joined) => joined,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        published.push(done);
        keep_alive.push(publisher);
        publish_error = publish_error.or(error);
    }
    if let Some(error) = publish_error {
        let _ = stop.send(true);
        return Err(error.into());
    }

    // Drain: wait until the router has applied every batch published.
    let drain_start = Instant::now();
    while drain_start.elapsed() < config.drain_timeout
        && tracks
            .iter()
            .zip(&published)
            .any(|(track, done)| track.applied.load(Ordering::Acquire) < done.batches)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let main_thread = u64::from(std::process::id());
    let main_name = cpu_before
        .threads
        .get(&main_thread)
        .map(|(name, _)| name.clone())
        .unwrap_or_default();
    let workers = runtime_threads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let engines_cpu: Duration = published.iter().map(|done| done.cpu).sum();
    let label = |tid: u64, name: &str| -> String {
        if tid == main_thread {
            "main".to_string()
        } else if let Some(runtime) = workers.get(&tid) {
            (*runtime).to_string()
        } else if name == main_name {
            // The engines' publishers were bound on the main thread.
            "engine-zmq-io".to_string()
        } else if name == "relay-rt" {
            // The relays create their subscribers on their runtime.
            "relay-zmq-io".to_string()
        } else {
            name.trim_end_matches(|c: char| c.is_ascii_digit())
                .trim_end_matches(['-', '/'])
                .to_string()
        }
    };
    let cpu = CpuSnapshot::take(&pids).since(
        &cpu_before,
        label,
        &[(pids.first().copied().unwrap_or(0), "nats-server")],
        &[("engines", engines_cpu)],
    );

    let _ = stop.send(true);
    let mut relay = RelayStats::default();
    for task in relays {
        if let Ok(Ok(stats)) = relay_rt.block_on(task) {
            relay.batches += stats.batches;
            relay.events += stats.events;
            relay.blocks += stats.blocks;
            relay.messages += stats.messages;
            relay.publish_failures += stats.publish_failures;
            relay.restarts += stats.restarts;
            relay.lost_batches += stats.lost_batches;
            relay.nats_reconnects += stats.nats_reconnects;
            for (reason, count) in stats.dropped {
                *relay.dropped.entry(reason).or_default() += count;
            }
        }
    }
    let source = router_rt
        .block_on(router)
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    drop(keep_alive);

    // Figures, warm-up batch left out.
    let mut latencies = Vec::new();
    let mut from_due = Vec::new();
    let (mut batches, mut events, mut blocks, mut batches_applied, mut blocks_applied) =
        (0, 0, 0, 0, 0);
    let (mut first_publish, mut last_apply) = (u64::MAX, 0u64);
    let mut behind_schedule_max = Duration::ZERO;
    let mut engine_bytes = 0;
    for ((track, done), stream) in tracks.iter().zip(&published).zip(&streams) {
        let applied_at = track
            .applied_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        behind_schedule_max = behind_schedule_max.max(done.behind_max);
        engine_bytes += done.bytes;
        for k in 1..done.batches {
            let blocks_k = stream.blocks[(k % stream.len()) as usize];
            batches += 1;
            events += stream.events_of(k);
            blocks += blocks_k;
            first_publish = first_publish.min(done.at[k as usize]);
            if let Some(&applied) = applied_at.get(k as usize) {
                batches_applied += 1;
                blocks_applied += blocks_k;
                last_apply = last_apply.max(applied);
                latencies.push(Duration::from_nanos(
                    applied.saturating_sub(done.at[k as usize]),
                ));
                // `due` has no entry for the warm-up batch.
                if let Some(&due) = done.due.get(k as usize - 1) {
                    from_due.push(Duration::from_nanos(applied.saturating_sub(due)));
                }
            }
        }
    }
    let router_dropped = lock(&state).metrics().dropped_total();
    Ok(RelayBenchReport {
        config: config.clone(),
        elapsed: Duration::from_nanos(last_apply.saturating_sub(first_publish)),
        batches,
        events,
        blocks,
        batches_applied,
        blocks_applied,
        nats_messages: relay.messages,
        engine_bytes,
        latency: LatencySummary::of(latencies),
        behind_schedule_max,
        latency_from_due: match config.pace {
            Pace::Rate { .. } => Some(LatencySummary::of(from_due)),
            Pace::Window { .. } => None,
        },
        router_dropped,
        relay,
        source,
        cpu,
        stages,
    })
}
