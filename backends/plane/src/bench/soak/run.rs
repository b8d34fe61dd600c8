//! The soak's run: start everything, publish for the duration while sampling RSS and
//! carrying out the kill schedule, drain, stop, check.
//!
//! Owns: [`run_soak`], [`SoakProgress`], [`interrupt_flag`] and `Soak` (the live run:
//! server, children, lives, counters carried over from killed processes).
//! Never: return with a child still running (every child is a guard), or check a
//! verdict before the engines have stopped and the router has drained.

use super::engines::{Engines, Stopped};
use super::observe::{self, RouterApi, RouterView};
use super::procs::{log_tail, rss_kib, Child};
use super::report::{judge_rss, KillRecord, Life, RssBound, Verdict};
use super::schedule::{kill_schedule, Kill, Target, Windows};
use super::{Chaos, SoakConfig, SoakError, SoakReport, STREAM, SUBJECT};
use crate::nats::{
    ensure_stream, jetstream_context, ConsumeMode, NatsError, NatsServer, SubscriberConfig,
};
use crate::service::auth::AuthToken;
use crate::service::http::{lock, SharedState};
use crate::service::nats_source::{NatsSource, NatsSourceConfig};
use crate::service::state::RouterState;
use crate::wire::DecodeLimits;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

/// How often RSS is sampled and children are checked.
const TICK: Duration = Duration::from_millis(500);

/// The stream's bound: far above what a soak stores (a 10-minute run at the default
/// rate wrote about 23 MB in all), so nothing is discarded; a run that filled it would fail
/// its state verdict, not pass silently.
const STREAM_MAX_BYTES: u64 = 256 << 20;

/// How long a router may take to listen, and relays and router to stop on SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where a run is, for a progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoakProgress {
    /// Time published so far.
    pub elapsed: Duration,
    /// The run's length.
    pub duration: Duration,
    /// Kills carried out so far.
    pub kills: usize,
    /// What it is doing: `publishing`, `recovering`, `draining`, `checking`.
    pub phase: &'static str,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// A flag that SIGINT (Ctrl-C) and SIGTERM set from now on, instead of ending the
/// process, so [`run_soak`] can stop its children first (installed once per process).
pub fn interrupt_flag() -> &'static AtomicBool {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            unsafe {
                libc::signal(signal, on_interrupt as *const () as libc::sighandler_t);
            }
        }
    });
    &INTERRUPTED
}

