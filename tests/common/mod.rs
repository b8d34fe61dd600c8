//! Helpers shared by the integration tests.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::path::PathBuf;

/// The repository root (where `scenarios/` lives).
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared` beside the repository, or `None` with a printed reason when it is absent
/// and the run is not CI (CI always has it, so there its absence fails the test).
pub(crate) fn shared_dir(what: &str) -> Option<PathBuf> {
    let shared = repo_root().join("..").join("shared");
    if shared.is_dir() {
        return Some(shared);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but ../shared is missing; {what} needs it"
    );
    eprintln!("skipping {what}: ../shared is not beside the repository");
    None
}
