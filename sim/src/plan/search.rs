//! The planner's search: the cheapest point of a space that meets an SLO, found with far
//! fewer runs than the space has points.
//!
//! Owns: [`search`] over [`Points`] with any [`Evaluate`] (the simulator, or a table in
//! tests), and its [`Outcome`]: the optimum, every run it made, and what it skipped.
//! Never: run a simulation itself or print.
//!
//! The search rests on the model's monotonicity: within a category (the non-monotone
//! dimensions fixed), more workers or more blocks in any tier never makes a latency
//! worse, so a point that meets the SLO makes every point above it meet it, and one that
//! fails makes every point below it fail. Cost grows along the same dimensions. Then:
//! 1. Fewest workers: per category, bisect workers at the largest cache for the fewest
//!    that meet the SLO (the point there meets, the one below fails, both on the full
//!    workload; a long line is screened on a prefix of the workload first, and only the
//!    guess and the walk to the true boundary run in full). Only the levels that could
//!    still beat the best found are searched, and with a best to beat the top of the line
//!    runs first: a category that cannot beat it costs one run.
//! 2. From that many workers up, category by category (the one whose cheapest
//!    undecided point is cheapest first), while a level's cheapest point could still beat
//!    the best found: for each setting of the other cache dimensions (cheapest first),
//!    bisect the last cache dimension for the smallest that meets the SLO, over the points
//!    cheaper than the best so far only. A point already implied by an earlier run (above
//!    a pass, below a failure) is not run again.
//!
//! 3. Check: the points one level below the optimum on each monotone dimension, where
//!    only implied, are run; if one meets the SLO the premise broke there, it becomes the
//!    optimum and its own neighbours are checked.
//!
//! Only full runs decide; screening only says where to start. So with a monotone model
//! the result is the exhaustive sweep's optimum (the least [`PlanPoint::key`] among the
//! points that meet the SLO), which the tests check against a brute force.

use super::slo::{Slo, Verdict};
use super::space::{PlanPoint, Points};
use super::summary::RunSummary;
use std::collections::BTreeMap;

/// Runs a point: on the whole workload (`fraction` 1) or on its first `fraction`.
pub trait Evaluate {
    /// Why a run failed.
    type Error;
    /// The summary of `point`'s run.
    fn evaluate(&mut self, point: &PlanPoint, fraction: f64) -> Result<RunSummary, Self::Error>;
}

impl<E: Evaluate> Evaluate for &mut E {
    type Error = E::Error;
    fn evaluate(&mut self, point: &PlanPoint, fraction: f64) -> Result<RunSummary, Self::Error> {
        (**self).evaluate(point, fraction)
    }
}

/// Worker levels below which screening costs more simulations than it saves: bisecting
/// `n` levels on full runs takes about log2(n) + 1 of them, screening log2(n) screens
/// and at least two full runs.
const MIN_SCREENED_LEVELS: usize = 8;

/// One full run the search made.
#[derive(Clone, Debug)]
pub struct Run {
    /// Its summary.
    pub summary: RunSummary,
    /// The SLO judged on it.
    pub verdict: Verdict,
}

/// What the search found and did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The optimum (a point index), or `None` when no point meets the SLO.
    pub chosen: Option<usize>,
    /// Every full run, by point index.
    pub runs: BTreeMap<usize, Run>,
    /// Screening runs (on the prefix), by point index.
    pub screens: BTreeMap<usize, RunSummary>,
    /// Of the full runs, those that checked the optimum's neighbours (see
    /// [`search`]'s step 3).
    pub checks: usize,
    /// Valid points decided without a run, by monotonicity.
    pub inferred: usize,
    /// Valid points never decided: dearer than the optimum.
    pub pruned: usize,
    /// Points that are not valid configurations.
    pub invalid: usize,
    /// Pairs of runs (lower, higher) that break the search's premise: `lower` has at most
    /// `higher`'s workers and blocks, yet meets the SLO where `higher` fails. Where there
    /// are any, the model is not monotone in this space and a point the search ruled out
    /// by implication may meet the SLO: check with an exhaustive sweep.
    pub violations: Vec<(usize, usize)>,
}

