//! A stand-in for a vLLM engine, for tests of the front door that must run fast and
//! fail on purpose: vLLM's OpenAI endpoints (`/health`, `/v1/models`,
//! `/v1/completions`, `/v1/chat/completions`, streamed or not, with usage and cached
//! tokens), a prefix cache of a few blocks kept as vLLM keeps it, its KV events published
//! on ZMQ in vLLM's format, and faults on demand.
//!
//! Owns: [`MockEngine`], [`MockConfig`] and [`Fault`]. Feature `testing` only.
//! The cache: a prompt's full blocks are found by chained hash; the leading ones held
//! are its cached tokens, except that a prompt cached whole recomputes its last block
//! (and stores it again, as vLLM does); the rest are stored (`BlockStored`, parent
//! first), evicting the least recently used blocks, a request's tail before its head
//! (`BlockRemoved`), so what the events say is exactly what the cache holds. Text is
//! "tokenized" one byte a token.
//! Never: stand in for vLLM in a test that claims agreement with vLLM (the real engine
//! tests use the real engine).

use crate::wire::{BlockRemoved, BlockStored, EngineBatch, EngineEvent, EngineFormat};
use crate::zmq::{PublisherConfig, ZmqPublisher};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// What a mock engine does wrong, from now on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    #[default]
    None,
    /// Takes requests and never answers them.
    Hang,
    /// Streams this many chunks, then breaks the connection (a crash mid-stream);
    /// an answer that is not streamed breaks before its body.
    DieAfterChunks(u32),
    /// Answers every request with this status.
    Status(u16),
    /// `/health` answers 503.
    Unhealthy,
}

/// How a mock engine is built.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// Tokens per block.
    pub block_size: u32,
    /// Blocks its cache holds.
    pub capacity_blocks: usize,
    /// The model it serves.
    pub model: String,
    /// LoRA adapters it lists.
    pub adapters: Vec<String>,
    /// Publish KV events (on free loopback ports).
    pub events: bool,
    /// Time to prefill a request.
    pub prefill: Duration,
    /// Time per output token.
    pub per_token: Duration,
    /// Seed of its block hashes (engines hash differently).
    pub hash_seed: u64,
}

impl Default for MockConfig {
    /// vLLM's CPU block size (32), 64 blocks, model `tiny`, events on, 1 ms per token.
    fn default() -> Self {
        Self {
            block_size: 32,
            capacity_blocks: 64,
            model: "tiny".into(),
            adapters: Vec::new(),
            events: true,
            prefill: Duration::from_millis(2),
            per_token: Duration::from_millis(1),
            hash_seed: 7,
        }
    }
}

/// The prefix cache and its publisher.
struct Cache {
    config: MockConfig,
    /// Block hash → (parent hash, tokens, last use).
    blocks: BTreeMap<u64, (Option<u64>, Vec<u32>, u64)>,
    clock: u64,
    publisher: Option<ZmqPublisher>,
    fault: Fault,
    requests: Vec<Value>,
    served: u64,
}

impl Cache {
    /// `tokens`' cached tokens, after storing its blocks (events published).
    fn admit(&mut self, tokens: &[u32]) -> u64 {
        let block_size = self.config.block_size as usize;
        let mut hashes = Vec::new();
        let mut parent = None;
        for chunk in tokens.chunks_exact(block_size) {
            let mut bytes = parent.unwrap_or(0u64).to_le_bytes().to_vec();
            bytes.extend(chunk.iter().flat_map(|t| t.to_le_bytes()));
            let hash = xxh3_64_with_seed(&bytes, self.config.hash_seed);
            hashes.push((hash, parent, chunk.to_vec()));
            parent = Some(hash);
        }
        let mut hits = hashes
            .iter()
            .take_while(|(hash, _, _)| self.blocks.contains_key(hash))
            .count();
        // A prompt cached whole recomputes its last block (vLLM needs one to compute).
        let recompute = hits == hashes.len() && hits > 0 && tokens.len().is_multiple_of(block_size);
        if recompute {
            hits -= 1;
        }
        self.clock += 1;
        let now = self.clock;
        let mut stored = Vec::new();
        for (k, (hash, parent, chunk)) in hashes.iter().enumerate() {
            // Tail last-used earlier than head: evicted first among equals.
            let stamp = now * 1_000_000 + (1_000_000 - k as u64);
            let fresh = !self.blocks.contains_key(hash);
            self.blocks.insert(*hash, (*parent, chunk.clone(), stamp));
            if fresh || (recompute && k == hashes.len() - 1) {
                stored.push((*hash, *parent, chunk.clone()));
            }
        }
        let mut removed = Vec::new();
        while self.blocks.len() > self.config.capacity_blocks {
            let in_use: Vec<u64> = hashes.iter().map(|(hash, _, _)| *hash).collect();
            let victim = self
                .blocks
                .iter()
                .filter(|(hash, _)| !in_use.contains(hash))
                .min_by_key(|(_, (_, _, stamp))| *stamp)
                .map(|(hash, _)| *hash);
            let Some(victim) = victim else { break };
            self.blocks.remove(&victim);
            removed.push(victim);
        }
        self.publish(stored, removed);
        (hits * block_size) as u64
    }

