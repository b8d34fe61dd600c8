//! What `kvtwin bench serve` measured: the records folded as they come, and the report
//! as one JSON line and as a table.
//!
//! Owns: [`Tally`] (the fold, in bounded memory), [`ServeReport`] and [`RunInfo`]; the
//! report's JSON field names are stable (scripts and `kvtwin validate --engine` read
//! them).
//! Invariants: every record is counted once, as succeeded or as failed under its reason;
//! latencies and token counts are of the succeeded requests; percentiles are nearest-rank
//! (`kvtwin::stats`), exact up to its [`EXACT_SAMPLES`](kvtwin::stats::EXACT_SAMPLES)
//! samples and within 0.1 % beyond; workers are counted up to [`WORKERS_MAX`], the rest
//! together.
//! Never: measure or send anything.

use super::request::RequestRecord;
use kvtwin::stats::{Latencies, LatencySummary};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Distinct workers counted apart; more are counted together as `other`.
pub const WORKERS_MAX: usize = 1024;

/// The records so far, folded.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    requests: u64,
    succeeded: u64,
    failed: BTreeMap<String, u64>,
    ttft: Latencies,
    itl: Latencies,
    e2e: Latencies,
    lag: Latencies,
    prompt_tokens: u64,
    output_tokens: u64,
    cached_tokens: u64,
    /// Prompt tokens of the succeeded requests whose usage gave cached tokens.
    prompt_tokens_with_cached: u64,
    requests_with_cached: u64,
    workers: BTreeMap<u64, u64>,
    other_workers: u64,
    without_worker: u64,
    last_end: Duration,
}

impl Tally {
    /// Nothing counted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `record`.
    pub fn add(&mut self, record: &RequestRecord) {
        self.requests += 1;
        self.last_end = self.last_end.max(record.started + record.e2e);
        if let Some(at) = record.scheduled {
            self.lag.push_duration(record.started.saturating_sub(at));
        }
        match record.worker {
            Some(worker) if self.workers.contains_key(&worker) => {
                *self.workers.entry(worker).or_default() += 1;
            }
            Some(worker) if self.workers.len() < WORKERS_MAX => {
                self.workers.insert(worker, 1);
            }
            Some(_) => self.other_workers += 1,
            None => self.without_worker += 1,
        }
        if let Some(failure) = record.failure {
            *self.failed.entry(failure.reason()).or_default() += 1;
            return;
        }
        self.succeeded += 1;
        if let Some(ttft) = record.ttft {
            self.ttft.push_duration(ttft);
        }
        for gap in &record.itl {
            self.itl.push_duration(*gap);
        }
        self.e2e.push_duration(record.e2e);
        self.prompt_tokens += record.prompt_tokens;
        self.output_tokens += record.output_tokens;
        if let Some(cached) = record.cached_tokens {
            self.cached_tokens += cached;
            self.prompt_tokens_with_cached += record.prompt_tokens;
            self.requests_with_cached += 1;
        }
    }

    /// Requests counted.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Failed requests counted.
    pub fn failed(&self) -> u64 {
        self.requests - self.succeeded
    }

    /// The report, the run having taken `wall`.
    pub fn report(mut self, info: RunInfo, wall: Duration) -> ServeReport {
        ServeReport {
            info,
            requests: self.requests,
            succeeded: self.succeeded,
            failed: self.failed,
            wall,
            ttft: self.ttft.summary(),
            itl: self.itl.summary(),
            e2e: self.e2e.summary(),
            lag: (!self.lag.is_empty()).then(|| self.lag.summary()),
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            cached_tokens: self.cached_tokens,
            prompt_tokens_with_cached: self.prompt_tokens_with_cached,
            requests_with_cached: self.requests_with_cached,
            workers: self.workers,
            other_workers: self.other_workers,
            without_worker: self.without_worker,
        }
    }
}

