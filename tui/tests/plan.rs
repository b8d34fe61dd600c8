//! `kvtwin plan`: on spaces of 200 and of 72 points it finds the exhaustive sweep's
//! optimum with at most a quarter of the simulations; it chooses a shared tier's size by
//! SLO and price; an SLO nothing meets names the constraint that fails and by how much;
//! bad input names its field.

mod common;

use serde_json::Value;
use std::path::Path;

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/cluster-kv.ron");

/// 2 GPUs × 5 worker counts × 4 device sizes × 5 host sizes = 200 points, on 80
/// conversations of the cluster scenario's traffic.
const SPACE: &str = r#"(
    gpu: ["h100-llama3-8b", "a100-llama3-8b"],
    set: [("workload.Conversations.conversations", ["80"])],
    workers: [1, 2, 3, 4, 6],
    device_blocks: [500, 1000, 2000, 4000],
    host_blocks: [1000, 2000, 4000, 8000, 16000],
)"#;

const SLO: &str = "ttft_p99_ms=450,tpot_p99_ms=15";

/// `kvtwin` with `args`: (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    common::kvtwin_outcome(args)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_plan_is_the_exhaustive_sweeps_optimum_from_a_quarter_of_the_runs() {
    // Several SLOs over the one sweep: binding on TTFT, on TPOT, and on both.
    plan_against_sweep(
        SPACE,
        200,
        &[
            "ttft_p99_ms=500,tpot_p99_ms=40",
            "ttft_p99_ms=300,tpot_p99_ms=12",
            SLO,
        ],
    );
}

/// 3 GPUs × 6 worker counts × 4 device sizes = 72 points, on 800 conversations: a
/// space small enough that bisecting it as a large one would cost more than a quarter.
const SMALL_SPACE: &str = r#"(
    gpu: ["h100-llama3-8b", "h200-llama3-8b", "a100-llama3-8b"],
    set: [("workload.Conversations.conversations", ["800"])],
    workers: [1, 2, 3, 4, 5, 6],
    device_blocks: [500, 1000, 2000, 4000],
)"#;

#[test]
fn a_small_space_costs_at_most_a_quarter_of_its_points_too() {
    plan_against_sweep(
        SMALL_SPACE,
        72,
        &[
            "ttft_p99_ms=500,tpot_p99_ms=40",
            "ttft_p99_ms=300,tpot_p99_ms=12",
            "ttft_p99_ms=450,tpot_p99_ms=15",
            "ttft_p99_ms=100,tpot_p99_ms=8",
        ],
    );
}

/// Sweeps `space` (`points` runs, all valid) as the README does (`sweep --space`), then
/// for each SLO: `plan`'s search chooses what `plan --from-sweep` (the exhaustive
/// optimum) chooses, with at most a quarter of the simulations, and not the space's
/// cheapest point (the search had to find it).
fn plan_against_sweep(space: &str, points: usize, slos: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let space = write(dir.path(), "space.ron", space);
    let file = dir.path().join("sweep.jsonl");
    let out = file.to_str().unwrap();
    common::kvtwin(&["sweep", SCENARIO, "--space", &space, "--out", out]);
    let lines = std::fs::read_to_string(&file).unwrap().lines().count();
    assert_eq!(lines, points, "the sweep runs every point");

    for slo in slos {
        let plan = ["plan", SCENARIO, "--space", &space, "--slo", slo];
        let exhaustive: Value = serde_json::from_str(&common::kvtwin(
            &[
                &plan[..],
                &["--json", "--from-sweep", file.to_str().unwrap()],
            ]
            .concat(),
        ))
        .unwrap();
        let searched: Value =
            serde_json::from_str(&common::kvtwin(&[&plan[..], &["--json"]].concat())).unwrap();
        let chosen = &searched["chosen"];
        assert!(chosen.is_object(), "{slo}: {searched}");
        assert_eq!(chosen["sets"], exhaustive["chosen"]["sets"], "{slo}");
        assert_eq!(chosen["usd_per_hour"], exhaustive["chosen"]["usd_per_hour"]);
        let simulations = searched["search"]["simulations"].as_u64().unwrap();
        eprintln!(
            "{slo}: kvtwin plan ran {simulations} simulations ({} screens) where the sweep ran \
             {lines}; optimum {}",
            searched["search"]["screens"], chosen["sets"]
        );
        assert!(
            simulations * 4 <= lines as u64,
            "{slo}: {simulations} simulations"
        );
        assert!(
            chosen["replicas"] != 1 || chosen["device_blocks"] != 500,
            "{slo}: {chosen}"
        );
    }
}

