//! One request of `kvtwin bench serve`: its body, its exchange with the server under one
//! deadline, and what it measured.
//!
//! Owns: [`Target`] (where and how requests go), [`Failure`] (why a request failed, with
//! a stable label), [`RequestRecord`] (one request's figures, and its JSON line for
//! `--out`) and [`send`].
//! Invariants: every request ends as a record, succeeded or failed with a reason, within
//! its deadline; a streamed answer's time to first token is the first chunk carrying
//! output, its inter-token gaps those between such chunks (at most
//! [`ITL_SAMPLES_MAX`] kept per request); token counts come from the answer's usage
//! when it has one. The wall clock is read here, and only to measure.
//! Never: retry, or decide what to send (the workload does) or when (the driver does).

use super::workload::PlannedRequest;
use crate::service::frontend::engine_client::{BodyReader, EngineClient, EngineError};
use crate::service::frontend::openai::{chunk_tokens, usage_of, TokenTimes, Usage};
use crate::service::sse::SseParser;
use bytes::Bytes;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Inter-token gaps kept per request (the report's summary takes them all).
pub const ITL_SAMPLES_MAX: usize = 4096;
/// A whole answer (not streamed), or an error's body, read at most.
pub const ANSWER_BYTES_MAX: usize = 64 << 20;
/// The header the router names the serving worker in.
pub const WORKER_HEADER: &str = "x-kvtwin-worker";
/// The header the router numbers its decision in (its order among all it made).
pub const ROUTE_SEQ_HEADER: &str = "x-kvtwin-route-seq";

/// Where requests go and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `http://HOST:PORT`.
    pub url: String,
    /// The `model` of every request.
    pub model: String,
    /// Streamed answers (server-sent events).
    pub stream: bool,
    /// Each request's deadline, from sending to the answer's end.
    pub timeout: Duration,
    /// The engine every request is pinned to behind a router (Dynamo's
    /// `nvext.backend_instance_id`, which `kvtwin router` honours); `None` lets the
    /// router choose.
    pub pinned: Option<u64>,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Failure {
    /// The server answered this status (not 2xx).
    Status(u16),
    /// No connection could be made.
    Connect,
    /// The connection broke before the answer ended.
    Broken,
    /// No whole answer within the deadline.
    Timeout,
    /// A streamed answer carried an error event (the router's, after an engine failed
    /// mid-stream, or the engine's own).
    StreamError,
    /// The answer ended without its end (`[DONE]`) and without output, or is not JSON.
    Incomplete,
    /// The answer was larger than [`ANSWER_BYTES_MAX`].
    TooLarge,
}

impl Failure {
    /// A stable label for the report: `http_<status>`, `connect_error`,
    /// `connection_broken`, `timeout`, `stream_error`, `incomplete`, `too_large`.
    pub fn reason(&self) -> String {
        match self {
            Failure::Status(code) => format!("http_{code}"),
            Failure::Connect => "connect_error".into(),
            Failure::Broken => "connection_broken".into(),
            Failure::Timeout => "timeout".into(),
            Failure::StreamError => "stream_error".into(),
            Failure::Incomplete => "incomplete".into(),
            Failure::TooLarge => "too_large".into(),
        }
    }

    fn of(error: &EngineError) -> Self {
        match error {
            // Listed whole (no wildcard), so a new kind of failure is placed on purpose.
            EngineError::Refused(_) | EngineError::Connect(_) | EngineError::BadUrl { .. } => {
                Failure::Connect
            }
            EngineError::Timeout(_) => Failure::Timeout,
            EngineError::TooLarge(_) => Failure::TooLarge,
            EngineError::Broken(_) => Failure::Broken,
        }
    }
}

/// What one request measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    /// Its place in the workload, from 0.
    pub index: u64,
    /// The synthetic prefix it started with.
    pub prefix: Option<u32>,
    /// The trace line it came from.
    pub line: Option<u64>,
    /// When it was due, from the run's start (`None` in a closed loop).
    pub scheduled: Option<Duration>,
    /// When it was sent, from the run's start.
    pub started: Duration,
    /// The answer's HTTP status, if one came.
    pub status: Option<u16>,
    /// Why it failed; `None` when it succeeded.
    pub failure: Option<Failure>,
    /// Sent to the first output chunk (streamed answers).
    pub ttft: Option<Duration>,
    /// Gaps between output chunks (streamed answers), the first [`ITL_SAMPLES_MAX`].
    pub itl: Vec<Duration>,
    /// Sent to the answer's end, or to the failure.
    pub e2e: Duration,
    /// Prompt tokens (the usage's, else the prompt's length).
    pub prompt_tokens: u64,
    /// Output tokens (the usage's, else the chunks counted).
    pub output_tokens: u64,
    /// Prompt tokens the server found cached, if its usage says.
    pub cached_tokens: Option<u64>,
    /// The worker that served it (the router's `x-kvtwin-worker`), if named.
    pub worker: Option<u64>,
    /// The router's decision's number (`x-kvtwin-route-seq`), if given: the order the
    /// router chose in, which requests sent together need not share with their sending.
    pub route_seq: Option<u64>,
}

