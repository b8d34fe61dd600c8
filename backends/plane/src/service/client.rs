//! The connection every in-repository client of the router's HTTP API makes: an
//! `http://` or `https://` URL, a TCP socket (and a TLS handshake for https), hyper's
//! HTTP/1 client over it, and the bearer token on every request.
//!
//! Owns: [`RouterUrl`] (the strict URL parsing: scheme, `HOST:PORT`, path),
//! [`ClientAccess`] (the token a client sends and the roots it trusts),
//! [`Connection`] (one connection's request sender and its driving task), [`request`]
//! (one request on a fresh connection, its whole answer) and [`ClientError`].
//! Invariants: a token goes only in the `Authorization` header, marked sensitive; an
//! https URL is never spoken to in plain HTTP, and its certificate is checked against
//! the roots given (`--router-ca`) or the system's.
//! Never: retry, reconnect or time out (callers do, as `stream_client` says), or read
//! the token from anywhere (`auth::load_token` does, for the binary).

use super::auth::AuthToken;
use super::tls::{client_config, TlsError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::sync::Arc;

/// Why a client could not talk to the router.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The URL is not `http[s]://HOST:PORT[/PATH]`.
    #[error("bad router URL {url:?}: {reason}")]
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
    /// No TLS configuration for an https URL (no system roots, a bad CA file).
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The TLS handshake failed (an untrusted certificate, a name that does not match,
    /// a server that does not speak TLS).
    #[error("TLS handshake with {address}: {source}")]
    Handshake {
        /// `HOST:PORT`.
        address: String,
        /// rustls's reason, as tokio-rustls reports it.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (handshake, request, or the body broke off).
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// The router answered something other than 200 where only 200 will do.
    #[error("the router answered HTTP {status}{}", status_hint(*status))]
    Status {
        /// The status code.
        status: u16,
    },
}

/// What to do about a refusal, for people reading a status line.
fn status_hint(status: u16) -> &'static str {
    match status {
        401 => {
            " (unauthorized: give the router's token with --router-token-file PATH or \
             KVTWIN_AUTH_TOKEN)"
        }
        _ => "",
    }
}

/// A router URL: `http://HOST:PORT[/PATH]` or `https://HOST:PORT[/PATH]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterUrl {
    /// Whether it is `https`.
    pub tls: bool,
    /// `HOST:PORT`, as given (IPv6 hosts in brackets).
    pub authority: String,
    /// The path and query, `default_path` when the URL has none.
    pub path: String,
}

impl RouterUrl {
    /// Parses `url`; a URL without a path (or with `/` alone) gets `default_path`.
    pub fn parse(url: &str, default_path: &str) -> Result<Self, ClientError> {
        let bad = |reason| ClientError::BadUrl {
            url: url.to_string(),
            reason,
        };
        let (tls, rest) = if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else {
            return Err(bad("only http:// and https:// are supported"));
        };
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
            default_path
        } else {
            path
        };
        Ok(Self {
            tls,
            authority: authority.to_string(),
            path: path.to_string(),
        })
    }

    /// The host, without brackets or port: the name its certificate must carry.
    pub fn host(&self) -> &str {
        let host = self
            .authority
            .rsplit_once(':')
            .map_or(self.authority.as_str(), |(host, _)| host);
        host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// What a client brings: the router's token, and for https the roots it trusts.
#[derive(Clone, Debug, Default)]
pub struct ClientAccess {
    /// Sent as `Authorization: Bearer <token>` on every request, when given.
    pub token: Option<AuthToken>,
    /// The TLS configuration for https URLs; `None` trusts the system's roots, loaded
    /// when an https URL is first connected (an http-only client never reads them).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl ClientAccess {
    /// A GET or POST of `path` on `url`'s host, with `Host` and, when there is a token,
    /// `Authorization`.
    pub fn request(
        &self,
        url: &RouterUrl,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, url.authority.as_str());
        if let Some(token) = &self.token {
            builder = builder.header(header::AUTHORIZATION, token.authorization());
        }
        builder
            .body(Full::new(body))
            .map_err(|_| ClientError::BadUrl {
                url: format!("{}{path}", url.authority),
                reason: "not a valid request target",
            })
    }
}