/// Two workers taking turns on 200 of the cluster scenario's conversations, with no
/// shared tier or one of 4,000 or 16,000 blocks (34 or 134 GB at the scenario's price):
/// round robin sends each conversation's turns and each system prompt to every worker,
/// so the store serves what the other worker computed.
const SHARED_SPACE: &str = r#"(
    routing: [RoundRobin],
    set: [
        ("workload.Conversations.conversations", ["200"]),
        ("cluster.workers", ["2"]),
    ],
    shared_blocks: [0, 4000, 16000],
)"#;

#[test]
fn the_plan_chooses_the_smallest_shared_tier_that_meets_the_slo() {
    let dir = tempfile::tempdir().unwrap();
    let space = write(dir.path(), "shared.ron", SHARED_SPACE);
    let plan = |slo: &str| -> Value {
        let out = common::kvtwin(&["plan", SCENARIO, "--space", &space, "--slo", slo, "--json"]);
        serde_json::from_str(&out).unwrap()
    };
    // The store's price is in the cost: of two sizes that meet the SLO, the smaller.
    let mut costs = Vec::new();
    for (slo, blocks) in [
        ("ttft_p99_ms=70", 0),
        ("ttft_p99_ms=52", 4_000),
        ("ttft_p99_ms=42", 16_000),
    ] {
        let outcome = plan(slo);
        let chosen = &outcome["chosen"];
        assert!(chosen.is_object(), "{slo}: {outcome}");
        let sets = chosen["sets"].to_string();
        assert!(
            sets.contains(&format!("cluster.shared_tier.capacity_blocks={blocks}\"")),
            "{slo}: chose {sets}"
        );
        let gb = chosen["shared_gb"].as_f64().unwrap();
        assert!(
            (gb - blocks as f64 * 8_388_608.0 / 1e9).abs() < 0.1,
            "{chosen}"
        );
        assert_eq!(chosen["hit_shared"].as_f64().unwrap() > 0.0, blocks > 0);
        costs.push(chosen["usd_per_hour"].as_f64().unwrap());
    }
    // 2 H100 workers and their host DRAM, plus 34 and 134 GB at 2.628 $/GB-month.
    assert!(costs[0] < costs[1] && costs[1] < costs[2], "{costs:?}");
    assert!(
        (costs[2] - costs[0] - 134.2 * 2.628 / 730.0).abs() < 0.01,
        "{costs:?}"
    );
    let text = common::kvtwin(&[
        "plan",
        SCENARIO,
        "--space",
        &space,
        "--slo",
        "ttft_p99_ms=42",
    ]);
    assert!(
        text.contains("shared tier: 16000 blocks (134.2 GB)"),
        "{text}"
    );
}