impl RequestRecord {
    /// Whether it succeeded.
    pub fn succeeded(&self) -> bool {
        self.failure.is_none()
    }

    /// Its time per output token after the first: (end − first token) / (tokens − 1),
    /// vLLM's benchmark's TPOT. Unlike a mean over [`Self::itl`] it stays right when the
    /// server merged several tokens into one chunk ([`Self::merged_chunks`]).
    pub fn time_per_output_token(&self) -> Option<Duration> {
        let after_first = self.output_tokens.checked_sub(1).filter(|n| *n > 0)?;
        let decoding = self.e2e.checked_sub(self.ttft?)?;
        decoding.checked_div(u32::try_from(after_first).ok()?)
    }

    /// Whether its answer came in fewer chunks than tokens, as far as its gaps were kept:
    /// a busy API server merges outputs into one chunk, so its gaps are not steps.
    pub fn merged_chunks(&self) -> bool {
        self.itl.len() < ITL_SAMPLES_MAX && (self.itl.len() as u64) + 1 < self.output_tokens
    }

    /// Its `--out` line: times in ms, `null` where unknown.
    pub fn to_json(&self) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        json!({
            "index": self.index,
            "prefix": self.prefix,
            "line": self.line,
            "scheduled_ms": self.scheduled.map(ms),
            "start_ms": ms(self.started),
            "status": self.status,
            "outcome": self.failure.map_or_else(|| "ok".to_string(), |f| f.reason()),
            "ttft_ms": self.ttft.map(ms),
            "itl_ms": self.itl.iter().copied().map(ms).collect::<Vec<f64>>(),
            "e2e_ms": ms(self.e2e),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "worker": self.worker,
            "route_seq": self.route_seq,
        })
    }
}

/// The body of a completion request for `planned`.
pub fn body(target: &Target, planned: &PlannedRequest) -> Bytes {
    let mut body = json!({
        "model": target.model,
        "prompt": planned.prompt,
        "max_tokens": planned.max_tokens,
        "ignore_eos": true,
        "stream": target.stream,
    });
    if target.stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    if let Some(worker) = target.pinned {
        body["nvext"] = json!({"backend_instance_id": worker});
    }
    Bytes::from(body.to_string())
}

/// What the answer said, however it ended.
#[derive(Default)]
struct Answer {
    status: Option<u16>,
    worker: Option<u64>,
    route_seq: Option<u64>,
    times: TokenTimes,
    chunk_tokens: u64,
    usage: Option<Usage>,
}

impl Answer {
    fn on_chunk(&mut self, chunk: &Value) -> Result<(), Failure> {
        if chunk.get("error").is_some() {
            return Err(Failure::StreamError);
        }
        if let Some(usage) = usage_of(chunk) {
            self.usage = Some(usage);
        }
        let tokens = chunk_tokens(chunk);
        if tokens > 0 {
            self.times.note(Instant::now(), ITL_SAMPLES_MAX);
            self.chunk_tokens += tokens;
        }
        Ok(())
    }
}

/// Sends `planned` to `target` through `client`, `origin` being the run's start; its
/// record, whatever happened.
pub async fn send(
    client: &EngineClient,
    target: &Target,
    planned: PlannedRequest,
    origin: Instant,
) -> RequestRecord {
    let body = body(target, &planned);
    let sent = Instant::now();
    let mut answer = Answer::default();
    let outcome =
        match tokio::time::timeout(target.timeout, exchange(client, target, body, &mut answer))
            .await
        {
            Ok(outcome) => outcome,
            Err(_) => Err(Failure::Timeout),
        };
    let e2e = sent.elapsed();
    let usage = answer.usage.unwrap_or_default();
    let usage_known = answer.usage.is_some();
    RequestRecord {
        index: planned.index,
        prefix: planned.prefix,
        line: planned.line,
        scheduled: planned.at,
        started: sent - origin,
        status: answer.status,
        failure: outcome.err(),
        ttft: answer.times.first.map(|first| first - sent),
        itl: answer.times.gaps,
        e2e,
        prompt_tokens: if usage_known {
            usage.prompt_tokens
        } else {
            planned.prompt.len() as u64
        },
        output_tokens: if usage_known {
            usage.completion_tokens
        } else {
            answer.chunk_tokens
        },
        cached_tokens: usage.cached_tokens,
        worker: answer.worker,
        route_seq: answer.route_seq,
    }
}