/// Runs the soak; see the module documentation of `bench::soak`. `exe` is the `kvtwin`
/// binary the relays and router are started from; `interrupted` ends the run early
/// (with every child stopped) when set.
pub fn run_soak(
    config: &SoakConfig,
    exe: &Path,
    interrupted: &AtomicBool,
    progress: &mut dyn FnMut(&SoakProgress),
) -> Result<SoakReport, SoakError> {
    if config.engines == 0 {
        return Err(SoakError::Config("at least one engine"));
    }
    if config.rate_blocks_per_s == 0 {
        return Err(SoakError::Config("a rate of 0 blocks/s"));
    }
    if config.capacity_blocks == 0 {
        return Err(SoakError::Config("a cache of 0 blocks"));
    }
    if config.duration < Duration::from_secs(4) {
        return Err(SoakError::Config("a run of at least 4 s"));
    }
    let dir = tempfile::Builder::new()
        .prefix("kvtwin-soak-")
        .tempdir()
        .map_err(|source| SoakError::Io {
            what: "create a temporary directory".to_string(),
            source,
        })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("soak-rt")
        .enable_all()
        .build()
        .map_err(|source| SoakError::Io {
            what: "start a tokio runtime".to_string(),
            source,
        })?;
    let (token, token_file) = write_token(dir.path())?;
    let server = NatsServer::start()?;
    let mut soak = Soak {
        config: config.clone(),
        exe: exe.to_path_buf(),
        dir: dir.path().to_path_buf(),
        runtime,
        server,
        router: None,
        router_api: None,
        token,
        token_file,
        relays: Vec::new(),
        lives: BTreeMap::new(),
        start: Instant::now(),
        last_sample: None,
        router_reconnects: (0, 0),
        relay_totals: RelayTotals::default(),
        jetstream_replayed_messages: 0,
    };
    // Made here with a bound sized for a soak, before router and relays would make it
    // with their default of 1 GiB, which a JetStream server refuses when its disk has less
    // free (it reserves a stream's bound up front).
    soak.create_stream()?;
    soak.start_router()?;
    let engines = Engines::start(
        config.engines,
        config.rate_blocks_per_s,
        config.capacity_blocks,
        config.seed,
    )?;
    for engine in 0..config.engines {
        let relay = soak.spawn_relay(engine, &engines.endpoints[engine])?;
        soak.relays.push(Some(relay));
    }
    let nats_pid = soak.server.pid();
    soak.begin_life("nats-server", nats_pid);
    soak.begin_life("soak", Some(std::process::id()));
    soak.start = Instant::now();
    // The children started before the clock did: their lives start at 0.
    for life in soak.lives.values_mut() {
        if let Some(life) = life.last_mut() {
            life.1.started = Duration::ZERO;
        }
    }

    let mut schedule: Vec<Kill> = match config.chaos {
        Chaos::On => kill_schedule(config.seed, config.duration, config.engines),
        Chaos::Off => Vec::new(),
    };
    schedule.reverse();
    let mut kills = Vec::new();
    loop {
        let elapsed = soak.start.elapsed();
        if interrupted.load(Ordering::SeqCst) {
            return Err(SoakError::Interrupted);
        }
        soak.tick()?;
        progress(&SoakProgress {
            elapsed: elapsed.min(config.duration),
            duration: config.duration,
            kills: kills.len(),
            phase: "publishing",
        });
        // A kill is never skipped: one still due when the time is up happens first.
        if let Some(kill) = schedule.last().copied() {
            if elapsed >= kill.at {
                schedule.pop();
                progress(&SoakProgress {
                    elapsed: elapsed.min(config.duration),
                    duration: config.duration,
                    kills: kills.len(),
                    phase: "recovering",
                });
                let record = soak.kill_and_recover(kill.target, &engines, interrupted)?;
                tracing::info!(
                    "soak: killed {} at {:.1} s, recovered after {:.1} s",
                    record.target,
                    record.at.as_secs_f64(),
                    record.recovered_after.as_secs_f64()
                );
                kills.push(record);
                continue;
            }
        }
        if elapsed >= config.duration && schedule.is_empty() {
            break;
        }
        std::thread::sleep(
            TICK.min(config.duration.saturating_sub(elapsed))
                .max(Duration::from_millis(20)),
        );
    }
    let elapsed = soak.start.elapsed();
    let sent: Vec<(u64, u64, u64)> = engines
        .sent
        .iter()
        .map(|sent| {
            (
                sent.batches.load(Ordering::Relaxed),
                sent.events.load(Ordering::Relaxed),
                sent.blocks.load(Ordering::Relaxed),
            )
        })
        .collect();
    let stopped = engines.stop();
    if let Some(error) = stopped.iter().find_map(|engine| engine.error.as_ref()) {
        tracing::warn!("soak: an engine stopped publishing early: {error}");
    }
    progress(&SoakProgress {
        elapsed: config.duration,
        duration: config.duration,
        kills: kills.len(),
        phase: "draining",
    });
    let drain_start = Instant::now();
    let drained = soak.drain(&stopped, interrupted)?;
    let drain = drain_start.elapsed();
    progress(&SoakProgress {
        elapsed: config.duration,
        duration: config.duration,
        kills: kills.len(),
        phase: "checking",
    });
    soak.finish(FinishInput {
        elapsed,
        drain,
        drained,
        sent,
        stopped,
        kills,
    })
}

/// What the relays reported, summed over their lives.
#[derive(Clone, Copy, Debug, Default)]
struct RelayTotals {
    events: u64,
    publish_failures: u64,
    lost_batches: u64,
    reconnects: u64,
}

impl RelayTotals {
    fn add(&mut self, line: Option<&Value>) {
        let Some(line) = line else { return };
        let number = |key: &str| line.get(key).and_then(Value::as_u64).unwrap_or(0);
        self.events += number("events");
        self.publish_failures += number("publish_failures");
        self.lost_batches += number("lost_batches");
        self.reconnects += number("nats_reconnects");
    }
}

struct FinishInput {
    elapsed: Duration,
    drain: Duration,
    drained: Option<RouterView>,
    sent: Vec<(u64, u64, u64)>,
    stopped: Vec<Stopped>,
    kills: Vec<KillRecord>,
}

