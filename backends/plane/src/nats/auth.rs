//! How a client proves itself to a secured NATS server: a credentials file (JWT and nkey
//! seed, NGS style), a token, a user and password, an nkey seed, and TLS (a CA to trust,
//! a client certificate, TLS required even when the server does not ask).
//!
//! Owns: [`NatsAuth`], [`Secret`] and the step that puts them on async-nats's
//! `ConnectOptions` ([`NatsAuth::apply`]).
//! Never: log or print a secret (a [`Secret`]'s `Debug` is `<redacted>`, and errors
//! name the file, not its contents), or read a file after the connection is made.

use super::NatsError;
use std::fmt;
use std::path::{Path, PathBuf};

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The credentials and TLS settings of a connection; the default is none (a server
/// without authentication, plain TCP unless it asks for TLS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsAuth {
    /// A `.creds` file (user JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// A token.
    pub token: Option<Secret>,
    /// A user and password.
    pub user_password: Option<(String, Secret)>,
    /// A file holding an nkey seed (`SU...`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A PEM file of the certificate authorities to trust for the server's certificate.
    pub tls_ca: Option<PathBuf>,
    /// A PEM client certificate, for servers that verify clients (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's PEM private key.
    pub tls_key: Option<PathBuf>,
    /// TLS even when the server does not require it.
    pub require_tls: bool,
}

impl NatsAuth {
    /// Whether any credential or TLS setting is given.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `options` with these credentials and TLS settings; a file that cannot be read or
    /// does not hold what it should is an error naming it.
    pub async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, NatsError> {
        let given = [
            self.creds_file.is_some(),
            self.token.is_some(),
            self.user_password.is_some(),
            self.nkey_seed_file.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(NatsError::Auth {
                what: "credentials".into(),
                reason: "give one of a credentials file, a token, a user and password or an \
                         nkey seed"
                    .into(),
            });
        }
        if let Some(path) = &self.creds_file {
            check_readable(path, "credentials file")?;
            options = options
                .credentials_file(path)
                .await
                .map_err(|error| NatsError::Auth {
                    what: format!("credentials file {}", path.display()),
                    reason: error.to_string(),
                })?;
        }
        if let Some(token) = &self.token {
            options = options.token(token.expose().to_string());
        }
        if let Some((user, password)) = &self.user_password {
            options = options.user_and_password(user.clone(), password.expose().to_string());
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = read_secret(path, "nkey seed file")?;
            if !seed.expose().starts_with('S') {
                return Err(NatsError::Auth {
                    what: format!("nkey seed file {}", path.display()),
                    reason: "holds no nkey seed (a seed starts with S, e.g. SU...)".into(),
                });
            }
            options = options.nkey(seed.expose().to_string());
        }
        if let Some(path) = &self.tls_ca {
            check_readable(path, "TLS CA file")?;
            options = options.add_root_certificates(path.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                check_readable(cert, "TLS certificate")?;
                check_readable(key, "TLS key")?;
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            _ => {
                return Err(NatsError::Auth {
                    what: "TLS client certificate".into(),
                    reason: "give both the certificate and its key".into(),
                })
            }
        }
        if self.require_tls || self.tls_ca.is_some() || self.tls_cert.is_some() {
            options = options.require_tls(true);
        }
        Ok(options)
    }
}

/// The secret in `path`, trimmed; an unreadable or empty file is an error naming it.
pub fn read_secret(path: &Path, what: &str) -> Result<Secret, NatsError> {
    let text = std::fs::read_to_string(path).map_err(|error| NatsError::Auth {
        what: format!("{what} {}", path.display()),
        reason: error.to_string(),
    })?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(NatsError::Auth {
            what: format!("{what} {}", path.display()),
            reason: "is empty".into(),
        });
    }
    Ok(Secret::new(trimmed))
}

/// An error naming `path` unless it can be opened (async-nats reads some files only when
/// it connects, where a missing file would read as a connection failure).
fn check_readable(path: &Path, what: &str) -> Result<(), NatsError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|error| NatsError::Auth {
            what: format!("{what} {}", path.display()),
            reason: error.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_show_and_bad_files_are_named() {
        let auth = NatsAuth {
            token: Some(Secret::new("s3cret-token")),
            user_password: Some(("svc".into(), Secret::new("hunter2"))),
            ..NatsAuth::default()
        };
        let shown = format!("{auth:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"), "{shown}");

        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let error = runtime
            .block_on(auth.apply(async_nats::ConnectOptions::new()))
            .unwrap_err();
        assert!(error.to_string().contains("give one of"), "{error}");

        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("seed");
        std::fs::write(&empty, "\n").unwrap();
        let nkey = NatsAuth {
            nkey_seed_file: Some(empty.clone()),
            ..NatsAuth::default()
        };
        let error = runtime
            .block_on(nkey.apply(async_nats::ConnectOptions::new()))
            .unwrap_err();
        assert!(
            error.to_string().contains(&empty.display().to_string())
                && error.to_string().contains("empty"),
            "{error}"
        );
        let missing = NatsAuth {
            tls_ca: Some(dir.path().join("missing-ca.pem")),
            ..NatsAuth::default()
        };
        let error = runtime
            .block_on(missing.apply(async_nats::ConnectOptions::new()))
            .unwrap_err();
        assert!(error.to_string().contains("missing-ca.pem"), "{error}");
        assert!(NatsAuth::default().is_empty() && !missing.is_empty());
    }
}