/// The exchange itself; what it learns goes into `answer` as it comes, so a timeout keeps
/// what came before it.
async fn exchange(
    client: &EngineClient,
    target: &Target,
    body: Bytes,
    answer: &mut Answer,
) -> Result<(), Failure> {
    let response = client
        .post_json(&target.url, "/v1/completions", body, &[])
        .await
        .map_err(|error| Failure::of(&error))?;
    let status = response.status();
    answer.status = Some(status.as_u16());
    let header_u64 = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok())
    };
    answer.worker = header_u64(WORKER_HEADER);
    answer.route_seq = header_u64(ROUTE_SEQ_HEADER);
    // The deadline over the whole exchange is the caller's; frames may take all of it.
    let idle = target.timeout;
    if !status.is_success() {
        // Read (bounded) so the connection can be reused; what it says is not counted.
        let _ = BodyReader::new(response.into_body(), idle, ANSWER_BYTES_MAX)
            .read_all()
            .await;
        return Err(Failure::Status(status.as_u16()));
    }
    if !target.stream {
        let whole = BodyReader::new(response.into_body(), idle, ANSWER_BYTES_MAX)
            .read_all()
            .await
            .map_err(|error| Failure::of(&error))?;
        let value: Value = serde_json::from_slice(&whole).map_err(|_| Failure::Incomplete)?;
        if value.get("error").is_some() {
            return Err(Failure::StreamError);
        }
        answer.usage = usage_of(&value);
        if answer.usage.is_none() {
            answer.chunk_tokens = chunk_tokens(&value);
        }
        return Ok(());
    }
    let mut reader = BodyReader::new(response.into_body(), idle, usize::MAX);
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut done = false;
    while let Some(data) = reader.next().await.map_err(|error| Failure::of(&error))? {
        // An over-long line loses its event; the stream goes on.
        let _ = parser.push(&data, &mut events);
        for event in events.drain(..) {
            if event.data == "[DONE]" {
                done = true;
                continue;
            }
            match serde_json::from_str::<Value>(&event.data) {
                Ok(chunk) => answer.on_chunk(&chunk)?,
                Err(_) => return Err(Failure::Incomplete),
            }
        }
    }
    if !done && answer.usage.is_none() && answer.chunk_tokens == 0 {
        return Err(Failure::Incomplete);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_asks_for_ids_without_eos_and_usage_when_streamed() {
        let target = Target {
            url: "http://127.0.0.1:1".into(),
            model: "tiny".into(),
            stream: true,
            timeout: Duration::from_secs(1),
            pinned: None,
        };
        let planned = PlannedRequest {
            index: 0,
            at: None,
            prompt: vec![5, 6, 7],
            max_tokens: 3,
            prefix: None,
            line: None,
        };
        let body: Value = serde_json::from_slice(&body(&target, &planned)).unwrap();
        assert_eq!(
            body,
            json!({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": true,
                   "stream": true, "stream_options": {"include_usage": true}})
        );
        let whole = Target {
            stream: false,
            ..target
        };
        let body: Value = serde_json::from_slice(&super::body(&whole, &planned)).unwrap();
        assert_eq!(body.get("stream_options"), None);
        assert_eq!(body["stream"], false);
    }

    #[test]
    fn chunks_time_output_and_an_error_event_fails_the_request() {
        let mut answer = Answer::default();
        answer
            .on_chunk(&json!({"choices": [{"text": "a"}]}))
            .unwrap();
        answer
            .on_chunk(&json!({"choices": [{"text": ""}]}))
            .unwrap();
        answer
            .on_chunk(&json!({"choices": [{"text": "b"}]}))
            .unwrap();
        answer
            .on_chunk(
                &json!({"choices": [], "usage": {"prompt_tokens": 64, "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 32}}}),
            )
            .unwrap();
        assert_eq!(answer.chunk_tokens, 2);
        assert_eq!(answer.times.gaps.len(), 1);
        assert!(answer.times.first.is_some());
        assert_eq!(answer.usage.unwrap().cached_tokens, Some(32));
        assert_eq!(
            answer.on_chunk(&json!({"error": {"message": "engine died"}})),
            Err(Failure::StreamError)
        );
        assert_eq!(Failure::Status(503).reason(), "http_503");
        assert_eq!(Failure::Timeout.reason(), "timeout");
    }
}
