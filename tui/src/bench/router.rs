//! `kvtwin bench router`: the command line around `kvtwin_plane::bench::router`, which
//! replays a `kv-router-workload` file through kvtwin's indexer the way peer-bench times
//! Dynamo's indexers.
//!
//! Owns: the flags and the output (one JSON line with peer-bench's field names).
//! Never: time, shard or apply anything itself (the library does).

use anyhow::Result;
use kvtwin_plane::bench::router::{run_router_bench, RouterBenchConfig};
use std::path::Path;

/// Replays `path` on `threads` threads (or, with `floor`, through no index) and prints
/// the JSON line.
pub(crate) fn router(path: &Path, threads: usize, floor: bool) -> Result<()> {
    let report = run_router_bench(&RouterBenchConfig {
        workload: path.to_path_buf(),
        threads,
        floor,
    })?;
    println!("{}", report.to_json());
    Ok(())
}
