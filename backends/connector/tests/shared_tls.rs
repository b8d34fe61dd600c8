//! The connector's shared tier over TLS: a `kvtwin store` serving `rediss://` with a
//! certificate of its own, trusted through SSL_CERT_FILE as a user of a private CA
//! would; a prefix put in the store is found by the connector's batched query. The same
//! store refuses the connector's plain-text `redis://`.
//!
//! One test in this file: it sets SSL_CERT_FILE for its whole process.

use kvtwin::ids::SequenceHash;
use kvtwin_connector::shared::SharedTier;
use kvtwin_store::resp::Limits;
use kvtwin_store::server::{serve, ServerConfig};
use kvtwin_store::store::{Store, StoreConfig};
use std::sync::Arc;

#[test]
fn the_connector_reaches_a_store_over_tls_and_not_in_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    std::env::set_var("SSL_CERT_FILE", &cert);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let namespace = "kvtwin:tiny:16";
    let held: Vec<SequenceHash> = (1..=3).map(SequenceHash::new).collect();
    let (store, listener) = runtime.block_on(async {
        let store = Store::open(StoreConfig {
            limits: [1 << 20, 0, 0],
            disk: None,
            object: None,
            max_value: 1 << 20,
            promote_on_hit: true,
            events: None,
        })
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        (Arc::new(store), listener)
    });
    let port = listener.local_addr().unwrap().port();
    // The store holds the first three blocks of a prompt of four.
    let naming = SharedTier::new("redis://127.0.0.1:1", namespace).unwrap();
    runtime.block_on(async {
        for hash in &held {
            let key = naming.key(*hash);
            store
                .put(key.into_bytes().into(), bytes::Bytes::from_static(b"block"))
                .await
                .unwrap();
        }
    });
    let tls = kvtwin_plane::service::tls::server_config(&cert, &key).unwrap();
    runtime.spawn(serve(
        listener,
        store,
        ServerConfig {
            token: None,
            max_clients: 8,
            limits: Limits::default(),
            tls: Some(tls),
        },
    ));

    let prompt: Vec<SequenceHash> = (1..=4).map(SequenceHash::new).collect();
    let mut over_tls = SharedTier::new(&format!("rediss://127.0.0.1:{port}"), namespace).unwrap();
    assert_eq!(over_tls.prefix(&prompt).unwrap(), 3);
    assert_eq!(over_tls.stats().errors, 0);

    let mut plain = SharedTier::new(&format!("redis://127.0.0.1:{port}"), namespace).unwrap();
    assert!(plain.prefix(&prompt).is_err(), "plain text to a TLS store");
    assert_eq!(plain.stats().errors, 1);
}
