//! Access control on a real loopback socket, over HTTP and over HTTPS (a certificate made
//! in the test): with a token every path but the probes answers 401 without it or with
//! a wrong one and 200 with it; `/metrics` is open unless told otherwise; the stream
//! client sends its token; a TLS port refuses plain HTTP and an untrusted client.

mod support;

use bytes::Bytes;
use kvtwin_plane::service::auth::{Access, AuthToken, MetricsAccess};
use kvtwin_plane::service::client::{self, ClientAccess, ClientError, RouterUrl};
use kvtwin_plane::service::http::{SharedState, Transport};
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::service::stream_client::{StreamClient, StreamClientError};
use kvtwin_plane::service::tls;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{http_with, self_signed, start_with};

const TOKEN: &str = "kvtwin-test-token-8f3a";

fn token() -> AuthToken {
    AuthToken::from_text(TOKEN).unwrap().unwrap()
}

fn state() -> SharedState {
    Arc::new(Mutex::new(RouterState::new(4)))
}

fn guarded(metrics: MetricsAccess) -> Access {
    Access {
        token: Some(token()),
        metrics,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const ROUTE_BODY: &str = "{\"tokens\":[1,2,3,4,5,6,7,8]}";

#[test]
fn over_http_a_token_guards_every_path_but_the_probes() {
    let (addr, _stop) = start_with(state(), guarded(MetricsAccess::Open), Transport::Plain);
    let bearer = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {TOKEN}x");
    for (method, path, body) in [
        ("GET", "/v1/workers", None),
        ("POST", "/v1/route", Some(ROUTE_BODY)),
    ] {
        let (status, head, text) = http_with(addr, method, path, body, &[]);
        assert_eq!(status, 401, "{method} {path} without a token: {text}");
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{head}"
        );
        for refused in [wrong.as_str(), "Basic a3Z0d2lu", "Bearer", TOKEN] {
            let (status, _, _) = http_with(addr, method, path, body, &[("Authorization", refused)]);
            assert_eq!(status, 401, "{method} {path} with {refused:?}");
        }
        let (status, _, text) = http_with(addr, method, path, body, &[("Authorization", &bearer)]);
        assert_eq!(status, 200, "{method} {path} with the token: {text}");
    }
    // The stream answers its head once admitted; without the token it never starts.
    let (status, _, _) = http_with(addr, "GET", "/v1/stream", None, &[]);
    assert_eq!(status, 401);
    // Probes and (by default) metrics are open; an unknown path says nothing without
    // the token.
    for open in ["/healthz", "/readyz", "/metrics"] {
        let (status, _, text) = http_with(addr, "GET", open, None, &[]);
        assert_eq!(status, 200, "{open}: {text}");
    }
    assert_eq!(http_with(addr, "GET", "/nowhere", None, &[]).0, 401);
    let (status, _, _) = http_with(addr, "GET", "/nowhere", None, &[("Authorization", &bearer)]);
    assert_eq!(status, 404);
}

#[test]
fn metrics_need_the_token_when_told() {
    let (addr, _stop) = start_with(state(), guarded(MetricsAccess::Token), Transport::Plain);
    assert_eq!(http_with(addr, "GET", "/metrics", None, &[]).0, 401);
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, text) = http_with(addr, "GET", "/metrics", None, &[("Authorization", &bearer)]);
    assert_eq!(status, 200);
    assert!(
        text.contains("kvtwin_router_kv_cache_events_applied_total"),
        "{text}"
    );
    assert_eq!(http_with(addr, "GET", "/healthz", None, &[]).0, 200);
}

#[test]
fn without_a_token_everything_stays_open() {
    let (addr, _stop) = start_with(state(), Access::default(), Transport::Plain);
    for path in ["/v1/workers", "/healthz", "/readyz", "/metrics"] {
        assert_eq!(http_with(addr, "GET", path, None, &[]).0, 200, "{path}");
    }
    // A token sent to a router without one is ignored, not refused.
    let (status, _, _) = http_with(
        addr,
        "GET",
        "/v1/workers",
        None,
        &[("Authorization", "Bearer x")],
    );
    assert_eq!(status, 200);
}

