//! One request's way through the front door: parsed, tokenized, hashed, dispatched,
//! forwarded, answered (whole, or streamed through a tap that times its tokens), and
//! counted; retried once on another engine when its engine fails before the client has
//! seen a byte.
//!
//! Owns: the handlers of `POST /v1/completions` and `/v1/chat/completions`, [`Ticket`]
//! (a dispatched request's hold on its engine's load, released on every path), the
//! stream tap ([`Tap`]) and the request's record ([`Context::served`], the trace row).
//! An answer carries `x-kvtwin-worker` (and `x-kvtwin-dp-rank`) naming who served it and
//! `x-kvtwin-overlap-blocks`, the prompt's blocks the router found cached there, and
//! `x-kvtwin-route-seq`, the sequence number of the router's decision (requests sent
//! together reach it in an order the client cannot see; the twin replays that one). The
//! client's `X-Request-Id` goes to the engine (vLLM names its answer after it); without
//! one the router makes one, unique to its process.
//! Never: hold the state's lock across an await; send the client anything before the
//! engine has answered (so a retry is invisible); change what the engine wrote, but for
//! the usage chunk of a stream whose client did not ask for it.

use super::engine_client::{BodyReader, EngineError};
use super::openai::{
    self, chunk_tokens, error_json, usage_of, Endpoint, Prompt, ProxyRequest, TokenTimes, Usage,
};
use super::trace::{hash_ids, unique_hash_ids, TraceRow};
use super::Frontend;
use crate::service::http::{lock, SharedState};
use crate::service::sse::{SseEvent, SseParser};
use crate::service::state::serving::predicted_cached_tokens;
use crate::service::state::{Dispatch, DispatchError, Outcome, Served};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kvtwin::ids::{LocalBlockHash, WorkerId, WorkerWithDpRank};
use kvtwin::tokens::HashSeed;
use serde_json::Value;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Gaps between output chunks kept per request for the ITL histogram; a longer answer's
/// later gaps are not observed one by one (its mean still is, in the trace).
const ITL_SAMPLES_MAX: usize = 16_384;

/// Error bodies of engines read at most (for the message passed on).
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// `POST /v1/completions`.
pub(super) async fn completions(
    State(front): State<Arc<Frontend>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(front, Endpoint::Completions, request_id(&headers), body).await
}

/// `POST /v1/chat/completions`.
pub(super) async fn chat(
    State(front): State<Arc<Frontend>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(front, Endpoint::ChatCompletions, request_id(&headers), body).await
}

/// The client's `X-Request-Id`, passed on to the engine (which names its answer after
/// it), when it is a sane one.
fn request_id(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("x-request-id")?.to_str().ok()?;
    (!value.is_empty() && value.len() <= 256).then(|| value.to_string())
}

/// An error of the router's, in vLLM's shape.
fn router_error(status: StatusCode, message: &str, kind: &str) -> Response {
    let body = error_json(message, kind, status.as_u16());
    (status, axum::Json(body)).into_response()
}

/// A request ready to dispatch.
struct Prepared {
    request: ProxyRequest,
    /// The prompt's token ids, when known (given, or tokenized here).
    tokens: Option<Arc<Vec<u32>>>,
    seed: HashSeed,
    query: Vec<LocalBlockHash>,
    /// Prompt tokens, or an estimate (4 bytes a token) when not tokenized.
    prompt_tokens: u64,
    /// The body to forward.
    body: Bytes,
    /// The router's block size when it hashed the query.
    block_size: usize,
    /// The client's request id, if it gave one.
    request_id: Option<String>,
}

