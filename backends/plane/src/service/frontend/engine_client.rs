//! The front door's HTTP client of its engines: pooled HTTP/1.1 connections (hyper's),
//! every step under a deadline.
//!
//! Owns: [`EngineClient`], [`EngineTimeouts`], [`EngineError`] (each failure with a stable
//! reason and whether it means the engine is gone) and [`BodyReader`] (an answer's body
//! read frame by frame, each frame under the idle deadline, the whole under a size
//! bound). A client may carry a bearer credential (`kvtwin bench serve` through a
//! router behind a token), sent on every request, marked sensitive.
//! Never: retry (the proxy decides), or decide an engine's health (it reports what
//! happened; the proxy and the health check mark engines down).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// How long each step with an engine may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineTimeouts {
    /// To open a connection.
    pub connect: Duration,
    /// From sending a request to its answer's first byte of body (prefill included).
    pub first_byte: Duration,
    /// Between two frames of an answer's body (a decode step, for a stream).
    pub idle: Duration,
    /// A health check or a model listing, whole.
    pub probe: Duration,
}

impl Default for EngineTimeouts {
    /// Connect 2 s; first byte 120 s (a long prompt's prefill on a CPU); idle 60 s;
    /// probe 1 s.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            probe: Duration::from_secs(1),
        }
    }
}

/// An exchange with an engine that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The URL is not `http://HOST:PORT[/PATH]`.
    #[error("bad engine URL {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The connection was refused: nothing listens on the engine's port (its process
    /// is gone, or not started yet).
    #[error("connection refused: {0}")]
    Refused(String),
    /// No connection otherwise (unreachable, or the connect timed out).
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection broke before or during the answer.
    #[error("the connection broke: {0}")]
    Broken(String),
    /// No answer (or no next frame of it) within its deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer is larger than allowed.
    #[error("an answer over {0} bytes")]
    TooLarge(usize),
}

impl EngineError {
    /// A stable label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            EngineError::BadUrl { .. } => "bad_engine_url",
            EngineError::Refused(_) => "engine_refused_connection",
            EngineError::Connect(_) => "engine_unreachable",
            EngineError::Broken(_) => "engine_connection_broken",
            EngineError::Timeout(_) => "engine_timeout",
            EngineError::TooLarge(_) => "engine_answer_too_large",
        }
    }

    /// Whether it means the engine's process is gone, so its cache is too: only a
    /// refused connection says so. A connection cut or timed out may be an engine that
    /// is alive but slow, or a network that failed; the health check decides those.
    pub fn engine_gone(&self) -> bool {
        matches!(self, EngineError::Refused(_))
    }

    fn of(error: hyper_util::client::legacy::Error) -> Self {
        if error.is_connect() {
            if refused(&error) {
                return EngineError::Refused(describe(&error));
            }
            return EngineError::Connect(describe(&error));
        }
        EngineError::Broken(describe(&error))
    }
}

/// Whether an error's chain holds a refused connection.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        next = cause.source();
    }
    false
}

/// An error and its sources on one line.
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Checks an engine's base URL: `http://HOST:PORT` (a trailing `/` allowed); what the
/// front door accepts in `--engine` and the admin API.
pub fn check_engine_url(url: &str) -> Result<String, EngineError> {
    let bad = |reason| EngineError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        if url.starts_with("https://") {
            bad("https engines are not supported yet; use http:// on a trusted network")
        } else {
            bad("expected http://HOST:PORT")
        }
    })?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(bad("expected http://HOST:PORT with no path"));
    }
    let port = authority
        .rsplit_once(':')
        .map(|(_, port)| port)
        .ok_or_else(|| bad("expected http://HOST:PORT (no port)"))?;
    port.parse::<u16>()
        .map_err(|_| bad("expected http://HOST:PORT (the port is not a number)"))?;
    Ok(format!("http://{authority}"))
}

/// The client; cheap to clone (one pool).
#[derive(Clone, Debug)]
pub struct EngineClient {
    client: Client<HttpConnector, Full<Bytes>>,
    timeouts: EngineTimeouts,
    authorization: Option<HeaderValue>,
}