#[test]
fn an_slo_nothing_meets_names_the_constraint_that_fails_and_by_how_much() {
    let dir = tempfile::tempdir().unwrap();
    let space = write(
        dir.path(),
        "space.ron",
        r#"(set: [("workload.Conversations.conversations", ["40"])], workers: [1, 2])"#,
    );
    let (ok, stdout, stderr) = run(&[
        "plan",
        SCENARIO,
        "--space",
        &space,
        "--slo",
        "ttft_p99_ms=1,tpot_p99_ms=1000",
    ]);
    assert!(!ok);
    assert!(stdout.contains("no point meets the SLO"), "{stdout}");
    assert!(
        stdout.contains("ttft_p99_ms") && stdout.contains("FAILS, over by"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 workers"),
        "the closest has the most workers: {stdout}"
    );
    assert!(
        stderr.contains("no point of the space meets the SLO"),
        "{stderr}"
    );
}

#[test]
fn bad_input_names_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.ron", r#"(workers: [1, 2])"#);
    let fails = |args: &[&str], needles: &[&str]| {
        let (ok, _, stderr) = run(&[&["plan", SCENARIO][..], args].concat());
        assert!(!ok, "{args:?} succeeded");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{args:?}: no {needle:?} in {stderr}"
            );
        }
    };
    let unknown_path = write(
        dir.path(),
        "path.ron",
        r#"(set: [("cluster.wrokers", ["1"])])"#,
    );
    fails(
        &["--space", &unknown_path, "--slo", SLO],
        &["path.ron", "set[0]", "cluster.wrokers", "no such field"],
    );
    let unknown_field = write(dir.path(), "field.ron", r#"(wrokers: [1])"#);
    fails(
        &["--space", &unknown_field, "--slo", SLO],
        &["field.ron:1:", "wrokers"],
    );
    let zero = write(dir.path(), "zero.ron", r#"(host_blocks: [0, 100])"#);
    fails(
        &["--space", &zero, "--slo", SLO],
        &["host_blocks", "at least 1"],
    );
    let gpu = write(dir.path(), "gpu.ron", r#"(gpu: ["tpu-v9-llama"])"#);
    fails(
        &["--space", &gpu, "--slo", SLO],
        &["gpu", "tpu-v9-llama", "h100-llama3-8b"],
    );
    fails(
        &["--space", &good, "--slo", "itl_p99_ms=5"],
        &["itl_p99_ms", "no such metric", "tpot_p99_ms"],
    );
    fails(&["--space", &good, "--slo", "ttft_p99_ms"], &["METRIC=MS"]);
    let prices = write(
        dir.path(),
        "prices.ron",
        "(gpu_usd_per_hour: {\"h100-sxm\": \"cheap\"}, dram_usd_per_gb_hour: 0.1, ssd_usd_per_gb_hour: 0.1)",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--prices", &prices],
        &["prices.ron:1:"],
    );
    let no_h100 = write(
        dir.path(),
        "no-h100.ron",
        "(gpu_usd_per_hour: {\"h200\": 3.0}, dram_usd_per_gb_hour: 0.1, ssd_usd_per_gb_hour: 0.1)",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--prices", &no_h100],
        &["no-h100.ron", "no price for GPU \"h100-sxm\"", "h200"],
    );
    let sweep = write(
        dir.path(),
        "other.jsonl",
        "{\"run\":0,\"runs\":1,\"overrides\":{\"cluster.workers\":7},\"seed\":1,\"error\":\"x\"}\n",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--from-sweep", &sweep],
        &["other.jsonl:1", "no point of the space"],
    );
}

#[test]
fn the_shipped_design_space_fits_its_scenario() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/conversation-trace.ron"
    );
    let space = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plans/conversation-space.ron"
    );
    let prices = concat!(env!("CARGO_MANIFEST_DIR"), "/../plans/prices.ron");
    let grid = common::kvtwin(&[
        "plan",
        scenario,
        "--space",
        space,
        "--prices",
        prices,
        "--slo",
        SLO,
        "--print-grid",
    ]);
    assert_eq!(grid.matches("--grid").count(), 4, "{grid}");
    assert!(
        grid.contains("cluster.workers=4,6,8,10,12,16,20,24"),
        "{grid}"
    );
}

#[test]
fn plan_and_sweep_draw_their_plots_as_svg_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let space = write(
        dir.path(),
        "space.ron",
        r#"(set: [("workload.Conversations.conversations", ["40"])], workers: [1, 2], host_blocks: [1000, 2000])"#,
    );
    let plots = dir.path().join("plan");
    common::kvtwin(&[
        "plan",
        SCENARIO,
        "--space",
        &space,
        "--slo",
        "ttft_p99_ms=5000",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    let sweep = dir.path().join("sweep");
    common::kvtwin(&[
        "sweep",
        SCENARIO,
        "--grid",
        "cluster.workers=1,2",
        "--grid",
        "workload.Conversations.conversations=40",
        "--out",
        dir.path().join("s.jsonl").to_str().unwrap(),
        "--plot",
        sweep.to_str().unwrap(),
    ]);
    let expected: [(&Path, &[&str]); 2] = [
        (
            &plots,
            &[
                "pareto-cost-ttft_p99_ms",
                "pareto-throughput",
                "cdf-ttft",
                "cdf-tpot",
                "occupancy",
            ],
        ),
        (
            &sweep,
            &["ttft-p99", "tpot-p99", "hit-ratio", "cdf-ttft", "cdf-tpot"],
        ),
    ];
    for (folder, stems) in expected {
        for stem in stems {
            let png = std::fs::read(folder.join(format!("{stem}.png"))).unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{stem}.png");
            let svg = std::fs::read_to_string(folder.join(format!("{stem}.svg"))).unwrap();
            assert!(
                svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
                "{stem}.svg"
            );
            assert!(svg.contains("<text"), "{stem}.svg has no labels");
        }
    }
}
