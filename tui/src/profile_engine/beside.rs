//! A request's time outside the engine while the engine steps for another: a fresh
//! prompt sent to an engine that is decoding a long answer, its time to first token less
//! the engine's own queue and prefill times (vLLM's histograms, read around it while the
//! long answer still streams, so that only the probe has finished in between).
//!
//! On vLLM's CPU build the API server and the engine core share the CPU with the
//! forward pass, so this is more than a lone request's overhead (on the 2-core VM, each
//! engine on a core of its own: 4 ms alone, 8 to 10 ms beside a decode). It also holds
//! the wait for the step in flight, which the engine's queue time does not count (vLLM
//! queues a request between steps); the caller takes that off, since the twin's engine
//! makes a request arriving mid-step wait anyway.
//!
//! Owns: the probe's timing and the sample. Never: judges the samples (the caller takes
//! the median) or runs without the engine's histograms (a sample needs them).

use super::engine_time::EngineClock;
use super::{check, PlannedRequest};
use anyhow::Result;
use kvtwin_plane::bench::serve::request::{send, Target};
use kvtwin_plane::service::frontend::engine_client::EngineClient;
use std::time::{Duration, Instant};

/// Outputs of the long answer: it decodes well past the probe (48 steps of a few to a
/// few tens of milliseconds).
pub(super) const BACKGROUND_TOKENS: u32 = 48;

/// How long after the long answer is sent the probe goes: past its prefill, into its
/// decode.
const PROBE_AFTER: Duration = Duration::from_millis(40);

/// Each engine's sample (in `targets`' order, all at once): the probe's time to first
/// token less the engine's part of it, milliseconds; `None` where the engine keeps no
/// histograms or another request finished around the probe.
pub(super) async fn overhead_beside_decode(
    client: &EngineClient,
    targets: &[(&Target, &str)],
    planned: Vec<(PlannedRequest, PlannedRequest)>,
) -> Result<Vec<Option<f64>>> {
    let origin = Instant::now();
    let each =
        targets
            .iter()
            .zip(planned)
            .map(|(&(target, url), (background, probe))| async move {
                let long = send(client, target, background, origin);
                let probed = async {
                    tokio::time::sleep(PROBE_AFTER).await;
                    let before = EngineClock::read(client, url).await.ok().flatten();
                    let record = send(client, target, probe, origin).await;
                    let after = EngineClock::read(client, url).await.ok().flatten();
                    (record, before, after)
                };
                let (long, (record, before, after)) = tokio::join!(long, probed);
                (target, long, record, before, after)
            });
    let mut samples = Vec::with_capacity(targets.len());
    for (target, long, record, before, after) in futures::future::join_all(each).await {
        check(long, target)?;
        let record = check(record, target)?;
        let ttft = record.ttft.unwrap_or(record.e2e).as_secs_f64() * 1e3;
        samples.push(match (before, after) {
            (Some(before), Some(after)) if after.requests_since(&before) == 1.0 => after
                .ms_per_request_since(&before)
                .map(|engine| ttft - engine),
            _ => None,
        });
    }
    Ok(samples)
}