/// Tokenizes and hashes `request`. A prompt that cannot be tokenized is still served,
/// routed on load alone, and counted.
fn prepare(front: &Frontend, request: ProxyRequest) -> Prepared {
    let lora_name = request
        .model
        .as_deref()
        .filter(|model| lock(&front.state).is_adapter(model));
    let seed = HashSeed::for_request(lora_name, request.cache_salt.as_deref());
    let tokenized: Result<Vec<u32>, &'static str> = match (&request.prompt, &front.tokenizer) {
        (Prompt::Tokens(ids), _) => Ok(ids.clone()),
        (_, None) => Err("no_tokenizer"),
        (Prompt::Text(text), Some(tokenizer)) => tokenizer
            .encode(text, request.add_special_tokens.unwrap_or(true))
            .map_err(|_| "tokenizer_error"),
        (Prompt::Chat(messages), Some(tokenizer)) => {
            if !tokenizer.has_chat_template() {
                Err("no_chat_template")
            } else {
                tokenizer
                    .render_chat(messages)
                    .map_err(|_| "chat_template_error")
                    .and_then(|text| {
                        tokenizer
                            .encode(&text, request.add_special_tokens.unwrap_or(false))
                            .map_err(|_| "tokenizer_error")
                    })
            }
        }
    };
    let mut state = lock(&front.state);
    let block_size = state.block_size().unwrap_or(0);
    let (tokens, query, prompt_tokens) = match tokenized {
        Ok(tokens) => {
            // Before the block size is learned nothing is indexed: no overlap to find.
            let query = state
                .hash_request(&tokens, lora_name, request.cache_salt.as_deref())
                .unwrap_or_default();
            let count = tokens.len() as u64;
            (Some(Arc::new(tokens)), query, count)
        }
        Err(reason) => {
            state.note_untokenized(reason);
            let bytes = match &request.prompt {
                Prompt::Text(text) => text.len(),
                Prompt::Chat(messages) => messages.to_string().len(),
                Prompt::Tokens(ids) => 4 * ids.len(),
            };
            (None, Vec::new(), (bytes / 4) as u64)
        }
    };
    drop(state);
    let body = request.forward_body();
    Prepared {
        request,
        tokens,
        seed,
        query,
        prompt_tokens,
        body,
        block_size,
        request_id: None,
    }
}

/// A dispatched request's hold on its engine: finished exactly once, by the path that
/// ends it or, if that path is dropped (the client went away), as
/// `client_disconnected`.
struct Ticket {
    state: SharedState,
    request: u64,
    done: bool,
}

impl Ticket {
    fn new(state: SharedState, request: u64) -> Self {
        Self {
            state,
            request,
            done: false,
        }
    }

    fn finish(&mut self, outcome: &Outcome) {
        if !self.done {
            self.done = true;
            lock(&self.state).finish_request(self.request, outcome);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.finish(&Outcome::Failed {
            reason: "client_disconnected",
        });
    }
}

/// Why a try on an engine failed.
struct Failure {
    reason: &'static str,
    message: String,
    /// The engine's port refuses: its process is gone, mark it so now.
    engine_gone: bool,
    /// Another engine may answer.
    retryable: bool,
}

impl Failure {
    fn of(error: &EngineError) -> Self {
        Self {
            reason: error.reason(),
            message: error.to_string(),
            engine_gone: error.engine_gone(),
            retryable: true,
        }
    }
}

/// What one request knows when it is answered.
struct Context {
    front: Arc<Frontend>,
    arrival: Instant,
    dispatch: Dispatch,
    tokens: Option<Arc<Vec<u32>>>,
    seed: HashSeed,
    prompt_tokens: u64,
    block_size: usize,
    model: Option<String>,
}

impl Context {
    /// The outcome of an answer with `usage` (or the router's own counts, when the
    /// engine gave none), and its trace row recorded.
    fn served(
        &self,
        usage: Option<Usage>,
        output_chunks: u64,
        ttft: Option<Duration>,
        itl: Vec<Duration>,
        itl_mean: Option<Duration>,
    ) -> Outcome {
        let usage = usage.unwrap_or(Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: output_chunks,
            cached_tokens: None,
        });
        let e2e = self.arrival.elapsed();
        let predicted = predicted_cached_tokens(
            self.dispatch.overlap_blocks,
            usage.prompt_tokens,
            self.block_size,
        );
        if let Some(recorder) = &self.front.recorder {
            let row_seq = self.front.trace_rows.fetch_add(1, Ordering::Relaxed);
            let (input_length, ids) = match &self.tokens {
                Some(tokens) => (
                    tokens.len() as u64,
                    hash_ids(tokens, recorder.block_size(), self.seed),
                ),
                None => (
                    usage.prompt_tokens,
                    unique_hash_ids(
                        row_seq,
                        usage.prompt_tokens.div_ceil(recorder.block_size() as u64),
                    ),
                ),
            };
            recorder.record(TraceRow {
                timestamp: recorder.timestamp_ms(self.arrival),
                input_length,
                output_length: usage.completion_tokens,
                hash_ids: ids,
                worker_id: self.dispatch.worker.worker.get(),
                dp_rank: self.dispatch.worker.dp_rank,
                cached_tokens: usage.cached_tokens.unwrap_or(0),
                predicted_cached_tokens: predicted,
                ttft_ms: ttft.map(|t| t.as_secs_f64() * 1e3),
                itl_ms: itl_mean.map(|t| t.as_secs_f64() * 1e3),
                e2e_ms: e2e.as_secs_f64() * 1e3,
                model: self.model.clone(),
            });
        }
        Outcome::Served(Served {
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens.unwrap_or(0),
            generation_tokens: usage.completion_tokens,
            ttft,
            itl,
            e2e,
        })
    }
}