impl EngineClient {
    /// A client with `timeouts`; idle connections are kept 4 s (below uvicorn's 5 s
    /// keep-alive, which vLLM's server uses, so the pool never hands out a connection the
    /// engine is closing), at most 64 per engine.
    pub fn new(timeouts: EngineTimeouts) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeouts.connect));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(4))
            .pool_max_idle_per_host(64)
            .build(connector);
        Self {
            client,
            timeouts,
            authorization: None,
        }
    }

    /// The same client sending `authorization` (an `Authorization` header's value, e.g.
    /// [`AuthToken::authorization`](crate::service::auth::AuthToken::authorization)) on
    /// every request; it is marked sensitive so no `Debug` output shows it.
    pub fn with_authorization(mut self, mut authorization: HeaderValue) -> Self {
        authorization.set_sensitive(true);
        self.authorization = Some(authorization);
        self
    }

    /// The deadlines it keeps.
    pub fn timeouts(&self) -> EngineTimeouts {
        self.timeouts
    }

    /// Sends `body` (JSON) to `url` + `path` with `headers`; the answer's status and
    /// headers, its body still to read ([`BodyReader`]). Waits at most
    /// [`EngineTimeouts::first_byte`].
    pub async fn post_json(
        &self,
        url: &str,
        path: &str,
        body: Bytes,
        headers: &[(&'static str, String)],
    ) -> Result<Response<Incoming>, EngineError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{url}{path}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|_| EngineError::BadUrl {
                url: url.to_string(),
                reason: "not a valid URI",
            })?;
        let deadline = self.timeouts.first_byte;
        match tokio::time::timeout(deadline, self.client.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(EngineError::of(error)),
            Err(_) => Err(EngineError::Timeout(deadline)),
        }
    }

    /// `GET url + path`, whole, under [`EngineTimeouts::probe`]; bodies over `limit`
    /// bytes are refused.
    pub async fn get(
        &self,
        url: &str,
        path: &str,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), EngineError> {
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(format!("{url}{path}"));
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|_| EngineError::BadUrl {
                url: url.to_string(),
                reason: "not a valid URI",
            })?;
        let deadline = self.timeouts.probe;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(EngineError::of)?;
            let status = response.status();
            let mut reader = BodyReader::new(response.into_body(), deadline, limit);
            let body = reader.read_all().await?;
            Ok((status, body))
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .unwrap_or(Err(EngineError::Timeout(deadline)))
    }
}

/// An answer's body, frame by frame, each under the idle deadline, the whole under a
/// size bound.
#[derive(Debug)]
pub struct BodyReader {
    body: Incoming,
    idle: Duration,
    limit: usize,
    read: usize,
}

impl BodyReader {
    /// Reads `body`, waiting at most `idle` for each frame, refusing more than `limit`
    /// bytes in all.
    pub fn new(body: Incoming, idle: Duration, limit: usize) -> Self {
        Self {
            body,
            idle,
            limit,
            read: 0,
        }
    }

    /// The next data frame; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, EngineError> {
        loop {
            let frame = match tokio::time::timeout(self.idle, self.body.frame()).await {
                Err(_) => return Err(EngineError::Timeout(self.idle)),
                Ok(None) => return Ok(None),
                Ok(Some(Err(error))) => return Err(EngineError::Broken(describe(&error))),
                Ok(Some(Ok(frame))) => frame,
            };
            // Trailers carry nothing the router reads.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            self.read += data.len();
            if self.read > self.limit {
                return Err(EngineError::TooLarge(self.limit));
            }
            return Ok(Some(data));
        }
    }

    /// The rest of the body, whole.
    pub async fn read_all(&mut self) -> Result<Bytes, EngineError> {
        let mut whole = Vec::new();
        while let Some(data) = self.next().await? {
            whole.extend_from_slice(&data);
        }
        Ok(Bytes::from(whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_urls_are_http_host_and_port() {
        assert_eq!(
            check_engine_url("http://127.0.0.1:8000/").unwrap(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            check_engine_url("http://engine-0:8000").unwrap(),
            "http://engine-0:8000"
        );
        for bad in [
            "127.0.0.1:8000",
            "https://h:1",
            "http://h",
            "http://h:port",
            "http://h:1/v1",
            "http://",
        ] {
            let error = check_engine_url(bad).unwrap_err();
            assert_eq!(error.reason(), "bad_engine_url", "{bad}");
        }
        assert!(check_engine_url("https://h:1")
            .unwrap_err()
            .to_string()
            .contains("https engines are not supported"));
    }

    #[tokio::test]
    async fn a_closed_port_refuses_and_means_the_engine_is_gone() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = EngineClient::new(EngineTimeouts::default());
        let error = client
            .get(&format!("http://127.0.0.1:{port}"), "/health", 1024)
            .await
            .unwrap_err();
        assert!(error.engine_gone(), "{error}");
        assert_eq!(error.reason(), "engine_refused_connection");
    }
}