#[test]
fn over_https_the_token_is_needed_and_the_certificate_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let config = tls::server_config(&cert, &key).unwrap();
    let (addr, _stop) = start_with(
        state(),
        guarded(MetricsAccess::Open),
        Transport::Tls(config),
    );
    let trusted = tls::client_config(Some(&cert)).unwrap();
    let with = |token: Option<AuthToken>| ClientAccess {
        token,
        tls: Some(trusted.clone()),
    };
    let wrong = AuthToken::from_text("not-the-token").unwrap().unwrap();
    runtime().block_on(async {
        for host in ["127.0.0.1", "localhost"] {
            let url = |path: &str| {
                RouterUrl::parse(&format!("https://{host}:{}{path}", addr.port()), "/").unwrap()
            };
            for (method, path, body) in [
                (hyper::Method::GET, "/v1/workers", ""),
                (hyper::Method::POST, "/v1/route", ROUTE_BODY),
            ] {
                let ask = |access: ClientAccess| {
                    let method = method.clone();
                    let url = url(path);
                    async move {
                        client::request(&url, &access, method, Bytes::from(body))
                            .await
                            .unwrap()
                    }
                };
                let refused = ask(with(None)).await;
                assert_eq!(refused.status(), 401, "{path} without a token");
                assert!(
                    refused.headers()["www-authenticate"]
                        .to_str()
                        .unwrap()
                        .starts_with("Bearer"),
                    "{path}"
                );
                assert_eq!(ask(with(Some(wrong.clone()))).await.status(), 401, "{path}");
                let admitted = ask(with(Some(token()))).await;
                assert_eq!(admitted.status(), 200, "{path}: {:?}", admitted.body());
            }
            let probe = client::request(
                &url("/healthz"),
                &with(None),
                hyper::Method::GET,
                Bytes::new(),
            )
            .await
            .unwrap();
            assert_eq!(
                (probe.status().as_u16(), probe.body().as_ref()),
                (200, &b"ok\n"[..])
            );
        }

        // The stream client sends its token over TLS; without it, a 401 it names.
        let stream_url = format!("https://127.0.0.1:{}", addr.port());
        let mut stream = StreamClient::connect_with(&stream_url, &with(Some(token())))
            .await
            .expect("the stream with the token");
        let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a message within 10 s")
            .unwrap()
            .expect("the stream goes on");
        assert!(first.full);
        let error = StreamClient::connect_with(&stream_url, &with(None))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                StreamClientError::Client(ClientError::Status { status: 401 })
            ),
            "{error}"
        );

        // A client that does not trust the certificate never gets to HTTP.
        let dir = tempfile::tempdir().unwrap();
        let (other, _) = self_signed(dir.path());
        let untrusting = ClientAccess {
            token: Some(token()),
            tls: Some(tls::client_config(Some(&other)).unwrap()),
        };
        let error = client::request(
            &RouterUrl::parse(&stream_url, "/v1/workers").unwrap(),
            &untrusting,
            hyper::Method::GET,
            Bytes::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, ClientError::Handshake { .. }), "{error}");
    });
    // Plain HTTP on the TLS port gets no HTTP answer, with the token or without.
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        http_with(
            addr,
            "GET",
            "/v1/workers",
            None,
            &[("Authorization", &bearer)]
        )
        .0,
        0
    );
}

#[test]
fn bad_certificate_files_are_errors_that_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let missing = dir.path().join("missing.pem");
    let error = tls::server_config(&missing, &key).unwrap_err();
    assert!(error.to_string().contains("missing.pem"), "{error}");
    // A key where the certificate should be: no certificate in it.
    let error = tls::server_config(&key, &key).unwrap_err();
    assert!(error.to_string().contains("key.pem"), "{error}");
    let error = tls::server_config(&cert, &cert).unwrap_err();
    assert!(error.to_string().contains("private key"), "{error}");
    let error = tls::client_config(Some(&key)).unwrap_err();
    assert!(error.to_string().contains("CA certificate"), "{error}");
}
