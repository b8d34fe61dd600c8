//! Helpers shared by the integration tests.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use kvtwin::block::BlockIdentity;
use kvtwin::ids::LocalBlockHash;
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

/// Chain `c` of `len` blocks: every chain shares block 0 (a system prompt); the rest is
/// its own.
pub(crate) fn shared_prefix_chain(c: u64, len: usize) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (0..len as u64)
        .map(|i| LocalBlockHash::new(if i == 0 { 1 } else { c * 100 + i }))
        .collect();
    BlockIdentity::chain(&locals)
}