/// What was run, echoed in the report.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// The server.
    pub url: String,
    /// The model asked for.
    pub model: String,
    /// Streamed answers.
    pub stream: bool,
    /// `synthetic` or `trace`.
    pub workload: &'static str,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Poisson arrivals per second (synthetic open loop).
    pub rate_per_s: Option<f64>,
    /// Trace speedup.
    pub speedup: Option<f64>,
    /// The seed.
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeReport {
    /// What was run.
    pub info: RunInfo,
    /// Requests sent.
    pub requests: u64,
    /// Requests that succeeded.
    pub succeeded: u64,
    /// Failed requests by reason ([`Failure::reason`](super::request::Failure::reason)).
    pub failed: BTreeMap<String, u64>,
    /// First send to the last answer's end.
    pub wall: Duration,
    /// Time to first token (streamed, succeeded).
    pub ttft: LatencySummary,
    /// Gaps between output chunks (streamed, succeeded).
    pub itl: LatencySummary,
    /// End to end (succeeded).
    pub e2e: LatencySummary,
    /// How late requests went out against their arrival times (the concurrency cap, or
    /// a busy client), when they had arrival times.
    pub lag: Option<LatencySummary>,
    /// Prompt tokens of the succeeded requests.
    pub prompt_tokens: u64,
    /// Output tokens of the succeeded requests.
    pub output_tokens: u64,
    /// Cached prompt tokens the server reported.
    pub cached_tokens: u64,
    /// Prompt tokens of the requests that reported cached tokens.
    pub prompt_tokens_with_cached: u64,
    /// Succeeded requests whose usage reported cached tokens.
    pub requests_with_cached: u64,
    /// Requests per worker named by the router.
    pub workers: BTreeMap<u64, u64>,
    /// Requests of workers past [`WORKERS_MAX`].
    pub other_workers: u64,
    /// Requests whose answer named no worker (a server that is not a kvtwin router, or
    /// no answer).
    pub without_worker: u64,
}

fn ms(span: Duration) -> f64 {
    span.as_secs_f64() * 1e3
}

fn latency_json(summary: &LatencySummary) -> Value {
    json!({
        "p50": ms(summary.p50),
        "p90": ms(summary.p90),
        "p99": ms(summary.p99),
        "mean": summary.mean_ns / 1e6,
        "max": ms(summary.max),
        "samples": summary.samples,
    })
}

impl ServeReport {
    /// Failed requests, all reasons.
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    /// Cached over prompt tokens, of the requests that reported cached tokens; `None`
    /// when none did (vLLM reports them with `--enable-prompt-tokens-details`).
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.prompt_tokens_with_cached > 0)
            .then(|| self.cached_tokens as f64 / self.prompt_tokens_with_cached as f64)
    }

    fn per_s(&self, count: u64) -> f64 {
        count as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Succeeded requests per second.
    pub fn requests_per_s(&self) -> f64 {
        self.per_s(self.succeeded)
    }

    /// Output tokens per second.
    pub fn output_tokens_per_s(&self) -> f64 {
        self.per_s(self.output_tokens)
    }

    /// The report's JSON line.
    pub fn to_json(&self) -> Value {
        let mut workers: Map<String, Value> = self
            .workers
            .iter()
            .map(|(worker, count)| (worker.to_string(), json!(count)))
            .collect();
        if self.other_workers > 0 {
            workers.insert("other".into(), json!(self.other_workers));
        }
        json!({
            "bench": "serve",
            "url": self.info.url,
            "model": self.info.model,
            "stream": self.info.stream,
            "workload": self.info.workload,
            "concurrency": self.info.concurrency,
            "rate_per_s": self.info.rate_per_s,
            "speedup": self.info.speedup,
            "seed": self.info.seed,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "failed": self.failed_total(),
            "failed_by_reason": self.failed,
            "wall_s": self.wall.as_secs_f64(),
            "requests_per_s": self.requests_per_s(),
            "output_tokens_per_s": self.output_tokens_per_s(),
            "ttft_ms": latency_json(&self.ttft),
            "itl_ms": latency_json(&self.itl),
            "e2e_ms": latency_json(&self.e2e),
            "arrival_lag_ms": self.lag.as_ref().map(latency_json),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "requests_with_cached_tokens": self.requests_with_cached,
            "hit_ratio": self.hit_ratio(),
            "requests_per_worker": workers,
            "requests_without_worker": self.without_worker,
        })
    }
}