/// One HTTP/1 connection to a router: send requests on `sender`; the task that moves
/// the bytes stops when this drops.
#[derive(Debug)]
pub struct Connection {
    /// Where requests go.
    pub sender: SendRequest<Full<Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Connection {
    /// Connects to `url`'s host (TLS for https, checked against `access`'s roots);
    /// must run inside a tokio runtime.
    pub async fn open(url: &RouterUrl, access: &ClientAccess) -> Result<Self, ClientError> {
        let address = url.authority.as_str();
        let socket = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|source| ClientError::Connect {
                address: address.to_string(),
                source,
            })?;
        let _ = socket.set_nodelay(true);
        if !url.tls {
            return Self::over(socket).await;
        }
        let config = match &access.tls {
            Some(config) => Arc::clone(config),
            None => client_config(None)?,
        };
        let name =
            ServerName::try_from(url.host().to_string()).map_err(|_| ClientError::BadUrl {
                url: url.authority.clone(),
                reason: "the host is not a DNS name or an IP address",
            })?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, socket)
            .await
            .map_err(|source| ClientError::Handshake {
                address: address.to_string(),
                source,
            })?;
        Self::over(stream).await
    }

    async fn over<T>(io: T) -> Result<Self, ClientError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        // The connection's own task moves the bytes; its error reaches the caller
        // through the response or the body.
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, task })
    }
}

/// One request on a fresh connection: `method` on `url` (its path) with `body`; the
/// answer whatever its status, its body read whole. For tests and scripts: a body is
/// held in memory.
pub async fn request(
    url: &RouterUrl,
    access: &ClientAccess,
    method: Method,
    body: Bytes,
) -> Result<Response<Bytes>, ClientError> {
    let mut connection = Connection::open(url, access).await?;
    let request = access.request(url, method, &url.path, body)?;
    let response = connection.sender.send_request(request).await?;
    let (head, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Response::from_parts(head, body))
}

/// Whether `status` is 200, as an error naming it when not.
pub fn expect_ok(status: StatusCode) -> Result<(), ClientError> {
    if status == StatusCode::OK {
        Ok(())
    } else {
        Err(ClientError::Status {
            status: status.as_u16(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_scheme_host_and_port_and_the_path_defaults() {
        let url = RouterUrl::parse("http://127.0.0.1:8080", "/v1/stream").unwrap();
        assert_eq!(
            (
                url.tls,
                url.authority.as_str(),
                url.path.as_str(),
                url.host()
            ),
            (false, "127.0.0.1:8080", "/v1/stream", "127.0.0.1")
        );
        let url = RouterUrl::parse("https://[::1]:9/x/y?z=1", "/v1/stream").unwrap();
        assert_eq!(
            (
                url.tls,
                url.authority.as_str(),
                url.path.as_str(),
                url.host()
            ),
            (true, "[::1]:9", "/x/y?z=1", "::1")
        );
        assert_eq!(
            RouterUrl::parse("https://localhost:1/", "/p").unwrap().path,
            "/p"
        );
        for bad in [
            "ftp://h:1",
            "http://h",
            "https://:80",
            "h:80",
            "http://u@h:1",
        ] {
            assert!(
                matches!(RouterUrl::parse(bad, "/"), Err(ClientError::BadUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_401_says_how_to_give_the_token() {
        let text = ClientError::Status { status: 401 }.to_string();
        assert!(text.contains("--router-token-file"), "{text}");
        assert_eq!(
            ClientError::Status { status: 404 }.to_string(),
            "the router answered HTTP 404"
        );
    }
}
