//! The driver of `kvtwin bench serve`: the model found, the requests sent at their
//! arrival times with at most `concurrency` in flight, each record handed to the caller
//! and folded into the report.
//!
//! Owns: [`run_serve_bench`].
//! Invariants: at most `concurrency` requests are in flight and held (the workload makes
//! the next one only when it may go); a request due while the cap is full waits, and its
//! lateness is reported (`arrival_lag_ms`); every spawned request is joined and its
//! record handed over before the run returns. Trace rows are read from the file on the
//! driver's task, one line at a time. The wall clock is read only to time.
//! Never: retry a failed request, or stop the run because requests fail (they are
//! counted); only an observer's error stops it, and requests in flight are then
//! abandoned.

use super::report::{RunInfo, ServeReport, Tally};
use super::request::{send, RequestRecord, Target};
use super::workload::{Arrivals, RequestSource, Workload};
use super::{ServeConfig, ServeError};
use crate::service::frontend::engine_client::{check_engine_url, EngineClient, EngineTimeouts};
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The model list's size, at most.
const MODELS_BYTES_MAX: usize = 1 << 20;
/// The model list's deadline, at most.
const MODELS_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// Runs `config`, handing each request's record to `observer` as it ends (in the order
/// they end); the report.
pub async fn run_serve_bench(
    config: &ServeConfig,
    observer: &mut (dyn FnMut(&RequestRecord) -> std::io::Result<()> + Send),
) -> Result<ServeReport, ServeError> {
    let url = check_engine_url(&config.url).map_err(ServeError::Url)?;
    if config.concurrency == 0 {
        return Err(ServeError::BadFlag {
            flag: "--concurrency",
            reason: "must be at least 1",
        });
    }
    if config.timeout.is_zero() {
        return Err(ServeError::BadFlag {
            flag: "--timeout-s",
            reason: "must be positive",
        });
    }
    let mut source = RequestSource::new(&config.workload, config.seed)?;
    let timeouts = EngineTimeouts {
        connect: config.timeout,
        first_byte: config.timeout,
        idle: config.timeout,
        probe: config.timeout.min(MODELS_TIMEOUT_MAX),
    };
    let mut client = EngineClient::new(timeouts);
    if let Some(token) = &config.token {
        client = client.with_authorization(token.authorization());
    }
    let model = match &config.model {
        Some(model) => model.clone(),
        None => first_model(&client, &url).await?,
    };
    let target = std::sync::Arc::new(Target {
        url: url.clone(),
        model: model.clone(),
        stream: config.stream,
        timeout: config.timeout,
        pinned: config.pinned,
    });
    let info = RunInfo {
        url,
        model,
        stream: config.stream,
        workload: match config.workload {
            Workload::Synthetic(_) => "synthetic",
            Workload::Trace(_) => "trace",
        },
        concurrency: config.concurrency,
        rate_per_s: match &config.workload {
            Workload::Synthetic(spec) => match spec.arrivals {
                Arrivals::Poisson { rate_per_s } => Some(rate_per_s),
                Arrivals::Closed => None,
            },
            Workload::Trace(_) => None,
        },
        speedup: match &config.workload {
            Workload::Trace(spec) => Some(spec.speedup),
            Workload::Synthetic(_) => None,
        },
        seed: config.seed,
    };

    let mut tally = Tally::new();
    let mut tasks: JoinSet<RequestRecord> = JoinSet::new();
    let origin = Instant::now();
    let mut finish = |joined: Result<RequestRecord, tokio::task::JoinError>,
                      tally: &mut Tally|
     -> Result<(), ServeError> {
        let record = match joined {
            Ok(record) => record,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        };
        tally.add(&record);
        observer(&record).map_err(|source| ServeError::Observer {
            index: record.index,
            source,
        })
    };
    while let Some(planned) = source.next_request()? {
        if let Some(at) = planned.at {
            let due = tokio::time::Instant::from_std(origin + at);
            loop {
                tokio::select! {
                    biased;
                    Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                        finish(joined, &mut tally)?;
                    }
                    () = tokio::time::sleep_until(due) => break,
                }
            }
        }
        while tasks.len() >= config.concurrency {
            let joined = tasks.join_next().await.expect("the set is not empty");
            finish(joined, &mut tally)?;
        }
        let (client, target) = (client.clone(), target.clone());
        tasks.spawn(async move { send(&client, &target, planned, origin).await });
    }
    while let Some(joined) = tasks.join_next().await {
        finish(joined, &mut tally)?;
    }
    let wall = origin.elapsed();
    Ok(tally.report(info, wall))
}

/// The first model the server lists.
async fn first_model(client: &EngineClient, url: &str) -> Result<String, ServeError> {
    let fail = |reason: String| ServeError::Models {
        url: url.to_string(),
        reason,
    };
    let (status, body) = client
        .get(url, "/v1/models", MODELS_BYTES_MAX)
        .await
        .map_err(|error| fail(error.to_string()))?;
    if !status.is_success() {
        let hint = if status.as_u16() == 401 {
            " (unauthorized: give the router's token with --router-token-file PATH or \
             KVTWIN_AUTH_TOKEN)"
        } else {
            ""
        };
        return Err(fail(format!("HTTP {}{hint}", status.as_u16())));
    }
    let list: Value =
        serde_json::from_slice(&body).map_err(|error| fail(format!("not JSON: {error}")))?;
    list.pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| fail("it lists no model".into()))
}
