//! A client of a router's `GET /v1/stream`: one HTTP/1 connection, its server-sent
//! events parsed as they arrive, each `delta` event decoded into a [`StreamMessage`].
//!
//! Owns: [`StreamClient`] (the connection, made by `client::Connection`: a tokio socket,
//! TLS for https URLs, hyper's client connection API on a task of its own, aborted
//! when the client drops; the token of its `ClientAccess` on the request) and
//! [`StreamClientError`].
//! Invariants: memory is bounded by the SSE line limit (16 MiB) and one chunk's events;
//! nothing is read from the socket until the caller asks for the next message, so a slow
//! reader slows the server's writes (TCP backpressure) rather than queueing.
//! Never: reconnect or back off (the caller does: on any `Err` or `Ok(None)`, connect
//! again after a pause of its choosing; the first message of a new connection is a full
//! snapshot, so nothing needs replaying), or time out (wrap calls in
//! `tokio::time::timeout` to bound them).

use super::client::{expect_ok, ClientAccess, ClientError, Connection, RouterUrl};
use super::sse::{SseError, SseEvent, SseParser, MAX_LINE_BYTES_DEFAULT};
use super::stream::StreamMessage;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::Method;
use std::collections::VecDeque;

/// The path asked for when the URL gives none.
pub const STREAM_PATH: &str = "/v1/stream";

/// Why the stream could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamClientError {
    /// Reaching the router failed: the URL, the socket, TLS, HTTP, or a status other
    /// than 200 (401 without the right token).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The body is not valid server-sent events.
    #[error("bad server-sent events: {0}")]
    Sse(#[from] SseError),
    /// A `delta` event's data is not a stream message.
    #[error("bad stream message JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<hyper::Error> for StreamClientError {
    fn from(error: hyper::Error) -> Self {
        Self::Client(ClientError::Http(error))
    }
}

/// A connected stream; see the module documentation.
#[derive(Debug)]
pub struct StreamClient {
    body: Incoming,
    parser: SseParser,
    /// Events of the last chunk not handed out yet (bounded by one chunk).
    pending: VecDeque<SseEvent>,
    scratch: Vec<SseEvent>,
    /// Kept for its task: dropping it stops the connection.
    _connection: Connection,
}

impl StreamClient {
    /// Connects to `url` (`http://HOST:PORT` or `https://HOST:PORT`, the path
    /// `/v1/stream` by default) without a token, trusting the system's roots for https;
    /// must run inside a tokio runtime.
    pub async fn connect(url: &str) -> Result<Self, StreamClientError> {
        Self::connect_with(url, &ClientAccess::default()).await
    }

    /// Connects to `url` with `access`'s token and TLS roots, and waits for the response
    /// head; must run inside a tokio runtime.
    pub async fn connect_with(url: &str, access: &ClientAccess) -> Result<Self, StreamClientError> {
        let url = RouterUrl::parse(url, STREAM_PATH)?;
        let mut connection = Connection::open(&url, access).await?;
        let mut request = access.request(&url, Method::GET, &url.path, Bytes::new())?;
        request.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let response = connection.sender.send_request(request).await?;
        expect_ok(response.status())?;
        Ok(Self {
            body: response.into_body(),
            parser: SseParser::new(MAX_LINE_BYTES_DEFAULT),
            pending: VecDeque::new(),
            scratch: Vec::new(),
            _connection: connection,
        })
    }

    /// The next stream message; `Ok(None)` when the router ended the stream. Events
    /// other than `delta` are skipped (keep-alives are comments and never surface).
    pub async fn next(&mut self) -> Result<Option<StreamMessage>, StreamClientError> {
        loop {
            while let Some(event) = self.pending.pop_front() {
                if event.event == "delta" {
                    return Ok(Some(serde_json::from_str(&event.data)?));
                }
            }
            let Some(frame) = self.body.frame().await else {
                return Ok(None);
            };
            let Ok(data) = frame?.into_data() else {
                // Trailers: nothing of the stream.
                continue;
            };
            let result = self.parser.push(&data, &mut self.scratch);
            self.pending.extend(self.scratch.drain(..));
            result?;
        }
    }
}