/// The live run.
struct Soak {
    config: SoakConfig,
    exe: PathBuf,
    dir: PathBuf,
    runtime: tokio::runtime::Runtime,
    server: NatsServer,
    router: Option<Child>,
    /// Where the live router listens, once it has said so; `None` while it starts.
    router_api: Option<RouterApi>,
    /// The router's token (every API call and `/metrics` need it) and its file.
    token: AuthToken,
    token_file: PathBuf,
    relays: Vec<Option<Child>>,
    /// Per process name, each life's pid and RSS samples.
    lives: BTreeMap<String, Vec<(Option<u32>, Life)>>,
    start: Instant,
    last_sample: Option<Instant>,
    /// Router reconnects: earlier lives summed, and the current life's last scrape.
    router_reconnects: (u64, u64),
    relay_totals: RelayTotals,
    jetstream_replayed_messages: u64,
}

impl Soak {
    fn begin_life(&mut self, process: &str, pid: Option<u32>) {
        let started = self.start.elapsed();
        self.lives.entry(process.to_string()).or_default().push((
            pid,
            Life {
                started,
                samples: Vec::new(),
            },
        ));
    }

    /// What the live router answers for `GET /v1/workers`; `None` while none answers.
    fn router_view(&self) -> Option<RouterView> {
        self.router_api.as_ref()?.view(&self.runtime)
    }

    fn life_count(&self, process: &str) -> usize {
        self.lives.get(process).map_or(0, Vec::len)
    }

    /// Samples RSS (every `TICK`), scrapes the router's reconnects, and fails if a child
    /// exited on its own.
    fn tick(&mut self) -> Result<(), SoakError> {
        if let Some(router) = &mut self.router {
            router.check_alive()?;
        }
        for relay in self.relays.iter_mut().flatten() {
            relay.check_alive()?;
        }
        if self.last_sample.is_some_and(|last| last.elapsed() < TICK) {
            return Ok(());
        }
        self.last_sample = Some(Instant::now());
        let at = self.start.elapsed();
        for lives in self.lives.values_mut() {
            if let Some((Some(pid), life)) = lives.last_mut() {
                if let Some(kib) = rss_kib(*pid) {
                    life.samples.push((at, kib));
                }
            }
        }
        if let Some(api) = &self.router_api {
            if let Some(text) = api.get(&self.runtime, "/metrics") {
                if let Some(reconnects) =
                    observe::metric(&text, "kvtwin_router_source_reconnects_total")
                {
                    self.router_reconnects.1 = reconnects;
                }
            }
        }
        Ok(())
    }

