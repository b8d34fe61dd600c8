//! A client of a router's `GET /v1/stream`: one HTTP/1 connection, its server-sent
//! events parsed as they arrive, each `delta` event decoded into a [`StreamMessage`].
//!
//! Owns: [`StreamClient`] (the connection: a tokio socket driven by hyper's client
//! connection API on a task of its own, aborted when the client drops) and
//! [`StreamClientError`].
//! Invariants: memory is bounded by the SSE line limit (16 MiB) and one chunk's events;
//! nothing is read from the socket until the caller asks for the next message, so a slow
//! reader slows the server's writes (TCP backpressure) rather than queueing.
//! Never: reconnect or back off (the caller does: on any `Err` or `Ok(None)`, connect
//! again after a pause of its choosing; the first message of a new connection is a full
//! snapshot, so nothing needs replaying), or time out (wrap calls in
//! `tokio::time::timeout` to bound them).

use super::sse::{SseError, SseEvent, SseParser, MAX_LINE_BYTES_DEFAULT};
use super::stream::StreamMessage;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;

/// The path asked for when the URL gives none.
pub const STREAM_PATH: &str = "/v1/stream";

/// Why the stream could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamClientError {
    /// The URL is not `http://HOST:PORT[/PATH]`.
    #[error("bad stream URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The TCP connection failed.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// `HOST:PORT`.
        address: String,
        /// The socket's error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (handshake, request, or the body broke off).
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The router answered something other than 200.
    #[error("the router answered HTTP {status}")]
    Status {
        /// The status code.
        status: u16,
    },
    /// The body is not valid server-sent events.
    #[error("bad server-sent events: {0}")]
    Sse(#[from] SseError),
    /// A `delta` event's data is not a stream message.
    #[error("bad stream message JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// `(HOST:PORT, PATH)` of `http://HOST:PORT[/PATH]`; the path defaults to
/// [`STREAM_PATH`].
fn split_url(url: &str) -> Result<(String, String), StreamClientError> {
    let bad = |reason| StreamClientError::BadUrl {
        url: url.to_string(),
        reason,
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    if authority.contains('@') {
        return Err(bad("user info is not supported"));
    }
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !has_port {
        return Err(bad("no port"));
    }
    let path = if path.is_empty() || path == "/" {
        STREAM_PATH
    } else {
        path
    };
    Ok((authority.to_string(), path.to_string()))
}

/// A connected stream; see the module documentation.
#[derive(Debug)]
pub struct StreamClient {
    body: Incoming,
    parser: SseParser,
    /// Events of the last chunk not handed out yet (bounded by one chunk).
    pending: VecDeque<SseEvent>,
    scratch: Vec<SseEvent>,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for StreamClient {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl StreamClient {
    /// Connects to `url` (`http://HOST:PORT`, the path `/v1/stream` by default) and
    /// waits for the response head; must run inside a tokio runtime.
    pub async fn connect(url: &str) -> Result<Self, StreamClientError> {
        let (address, path) = split_url(url)?;
        let socket = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|source| StreamClientError::Connect {
                address: address.clone(),
                source,
            })?;
        let _ = socket.set_nodelay(true);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(socket)).await?;
        // The connection's own task moves the bytes; its error reaches us through the
        // response or the body.
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let request = Request::get(path.as_str())
            .header(header::HOST, address.as_str())
            .header(header::ACCEPT, "text/event-stream")
            .body(Empty::<Bytes>::new())
            .map_err(|_| StreamClientError::BadUrl {
                url: url.to_string(),
                reason: "not a valid request target",
            })?;
        let response = match sender.send_request(request).await {
            Ok(response) => response,
            Err(error) => {
                connection.abort();
                return Err(error.into());
            }
        };
        if response.status() != StatusCode::OK {
            connection.abort();
            return Err(StreamClientError::Status {
                status: response.status().as_u16(),
            });
        }
        Ok(Self {
            body: response.into_body(),
            parser: SseParser::new(MAX_LINE_BYTES_DEFAULT),
            pending: VecDeque::new(),
            scratch: Vec::new(),
            connection,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_port_and_the_path_defaults_to_the_stream() {
        assert_eq!(
            split_url("http://127.0.0.1:8080").unwrap(),
            ("127.0.0.1:8080".to_string(), "/v1/stream".to_string())
        );
        assert_eq!(
            split_url("http://localhost:1/").unwrap().1,
            "/v1/stream".to_string()
        );
        assert_eq!(
            split_url("http://[::1]:9/x/y?z=1").unwrap(),
            ("[::1]:9".to_string(), "/x/y?z=1".to_string())
        );
        for bad in [
            "https://h:1",
            "http://h",
            "http://:80",
            "h:80",
            "http://u@h:1",
        ] {
            assert!(
                matches!(split_url(bad), Err(StreamClientError::BadUrl { .. })),
                "{bad}"
            );
        }
    }
}
