//! The engine's own account of where a request's time went: vLLM's request histograms
//! (`vllm:request_queue_time_seconds` and `vllm:request_prefill_time_seconds`, their sums
//! and counts), read before and after a prefill point, so that a lone request's time to
//! first token splits into the engine's part (queued to scheduled, scheduled to its
//! first token: the step) and the rest (HTTP, the router, the tokenizer, the engine's
//! input and output queues between processes).
//!
//! Owns: [`EngineClock`] and reading it off `/metrics`.
//! Never: judge the figures (the caller takes medians), or fail a profile: an engine
//! without these histograms (not vLLM) reads as `None`.

use super::get_ok;
use anyhow::Result;
use kvtwin_plane::service::frontend::engine_client::EngineClient;

/// The histograms' sums (seconds) and the requests they count, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct EngineClock {
    queue_s: f64,
    prefill_s: f64,
    requests: f64,
}

const QUEUE_SUM: &str = "vllm:request_queue_time_seconds_sum";
const PREFILL_SUM: &str = "vllm:request_prefill_time_seconds_sum";
const PREFILL_COUNT: &str = "vllm:request_prefill_time_seconds_count";

impl EngineClock {
    /// Reads the engine's histograms; `None` when it has none of them.
    pub(super) async fn read(client: &EngineClient, url: &str) -> Result<Option<Self>> {
        let metrics = get_ok(client, url, "/metrics", 16 << 20).await?;
        Ok(Self::parse(&String::from_utf8_lossy(&metrics)))
    }

    /// The clock in a Prometheus text exposition: each figure summed over its label sets
    /// (one per engine of a data-parallel server).
    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut clock = Self::default();
        let mut seen = false;
        for line in text.lines() {
            let Some((name, value)) = sample(line) else {
                continue;
            };
            let slot = match name {
                QUEUE_SUM => &mut clock.queue_s,
                PREFILL_SUM => &mut clock.prefill_s,
                PREFILL_COUNT => &mut clock.requests,
                _ => continue,
            };
            *slot += value;
            seen = true;
        }
        seen.then_some(clock)
    }

    /// The engine's time per request finished since `earlier`, milliseconds (queued to
    /// first token), or `None` when none finished.
    pub(super) fn ms_per_request_since(&self, earlier: &Self) -> Option<f64> {
        let requests = self.requests - earlier.requests;
        (requests >= 1.0).then(|| {
            let seconds = (self.queue_s - earlier.queue_s) + (self.prefill_s - earlier.prefill_s);
            seconds / requests * 1e3
        })
    }
}

/// A sample line's metric name and value (labels dropped), if it is one.
fn sample(line: &str) -> Option<(&str, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let value = line.rsplit(' ').next()?.parse().ok()?;
    Some((&line[..name_end], value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_part_of_a_request_is_read_from_its_histograms() {
        let before = "# HELP x\n\
            vllm:request_queue_time_seconds_sum{engine=\"0\",model_name=\"m\"} 0.5\n\
            vllm:request_prefill_time_seconds_sum{engine=\"0\",model_name=\"m\"} 2.0\n\
            vllm:request_prefill_time_seconds_count{engine=\"0\",model_name=\"m\"} 10.0\n\
            vllm:request_prefill_time_seconds_bucket{le=\"0.3\"} 10.0\n";
        let after = "vllm:request_queue_time_seconds_sum{engine=\"0\"} 0.502\n\
            vllm:request_prefill_time_seconds_sum{engine=\"0\"} 2.04\n\
            vllm:request_prefill_time_seconds_count{engine=\"0\"} 11.0\n\
            vllm:request_prefill_time_seconds_sum{engine=\"1\"} 1.0\n\
            vllm:request_prefill_time_seconds_count{engine=\"1\"} 1.0\n";
        let (before, after) = (
            EngineClock::parse(before).unwrap(),
            EngineClock::parse(after).unwrap(),
        );
        // Two requests finished (one per engine): (0.002 + 0.04 + 1.0) s over two.
        let ms = after.ms_per_request_since(&before).unwrap();
        assert!((ms - 521.0).abs() < 1e-9, "{ms}");
        assert_eq!(before.ms_per_request_since(&before), None);
        assert_eq!(EngineClock::parse("other_metric 1.0\n"), None);
    }
}
