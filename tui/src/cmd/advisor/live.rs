//! `kvtwin advisor --nats ... / --zmq ...`: the advisor on the live event plane.
//!
//! One loop (a tokio task) owns the `Advisor`: it applies what the sources hand over
//! ([`super::sources`]) in the order received, appends each event to `--record`'s file,
//! and every `--interval` takes a report (the index's figures at once; the tier sizes,
//! which replay the window many times, from a copy of the window on a blocking thread,
//! while events keep being applied; a tick while one is being sized is skipped), then
//! prints it (a table, or one JSON object a line with `--json`) and hands its figures to
//! `--metrics-listen`. Time, for the advisor, is the
//! number of events received so far, so a report's idle times are in events and a
//! recording replays to the same index. It stops after `--reports` reports, at
//! `--duration` or on Ctrl-C / SIGTERM; the last two drain what the sources had already
//! handed over and print a last report.
//! Bad input is counted by reason (undecodable messages and batches, the index's
//! anomalies) and warned about at most once per reason every 10 s.
//! Owns: [`LiveReport`], the loop, the recording. Never: decode (sources do), or decide
//! anything about blocks (`kvtwin_sim::advisor` does).

use super::metrics::{render, serve_metrics};
use super::sources::{self, Input, SourceSpecs, CHANNEL_BOUND};
use super::{print, AdvisorArgs};
use crate::args::nats::DEFAULT_SUBJECT;
use crate::runtime::{runtime, stop_on_signal, stopped};
use anyhow::{Context, Result};
use kvtwin_plane::service::warn::WarnLimiter;
use kvtwin_plane::wire::RouterEvent;
use kvtwin_sim::advisor::index::query::QueryOptions;
use kvtwin_sim::advisor::index::IndexBounds;
use kvtwin_sim::advisor::report::{Advisor, AdvisorConfig, AdvisorReport, ReportOptions, Sizing};
use kvtwin_sim::advisor::Access;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// One source's counts.
#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct SourceStats {
    /// What it is (`nats URL SUBJECT`, `zmq ENDPOINT worker W`).
    pub(super) source: String,
    /// Events received from it.
    pub(super) events: u64,
    /// Messages, batches or events it refused.
    pub(super) dropped: u64,
    /// Engine batches lost (ZMQ).
    pub(super) lost_batches: u64,
    /// Why it stopped, if it did.
    pub(super) failed: Option<String>,
}

/// One live report.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LiveReport {
    /// Its number, from 1.
    pub(super) report: u64,
    /// Milliseconds since the advisor started.
    pub(super) elapsed_ms: u64,
    /// Events received (the advisor's clock).
    pub(super) events_received: u64,
    /// Messages, batches or events refused, by reason.
    pub(super) bad_events: BTreeMap<&'static str, u64>,
    /// Events the index could not apply as they stood, by reason.
    pub(super) anomalies: BTreeMap<&'static str, u64>,
    /// Per source.
    pub(super) sources: Vec<SourceStats>,
    /// The advisor's report.
    #[serde(flatten)]
    pub(super) advisor: AdvisorReport,
}

/// The loop's state.
struct Live {
    advisor: Advisor,
    options: ReportOptions,
    received: u64,
    bad: BTreeMap<&'static str, u64>,
    anomalies: BTreeMap<&'static str, u64>,
    sources: Vec<SourceStats>,
    record: Option<std::io::BufWriter<std::fs::File>>,
    record_line: Vec<u8>,
    warnings: WarnLimiter,
    reports: u64,
    started: Instant,
}

impl Live {
    fn apply(&mut self, input: Input) -> Result<()> {
        match input {
            Input::Events { source, events } => {
                self.sources[source].events += events.len() as u64;
                for event in events {
                    self.event(&event)?;
                }
            }
            Input::Dropped {
                source,
                reason,
                count,
            } => {
                self.sources[source].dropped += count;
                *self.bad.entry(reason).or_default() += count;
                if let Some(held_back) = self.warnings.admit(reason, std::time::Instant::now()) {
                    tracing::warn!(
                        source = %self.sources[source].source,
                        reason,
                        held_back,
                        "kvtwin advisor: refused a message ({reason})"
                    );
                }
            }
            Input::Lost { source, batches } => {
                self.sources[source].lost_batches += batches;
                *self.bad.entry("lost_batches").or_default() += batches;
                if let Some(held_back) = self.warnings.admit("lost", std::time::Instant::now()) {
                    tracing::warn!(
                        source = %self.sources[source].source,
                        batches,
                        held_back,
                        "kvtwin advisor: engine batches lost"
                    );
                }
            }
            Input::Failed { source, error } => {
                tracing::error!(source = %self.sources[source].source, %error, "kvtwin advisor: a source stopped");
                self.sources[source].failed = Some(error);
            }
        }
        Ok(())
    }

    fn event(&mut self, event: &RouterEvent) -> Result<()> {
        self.received += 1;
        if let Some(record) = &mut self.record {
            self.record_line.clear();
            event.write_json(&mut self.record_line);
            self.record_line.push(b'\n');
            record
                .write_all(&self.record_line)
                .context("writing --record")?;
        }
        if let Err(anomaly) =
            self.advisor
                .handle_event(event.worker_id, &event.event, self.received)
        {
            let reason = anomaly.reason();
            *self.anomalies.entry(reason).or_default() += 1;
            if let Some(held_back) = self.warnings.admit(reason, std::time::Instant::now()) {
                tracing::warn!(
                    worker_id = event.worker_id.get(),
                    held_back,
                    "kvtwin advisor: {anomaly}"
                );
            }
        }
        Ok(())
    }