impl Outcome {
    /// Finds the [`Outcome::violations`] among the runs made.
    fn find_violations(&mut self, points: &Points) {
        self.violations.clear();
        for (&low, low_run) in &self.runs {
            if !low_run.verdict.holds() {
                continue;
            }
            for (&high, high_run) in &self.runs {
                if low != high
                    && !high_run.verdict.holds()
                    && points.points[low].below(&points.points[high])
                {
                    self.violations.push((low, high));
                }
            }
        }
    }

    /// The full run nearest to meeting the SLO when none does: the one whose worst
    /// bound is exceeded by the smallest share (fewest unserved requests first).
    pub fn closest(&self) -> Option<usize> {
        self.runs
            .iter()
            .min_by(|(_, a), (_, b)| {
                a.verdict.unserved.cmp(&b.verdict.unserved).then(
                    b.verdict
                        .binding()
                        .margin()
                        .total_cmp(&a.verdict.binding().margin()),
                )
            })
            .map(|(i, _)| *i)
    }
}

/// What the search knows about one point.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Known {
    Meets,
    Fails,
}

struct State<'p, E: Evaluate> {
    points: &'p Points,
    slo: &'p Slo,
    evaluate: E,
    screen_fraction: f64,
    /// Full-run results per category: (point index, result).
    known: Vec<Vec<(usize, Known)>>,
    /// [`free_dimensions`] of the space.
    free: [bool; 4],
    best: Option<usize>,
    outcome: Outcome,
}

