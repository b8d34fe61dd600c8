//! Access control for the router's HTTP API: the bearer token, where it comes from, and
//! the check every request but the probes passes.
//!
//! Owns: [`AuthToken`] (the secret; its `Debug` prints `<redacted>` and it has no
//! `Display`), [`TokenSource`] and [`load_token`] (a file read once, or
//! [`TOKEN_ENV`]), [`Access`] (which requests need the token: all but
//! [`OPEN_PATHS`], and `/metrics` as [`MetricsAccess`] says), [`require_token`] (the
//! axum middleware answering 401 with `WWW-Authenticate: Bearer`), and
//! [`check_exposure`] (no token on a non-loopback address unless the caller says
//! [`Exposure::Open`]).
//! Invariants: the token is compared in constant time (as BLAKE3 digests, so not even
//! its length leaks through timing); it never appears in an error, a log line or a
//! `Debug` output; a path that is not exactly one of the open ones needs the token, so
//! an unknown path is a 401 before it is a 404 and nothing about the routes leaks.
//! Never: serve TLS (`tls` does), log, or read the token file more than once.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The environment variable a token may come from when no file is named (the router's
/// and its clients').
pub const TOKEN_ENV: &str = "KVTWIN_AUTH_TOKEN";

/// The paths anyone may ask for: probes an orchestrator calls without credentials.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The router's shared secret. Cloning shares it; it is never printed.
#[derive(Clone)]
pub struct AuthToken {
    secret: Arc<str>,
    digest: [u8; 32],
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Why no token could be had. Messages name where it was looked for, never what it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The token file could not be read.
    #[error("cannot read the token file {}: {source}", path.display())]
    Unreadable {
        /// The file named.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds nothing but whitespace.
    #[error("the token file {} is empty", path.display())]
    EmptyFile {
        /// The file named.
        path: PathBuf,
    },
    /// The environment variable is set but empty (or not Unicode).
    #[error("{var} is set but empty or not valid text; unset it or give a token")]
    EmptyEnv {
        /// The variable.
        var: &'static str,
    },
    /// The token has bytes an HTTP header cannot carry (a control character, or
    /// whitespace inside it).
    #[error("the token from {from} has a control character or whitespace inside it")]
    NotHeaderText {
        /// Where it came from: the file's path or the variable's name.
        from: String,
    },
}

impl AuthToken {
    /// A token from text, trimmed; `from` names where it came from for the error.
    fn parse(text: &str, from: String) -> Result<Self, TokenError> {
        let secret = text.trim();
        // Visible ASCII only: what a Bearer credential may hold, and what every client
        // can put in a header unchanged.
        if secret.bytes().any(|byte| !byte.is_ascii_graphic()) {
            return Err(TokenError::NotHeaderText { from });
        }
        Ok(Self {
            secret: Arc::from(secret),
            digest: *blake3::hash(secret.as_bytes()).as_bytes(),
        })
    }

    /// Reads `path` once, trimming surrounding whitespace (a trailing newline).
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        if text.trim().is_empty() {
            return Err(TokenError::EmptyFile {
                path: path.to_path_buf(),
            });
        }
        Self::parse(&text, path.display().to_string())
    }

    /// A token given as text (tests, and callers with their own secret store); `None`
    /// when it is empty after trimming.
    pub fn from_text(text: &str) -> Option<Result<Self, TokenError>> {
        (!text.trim().is_empty()).then(|| Self::parse(text, "the text given".to_string()))
    }

    /// Whether `presented` is this token, in time independent of both.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let digest = blake3::hash(presented);
        bool::from(digest.as_bytes().ct_eq(&self.digest))
    }

    /// `Authorization: Bearer <token>`, marked sensitive so that `http`'s `Debug` of
    /// the header map prints `Sensitive` instead of the value.
    pub fn authorization(&self) -> HeaderValue {
        let mut value = HeaderValue::try_from(format!("Bearer {}", self.secret))
            .expect("checked in parse: visible ASCII");
        value.set_sensitive(true);
        value
    }
}

/// Where a token is looked for, in order: the file, if named; else [`TOKEN_ENV`].
#[derive(Clone, Debug, Default)]
pub struct TokenSource {
    /// `--auth-token-file` / `--router-token-file`.
    pub file: Option<PathBuf>,
}

/// The token `source` names: the file's (which must be readable and non-empty), else the
/// environment variable's when it is set (which must not be empty), else `None`.
pub fn load_token(source: &TokenSource) -> Result<Option<AuthToken>, TokenError> {
    if let Some(path) = &source.file {
        return AuthToken::from_file(path).map(Some);
    }
    match std::env::var_os(TOKEN_ENV) {
        None => Ok(None),
        Some(value) => {
            let text = value
                .to_str()
                .filter(|text| !text.trim().is_empty())
                .ok_or(TokenError::EmptyEnv { var: TOKEN_ENV })?;
            AuthToken::parse(text, TOKEN_ENV.to_string()).map(Some)
        }
    }
}

/// Whether `GET /metrics` needs the token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsAccess {
    /// Anyone may scrape it (the default: scrapers are often set up without secrets,
    /// and the metrics hold counts, not prompts or hashes).
    #[default]
    Open,
    /// It needs the token like the API (`--metrics-auth`).
    Token,
}

/// Who may call the API.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// The token every request but the open paths must carry; `None` lets everyone in
    /// (the behaviour without flags).
    pub token: Option<AuthToken>,
    /// Whether `/metrics` is one of the open paths.
    pub metrics: MetricsAccess,
}

