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
        "e70385e41094ee54eb00b565873ecb5b9853b4b7d2ec2e8382733f6c54e391d7",
    ),
    (
        "autoscale-diurnal.ron",
        "7e203beb3aa9dcb634830165ce8b0e8ce45f6175ba1ff81c4a52bc26590979b8",
    ),
    (
        "autoscale-flap.ron",
        "e3e23f21f679e57713d2d7367b374175b61e49145a721c27fad577803014b4ea",
    ),
    (
        "cluster-disagg.ron",
        "f4262f6dd0e4c60f9c0132218e7f2f1570d4ab445d454cdc05931dd7a9026b99",
    ),
    (
        "cluster-faults.ron",
        "6cb1f981cf9a52ee6c6bc6a71b6b0ea466e0ea39aa346aeeb26df322d624b707",
    ),
    (
        "cluster-kv.ron",
        "26c089ca94fb0513dc3af81d073cac56b747914d3b91018899463222eb66b33e",
    ),
    (
        "conversation-shared.ron",
        "f43b0aaa0ed0b5b9bb327cb15874168223284fe3d218ee270673faac32505727",
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
        "c0c58110ae1c0f4df18bb6b24dc84ba47a79d7968dd526e9e0f9658a795fc3aa",
    ),
    (
        "reasoning-priority.ron",
        "12e12234dec3450f0e3fe68baa22690a2c52af3ff71ae7b0efd52cad43ce7399",
    ),
    (
        "vllm-cpu-tiny.ron",
        "c747dc7e0d656790065ed6ad8185587167cce513443af64da4da8d8d34a27c0d",
    ),
    (
        "vllm-cpu-tiny-connector.ron",
        "6d1a1bd4864a462c3bc7b0a48a95252754d5adb10158e793c4b4ce7fbd15a63a",
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
