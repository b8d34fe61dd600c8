//! A user's mistake (a missing file, a bad field, a bad flag) prints its message, never a
//! backtrace, even with `RUST_BACKTRACE=1` set (anyhow captures one then, and Rust's
//! own `main -> Result` would print it, which reads as a crash).

use std::process::Command;

/// `kvtwin ARGS` with backtraces asked for: (succeeded, stderr).
fn kvtwin_with_backtraces(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_message_only(args: &[&str], names: &str) {
    let (ok, stderr) = kvtwin_with_backtraces(args);
    assert!(!ok, "{args:?} succeeded");
    assert!(
        stderr.contains(names),
        "{args:?}: no {names:?} in\n{stderr}"
    );
    assert!(
        !stderr.to_lowercase().contains("backtrace") && !stderr.contains(" at /"),
        "{args:?} printed a backtrace:\n{stderr}"
    );
}

#[test]
fn user_errors_print_their_message_and_no_backtrace() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/default.ron");
    assert_message_only(&["run", "no-such-scenario.ron"], "no-such-scenario.ron");
    assert_message_only(
        &["run", scenario, "--set", "cluster.no_such_field=1"],
        "no_such_field",
    );
    assert_message_only(&["run", "--no-such-flag"], "--no-such-flag");
    // A cause chain keeps anyhow's layout: the message, then what caused it.
    let (_, stderr) = kvtwin_with_backtraces(&["run", "no-such-scenario.ron"]);
    assert!(stderr.starts_with("Error: "), "{stderr}");
}
