//! `kvtwin router` and `kvtwin relay` against a nats-server that requires a token: the
//! right token (from a file) connects and the router serves; a wrong one stops the start
//! with an error naming the server and the reason, and never prints the token.

mod common;

use common::{kvtwin_outcome, listening_on, Process};
use kvtwin_plane::nats::NatsServer;

#[test]
fn the_router_and_relay_connect_with_the_token_and_stop_on_a_wrong_one() {
    let config = "authorization { token: \"router-s3cret\" }\n";
    let Some(server) = NatsServer::start_secured_or_skip("kvtwin router nats token", config) else {
        return;
    };
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let right = dir.path().join("right");
    let wrong = dir.path().join("wrong");
    std::fs::write(&right, "router-s3cret\n").unwrap();
    std::fs::write(&wrong, "guess\n").unwrap();
    let (right, wrong) = (right.to_str().unwrap(), wrong.to_str().unwrap());

    let router = Process::start(&[
        "router",
        "--listen",
        "127.0.0.1:0",
        "--nats",
        &url,
        "--block-size",
        "16",
        "--nats-token-file",
        right,
    ]);
    let address = listening_on(&router);
    let (status, body) = common::http(&address, "GET", "/v1/workers", "");
    assert_eq!(status, 200, "{body}");
    router.interrupt();

    for command in [
        vec![
            "router",
            "--listen",
            "127.0.0.1:0",
            "--nats",
            &url,
            "--block-size",
            "16",
        ],
        vec![
            "relay",
            "--zmq",
            "tcp://127.0.0.1:1",
            "--worker-id",
            "1",
            "--nats",
            &url,
        ],
    ] {
        let mut args = command.clone();
        args.extend(["--nats-token-file", wrong]);
        let (ok, _, stderr) = kvtwin_outcome(&args);
        assert!(!ok, "{} started with a wrong token", command[0]);
        assert!(stderr.contains(&url), "{stderr}");
        assert!(stderr.to_lowercase().contains("authorization"), "{stderr}");
        assert!(!stderr.contains("guess"), "the token was printed: {stderr}");
    }
}