    fn start_router(&mut self) -> Result<(), SoakError> {
        let life = self.life_count("router") + 1;
        let log = self.dir.join(format!("router-{life}.log"));
        let args: Vec<String> = [
            "router",
            "--nats",
            &self.server.url(),
            "--subject",
            SUBJECT,
            "--jetstream",
            STREAM,
            "--listen",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--auth-token-file",
            &self.token_file.to_string_lossy(),
            "--metrics-auth",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut router = Child::spawn("router", &self.exe, &args, log)?;
        let started = Instant::now();
        let address = loop {
            router.check_alive()?;
            if let Some(address) = listening_address(router.log()) {
                break address;
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(SoakError::NotStarted {
                    process: "router".to_string(),
                    waited: START_TIMEOUT,
                    log: log_tail(router.log()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let pid = router.pid();
        self.router = Some(router);
        self.router_api = Some(RouterApi::new(address, self.token.clone()));
        self.begin_life("router", Some(pid));
        Ok(())
    }

    fn spawn_relay(
        &mut self,
        engine: usize,
        endpoints: &(String, String),
    ) -> Result<Child, SoakError> {
        let name = format!("relay-{}", engine + 1);
        let life = self.life_count(&name) + 1;
        let log = self.dir.join(format!("{name}-{life}.log"));
        let worker = (engine + 1).to_string();
        let args: Vec<String> = [
            "relay",
            "--zmq",
            &endpoints.0,
            "--replay",
            &endpoints.1,
            "--nats",
            &self.server.url(),
            "--worker-id",
            &worker,
            "--subject",
            SUBJECT,
            "--jetstream",
            STREAM,
            "--envelope",
            "--stats-every-ms",
            "50",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let relay = Child::spawn(&name, &self.exe, &args, log)?;
        self.begin_life(&name, Some(relay.pid()));
        Ok(relay)
    }

    /// A client of the soak's nats-server (on the soak's runtime).
    async fn client(url: &str) -> Result<async_nats::Client, SoakError> {
        Ok(async_nats::connect(url)
            .await
            .map_err(|source| NatsError::Connect {
                url: url.to_string(),
                source,
            })?)
    }

    /// The soak's stream, file-backed, bounded at `STREAM_MAX_BYTES`.
    fn create_stream(&self) -> Result<(), SoakError> {
        let url = self.server.url();
        self.runtime.block_on(async {
            let client = Self::client(&url).await?;
            let context = jetstream_context(client, Duration::from_secs(5));
            ensure_stream(&context, STREAM, SUBJECT, Some(STREAM_MAX_BYTES)).await?;
            Ok(())
        })
    }

    /// The stream's message count now.
    fn stream_messages(&self) -> Result<u64, SoakError> {
        let url = self.server.url();
        self.runtime.block_on(async {
            let client = Self::client(&url).await?;
            let stream = async_nats::jetstream::new(client)
                .get_stream(STREAM)
                .await
                .map_err(|source| SoakError::StreamInfo {
                    stream: STREAM.to_string(),
                    source,
                })?;
            Ok(stream.cached_info().state.messages)
        })
    }

    /// `kill -9` of `target`, its restart, and the wait until every engine's events
    /// reach the router again.
    fn kill_and_recover(
        &mut self,
        target: Target,
        engines: &Engines,
        interrupted: &AtomicBool,
    ) -> Result<KillRecord, SoakError> {
        let at = self.start.elapsed();
        let killed = Instant::now();
        let before = match target {
            Target::NatsServer => {
                self.server.kill()?;
                self.server.restart()?;
                let pid = self.server.pid();
                self.begin_life("nats-server", pid);
                self.router_view()
            }
            Target::Relay(engine) => {
                if let Some(relay) = self.relays[engine].take() {
                    self.relay_totals.add(relay.kill().as_ref());
                }
                let relay = self.spawn_relay(engine, &engines.endpoints[engine])?;
                self.relays[engine] = Some(relay);
                self.router_view()
            }
            Target::Router => {
                if let Some(router) = self.router.take() {
                    router.kill();
                }
                self.router_reconnects = (self.router_reconnects.0 + self.router_reconnects.1, 0);
                self.router_api = None;
                self.jetstream_replayed_messages += self.stream_messages()?;
                self.start_router()?;
                None
            }
        };
        let before = before.unwrap_or_default();
        loop {
            if interrupted.load(Ordering::SeqCst) {
                return Err(SoakError::Interrupted);
            }
            self.tick()?;
            let now = self.router_view().unwrap_or_default();
            let behind: Vec<u64> = (1..=self.config.engines as u64)
                .filter(|worker| {
                    let was = before.get(worker).map_or(0, |view| view.received);
                    now.get(worker).is_none_or(|view| view.received <= was)
                })
                .collect();
            if behind.is_empty() {
                return Ok(KillRecord {
                    target,
                    at,
                    recovered_after: killed.elapsed(),
                });
            }
            if killed.elapsed() > self.config.recovery_timeout {
                return Err(SoakError::NotRecovered {
                    target,
                    waited: self.config.recovery_timeout,
                    detail: format!("no new events at the router from workers {behind:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the router holds exactly each engine's cache and has received nothing
    /// new for 2 s; its last view if so, `None` if the drain timed out.
    fn drain(
        &mut self,
        stopped: &[Stopped],
        interrupted: &AtomicBool,
    ) -> Result<Option<RouterView>, SoakError> {
        let start = Instant::now();
        let mut quiet_since: Option<(Instant, u64)> = None;
        while start.elapsed() < self.config.drain_timeout {
            if interrupted.load(Ordering::SeqCst) {
                return Err(SoakError::Interrupted);
            }
            if let Some(router) = &mut self.router {
                router.check_alive()?;
            }
            if let Some(view) = self.router_view() {
                let received: u64 = view.values().map(|worker| worker.received).sum();
                let matches = matches_engines(&view, stopped).is_empty();
                match quiet_since {
                    Some((since, was)) if was == received => {
                        if matches && since.elapsed() >= Duration::from_secs(2) {
                            return Ok(Some(view));
                        }
                    }
                    _ => quiet_since = Some((Instant::now(), received)),
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(None)
    }

    /// Stops relays (their final stats), counts the stream, rebuilds from it, reads the
    /// router, stops it, and judges.
    fn finish(mut self, input: FinishInput) -> Result<SoakReport, SoakError> {
        for relay in self.relays.iter_mut() {
            if let Some(relay) = relay.take() {
                self.relay_totals.add(relay.stop(STOP_GRACE).as_ref());
            }
        }
        let stream_messages = self.stream_messages()?;
        let rebuilt = self.rebuild(stream_messages)?;
        let rebuilt_view = observe::view_of(&lock(&rebuilt));
        let stream_events = lock(&rebuilt).metrics().events_received;
        // The router has what the stream has, or gets it within a few seconds.
        let mut router_metrics = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Some(text) = self
            .router_api
            .as_ref()
            .and_then(|api| api.get(&self.runtime, "/metrics"))
        {
            let received =
                observe::metric(&text, "kvtwin_router_events_received_total").unwrap_or(0);
            let applied =
                observe::metric(&text, "kvtwin_router_kv_cache_events_applied_total").unwrap_or(0);
            router_metrics = (received, applied);
            if let Some(reconnects) =
                observe::metric(&text, "kvtwin_router_source_reconnects_total")
            {
                self.router_reconnects.1 = reconnects;
            }
            if received >= stream_events || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let final_view = self.router_view();
        if let Some(router) = self.router.take() {
            router.stop(STOP_GRACE);
        }
        let _ = self.server.stop();

        let windows = Windows::of(self.config.duration);
        let rss = self
            .lives
            .iter()
            .map(|(process, lives)| {
                let lives: Vec<Life> = lives.iter().map(|(_, life)| life.clone()).collect();
                judge_rss(process, &lives, &windows, RssBound::of(process))
            })
            .collect::<Vec<_>>();

        let mut verdicts = Vec::new();
        let router_view = final_view.or(input.drained.clone());
        let state_detail = match &router_view {
            None => vec!["the router did not answer".to_string()],
            Some(view) => {
                let mut detail = matches_engines(view, &input.stopped);
                if input.drained.is_none() {
                    detail.push(format!(
                        "the drain timed out after {:?}",
                        self.config.drain_timeout
                    ));
                }
                detail.extend(
                    matches_engines(&rebuilt_view, &input.stopped)
                        .into_iter()
                        .map(|d| format!("rebuild from the stream: {d}")),
                );
                detail
            }
        };
        let engines_blocks: u64 = input.stopped.iter().map(|s| s.cached_blocks).sum();
        verdicts.push(Verdict {
            name: "state",
            passed: state_detail.is_empty(),
            detail: if state_detail.is_empty() {
                format!(
                    "the router and a rebuild from the stream hold exactly the engines' {} cached blocks ({} engines, digests equal)",
                    engines_blocks,
                    input.stopped.len()
                )
            } else {
                state_detail.join("; ")
            },
        });
        let acked = self.relay_totals.events;
        let (received, applied) = router_metrics;
        verdicts.push(Verdict {
            name: "acknowledged",
            passed: acked <= stream_events && received == stream_events,
            detail: format!(
                "relays acked {acked} events, the stream holds {stream_events}, the router received {received}"
            ),
        });
        let failing: Vec<String> = rss
            .iter()
            .filter(|rss| !rss.passed())
            .map(|rss| {
                format!(
                    "{}: {:?} KiB after warm-up, {:?} KiB in the last window",
                    rss.process, rss.after_warm_up_kib, rss.last_window_kib
                )
            })
            .collect();
        verdicts.push(Verdict {
            name: "rss",
            passed: failing.is_empty(),
            detail: if failing.is_empty() {
                let worst = rss
                    .iter()
                    .filter(|rss| rss.judged())
                    .filter_map(|rss| rss.ratio().map(|ratio| (ratio, rss.process.clone())))
                    .max_by(|a, b| a.0.total_cmp(&b.0));
                match worst {
                    Some((ratio, process)) => format!(
                        "every process within its bound of its RSS after warm-up (10 %; the nats-server 2x; highest: {process}, {:+.1} %)",
                        (ratio - 1.0) * 100.0
                    ),
                    None => "no process judged".to_string(),
                }
            } else {
                format!("over its bound above after warm-up: {}", failing.join("; "))
            },
        });

        let sum = |pick: fn(&(u64, u64, u64)) -> u64| input.sent.iter().map(pick).sum::<u64>();
        Ok(SoakReport {
            config: self.config.clone(),
            elapsed: input.elapsed,
            drain: input.drain,
            batches_sent: sum(|s| s.0),
            events_sent: sum(|s| s.1),
            blocks_sent: sum(|s| s.2),
            events_acked: acked,
            publish_failures: self.relay_totals.publish_failures,
            relay_lost_batches: self.relay_totals.lost_batches,
            stream_messages,
            stream_events,
            router_events_received: received,
            router_events_applied: applied,
            zmq_replayed_batches: input
                .stopped
                .iter()
                .map(|engine| engine.publisher.stats().replayed_batches)
                .sum(),
            jetstream_replayed_messages: self.jetstream_replayed_messages,
            relay_reconnects: self.relay_totals.reconnects,
            router_reconnects: self.router_reconnects.0 + self.router_reconnects.1,
            kills: input.kills,
            rss,
            verdicts,
        })
    }

    /// A fresh router state rebuilt from the whole stream (`stream_messages` of them),
    /// by this process.
    fn rebuild(&self, stream_messages: u64) -> Result<SharedState, SoakError> {
        let state: SharedState = Arc::new(Mutex::new(RouterState::new(16)));
        let source = self
            .runtime
            .block_on(NatsSource::connect(NatsSourceConfig {
                subscriber: SubscriberConfig::new(
                    &self.server.url(),
                    SUBJECT,
                    ConsumeMode::Replay {
                        stream: STREAM.to_string(),
                    },
                ),
                limits: DecodeLimits::default(),
            }))?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = self.runtime.spawn(source.run(state.clone(), async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        let deadline = Instant::now() + self.config.drain_timeout;
        while lock(&state).metrics().batches < stream_messages && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = stop.send(true);
        let _ = self.runtime.block_on(task);
        Ok(state)
    }
}

/// Where `view` differs from the engines' caches (empty when it matches exactly).
fn matches_engines(view: &RouterView, stopped: &[Stopped]) -> Vec<String> {
    let mut differences = Vec::new();
    for (index, engine) in stopped.iter().enumerate() {
        let worker = index as u64 + 1;
        match view.get(&worker) {
            None => differences.push(format!("worker {worker}: unknown to the router")),
            Some(got) => {
                if got.digest != engine.digest
                    || got.blocks != engine.cached_blocks
                    || got.indexed_blocks != engine.cached_blocks
                {
                    differences.push(format!(
                        "worker {worker}: {} blocks listed, {} indexed, digest {:016x}; the engine caches {} blocks, digest {:016x}",
                        got.blocks, got.indexed_blocks, got.digest, engine.cached_blocks, engine.digest
                    ));
                }
            }
        }
    }
    differences
}

/// A fresh token for the soak's router, in a file only this user may read (the soak's
/// private temporary directory); the token and the file's path. The secret is 128 bits
/// from the standard library's per-process random hash keys (the OS's randomness), as
/// hex; it never reaches the report or a log.
fn write_token(dir: &Path) -> Result<(AuthToken, PathBuf), SoakError> {
    use std::hash::BuildHasher;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let keys = std::collections::hash_map::RandomState::new();
    let text = format!("{:016x}{:016x}", keys.hash_one(1u8), keys.hash_one(2u8));
    let path = dir.join("router.token");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{text}"))
        .map_err(|source| SoakError::Io {
            what: "write the router's token file".to_string(),
            source,
        })?;
    // Read back as the router reads it, so both sides hold the same secret.
    Ok((AuthToken::from_file(&path)?, path))
}

/// The router's address from its log's "listening on http://ADDR" line.
fn listening_address(log: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .find(|line| line.contains("listening on http://"))?;
    let start = line.find("http://")? + "http://".len();
    line[start..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routers_address_is_read_from_its_listening_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("router.log");
        std::fs::write(&log, "x INFO kvtwin router: events from nats://h\n").unwrap();
        assert_eq!(listening_address(&log), None);
        std::fs::write(
            &log,
            "x INFO kvtwin router: listening on http://127.0.0.1:4321 (POST /v1/route, ...)\n",
        )
        .unwrap();
        assert_eq!(
            listening_address(&log),
            Some("127.0.0.1:4321".parse().unwrap())
        );
    }
}
