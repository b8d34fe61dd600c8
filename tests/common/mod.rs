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
        "2b2c179bb2ea1b118607085c9d172b577c802dd92e9e42d5028a698fee6a8a9f",
    ),
    (
        "autoscale-diurnal.ron",
        "94ee57ab4dc5ff74cb5225d740a160ec63180eb622fcae86d82eeed6eba60d0c",
    ),
    (
        "autoscale-flap.ron",
        "f0698628a40dae49dd83d11fefae86b714869876dba850036f4c8314cebf5016",
    ),
    (
        "cluster-disagg.ron",
        "a0a5f427fb622eb323fe9719eece512d49bc21241f2f5129696667d8f8577edc",
    ),
    (
        "cluster-faults.ron",
        "9afa3f0676c049ef64c618f57bf290115b96321d36b2e2f35571fcc277628770",
    ),
    (
        "cluster-kv.ron",
        "b689972b187acd0954e5a92f206e2033d4b487cb654b83c3170a7799b4b1e6ed",
    ),
    (
        "conversation-trace.ron",
        "7cee30304a08a27a8c5196444ca04d764b3c6046b27338ca4db790599c7ac8cd",
    ),
    (
        "default.ron",
        "c0c7e43451b4419991b6fdb88f606180466cead7b1eef3906f35236700b3168f",
    ),
    (
        "dynosim-round-robin.ron",
        "c5fa4e094cde7e3fff9f89017b7bdb9bb8402c2097426fcc29914bc538f7b460",
    ),
    (
        "h100-llama3-8b.ron",
        "964e8d40d691fc6462335cbb668c478350db282fea5a86957424ff1650617984",
    ),
    (
        "reasoning-priority.ron",
        "9620d12db03ea65520aebae09106847031f0300b7a0a0e741712ec786277b547",
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