impl Access {
    /// Whether a request for `path` may go without the token.
    pub fn is_open(&self, path: &str) -> bool {
        OPEN_PATHS.contains(&path) || (path == "/metrics" && self.metrics == MetricsAccess::Open)
    }

    /// Whether a request for `path` carrying `authorization` may go on.
    pub fn admits(&self, path: &str, authorization: Option<&HeaderValue>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        if self.is_open(path) {
            return true;
        }
        authorization
            .and_then(|value| bearer_credential(value.as_bytes()))
            .is_some_and(|presented| token.matches(presented))
    }
}

/// The credential of `Bearer <credential>`; the scheme is case-insensitive (RFC 7235).
fn bearer_credential(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"Bearer") || !rest.starts_with(b" ") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// The axum middleware: passes a request [`Access::admits`], answers anything else 401
/// with `WWW-Authenticate: Bearer` and without saying whether a token was sent.
pub async fn require_token(
    State(access): State<Arc<Access>>,
    request: Request,
    next: Next,
) -> Response {
    let admitted = access.admits(
        request.uri().path(),
        request.headers().get(header::AUTHORIZATION),
    );
    if admitted {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"kvtwin\"")],
        "a bearer token is required (Authorization: Bearer <token>)\n",
    )
        .into_response()
}

/// Whether the API may listen beyond loopback without a token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Exposure {
    /// Refuse a non-loopback address without a token (the default).
    #[default]
    LoopbackUnlessToken,
    /// Listen anywhere without one (`--insecure`).
    Open,
}

/// A listening address that would serve everyone on the network.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve the router API on {address} without a token: it is not a loopback \
     address. Give a token (--auth-token-file PATH or {TOKEN_ENV}), listen on 127.0.0.1, \
     or pass --insecure to serve it open"
)]
pub struct ExposureError {
    /// The address asked for.
    pub address: SocketAddr,
}

/// Refuses `address` when it is not loopback, there is no token and `exposure` does not
/// allow it.
pub fn check_exposure(
    address: SocketAddr,
    access: &Access,
    exposure: Exposure,
) -> Result<(), ExposureError> {
    if access.token.is_none() && !address.ip().is_loopback() && exposure != Exposure::Open {
        return Err(ExposureError { address });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str) -> AuthToken {
        AuthToken::from_text(text).unwrap().unwrap()
    }

    fn header(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let access = Access {
            token: Some(token(" s3cret\n")),
            metrics: MetricsAccess::Open,
        };
        let path = "/v1/route";
        assert!(access.admits(path, Some(&header("Bearer s3cret"))));
        assert!(access.admits(path, Some(&header("bearer  s3cret "))));
        for refused in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Basic s3cret",
            "Bearers3cret",
            "s3cret",
            "Bearer",
            "",
        ] {
            assert!(!access.admits(path, Some(&header(refused))), "{refused:?}");
        }
        assert!(!access.admits(path, None));
        assert!(!access.admits("/nowhere", None));
        for open in ["/healthz", "/readyz", "/metrics"] {
            assert!(access.admits(open, None), "{open}");
        }
        let closed = Access {
            metrics: MetricsAccess::Token,
            ..access
        };
        assert!(!closed.admits("/metrics", None));
        assert!(closed.admits("/metrics", Some(&header("Bearer s3cret"))));
        // Prefixes of open paths are not open.
        assert!(!closed.admits("/healthz/x", None));
        assert!(Access::default().admits(path, None));
    }

    #[test]
    fn the_token_never_shows_in_debug_or_errors() {
        let secret = token("hunter2-abc");
        assert_eq!(format!("{secret:?}"), "AuthToken(<redacted>)");
        let access = Access {
            token: Some(secret.clone()),
            metrics: MetricsAccess::Open,
        };
        assert!(!format!("{access:?}").contains("hunter2"));
        assert!(!format!("{:?}", secret.authorization()).contains("hunter2"));
        let error = AuthToken::from_text("hunter2 abc").unwrap().unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    #[test]
    fn token_files_are_trimmed_and_empty_or_missing_ones_name_the_path() {
        let dir = std::env::temp_dir().join(format!("kvtwin-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("token");
        std::fs::write(&good, "abc123\n").unwrap();
        assert!(AuthToken::from_file(&good).unwrap().matches(b"abc123"));
        let empty = dir.join("empty");
        std::fs::write(&empty, " \n").unwrap();
        let error = AuthToken::from_file(&empty).unwrap_err();
        assert!(matches!(error, TokenError::EmptyFile { .. }));
        assert!(
            error.to_string().contains(&*empty.to_string_lossy()),
            "{error}"
        );
        let missing = dir.join("missing");
        let error = load_token(&TokenSource {
            file: Some(missing.clone()),
        })
        .unwrap_err();
        assert!(matches!(error, TokenError::Unreadable { .. }));
        assert!(
            error.to_string().contains(&*missing.to_string_lossy()),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_non_loopback_address_needs_a_token_or_open_exposure() {
        let open = Access::default();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let error = check_exposure(any, &open, Exposure::default()).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("0.0.0.0:8080") && text.contains("--insecure"),
            "{text}"
        );
        assert!(text.contains("--auth-token-file"), "{text}");
        assert!(check_exposure(any, &open, Exposure::Open).is_ok());
        let with_token = Access {
            token: Some(token("t")),
            metrics: MetricsAccess::Open,
        };
        assert!(check_exposure(any, &with_token, Exposure::default()).is_ok());
        for loopback in ["127.0.0.1:0", "[::1]:8080"] {
            let address = loopback.parse().unwrap();
            assert!(check_exposure(address, &open, Exposure::default()).is_ok());
        }
    }
}