    /// The next report as it stands now, and the sizing still to do: its window and
    /// options, for [`Sizing::of`] wherever the caller likes.
    fn report(&mut self) -> Result<(LiveReport, SizingJob)> {
        if let Some(record) = &mut self.record {
            record.flush().context("writing --record")?;
        }
        self.reports += 1;
        let report = LiveReport {
            report: self.reports,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            events_received: self.received,
            bad_events: self.bad.clone(),
            anomalies: self.anomalies.clone(),
            sources: self.sources.clone(),
            advisor: self.advisor.report_index(self.received, &self.options),
        };
        let job = SizingJob {
            window: self.advisor.window().to_vec(),
            options: self.options.clone(),
            block_bytes: self.advisor.index().block_bytes(),
        };
        Ok((report, job))
    }
}

/// A report's sizing to do: a copy of the window at the report's moment.
struct SizingJob {
    window: Vec<Access>,
    options: ReportOptions,
    block_bytes: u64,
}

impl SizingJob {
    /// `report` with its sizing.
    fn finish(self, mut report: LiveReport) -> LiveReport {
        Sizing::of(&self.window, &self.options, self.block_bytes).fill(&mut report.advisor);
        report
    }
}

/// `kvtwin advisor` on the live plane.
pub(super) fn run(args: &AdvisorArgs) -> Result<()> {
    crate::logging::init(args.log_format, crate::logging::SERVICE_DEFAULT)?;
    runtime()?.block_on(live(args))
}

async fn live(args: &AdvisorArgs) -> Result<()> {
    let stop = stop_on_signal()?;
    let record = match &args.record {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--record {}", path.display()))?,
        )),
        None => None,
    };
    let subjects = if args.subject.is_empty() {
        vec![DEFAULT_SUBJECT.to_string()]
    } else {
        args.subject.clone()
    };
    let (sender, mut receiver) = mpsc::channel(CHANNEL_BOUND);
    let specs = SourceSpecs {
        nats: args.nats.as_deref(),
        subjects,
        auth: args.nats_auth.auth()?,
        zmq: args.zmq_sources(),
    };
    let sources = sources::start(specs, sender).await?;
    let (metrics, metrics_text) = watch::channel(String::new());
    if let Some(address) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--metrics-listen {address}"))?;
        let bound = listener.local_addr().context("the metrics address")?;
        tracing::info!("kvtwin advisor: metrics on http://{bound}/metrics");
        let serving = serve_metrics(listener, metrics_text, stopped(&stop));
        tokio::spawn(async move {
            if let Err(error) = serving.await {
                tracing::warn!(%error, "kvtwin advisor: the metrics listener failed");
            }
        });
    }
    let mut live = Live {
        advisor: Advisor::new(AdvisorConfig {
            bounds: IndexBounds {
                blocks_max: args.max_blocks,
                ..IndexBounds::default()
            },
            window_blocks_max: args.window_blocks,
            block_bytes: args.block_bytes,
        }),
        options: ReportOptions {
            query: QueryOptions {
                top: args.top,
                hot_accesses_min: args.hot_accesses_min,
                cold_idle_min: args.cold_idle_events,
            },
            policies: args.policies(),
            fractions: args.size_for.clone(),
            capacities: args.capacity_blocks.clone(),
        },
        received: 0,
        bad: BTreeMap::new(),
        anomalies: BTreeMap::new(),
        sources: sources
            .labels
            .iter()
            .map(|label| SourceStats {
                source: label.clone(),
                ..SourceStats::default()
            })
            .collect(),
        record,
        record_line: Vec::new(),
        warnings: WarnLimiter::default(),
        reports: 0,
        started: Instant::now(),
    };
    tracing::info!(
        "kvtwin advisor: listening to {} (a report every {:.1} s)",
        sources.labels.join(", "),
        args.interval.as_secs_f64()
    );
    let mut tick = tokio::time::interval_at(live.started + args.interval, args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = args.duration.map(|span| live.started + span);
    let until_deadline = async move {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);
    let mut stopping = stop.subscribe();
    let publish = |report: &LiveReport| -> Result<()> {
        print::report(report, args.json)?;
        metrics.send_replace(render(report));
        Ok(())
    };
    // The report being sized on a blocking thread (the window is replayed many times:
    // events keep being applied meanwhile). A tick while one is pending is skipped.
    let mut pending: Option<tokio::task::JoinHandle<LiveReport>> = None;
    // Whether the stop calls for a last report (not after the `--reports`th).
    let last_report = loop {
        tokio::select! {
            input = receiver.recv() => match input {
                Some(input) => live.apply(input)?,
                None => break true,
            },
            _ = tick.tick() => {
                if pending.is_none() {
                    let (report, job) = live.report()?;
                    pending = Some(tokio::task::spawn_blocking(move || job.finish(report)));
                } else {
                    tracing::debug!("kvtwin advisor: a report is still being sized; tick skipped");
                }
            }
            sized = async { pending.as_mut().expect("guarded").await }, if pending.is_some() => {
                pending = None;
                publish(&sized.context("sizing a report")?)?;
                if args.reports.is_some_and(|n| live.reports >= n) {
                    break false;
                }
            }
            _ = &mut until_deadline => break true,
            _ = stopping.wait_for(|stop| *stop) => break true,
        }
    };
    if let Some(sizing) = pending.take() {
        publish(&sizing.await.context("sizing a report")?)?;
    }
    if last_report {
        // What was handed over before the stop is part of the last report.
        while let Ok(input) = receiver.try_recv() {
            live.apply(input)?;
        }
    }
    // Closed first, so a ZMQ thread waiting for room stops waiting, then joined.
    drop(receiver);
    drop(sources);
    if last_report {
        let (report, job) = live.report()?;
        publish(&job.finish(report))?;
    }
    Ok(())
}