/// Headers naming who served a request, the overlap the router found there, and the
/// place of the router's decision among all it made.
fn decorate(
    response: &mut Response,
    worker: WorkerWithDpRank,
    overlap_blocks: u32,
    route_seq: u64,
) {
    let headers = response.headers_mut();
    headers.insert("x-kvtwin-overlap-blocks", HeaderValue::from(overlap_blocks));
    headers.insert("x-kvtwin-route-seq", HeaderValue::from(route_seq));
    if let Ok(value) = HeaderValue::from_str(&worker.worker.get().to_string()) {
        headers.insert("x-kvtwin-worker", value);
    }
    if let Ok(value) = HeaderValue::from_str(&worker.dp_rank.to_string()) {
        headers.insert("x-kvtwin-dp-rank", value);
    }
}

async fn handle(
    front: Arc<Frontend>,
    endpoint: Endpoint,
    client_request_id: Option<String>,
    body: Bytes,
) -> Response {
    let arrival = Instant::now();
    let request = match openai::parse(endpoint, &body) {
        Ok(request) => request,
        Err(why) => {
            lock(&front.state).refuse_request(why.reason());
            return router_error(StatusCode::BAD_REQUEST, &why.to_string(), "BadRequestError");
        }
    };
    let mut prepared = prepare(&front, request);
    prepared.request_id = client_request_id;
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for attempt in 0..=front.config.retries {
        let dispatched = lock(&front.state).dispatch(
            &prepared.query,
            prepared.prompt_tokens,
            prepared.request.model.as_deref(),
            &tried,
            prepared.request.pinned.map(WorkerId::new),
        );
        let dispatch = match dispatched {
            Ok(dispatch) => dispatch,
            Err(why) => return refused(&front, why, &failures),
        };
        let worker = dispatch.worker.worker;
        let mut ticket = Ticket::new(front.state.clone(), dispatch.request);
        let context = Context {
            front: front.clone(),
            arrival,
            dispatch,
            tokens: prepared.tokens.clone(),
            seed: prepared.seed,
            prompt_tokens: prepared.prompt_tokens,
            block_size: prepared.block_size,
            model: prepared.request.model.clone(),
        };
        match try_engine(context, &mut ticket, &prepared).await {
            Ok(response) => return response,
            Err(failure) => {
                if failure.engine_gone {
                    lock(&front.state).mark_engine_gone(worker, failure.message.clone());
                }
                let last = attempt == front.config.retries;
                failures.push(format!("engine {worker}: {}", failure.message));
                if failure.retryable && !last {
                    tracing::warn!(
                        worker = worker.get(),
                        "request failed on engine {worker} ({}); trying another",
                        failure.message
                    );
                    ticket.finish(&Outcome::Retried {
                        reason: failure.reason,
                    });
                    tried.push(worker);
                    continue;
                }
                ticket.finish(&Outcome::Failed {
                    reason: failure.reason,
                });
                return router_error(StatusCode::BAD_GATEWAY, &failures.join("; "), "EngineError");
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// The answer to a request no engine took.
fn refused(front: &Frontend, why: DispatchError, failures: &[String]) -> Response {
    lock(&front.state).refuse_request(why.reason());
    let mut message = why.to_string();
    if !failures.is_empty() {
        message = format!("{message}; tried: {}", failures.join("; "));
    }
    let status = match why {
        DispatchError::UnknownModel(_) | DispatchError::UnknownEngine(_) => StatusCode::NOT_FOUND,
        _ if !failures.is_empty() => StatusCode::BAD_GATEWAY,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    let kind = match status {
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::BAD_GATEWAY => "EngineError",
        _ => "ServiceUnavailableError",
    };
    router_error(status, &message, kind)
}

/// One try on the engine the context names: the client's response, or why not.
async fn try_engine(
    context: Context,
    ticket: &mut Ticket,
    prepared: &Prepared,
) -> Result<Response, Failure> {
    let dispatch = &context.dispatch;
    let front = context.front.clone();
    // vLLM names its answer after the request id and refuses two running under one, so
    // the router's own ids carry its process's mark.
    let id = prepared
        .request_id
        .clone()
        .unwrap_or_else(|| format!("kvtwin-{}-{}", front.id_prefix, dispatch.request));
    let mut headers = vec![("x-request-id", id)];
    if dispatch.ranked {
        headers.push(("x-data-parallel-rank", dispatch.worker.dp_rank.to_string()));
    }
    let response = front
        .client
        .post_json(
            &dispatch.url,
            prepared.request.endpoint.path(),
            prepared.body.clone(),
            &headers,
        )
        .await
        .map_err(|error| Failure::of(&error))?;
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let idle = front.client.timeouts().idle;
    if matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    ) {
        let body = BodyReader::new(response.into_body(), idle, ERROR_BODY_LIMIT)
            .read_all()
            .await
            .unwrap_or_default();
        return Err(Failure {
            reason: "engine_unavailable",
            message: format!(
                "HTTP {}: {}",
                status.as_u16(),
                String::from_utf8_lossy(&body).trim()
            ),
            engine_gone: false,
            retryable: true,
        });
    }
    if !status.is_success() {
        // The engine's own refusal (a prompt too long, a bad parameter): the client's to
        // read, as the engine wrote it; another engine would say the same.
        let body = BodyReader::new(response.into_body(), idle, ERROR_BODY_LIMIT)
            .read_all()
            .await
            .map_err(|error| Failure::of(&error))?;
        ticket.finish(&Outcome::Failed {
            reason: if status.is_client_error() {
                "engine_refused"
            } else {
                "engine_error"
            },
        });
        let mut answer = (status, body).into_response();
        if let Some(content_type) = content_type {
            answer
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
        }
        decorate(
            &mut answer,
            context.dispatch.worker,
            context.dispatch.overlap_blocks,
            context.dispatch.route_seq,
        );
        return Ok(answer);
    }
    if !prepared.request.stream {
        let body = BodyReader::new(response.into_body(), idle, front.config.max_answer_bytes)
            .read_all()
            .await
            .map_err(|error| Failure::of(&error))?;
        let usage = serde_json::from_slice::<Value>(&body)
            .ok()
            .as_ref()
            .and_then(usage_of);
        let outcome = context.served(usage, 0, None, Vec::new(), None);
        ticket.finish(&outcome);
        let mut answer = (StatusCode::OK, body).into_response();
        answer.headers_mut().insert(
            header::CONTENT_TYPE,
            content_type.unwrap_or(HeaderValue::from_static("application/json")),
        );
        decorate(
            &mut answer,
            context.dispatch.worker,
            context.dispatch.overlap_blocks,
            context.dispatch.route_seq,
        );
        return Ok(answer);
    }
    let mut tap = Tap {
        reader: BodyReader::new(response.into_body(), idle, usize::MAX),
        parser: SseParser::default(),
        pending: VecDeque::new(),
        client_wants_usage: prepared.request.client_wants_usage,
        times: TokenTimes::default(),
        output_chunks: 0,
        usage: None,
        saw_done: false,
        engine_error: false,
        finished: false,
        ticket: None,
        context,
    };
    // Nothing goes to the client before the engine's first event: until then a failure
    // is retried elsewhere.
    tap.fill().await?;
    if tap.pending.is_empty() {
        return Err(Failure {
            reason: "engine_stream_incomplete",
            message: "the stream ended before its first event".into(),
            engine_gone: false,
            retryable: true,
        });
    }
    // The tap finishes the request from here on, whatever happens to the stream.
    ticket.done = true;
    tap.ticket = Some(Ticket::new(front.state.clone(), ticket.request));
    let (worker, overlap, route_seq) = (
        tap.context.dispatch.worker,
        tap.context.dispatch.overlap_blocks,
        tap.context.dispatch.route_seq,
    );
    let mut answer = Response::new(Body::from_stream(futures::stream::unfold(
        tap,
        |mut tap| async move {
            let bytes = tap.next().await?;
            Some((Ok::<_, Infallible>(bytes), tap))
        },
    )));
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    decorate(&mut answer, worker, overlap, route_seq);
    Ok(answer)
}

/// A streamed answer passing through, event by event: output chunks timed and counted
/// into the engine's load, the usage read, the request finished when the stream ends.
struct Tap {
    context: Context,
    /// Set once the client has the response; finished by the tap.
    ticket: Option<Ticket>,
    reader: BodyReader,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    client_wants_usage: bool,
    times: TokenTimes,
    output_chunks: u64,
    usage: Option<Usage>,
    saw_done: bool,
    engine_error: bool,
    finished: bool,
}

/// An event written back as server-sent events.
fn sse_bytes(event: &SseEvent) -> Bytes {
    let mut text = String::with_capacity(event.data.len() + 16);
    if event.event != "message" {
        text.push_str("event: ");
        text.push_str(&event.event);
        text.push('\n');
    }
    for line in event.data.split('\n') {
        text.push_str("data: ");
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    Bytes::from(text)
}

/// An error event and the end marker, as vLLM ends a stream that failed.
fn sse_error(message: &str) -> Bytes {
    let body = error_json(message, "EngineError", StatusCode::BAD_GATEWAY.as_u16());
    Bytes::from(format!("data: {body}\n\ndata: [DONE]\n\n"))
}

impl Tap {
    /// Reads until at least one event is pending or the body ended.
    async fn fill(&mut self) -> Result<(), Failure> {
        while self.pending.is_empty() && !self.finished {
            match self.reader.next().await {
                Ok(Some(data)) => {
                    let mut events = Vec::new();
                    // An over-long line is skipped (its event lost); the rest goes on.
                    let _ = self.parser.push(&data, &mut events);
                    self.pending.extend(events);
                }
                Ok(None) => self.finished = true,
                Err(error) => return Err(Failure::of(&error)),
            }
        }
        Ok(())
    }

    /// The next bytes for the client; `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if let Some(bytes) = self.process(event) {
                    return Some(bytes);
                }
                continue;
            }
            if self.finished {
                return self.end(None);
            }
            if let Err(failure) = self.fill().await {
                self.finished = true;
                return self.end(Some(failure));
            }
        }
    }

    fn process(&mut self, event: SseEvent) -> Option<Bytes> {
        if event.data == "[DONE]" {
            self.saw_done = true;
            self.finish_served();
            return Some(sse_bytes(&event));
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            return Some(sse_bytes(&event));
        };
        if chunk.get("error").is_some() {
            self.engine_error = true;
            return Some(sse_bytes(&event));
        }
        let usage = usage_of(&chunk);
        if usage.is_some() {
            self.usage = usage;
        }
        let tokens = chunk_tokens(&chunk);
        if tokens > 0 {
            self.times.note(Instant::now(), ITL_SAMPLES_MAX);
            self.output_chunks += tokens;
            lock(&self.context.front.state).note_output(self.context.dispatch.request, tokens);
        }
        let usage_only = chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
            && usage.is_some();
        if usage_only && !self.client_wants_usage {
            return None;
        }
        Some(sse_bytes(&event))
    }

    fn finish_served(&mut self) {
        let Some(mut ticket) = self.ticket.take() else {
            return;
        };
        if self.engine_error {
            ticket.finish(&Outcome::Failed {
                reason: "engine_error",
            });
            return;
        }
        let arrival = self.context.arrival;
        let ttft = self.times.first.map(|first| first - arrival);
        let itl_mean = match (self.times.first, self.times.last) {
            (Some(first), Some(last)) if self.output_chunks > 1 => {
                Some((last - first) / (self.output_chunks - 1) as u32)
            }
            _ => None,
        };
        let itl = std::mem::take(&mut self.times.gaps);
        let outcome = self
            .context
            .served(self.usage, self.output_chunks, ttft, itl, itl_mean);
        ticket.finish(&outcome);
    }

    /// The stream's end: the request finished; after a failure, an error event.
    fn end(&mut self, failure: Option<Failure>) -> Option<Bytes> {
        let mut ticket = self.ticket.take()?;
        let worker = self.context.dispatch.worker.worker;
        let message = match failure {
            Some(failure) => {
                if failure.engine_gone {
                    lock(&self.context.front.state)
                        .mark_engine_gone(worker, failure.message.clone());
                }
                ticket.finish(&Outcome::Failed {
                    reason: failure.reason,
                });
                format!("engine {worker} failed mid-stream: {}", failure.message)
            }
            None if self.engine_error || self.usage.is_some() || self.output_chunks > 0 => {
                // Without the end marker, but with an answer (or the engine's own error
                // event, already passed on).
                self.ticket = Some(ticket);
                self.finish_served();
                return None;
            }
            None => {
                ticket.finish(&Outcome::Failed {
                    reason: "engine_stream_incomplete",
                });
                format!("engine {worker} ended its stream without an answer")
            }
        };
        tracing::warn!(worker = worker.get(), "{message}");
        Some(sse_error(&message))
    }
}
