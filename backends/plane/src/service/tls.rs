//! HTTPS for the router's API and its clients, with rustls and its ring provider.
//!
//! Owns: [`server_config`] (a certificate chain and key from PEM files), [`client_config`]
//! (the roots a client trusts: a CA file, or the system's), [`TlsListener`] (an
//! `axum::serve::Listener` whose connections are TLS streams) and [`TlsError`].
//! Invariants: handshakes run on tasks of their own with a deadline, so a client that
//! stalls in its handshake holds neither the accept loop nor anyone else's connection;
//! at most [`HANDSHAKES_MAX`] run at once (accepting waits beyond that), and finished
//! ones wait in a channel of that bound. The crypto provider is passed to every config
//! explicitly (ring, as async-nats uses), never installed process-wide.
//! Never: check tokens (`auth` does), speak HTTP, or log (a failed handshake is the
//! client's to report).

use axum::serve::Listener;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// TLS handshakes in progress at once; accepting more waits for one to end.
pub const HANDSHAKES_MAX: usize = 256;

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or holds no item of the kind wanted.
    #[error("{what} {}: {source}", path.display())]
    Pem {
        /// What the file should hold: "certificate", "private key", "CA certificate".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The file reads but holds no certificate.
    #[error("{what} {}: no certificate in it", path.display())]
    NoCertificate {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the certificates or the key (a key that does not match, a
    /// certificate it cannot parse).
    #[error("{context}: {source}")]
    Rustls {
        /// What was being built, with the files involved.
        context: String,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// No root certificate could be loaded from the system for an https URL.
    #[error(
        "no trusted root certificates found on this system for https; give the router's \
         CA with --router-ca PATH"
    )]
    NoSystemRoots,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// A server configuration from `cert` (PEM: the chain, leaf first) and `key` (PEM:
/// PKCS#8, PKCS#1 or SEC1), speaking HTTP/1.1 over TLS 1.3.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates("certificate", cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
        what: "private key",
        path: key.to_path_buf(),
        source,
    })?;
    let context = || {
        format!(
            "the certificate {} with the key {}",
            cert.display(),
            key.display()
        )
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            context: context(),
            source,
        })?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|source| TlsError::Rustls {
            context: context(),
            source,
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration trusting the certificates in `ca` (PEM), or the system's roots
/// when `ca` is `None`.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in certificates("CA certificate", path)? {
                roots.add(cert).map_err(|source| TlsError::Rustls {
                    context: format!("the CA certificate {}", path.display()),
                    source,
                })?;
            }
        }
        None => {
            // Unreadable ones are skipped: one bad file in the system store should not
            // stop the others.
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsError::NoSystemRoots);
            }
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            context: "the client's TLS configuration".to_string(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TCP listener whose accepted connections have finished a TLS handshake; see the
/// module documentation.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: Arc<Semaphore>,
    done: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local_addr", &self.tcp.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Serves TLS with `config` on `tcp`.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> Self {
        let (done, ready) = mpsc::channel(HANDSHAKES_MAX);
        Self {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshakes: Arc::new(Semaphore::new(HANDSHAKES_MAX)),
            done,
            ready,
        }
    }
}

/// One TCP connection from `tcp`, once a handshake slot of `handshakes` is free.
async fn accept_tcp(
    tcp: &TcpListener,
    handshakes: &Arc<Semaphore>,
) -> (tokio::sync::OwnedSemaphorePermit, TcpStream, SocketAddr) {
    let permit = Arc::clone(handshakes)
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    loop {
        match tcp.accept().await {
            Ok((socket, address)) => return (permit, socket, address),
            Err(error) => pause_after_accept_error(&error).await,
        }
    }
}

/// As axum does for plain TCP: errors of one connection are skipped at once; others
/// (out of file descriptors) wait a second rather than spin.
async fn pause_after_accept_error(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // Both branches are cancel-safe: a dropped accept keeps no connection, a
            // dropped permit wait holds no permit.
            tokio::select! {
                ready = self.ready.recv() => {
                    // `done` lives in self, so the channel never closes.
                    if let Some(ready) = ready {
                        return ready;
                    }
                }
                (permit, socket, address) = accept_tcp(&self.tcp, &self.handshakes) => {
                    let _ = socket.set_nodelay(true);
                    let acceptor = self.acceptor.clone();
                    let done = self.done.clone();
                    tokio::spawn(async move {
                        let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket));
                        if let Ok(Ok(stream)) = handshake.await {
                            let _ = done.send((stream, address)).await;
                        }
                        drop(permit);
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
