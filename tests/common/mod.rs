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

/// BLAKE3 (hex) of the JSON report (`Report::to_json`, what `kvtwin run SCENARIO --json`
/// writes, less its newline) of every `scenarios/*.ron` simulation, by file name.
/// Users compare reports across versions, so a change to any of these must be deliberate:
/// update the digest in the same commit and say there why the report changed.
/// `KVTWIN_PRINT_DIGESTS=1 cargo test --test scenarios --test dynosim_agreement --test
/// conversation_trace -- --nocapture` prints the digests as they now stand.
pub(crate) const REPORT_DIGESTS: &[(&str, &str)] = &[
    (
        "autoscale-burst.ron",
        "5622cb7a4eb20fca39ff42451f4b04c9b94ec378c8cf6882c8d52abd0014a0dc",
    ),
    (
        "autoscale-diurnal.ron",
        "c001110e453fa9fc1aadb57fa477dd024525d76e3f6aeba28d6e4c98b646faee",
    ),
    (
        "autoscale-flap.ron",
        "32db83afd5be1f21806eaf1a80dc496e577b1a9c1a039b46b196017be223239e",
    ),
    (
        "cluster-disagg.ron",
        "b2ff3392056b0eaad5127709de4579738d4fa60b711269689dd713323cd51bcf",
    ),
    (
        "cluster-faults.ron",
        "f54b803131bf929f5e4b14b26cea09773a1211074e47aeb767e0ca155da46632",
    ),
    (
        "cluster-kv.ron",
        "84de01956f0fb5fc0fddc8f3732eec1d6cb039d7e68ccad3f2f42b89026056f5",
    ),
    (
        "conversation-trace.ron",
        "096caeb635ac0afaa58410102cfda752a0655c7019d6146f6f00e75d4a54139d",
    ),
    (
        "default.ron",
        "a016e4fea064f11d6a575af968e30fe7e9488ae884600f12b00e094e92a4f51a",
    ),
    (
        "dynosim-round-robin.ron",
        "c5fa4e094cde7e3fff9f89017b7bdb9bb8402c2097426fcc29914bc538f7b460",
    ),
    (
        "h100-llama3-8b.ron",
        "a1cabbe6c2717fbfe05c18c79c2c4db4337644b072f5f2f2682c2d7193566e6c",
    ),
    (
        "reasoning-priority.ron",
        "c91bd60169b3866ee9a2d82bf331f1f565964b0c114066a0032322885032ce46",
    ),
];

/// Whether the JSON report of scenario file `file` has the digest [`REPORT_DIGESTS`]
/// gives it: `Err` names the file and both digests.
pub(crate) fn check_report_digest(file: &str, report_json: &str) -> Result<(), String> {
    let digest = blake3::hash(report_json.as_bytes()).to_hex().to_string();
    if std::env::var_os("KVTWIN_PRINT_DIGESTS").is_some() {
        println!("    (\"{file}\", \"{digest}\"),");
    }
    match REPORT_DIGESTS.iter().find(|(name, _)| *name == file) {
        Some((_, expected)) if *expected == digest => Ok(()),
        Some((_, expected)) => Err(format!(
            "{file}: the report's digest is {digest}, REPORT_DIGESTS says {expected}"
        )),
        None => Err(format!(
            "{file}: no digest in REPORT_DIGESTS (the report's is {digest})"
        )),
    }
}
