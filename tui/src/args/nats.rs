//! The secured-NATS options `kvtwin router`, `kvtwin relay` and `kvtwin dash --nats`
//! share: a credentials file, a token, a user and password, an nkey seed, TLS.
//!
//! Owns: [`NatsAuthArgs`] and its conversion to the plane's `NatsAuth`, the subject KV
//! events go to by default ([`DEFAULT_SUBJECT`]), and [`connect_nats`], a subscription to
//! Dynamo RouterEvents (the router's, and a dashboard replica's).
//! Never: print a secret (tokens and passwords come from the environment or a file
//! rather than the command line where they can be, and clap hides their values).

use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin_plane::nats::{
    read_secret, ConsumeMode, NatsAuth, Secret, SubscriberConfig as NatsSubscriberConfig,
};
use kvtwin_plane::service::nats_source::{NatsSource, NatsSourceConfig};
use kvtwin_plane::wire::DecodeLimits;
use std::path::PathBuf;

/// How to authenticate to a NATS server that requires it, and TLS.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct NatsAuthArgs {
    /// A NATS credentials file (user JWT and nkey seed, `.creds`).
    #[arg(long, value_name = "FILE")]
    nats_creds: Option<PathBuf>,
    /// A NATS token (better from the environment: KVTWIN_NATS_TOKEN).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "KVTWIN_NATS_TOKEN",
        hide_env_values = true
    )]
    nats_token: Option<String>,
    /// A file holding the NATS token.
    #[arg(long, value_name = "FILE", conflicts_with = "nats_token")]
    nats_token_file: Option<PathBuf>,
    /// A NATS user (its password from --nats-password or KVTWIN_NATS_PASSWORD).
    #[arg(long, value_name = "USER", requires = "nats_password")]
    nats_user: Option<String>,
    /// The NATS user's password.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "KVTWIN_NATS_PASSWORD",
        hide_env_values = true
    )]
    nats_password: Option<String>,
    /// A file holding an nkey seed (SU...).
    #[arg(long, value_name = "FILE")]
    nats_nkey: Option<PathBuf>,
    /// PEM certificate authorities to trust for the server's certificate (implies TLS).
    #[arg(long, value_name = "FILE")]
    nats_tls_ca: Option<PathBuf>,
    /// A PEM client certificate, for servers that verify clients (with --nats-tls-key).
    #[arg(long, value_name = "FILE", requires = "nats_tls_key")]
    nats_tls_cert: Option<PathBuf>,
    /// The client certificate's PEM key.
    #[arg(long, value_name = "FILE", requires = "nats_tls_cert")]
    nats_tls_key: Option<PathBuf>,
    /// Use TLS even when the server does not require it.
    #[arg(long)]
    nats_require_tls: bool,
}

impl NatsAuthArgs {
    /// The credentials and TLS settings these options give; a token or seed file that
    /// cannot be read is an error naming it.
    pub(crate) fn auth(&self) -> Result<NatsAuth> {
        let token = match (&self.nats_token, &self.nats_token_file) {
            (Some(token), _) if token.trim().is_empty() => {
                bail!("--nats-token (or KVTWIN_NATS_TOKEN) is empty")
            }
            (Some(token), _) => Some(Secret::new(token.trim())),
            (None, Some(path)) => Some(read_secret(path, "token file")?),
            (None, None) => None,
        };
        let user_password = match (&self.nats_user, &self.nats_password) {
            (Some(user), Some(password)) => Some((user.clone(), Secret::new(password.as_str()))),
            _ => None,
        };
        Ok(NatsAuth {
            creds_file: self.nats_creds.clone(),
            token,
            user_password,
            nkey_seed_file: self.nats_nkey.clone(),
            tls_ca: self.nats_tls_ca.clone(),
            tls_cert: self.nats_tls_cert.clone(),
            tls_key: self.nats_tls_key.clone(),
            require_tls: self.nats_require_tls,
        })
    }
}

/// Dynamo's subject for KV events without a namespace; ours by default.
pub(crate) const DEFAULT_SUBJECT: &str = "kvtwin.kv_events";

/// Subscribes to Dynamo RouterEvents on `subject` at `url`: core NATS, or a JetStream
/// stream replayed from its start.
pub(crate) async fn connect_nats(
    url: &str,
    subject: &str,
    jetstream: Option<&str>,
    auth: &NatsAuth,
) -> Result<NatsSource> {
    let mode = match jetstream {
        Some(stream) => ConsumeMode::Replay {
            stream: stream.to_string(),
        },
        None => ConsumeMode::Core,
    };
    let mut subscriber = NatsSubscriberConfig::new(url, subject, mode);
    subscriber.connect.auth = auth.clone();
    let source = NatsSource::connect(NatsSourceConfig {
        subscriber,
        limits: DecodeLimits::default(),
    })
    .await
    .with_context(|| format!("subscribing to {subject} on {url}"))?;
    Ok(source)
}
