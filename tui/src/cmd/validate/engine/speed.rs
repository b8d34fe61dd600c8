//! `kvtwin validate --engine --speed-check`: the twin of each repeat run at the engines'
//! speed around it. A check (`profile::engine::speed`) before the first repeat and after
//! each gives every engine a factor over its table; the repeat's twin runs on each
//! engine's table at the mean of the two checks around it (`TableModel::at_speed`), and
//! the twin at the profile's own speed is kept beside it, so that the report can say
//! what levelling changed.
//!
//! Owns: the checks' targets and tables, the factors, the levelled config, and the line
//! that reports the errors at the profile's own speed. Never: changes a profile on disk,
//! or levels an engine no check measured.

use super::Engine;
use crate::cmd::profile::engine::speed::{geometric_mean, Speed, SpeedCheck, SpeedPoints};
use crate::cmd::profile::engine::EngineInfo;
use anyhow::{Context, Result};
use kvtwin::ids::WorkerId;
use kvtwin_plane::bench::serve::request::Target;
use kvtwin_plane::bench::serve::ServeConfig;
use kvtwin_plane::service::frontend::engine_client::EngineClient;
use kvtwin_sim::compute::table::TableModel;
use kvtwin_sim::compute::ComputeModel;
use kvtwin_sim::validation::MetricSpread;
use kvtwin_sim::vllm::{TwinClusterConfig, TwinRun};

/// A repeat's speed checks (before and after it, each engine's in the engines' order),
/// each engine's factor over the repeat (`None` where neither check said), and what the
/// twin said at the profile's own speed.
pub(super) struct Levelled {
    pub(super) before: Vec<Speed>,
    pub(super) after: Vec<Speed>,
    pub(super) factors: Vec<Option<f64>>,
    pub(super) at_profile: TwinRun,
}

/// `--speed-check`: the checks, and each engine's table to level by them.
pub(super) struct SpeedLevel {
    check: SpeedCheck,
    /// Each engine, in the engines' order.
    targets: Vec<Target>,
    /// Each engine's table (its own, else the pooled one), in that order.
    tables: Vec<TableModel>,
    workers: Vec<WorkerId>,
}

impl SpeedLevel {
    pub(super) fn new(
        twin: &TwinClusterConfig,
        engines: &[Engine],
        info: &EngineInfo,
        serve: &ServeConfig,
    ) -> Result<SpeedLevel> {
        let table_of = |compute: &ComputeModel| match compute {
            ComputeModel::Table(table) => Some(table.clone()),
            _ => None,
        };
        let needs = "--speed-check: the profile is not a measured table (kvtwin profile --engine writes one)";
        let pooled = table_of(&twin.compute).context(needs)?;
        let workers: Vec<WorkerId> = engines.iter().map(|e| WorkerId::new(e.worker)).collect();
        let tables = workers
            .iter()
            .map(|worker| table_of(twin.engine_compute.get(worker).unwrap_or(&twin.compute)))
            .collect::<Option<Vec<_>>>()
            .context(needs)?;
        let max_kv = info.num_gpu_blocks.saturating_sub(1) * info.block_size;
        let points = SpeedPoints::of(&pooled, max_kv).with_context(|| {
            format!(
                "--speed-check: the profile has no prefill or decode point that fits the engines' {max_kv} KV tokens"
            )
        })?;
        Ok(SpeedLevel {
            check: SpeedCheck::new(points, info.block_size),
            targets: engines
                .iter()
                // Straight to each engine, not through the router: a request pinned
                // there still draws from its seeded tie-break RNG, which the twin's
                // router follows draw for draw. The figures compared are the engine's
                // own clocks either way.
                .map(|engine| Target {
                    url: engine.url.clone(),
                    model: info.model.clone(),
                    stream: true,
                    timeout: serve.timeout,
                    pinned: None,
                })
                .collect(),
            tables,
            workers,
        })
    }

    /// Every engine's speed now, in the engines' order.
    pub(super) async fn check(
        &mut self,
        client: &EngineClient,
        urls: &[String],
    ) -> Result<Vec<Speed>> {
        let tables: Vec<&TableModel> = self.tables.iter().collect();
        self.check
            .run(client, &self.targets, urls, &tables)
            .await
            .context("--speed-check")
    }

    /// Each engine's factor over a repeat: the geometric mean of the checks before and
    /// after it, the one there is where the other said nothing.
    pub(super) fn factors(before: &[Speed], after: &[Speed]) -> Vec<Option<f64>> {
        after
            .iter()
            .enumerate()
            .map(|(i, after)| geometric_mean(before.get(i).and_then(Speed::factor), after.factor()))
            .collect()
    }

    /// `config` with each engine's table at its factor (an engine without one at its
    /// table's own speed).
    pub(super) fn config(
        &self,
        config: &TwinClusterConfig,
        factors: &[Option<f64>],
    ) -> TwinClusterConfig {
        let mut levelled = config.clone();
        for ((worker, table), factor) in self.workers.iter().zip(&self.tables).zip(factors) {
            if let Some(factor) = factor {
                levelled
                    .engine_compute
                    .insert(*worker, ComputeModel::Table(table.at_speed(*factor)));
            }
        }
        levelled
    }
}

/// The timing errors of the twin at the profile's own speed, in a line.
pub(super) fn at_profile_line(summary: &[MetricSpread]) -> String {
    let errors: Vec<String> = [
        "ttft_ms.p50",
        "itl_ms.p50",
        "ttft_ms.p99",
        "itl_ms.p99",
        "output_tokens_per_s",
    ]
    .iter()
    .filter_map(|name| {
        let metric = summary.iter().find(|m| m.name == *name)?;
        Some(format!("{name} {:+.1} %", metric.error_pct))
    })
    .collect();
    format!(
        "the twin at the profile's own speed (not levelled by the speed checks): {}",
        errors.join(", ")
    )
}
