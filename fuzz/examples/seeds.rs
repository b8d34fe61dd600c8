//! Writes the seed corpus into `DIR/<target>/seed-<n>` (`seeds DIR [REPO]`): valid messages
//! from the project's own encoders, which the fuzzer then mutates. Generated, never
//! committed (scripts/fuzz.sh puts it under target/; `cargo run -p kvtwin-fuzz --example seeds -- DIR REPO`).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "target/fuzz-corpus".into()));
    let repo = PathBuf::from(args.next().unwrap_or_else(|| ".".into()));
    let mut counts = std::collections::BTreeMap::new();
    for (target, bytes) in kvtwin_fuzz::seeds(&repo) {
        let n = counts.entry(target).or_insert(0usize);
        let folder = dir.join(target);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join(format!("seed-{n}")), bytes)?;
        *n += 1;
    }
    for (target, _) in kvtwin_fuzz::TARGETS {
        std::fs::create_dir_all(dir.join(target))?;
        println!(
            "{target}: {} seeds",
            counts.get(target).copied().unwrap_or(0)
        );
    }
    Ok(())
}