    fn publish(&mut self, stored: Vec<(u64, Option<u64>, Vec<u32>)>, removed: Vec<u64>) {
        let Some(publisher) = &mut self.publisher else {
            return;
        };
        let mut events = Vec::new();
        // One BlockStored per run of consecutive blocks, parent first, as vLLM batches.
        for (hash, parent, tokens) in stored {
            match events.last_mut() {
                Some(EngineEvent::BlockStored(run))
                    if run.block_hashes.last().copied() == parent =>
                {
                    run.block_hashes.push(hash);
                    run.token_ids.extend(tokens);
                }
                _ => events.push(EngineEvent::BlockStored(BlockStored {
                    block_hashes: vec![hash],
                    parent_block_hash: parent,
                    token_ids: tokens,
                    block_size: self.config.block_size,
                    ..BlockStored::default()
                })),
            }
        }
        if !removed.is_empty() {
            events.push(EngineEvent::BlockRemoved(BlockRemoved {
                block_hashes: removed,
                ..BlockRemoved::default()
            }));
        }
        if events.is_empty() {
            return;
        }
        let batch = EngineBatch::new(publisher.next_seq(), 0.0, events, Some(0));
        let options = EngineFormat::Vllm0_24.options();
        // A mock that cannot publish fails its test by what the router then misses.
        let _ = publisher.publish(&batch.to_payload(&options));
    }
}

type Shared = Arc<Mutex<Cache>>;

fn cache(shared: &Shared) -> std::sync::MutexGuard<'_, Cache> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running mock engine; stops (its port then refuses connections) when dropped.
pub struct MockEngine {
    addr: SocketAddr,
    events: Option<(String, String)>,
    shared: Shared,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for MockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockEngine")
            .field("addr", &self.addr)
            .finish()
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl MockEngine {
    /// Starts one on a free loopback port.
    pub fn start(config: MockConfig) -> std::io::Result<Self> {
        Self::start_on(config, 0)
    }

    /// Starts one on `port` (0: a free one): a restarted engine comes back where it was.
    pub fn start_on(config: MockConfig, port: u16) -> std::io::Result<Self> {
        let (publisher, events) = if config.events {
            let (live, replay) = (free_port()?, free_port()?);
            let bind = PublisherConfig::new(
                &format!("tcp://127.0.0.1:{live}"),
                Some(&format!("tcp://127.0.0.1:{replay}")),
            );
            let publisher = ZmqPublisher::bind(&bind).map_err(std::io::Error::other)?;
            let endpoints = (
                format!("tcp://127.0.0.1:{live}"),
                format!("tcp://127.0.0.1:{replay}"),
            );
            (Some(publisher), Some(endpoints))
        } else {
            (None, None)
        };
        let shared = Arc::new(Mutex::new(Cache {
            config,
            blocks: BTreeMap::new(),
            clock: 0,
            publisher,
            fault: Fault::None,
            requests: Vec::new(),
            served: 0,
        }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat))
            .with_state(shared.clone());
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            events,
            shared,
            runtime: Some(runtime),
        })
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Its event endpoints (live, replay), when it publishes.
    pub fn events(&self) -> Option<(String, String)> {
        self.events.clone()
    }

    /// Sets what it does wrong from now on.
    pub fn set_fault(&self, fault: Fault) {
        cache(&self.shared).fault = fault;
    }

    /// The bodies of the requests it received, in order.
    pub fn requests(&self) -> Vec<Value> {
        cache(&self.shared).requests.clone()
    }

    /// Requests it answered in full.
    pub fn served(&self) -> u64 {
        cache(&self.shared).served
    }

    /// Blocks its cache holds.
    pub fn cached_blocks(&self) -> usize {
        cache(&self.shared).blocks.len()
    }

    /// Stops it at once: connections are cut, the port refuses new ones.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        // The publisher's sockets close with the cache.
        cache(&self.shared).publisher = None;
    }
}