impl<E: Evaluate> State<'_, E> {
    fn point(&self, index: usize) -> &PlanPoint {
        &self.points.points[index]
    }

    /// What monotonicity implies about `index` from the runs so far.
    fn implied(&self, index: usize) -> Option<Known> {
        let p = self.point(index);
        self.known[p.category].iter().find_map(|(other, known)| {
            let q = self.point(*other);
            match known {
                Known::Meets if q.below(p) => Some(Known::Meets),
                Known::Fails if p.below(q) => Some(Known::Fails),
                _ => None,
            }
        })
    }

    /// Whether `index` meets the SLO on the full workload: implied, or run.
    fn decide(&mut self, index: usize) -> Result<bool, E::Error> {
        if let Some(known) = self.implied(index) {
            return Ok(known == Known::Meets);
        }
        self.run(index)
    }

    /// Runs `index` on the full workload, whatever is implied; whether it meets the SLO.
    fn run(&mut self, index: usize) -> Result<bool, E::Error> {
        let points = self.points;
        let summary = self.evaluate.evaluate(&points.points[index], 1.0)?;
        let verdict = self.slo.judge(&summary);
        let meets = verdict.holds();
        let category = self.point(index).category;
        self.known[category].push((index, if meets { Known::Meets } else { Known::Fails }));
        self.outcome.runs.insert(index, Run { summary, verdict });
        if meets
            && self
                .best
                .is_none_or(|b| self.point(index).before(self.point(b)))
        {
            self.best = Some(index);
        }
        Ok(meets)
    }

    /// Whether `index` could still beat the best found.
    fn affordable(&self, index: usize) -> bool {
        self.best
            .is_none_or(|b| self.point(index).before(self.point(b)))
    }

    /// Runs the points one level below the best on each monotone dimension that were
    /// ruled out by implication only: if the premise holds they fail, and the best stands
    /// confirmed by runs on every side; if one meets, the premise broke, it becomes the
    /// best and its own neighbours are checked in turn.
    fn check_neighbours(&mut self) -> Result<(), E::Error> {
        let mut checked = Vec::new();
        while let Some(best) = self.best {
            if checked.contains(&best) {
                break;
            }
            checked.push(best);
            let p = self.point(best).clone();
            for dim in 0..4 {
                if p.levels[dim] == 0 {
                    continue;
                }
                let mut levels = p.levels;
                levels[dim] -= 1;
                let Some(below) = self.valid(p.category, levels) else {
                    continue;
                };
                if !self.outcome.runs.contains_key(&below) {
                    self.outcome.checks += 1;
                    self.run(below)?;
                }
            }
        }
        Ok(())
    }

    /// Runs, per category, the cheapest point of the most workers that could still beat
    /// the best, where no run at that level decided it: the premise's weakest spot. More
    /// device blocks are free and admit bigger decode batches, so a point with fewer of
    /// them can meet a TPOT bound that the level's largest cache, run in step 1, fails;
    /// then every point of the level was ruled out wrongly. If the probe meets the SLO it
    /// becomes the best, and its neighbours are checked in turn.
    fn probe_levels(&mut self) -> Result<(), E::Error> {
        for category in 0..self.points.categories.len() {
            let Some(w) = (0..self.points.levels[0])
                .rev()
                .find(|w| self.level_affordable(category, *w))
            else {
                continue;
            };
            let cheapest = cheapest(
                self.points,
                (0..self.points.points.len()).filter(|i| {
                    let p = self.point(*i);
                    p.category == category
                        && p.levels[0] == w
                        && p.invalid.is_none()
                        && self.affordable(*i)
                }),
            );
            if let Some(index) = cheapest {
                if !self.outcome.runs.contains_key(&index) && self.failed_only_with_more_free(index)
                {
                    self.outcome.checks += 1;
                    self.run(index)?;
                }
            }
        }
        Ok(())
    }

    /// Whether every run that rules `index` out has more of some free dimension (one
    /// that does not change the price, as device blocks) than it: then only the premise
    /// on those dimensions says it fails.
    fn failed_only_with_more_free(&self, index: usize) -> bool {
        let p = self.point(index);
        self.known[p.category].iter().all(|(other, known)| {
            let q = self.point(*other);
            *known == Known::Meets
                || !p.below(q)
                || (1..4).any(|d| self.free[d] && q.levels[d] > p.levels[d])
        })
    }

    /// The index of the point of `category` at `levels`, if it is a valid one.
    fn valid(&self, category: usize, levels: [usize; 4]) -> Option<usize> {
        let p = self.points.at(category, levels);
        p.invalid
            .is_none()
            .then(|| self.points.index(category, levels))
    }

    /// Finds the lowest worker level whose largest-cache point meets the SLO, among the
    /// levels whose cheapest point could still beat the best found, so that every level
    /// below is known to fail at once (and the point found is a best to beat). The
    /// largest cache is the most of each cache dimension any valid point of the category
    /// has; levels where that point is not valid are left to the rest of the search.
    ///
    /// A long line is screened first (bisected on the prefix of the workload, then the
    /// guess confirmed on all of it, walking to the boundary); a short one is bisected on
    /// full runs, which is exact with fewer runs in all than screens and a walk. With a
    /// best to beat, the top of the line runs first: a category that cannot beat it is
    /// then settled by that one run.
    fn fewest_workers(&mut self, category: usize) -> Result<(), E::Error> {
        let mut top = [0; 4];
        for p in &self.points.points {
            if p.category == category && p.invalid.is_none() {
                for (top, level) in top.iter_mut().zip(p.levels).skip(1) {
                    *top = (*top).max(level);
                }
            }
        }
        let line: Vec<usize> = (0..self.points.levels[0])
            .filter(|w| self.level_affordable(category, *w))
            .filter_map(|w| self.valid(category, [w, top[1], top[2], top[3]]))
            .collect();
        let Some(&highest) = line.last() else {
            return Ok(());
        };
        if self.best.is_some() && !self.decide(highest)? {
            return Ok(());
        }
        if self.screen_fraction < 1.0 && line.len() >= MIN_SCREENED_LEVELS {
            return self.screen_then_walk(&line);
        }
        self.bisect(&line, line.len())?;
        Ok(())
    }

    /// Bisects `line` (points in increasing order) on full runs for the first that meets
    /// the SLO, knowing that none before `hi` has been shown to (`line.len()`: none may);
    /// its position, `hi` when none before it does.
    fn bisect(&mut self, line: &[usize], hi: usize) -> Result<usize, E::Error> {
        let (mut lo, mut hi) = (0, hi);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.decide(line[mid])? {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok(lo)
    }

    /// [`State::fewest_workers`] on a long `line`: bisect on the prefix for the first
    /// level that meets the SLO, then confirm on the full workload, walking from that
    /// guess to the boundary (the point there meets the SLO, the one below does not).
    fn screen_then_walk(&mut self, line: &[usize]) -> Result<(), E::Error> {
        let (mut lo, mut hi) = (0, line.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let points = self.points;
            let summary = self
                .evaluate
                .evaluate(&points.points[line[mid]], self.screen_fraction)?;
            let meets = self.slo.judge(&summary).holds();
            self.outcome.screens.insert(line[mid], summary);
            if meets {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut at = lo.min(line.len() - 1);
        if self.decide(line[at])? {
            while at > 0 && self.decide(line[at - 1])? {
                at -= 1;
            }
        } else {
            at += 1;
            while at < line.len() && !self.decide(line[at])? {
                at += 1;
            }
        }
        Ok(())
    }

    /// Whether any valid point of `category` at worker level `w` could still beat the
    /// best found.
    fn level_affordable(&self, category: usize, w: usize) -> bool {
        self.points.points.iter().enumerate().any(|(i, p)| {
            p.category == category && p.levels[0] == w && p.invalid.is_none() && self.affordable(i)
        })
    }

    /// The cheapest valid point of `category` not yet known to fail, if any: what the
    /// category's optimum costs at least.
    fn lower_bound(&self, category: usize) -> Option<usize> {
        cheapest(
            self.points,
            (0..self.points.points.len()).filter(|i| {
                let p = self.point(*i);
                p.category == category
                    && p.invalid.is_none()
                    && self.implied(*i) != Some(Known::Fails)
            }),
        )
    }

    /// At worker level `w`: for each setting of the outer cache dimensions, bisect the
    /// innermost varied one among the points that could still beat the best.
    fn cheapest_at(&mut self, category: usize, w: usize) -> Result<(), E::Error> {
        let [_, nd, nh, nk] = self.points.levels;
        // The innermost cache dimension the space varies is bisected; the others are
        // enumerated (all are 1 level when not varied).
        let inner = if nk > 1 {
            3
        } else if nh > 1 {
            2
        } else {
            1
        };
        let mut outer: Vec<[usize; 4]> = Vec::new();
        for d in 0..nd {
            for h in 0..nh {
                for k in 0..nk {
                    let mut levels = [w, d, h, k];
                    levels[inner] = 0;
                    if !outer.contains(&levels) {
                        outer.push(levels);
                    }
                }
            }
        }
        // Cheapest first, so that the best found early prunes the rest.
        outer.sort_by(|a, b| {
            let (pa, pb) = (self.points.at(category, *a), self.points.at(category, *b));
            pa.key().0.total_cmp(&pb.key().0).then(a.cmp(b))
        });
        for base in outer {
            let line: Vec<usize> = (0..self.points.levels[inner])
                .filter_map(|level| {
                    let mut levels = base;
                    levels[inner] = level;
                    self.valid(category, levels)
                })
                .filter(|i| self.affordable(*i))
                .collect();
            if line.is_empty() || !self.decide(*line.last().expect("not empty"))? {
                continue;
            }
            // The last point meets the SLO: bisect for the first that does.
            self.bisect(&line, line.len() - 1)?;
        }
        Ok(())
    }
}

/// The cheapest point of `points` meeting `slo` (see the module doc), running points
/// through `evaluate`; screening runs use the first `screen_fraction` of the workload
/// (1: no screening).
pub fn search<E: Evaluate>(
    points: &Points,
    slo: &Slo,
    evaluate: E,
    screen_fraction: f64,
) -> Result<Outcome, E::Error> {
    let mut state = State {
        points,
        slo,
        evaluate,
        screen_fraction,
        known: vec![Vec::new(); points.categories.len()],
        free: free_dimensions(points),
        best: None,
        outcome: Outcome::default(),
    };
    // 1. Every category's fewest workers, each found point a best for the next to beat.
    for category in 0..points.categories.len() {
        state.fewest_workers(category)?;
    }
    // 2. The categories whose optimum could be cheapest first, so that the best found
    // early leaves the others' dearer points unrun.
    let mut order: Vec<(usize, usize)> = (0..points.categories.len())
        .filter_map(|category| state.lower_bound(category).map(|at| (at, category)))
        .collect();
    order.sort_by(|(a, _), (b, _)| points.points[*a].key_cmp(&points.points[*b]));
    for (_, category) in order {
        // Levels below the fewest workers fail by implication: their lines cost no run.
        for w in 0..points.levels[0] {
            if state.level_affordable(category, w) {
                state.cheapest_at(category, w)?;
            }
        }
    }
    loop {
        let best = state.best;
        state.check_neighbours()?;
        state.probe_levels()?;
        if state.best == best {
            break;
        }
    }
    let mut outcome = std::mem::take(&mut state.outcome);
    outcome.chosen = state.best;
    outcome.find_violations(points);
    for (index, point) in points.points.iter().enumerate() {
        if point.invalid.is_some() {
            outcome.invalid += 1;
        } else if !outcome.runs.contains_key(&index) {
            if state.implied(index).is_some() {
                outcome.inferred += 1;
            } else {
                outcome.pruned += 1;
            }
        }
    }
    Ok(outcome)
}

/// The optimum of runs already made for every valid point (an exhaustive sweep read
/// back): the least [`PlanPoint::key`] among the runs that meet `slo`. Points without a
/// run are counted as pruned.
pub fn exhaustive(points: &Points, slo: &Slo, summaries: BTreeMap<usize, RunSummary>) -> Outcome {
    let mut outcome = Outcome::default();
    for (index, summary) in summaries {
        let verdict = slo.judge(&summary);
        outcome.runs.insert(index, Run { summary, verdict });
    }
    for (index, point) in points.points.iter().enumerate() {
        if point.invalid.is_some() {
            outcome.invalid += 1;
            outcome.runs.remove(&index);
        } else if !outcome.runs.contains_key(&index) {
            outcome.pruned += 1;
        }
    }
    outcome.find_violations(points);
    outcome.chosen = cheapest(
        points,
        outcome
            .runs
            .iter()
            .filter(|(_, run)| run.verdict.holds())
            .map(|(index, _)| *index),
    );
    outcome
}

/// The cache dimensions of `points` whose levels do not change a point's price (device
/// blocks: the GPU is paid for).
fn free_dimensions(points: &Points) -> [bool; 4] {
    let mut free = [false, true, true, true];
    for p in &points.points {
        for (d, free) in free.iter_mut().enumerate().skip(1) {
            if *free && p.levels[d] > 0 && p.invalid.is_none() {
                let mut levels = p.levels;
                levels[d] -= 1;
                let q = points.at(p.category, levels);
                *free = q.invalid.is_some() || q.usd_per_hour == p.usd_per_hour;
            }
        }
    }
    free
}

/// The point of `indices` least in [`PlanPoint::key`] order, if any.
fn cheapest(points: &Points, indices: impl Iterator<Item = usize>) -> Option<usize> {
    indices.min_by(|a, b| points.points[*a].key_cmp(&points.points[*b]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Percentiles;
    use crate::plan::prices::GpuShape;
    use crate::plan::space::Shape;
    use proptest::prelude::*;

    /// A monotone model: latency falls with every level, scaled per category.
    #[derive(Clone, Debug)]
    struct Model {
        /// Per category: base latency and per-dimension gains.
        categories: Vec<(f64, [f64; 4])>,
        /// Screening runs are off by this factor (a prefix is not the whole).
        screen_error: f64,
    }

    impl Model {
        fn latency(&self, p: &PlanPoint) -> f64 {
            let (base, gain) = self.categories[p.category];
            let speed: f64 = (0..4).map(|d| 1.0 + gain[d] * p.levels[d] as f64).product();
            base / speed
        }
    }

    struct Table<'m> {
        model: &'m Model,
        full: usize,
    }

    impl Evaluate for Table<'_> {
        type Error = std::convert::Infallible;
        fn evaluate(
            &mut self,
            point: &PlanPoint,
            fraction: f64,
        ) -> Result<RunSummary, Self::Error> {
            assert!(point.invalid.is_none(), "an invalid point was run");
            let mut latency = self.model.latency(point);
            if fraction < 1.0 {
                latency *= self.model.screen_error;
            } else {
                self.full += 1;
            }
            Ok(summary(latency))
        }
    }

    fn summary(ttft_p99_ms: f64) -> RunSummary {
        RunSummary {
            workers: 1,
            requests: 1,
            completed: 1,
            ttft: Percentiles {
                p99_ms: ttft_p99_ms,
                ..Percentiles::default()
            },
            ..RunSummary::default()
        }
    }

    /// A space of `categories` × `levels`, priced per worker by category (GPU) plus
    /// `memory` per host and disk level; `invalid` marks points by index.
    fn space(
        gpu_prices: &[f64],
        levels: [usize; 4],
        memory: [f64; 2],
        invalid: &[usize],
    ) -> Points {
        let mut points = Vec::new();
        for (category, gpu) in gpu_prices.iter().enumerate() {
            for w in 0..levels[0] {
                for d in 0..levels[1] {
                    for h in 0..levels[2] {
                        for k in 0..levels[3] {
                            let workers = w + 1;
                            let usd_per_hour = workers as f64
                                * (gpu + memory[0] * h as f64 + memory[1] * k as f64);
                            let index = points.len();
                            points.push(PlanPoint {
                                category,
                                levels: [w, d, h, k],
                                sets: Vec::new(),
                                shape: Shape {
                                    workers,
                                    prefill_workers: 0,
                                    gpu: GpuShape {
                                        name: "g".into(),
                                        count: 1,
                                        weight_bytes: 0,
                                    },
                                    blocks: [d, h, k, 0],
                                    bytes_per_block: 1,
                                    shared_blocks: 0,
                                    shared_usd_per_gb_month: 0.0,
                                },
                                usd_per_hour,
                                invalid: invalid.contains(&index).then(|| "no".to_string()),
                            });
                        }
                    }
                }
            }
        }
        Points {
            category_axes: Vec::new(),
            monotone_axes: Vec::new(),
            categories: gpu_prices.iter().map(|p| p.to_string()).collect(),
            levels,
            points,
        }
    }

    /// The exhaustive answer: the least key among valid points that meet the bound.
    fn brute_force(points: &Points, model: &Model, bound: f64) -> Option<usize> {
        (0..points.points.len())
            .filter(|i| {
                let p = &points.points[*i];
                p.invalid.is_none() && model.latency(p) <= bound
            })
            .reduce(|a, b| {
                if points.points[b].before(&points.points[a]) {
                    b
                } else {
                    a
                }
            })
    }

    proptest! {
        #[test]
        fn the_search_finds_the_exhaustive_optimum(
            gpu_prices in proptest::collection::vec(0.5f64..4.0, 1..4),
            levels in (1usize..7, 1usize..4, 1usize..6, 1usize..3),
            memory in (0.0f64..0.6, 0.0f64..0.2),
            bases in proptest::collection::vec((50.0f64..800.0, 0.0f64..1.0, 0.0f64..0.5, 0.0f64..0.8, 0.0f64..0.4), 3),
            screen_error in 0.5f64..2.0,
            bound in 20.0f64..300.0,
            invalid in proptest::collection::vec(0usize..500, 0..20),
        ) {
            let levels = [levels.0, levels.1, levels.2, levels.3];
            let points = space(&gpu_prices, levels, [memory.0, memory.1], &invalid);
            let model = Model {
                categories: bases.iter().map(|b| (b.0, [b.1, b.2, b.3, b.4])).collect(),
                screen_error,
            };
            let slo = Slo::parse(&format!("ttft_p99_ms={bound}")).unwrap();
            let table = Table { model: &model, full: 0 };
            let outcome = search(&points, &slo, table, 0.25).unwrap();
            prop_assert_eq!(outcome.chosen, brute_force(&points, &model, bound));
            let valid = points.points.iter().filter(|p| p.invalid.is_none()).count();
            prop_assert_eq!(outcome.runs.len() + outcome.inferred + outcome.pruned, valid);
            if outcome.chosen.is_none() {
                prop_assert!(outcome.closest().is_some() || outcome.runs.is_empty());
            }
        }
    }

    #[test]
    fn runs_that_break_monotonicity_are_reported() {
        // Latency grows with workers (cache locality lost): the premise is false.
        let points = space(&[1.0], [4, 1, 1, 1], [0.0, 0.0], &[]);
        let model = Model {
            categories: vec![(50.0, [-0.2, 0.0, 0.0, 0.0])],
            screen_error: 1.0,
        };
        let slo = Slo::parse("ttft_p99_ms=55").unwrap();
        let all: BTreeMap<usize, RunSummary> = (0..points.points.len())
            .map(|i| {
                let mut table = Table {
                    model: &model,
                    full: 0,
                };
                (i, table.evaluate(&points.points[i], 1.0).unwrap())
            })
            .collect();
        let exhaustive = exhaustive(&points, &slo, all);
        // One worker meets the SLO, more fail: every (1, more) pair is reported.
        assert_eq!(exhaustive.chosen, Some(0));
        assert_eq!(exhaustive.violations, vec![(0, 1), (0, 2), (0, 3)]);
        // The search trusts the premise, so here it may miss the optimum; what it shows
        // of the breach depends on the runs it made, and is reported the same way.
        let searched = search(
            &points,
            &slo,
            Table {
                model: &model,
                full: 0,
            },
            1.0,
        )
        .unwrap();
        for (low, high) in &searched.violations {
            assert!(searched.runs[low].verdict.holds() && !searched.runs[high].verdict.holds());
        }
    }

    /// The simulations (full runs and screens) a search of `points` under `bound` makes,
    /// after checking its answer against the brute force.
    fn simulations(points: &Points, model: &Model, bound: f64) -> usize {
        let slo = Slo::parse(&format!("ttft_p99_ms={bound}")).unwrap();
        let table = Table { model, full: 0 };
        let outcome = search(points, &slo, table, 0.25).unwrap();
        assert_eq!(
            outcome.chosen,
            brute_force(points, model, bound),
            "bound {bound}"
        );
        outcome.runs.len() + outcome.screens.len()
    }

    #[test]
    fn a_small_space_needs_at_most_a_quarter_of_its_valid_points() {
        // 3 GPUs (H100, H200, A100 prices) × 6 worker counts × 4 device sizes = 72
        // points, the largest device size not fitting on two of them: 60 valid, as the
        // issue's example. Device blocks cost nothing (the GPU is paid for), so at each
        // worker count the search wants the fewest that meet the SLO.
        let levels = [6, 4, 1, 1];
        let per_category = 24;
        let invalid: Vec<usize> = [0, 2]
            .iter()
            .flat_map(|c| (0..6).map(move |w| c * per_category + w * 4 + 3))
            .collect();
        let points = space(&[2.99, 3.79, 1.79], levels, [0.0, 0.0], &invalid);
        let valid = points.points.len() - invalid.len();
        assert_eq!(valid, 60);
        // The GPUs as fast as they are dear (any of them may win), one much slower, or
        // cache worth more than workers: and SLOs from met by a single worker to met
        // by none.
        let models = [
            [(900.0, 0.6, 0.5), (700.0, 0.6, 0.5), (1500.0, 0.6, 0.5)],
            [(900.0, 0.9, 0.1), (500.0, 0.9, 0.1), (3000.0, 0.5, 0.1)],
            [(600.0, 0.2, 1.2), (600.0, 0.3, 1.0), (900.0, 0.2, 1.5)],
        ];
        let mut worst = 0;
        for categories in models {
            let model = Model {
                categories: categories
                    .iter()
                    .map(|(base, w, d)| (*base, [*w, *d, 0.0, 0.0]))
                    .collect(),
                screen_error: 1.0,
            };
            for bound in (1..=60).map(|i| i as f64 * 25.0) {
                let made = simulations(&points, &model, bound);
                assert!(
                    made * 4 <= valid,
                    "bound {bound}: {made} simulations of {valid}"
                );
                worst = worst.max(made);
            }
        }
        eprintln!("at most {worst} simulations of {valid} valid points");
        // The host tier priced too: 2 GPUs × 4 workers × 2 device × 3 host sizes = 48.
        let points = space(&[2.99, 1.79], [4, 2, 3, 1], [0.4, 0.0], &[]);
        let model = Model {
            categories: vec![
                (800.0, [0.7, 0.3, 0.4, 0.0]),
                (1200.0, [0.7, 0.3, 0.4, 0.0]),
            ],
            screen_error: 1.0,
        };
        for bound in (1..=40).map(|i| i as f64 * 25.0) {
            let made = simulations(&points, &model, bound);
            assert!(made * 4 <= 48, "bound {bound}: {made} simulations of 48");
        }
    }

    #[test]
    fn a_realistic_space_needs_a_fraction_of_its_points() {
        // 2 GPUs × 5 worker counts × 4 device × 5 host sizes = 200 points; GPUs cost far
        // more than DRAM, as they do.
        let points = space(&[2.99, 3.79], [5, 4, 5, 1], [0.05, 0.0], &[]);
        let model = Model {
            categories: vec![
                (900.0, [0.9, 0.15, 0.3, 0.0]),
                (700.0, [0.9, 0.15, 0.3, 0.0]),
            ],
            screen_error: 1.1,
        };
        let slo = Slo::parse("ttft_p99_ms=150").unwrap();
        let mut table = Table {
            model: &model,
            full: 0,
        };
        let outcome = search(&points, &slo, &mut table, 0.25).unwrap();
        assert_eq!(outcome.chosen, brute_force(&points, &model, 150.0));
        let runs = outcome.runs.len() + outcome.screens.len();
        assert!(runs * 4 <= points.points.len(), "{runs} runs");
        assert_eq!(table.full, outcome.runs.len());
    }
}
