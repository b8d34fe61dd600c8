//! Secured NATS: a real `nats-server` started with each of a token, a user and password,
//! an nkey, TLS and TLS with client certificates (certificates made in the test with
//! rcgen, the nkey with the nkeys crate). The right credentials connect and carry a
//! message; wrong or missing ones fail with an error naming the server and the reason.
//!
//! Without a `nats-server` binary every test skips with the reason, unless
//! `KVTWIN_REQUIRE_NATS=1` or `CI=true`, which make that a failure.

use kvtwin_plane::nats::{
    ConnectConfig, ConsumeMode, NatsAuth, NatsError, NatsMode, NatsPublisher, NatsServer,
    NatsSubscriber, PublisherConfig, Secret, SubscriberConfig,
};
use std::time::Duration;
use support::self_signed_as as certificate;

mod support;

const SUBJECT: &str = "kvtwin.auth.test";

fn connect_config(url: &str, auth: &NatsAuth) -> ConnectConfig {
    ConnectConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        auth: auth.clone(),
        ..ConnectConfig::new(url)
    }
}

/// Connects a subscriber and a publisher with `auth` and passes one message between
/// them; the first error otherwise.
async fn round_trip(url: &str, auth: &NatsAuth) -> Result<(), NatsError> {
    let mut subscriber = NatsSubscriber::connect(SubscriberConfig {
        connect: connect_config(url, auth),
        ..SubscriberConfig::new(url, SUBJECT, ConsumeMode::Core)
    })
    .await?;
    let publisher = NatsPublisher::connect(PublisherConfig {
        connect: connect_config(url, auth),
        ..PublisherConfig::new(url, SUBJECT, NatsMode::Core)
    })
    .await?;
    publisher.publish(b"hello".to_vec()).await?;
    publisher.flush().await?;
    let message = tokio::time::timeout(Duration::from_secs(5), subscriber.next())
        .await
        .expect("the message within 5 s")?;
    assert_eq!(message.payload.as_ref(), b"hello");
    Ok(())
}

/// Asserts that `auth` is refused by the server at `url`, naming it and `reason`.
async fn refused(url: &str, auth: &NatsAuth, reason: &str) {
    let error = round_trip(url, auth).await.expect_err("refused");
    let text = error.to_string();
    assert!(text.contains(url), "{text}");
    assert!(text.to_lowercase().contains(reason), "{reason}: {text}");
}

fn token(value: &str) -> NatsAuth {
    NatsAuth {
        token: Some(Secret::new(value)),
        ..NatsAuth::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_server_takes_the_token_and_refuses_others() {
    let config = "authorization { token: \"s3cret-token\" }\n";
    let Some(server) = NatsServer::start_secured_or_skip("nats token", config) else {
        return;
    };
    let url = server.url();
    round_trip(&url, &token("s3cret-token")).await.unwrap();
    refused(&url, &token("wrong"), "authorization").await;
    refused(&url, &NatsAuth::default(), "authorization").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_server_takes_them_and_refuses_a_wrong_password() {
    let config = "authorization { users = [ { user: \"svc\", password: \"pw-1\" } ] }\n";
    let Some(server) = NatsServer::start_secured_or_skip("nats user", config) else {
        return;
    };
    let url = server.url();
    let user = |password: &str| NatsAuth {
        user_password: Some(("svc".into(), Secret::new(password))),
        ..NatsAuth::default()
    };
    round_trip(&url, &user("pw-1")).await.unwrap();
    refused(&url, &user("pw-2"), "authorization").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_server_takes_its_user_seed_and_refuses_another() {
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let config = format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    );
    let Some(server) = NatsServer::start_secured_or_skip("nats nkey", &config) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let seed_file = |name: &str, pair: &nkeys::KeyPair| {
        let path = dir.path().join(name);
        std::fs::write(&path, pair.seed().unwrap()).unwrap();
        NatsAuth {
            nkey_seed_file: Some(path),
            ..NatsAuth::default()
        }
    };
    let url = server.url();
    round_trip(&url, &seed_file("user.nk", &user))
        .await
        .unwrap();
    refused(&url, &seed_file("stranger.nk", &stranger), "authorization").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_takes_a_client_that_trusts_its_certificate_and_one_with_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (server_cert, server_key) = certificate(dir.path(), "server", &["localhost", "127.0.0.1"]);
    let (client_cert, client_key) = certificate(dir.path(), "client", &["kvtwin-client"]);
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\n",
        server_cert.display(),
        server_key.display()
    );
    let Some(server) = NatsServer::start_secured_or_skip("nats tls", &config) else {
        return;
    };
    let url = server.url();
    let trusting = NatsAuth {
        tls_ca: Some(server_cert.clone()),
        ..NatsAuth::default()
    };
    round_trip(&url, &trusting).await.unwrap();
    // TLS required by the client, the server's certificate not trusted.
    let untrusting = NatsAuth {
        require_tls: true,
        ..NatsAuth::default()
    };
    refused(&url, &untrusting, "certificate").await;

    // The same server verifying clients against the client's certificate.
    let config = format!(
        "tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true }}\n",
        server_cert.display(),
        server_key.display(),
        client_cert.display()
    );
    let Some(verifying) = NatsServer::start_secured_or_skip("nats mtls", &config) else {
        return;
    };
    let url = verifying.url();
    let with_certificate = NatsAuth {
        tls_ca: Some(server_cert.clone()),
        tls_cert: Some(client_cert),
        tls_key: Some(client_key),
        ..NatsAuth::default()
    };
    round_trip(&url, &with_certificate).await.unwrap();
    let error = round_trip(&url, &trusting)
        .await
        .expect_err("no client certificate");
    assert!(error.to_string().contains(&url), "{error}");
}