impl Drop for MockEngine {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn health(State(shared): State<Shared>) -> StatusCode {
    if cache(&shared).fault == Fault::Unhealthy {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn models(State(shared): State<Shared>) -> Json<Value> {
    let cache = cache(&shared);
    let model = cache.config.model.clone();
    let mut data = vec![json!({"id": model, "object": "model", "root": model, "parent": null})];
    for adapter in &cache.config.adapters {
        data.push(json!({"id": adapter, "object": "model", "root": adapter, "parent": model}));
    }
    Json(json!({"object": "list", "data": data}))
}

async fn completions(State(shared): State<Shared>, body: Bytes) -> Response {
    answer(shared, body, false).await
}

async fn chat(State(shared): State<Shared>, body: Bytes) -> Response {
    answer(shared, body, true).await
}

/// The prompt's tokens: ids as given, text one byte a token, chat the contents'.
fn prompt_tokens(request: &Value) -> Vec<u32> {
    let bytes = |text: &str| text.bytes().map(u32::from).collect::<Vec<u32>>();
    if let Some(messages) = request.get("messages").and_then(Value::as_array) {
        let text: String = messages
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_str))
            .collect();
        return bytes(&text);
    }
    match request.get("prompt") {
        Some(Value::String(text)) => bytes(text),
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(text)) => bytes(text),
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            _ => items
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
        },
        _ => Vec::new(),
    }
}

async fn answer(shared: Shared, body: Bytes, chat: bool) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (fault, prefill, per_token, model) = {
        let mut cache = cache(&shared);
        cache.requests.push(request.clone());
        (
            cache.fault,
            cache.config.prefill,
            cache.config.per_token,
            cache.config.model.clone(),
        )
    };
    match fault {
        Fault::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let error = json!({"error": {"message": "mock fault", "type": "MockError", "param": null, "code": code}});
            return (status, Json(error)).into_response();
        }
        _ => {}
    }
    let tokens = prompt_tokens(&request);
    tokio::time::sleep(prefill).await;
    let cached = cache(&shared).admit(&tokens);
    let max_tokens = request
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(16);
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let usage = json!({
        "prompt_tokens": tokens.len(),
        "completion_tokens": max_tokens,
        "total_tokens": tokens.len() as u64 + max_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    });
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    if !stream {
        if let Fault::DieAfterChunks(_) = fault {
            return Response::new(Body::from_stream(futures::stream::once(async {
                Err::<Bytes, std::io::Error>(std::io::Error::other("mock crash"))
            })));
        }
        tokio::time::sleep(per_token * max_tokens as u32).await;
        cache(&shared).served += 1;
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": "x".repeat(max_tokens as usize)}, "finish_reason": "length"})
        } else {
            json!({"index": 0, "text": "x".repeat(max_tokens as usize), "finish_reason": "length"})
        };
        return Json(json!({"id": "mock", "object": object, "model": model,
                           "choices": [choice], "usage": usage}))
        .into_response();
    }
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let die_after = match fault {
        Fault::DieAfterChunks(chunks) => Some(u64::from(chunks)),
        _ => None,
    };
    let chunk_object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let events = futures::stream::unfold(0u64, move |k| {
        let shared = shared.clone();
        let usage = usage.clone();
        let model = model.clone();
        async move {
            if die_after == Some(k) {
                // Let what was written reach the client before the connection breaks.
                tokio::time::sleep(per_token + Duration::from_millis(20)).await;
                return Some((Err(std::io::Error::other("mock crash")), u64::MAX));
            }
            if k == u64::MAX || k > max_tokens + 1 {
                return None;
            }
            if k < max_tokens {
                if k > 0 {
                    tokio::time::sleep(per_token).await;
                }
                let finish = (k + 1 == max_tokens).then_some("length");
                let choice = if chat {
                    json!({"index": 0, "delta": {"content": "x"}, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": "x", "finish_reason": finish})
                };
                let chunk = json!({"id": "mock", "object": chunk_object, "model": model, "choices": [choice]});
                return Some((Ok(Bytes::from(format!("data: {chunk}\n\n"))), k + 1));
            }
            if k == max_tokens {
                cache(&shared).served += 1;
                if include_usage {
                    let chunk = json!({"id": "mock", "object": chunk_object, "model": model, "choices": [], "usage": usage});
                    return Some((Ok(Bytes::from(format!("data: {chunk}\n\n"))), k + 1));
                }
                return Some((Ok(Bytes::new()), k + 1));
            }
            Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), k + 1))
        }
    });
    let mut response = Response::new(Body::from_stream(events));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    response
}