impl std::fmt::Display for ServeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let load = match (self.info.rate_per_s, self.info.speedup) {
            (Some(rate), _) => format!(
                "open loop at {rate} req/s, at most {} in flight",
                self.info.concurrency
            ),
            (None, Some(speedup)) => format!(
                "trace at {speedup}x, at most {} in flight",
                self.info.concurrency
            ),
            (None, None) => format!("closed loop, {} in flight", self.info.concurrency),
        };
        writeln!(
            f,
            "serve: {} ({}, {}), {} workload, {load}",
            self.info.url,
            self.info.model,
            if self.info.stream {
                "streamed"
            } else {
                "whole answers"
            },
            self.info.workload,
        )?;
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(f, "  {name:<26} {value}")
        };
        let failed = if self.failed.is_empty() {
            "0".to_string()
        } else {
            let reasons: Vec<String> = self
                .failed
                .iter()
                .map(|(reason, count)| format!("{reason} {count}"))
                .collect();
            format!("{} ({})", self.failed_total(), reasons.join(", "))
        };
        row(
            f,
            "requests",
            format!("{} sent, {} succeeded", self.requests, self.succeeded),
        )?;
        row(f, "failed", failed)?;
        row(f, "wall", format!("{:.3} s", self.wall.as_secs_f64()))?;
        row(
            f,
            "throughput",
            format!(
                "{:.2} req/s, {:.1} output tokens/s",
                self.requests_per_s(),
                self.output_tokens_per_s()
            ),
        )?;
        writeln!(
            f,
            "  {:<26} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency (ms)", "p50", "p90", "p99", "mean", "samples"
        )?;
        let mut latencies = vec![
            ("TTFT", &self.ttft),
            ("ITL", &self.itl),
            ("end to end", &self.e2e),
        ];
        if let Some(lag) = &self.lag {
            latencies.push(("arrival lag", lag));
        }
        for (name, summary) in latencies {
            writeln!(
                f,
                "  {name:<26} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9}",
                ms(summary.p50),
                ms(summary.p90),
                ms(summary.p99),
                summary.mean_ns / 1e6,
                summary.samples
            )?;
        }
        row(
            f,
            "tokens",
            format!(
                "{} prompt, {} output",
                self.prompt_tokens, self.output_tokens
            ),
        )?;
        row(
            f,
            "cached prompt tokens",
            match self.hit_ratio() {
                Some(ratio) => format!("{} (hit ratio {:.3})", self.cached_tokens, ratio),
                None => "not reported (vLLM: --enable-prompt-tokens-details)".into(),
            },
        )?;
        if !self.workers.is_empty() || self.other_workers > 0 {
            let mut per: Vec<String> = self
                .workers
                .iter()
                .map(|(worker, count)| format!("{worker}: {count}"))
                .collect();
            if self.other_workers > 0 {
                per.push(format!("other: {}", self.other_workers));
            }
            row(f, "requests per worker", per.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::Failure;
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            url: "http://127.0.0.1:1".into(),
            model: "tiny".into(),
            stream: true,
            workload: "synthetic",
            concurrency: 4,
            rate_per_s: None,
            speedup: None,
            seed: 1,
        }
    }

    fn record(index: u64, e2e_ms: u64) -> RequestRecord {
        RequestRecord {
            index,
            started: Duration::from_millis(index),
            status: Some(200),
            ttft: Some(Duration::from_millis(e2e_ms / 2)),
            itl: vec![Duration::from_millis(1), Duration::from_millis(3)],
            e2e: Duration::from_millis(e2e_ms),
            prompt_tokens: 100,
            output_tokens: 3,
            cached_tokens: Some(if index.is_multiple_of(2) { 64 } else { 0 }),
            worker: Some(1 + index % 2),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_of_the_succeeded_and_failures_are_counted_by_reason() {
        let mut tally = Tally::new();
        // e2e 1..=100 ms, in a shuffled order.
        for k in 0..100u64 {
            tally.add(&record(k, (k * 37) % 100 + 1));
        }
        for (k, failure) in [Failure::Status(500), Failure::Timeout, Failure::Status(500)]
            .into_iter()
            .enumerate()
        {
            tally.add(&RequestRecord {
                index: 100 + k as u64,
                failure: Some(failure),
                e2e: Duration::from_secs(9),
                ..RequestRecord::default()
            });
        }
        let report = tally.report(info(), Duration::from_secs(2));
        assert_eq!((report.requests, report.succeeded), (103, 100));
        assert_eq!(report.failed_total(), 3);
        assert_eq!(report.failed.get("http_500"), Some(&2));
        assert_eq!(report.failed.get("timeout"), Some(&1));
        // Nearest rank: the q quantile of 100 samples is the sample of rank ⌈100q⌉.
        assert_eq!(report.e2e.p50, Duration::from_millis(50));
        assert_eq!(report.e2e.p90, Duration::from_millis(90));
        assert_eq!(report.e2e.p99, Duration::from_millis(99));
        assert_eq!(report.e2e.mean_ns, 50.5e6);
        assert_eq!(report.e2e.samples, 100, "failures have no latency");
        // 200 gaps, half 1 ms and half 3 ms.
        assert_eq!(report.itl.samples, 200);
        assert_eq!(report.itl.p50, Duration::from_millis(1));
        assert_eq!(report.itl.p90, Duration::from_millis(3));
        assert_eq!(report.itl.mean_ns, 2e6);
        assert_eq!(report.ttft.p50, Duration::from_millis(25));
        // Hits: 50 requests of 100 tokens with 64 cached, 50 with none.
        assert_eq!(report.prompt_tokens, 10_000);
        assert_eq!(report.cached_tokens, 3_200);
        assert_eq!(report.hit_ratio(), Some(0.32));
        assert_eq!(report.requests_per_s(), 50.0);
        assert_eq!(report.output_tokens_per_s(), 150.0);
        let json = report.to_json();
        assert_eq!(json["requests_per_worker"], json!({"1": 50, "2": 50}));
        assert_eq!(json["requests_without_worker"], 3);
        assert_eq!(
            json["failed_by_reason"],
            json!({"http_500": 2, "timeout": 1})
        );
        assert_eq!(json["e2e_ms"]["p99"], 99.0);
        assert_eq!(json["hit_ratio"], 0.32);
        assert_eq!(json["arrival_lag_ms"], Value::Null);
        let table = report.to_string();
        assert!(table.contains("3 (http_500 2, timeout 1)"), "{table}");
        assert!(table.contains("hit ratio 0.320"), "{table}");
        assert!(table.contains("1: 50, 2: 50"), "{table}");
    }

    #[test]
    fn no_cached_tokens_reported_is_no_hit_ratio_and_workers_are_bounded() {
        let mut tally = Tally::new();
        for k in 0..(WORKERS_MAX as u64 + 5) {
            tally.add(&RequestRecord {
                index: k,
                worker: Some(k),
                scheduled: Some(Duration::from_millis(k)),
                started: Duration::from_millis(k + 2),
                prompt_tokens: 10,
                ..RequestRecord::default()
            });
        }
        let report = tally.report(info(), Duration::from_secs(1));
        assert_eq!(report.hit_ratio(), None);
        assert_eq!(report.to_json()["hit_ratio"], Value::Null);
        assert_eq!(report.workers.len(), WORKERS_MAX);
        assert_eq!(report.other_workers, 5);
        assert_eq!(report.lag.unwrap().p99, Duration::from_millis(2));
        assert!(report.to_string().contains("not reported"));
    }
}
