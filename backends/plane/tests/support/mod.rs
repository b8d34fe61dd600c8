//! Helpers shared by the service's integration tests: a minimal HTTP/1.1 client over a
//! real loopback socket (one request per connection), servers on free ports (plain, or
//! with a token and TLS), and self-signed certificates made on the spot.

#![allow(dead_code)] // Each test file uses its own subset.

use kvtwin_plane::service::auth::Access;
use kvtwin_plane::service::http::{self, SharedState, Transport};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Sends one request and returns (status, body).
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let (status, _, body) = http_with(addr, method, path, body, &[]);
    (status, body)
}

/// Sends one request with `headers` added; (status, head, body). A status of 0 means
/// no HTTP answer came back.
pub(crate) fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = body.unwrap_or("");
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    // A TLS server may reset a plain-text client; what came before still counts.
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .map(|(head, body)| (head.to_string(), body.to_string()))
        .unwrap_or_default();
    (status, head, body)
}

/// Parses a JSON body.
pub(crate) fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"))
}

/// A server over `state` on a free port, on its own runtime thread; stops when the
/// sender drops.
pub(crate) fn start(state: SharedState) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    start_with(state, Access::default(), Transport::Plain)
}

/// As [`start`], with `access` and `transport`.
pub(crate) fn start_with(
    state: SharedState,
    access: Access,
    transport: Transport,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        runtime
            .block_on(http::serve_with(
                listener,
                state,
                access,
                transport,
                async {
                    let _ = stopped.await;
                },
            ))
            .unwrap();
    });
    (addr, stop)
}

/// A self-signed certificate for `localhost` and `127.0.0.1` written as PEM into `dir`:
/// (certificate, key). The certificate is its own CA.
pub(crate) fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    self_signed_as(dir, "server", &["localhost", "127.0.0.1"])
}

/// A self-signed certificate for `names` written as `dir/STEM.pem` with its key as
/// `dir/STEM-key.pem`.
pub(crate) fn self_signed_as(dir: &Path, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key)
}
