//! Predictors of the next interval's load from the past ones, as Dynamo's
//! throughput-based planner uses them: constant, moving average, Holt-Winters.
//!
//! Owns: [`Forecaster`] (one series: observe a value per interval, predict the next).
//! Deterministic: no randomness, no clock; the same series gives the same predictions.
//! Never: decide replica counts (`planner`).

use super::spec::Predictor;
use std::collections::VecDeque;

/// One series (request count, mean input length, ...) and its predictor's state.
#[derive(Clone, Debug)]
pub struct Forecaster {
    predictor: Predictor,
    /// The latest values, as many as the predictor needs.
    recent: VecDeque<f64>,
    /// Holt-Winters' level and trend, once it has seen a value.
    level_trend: Option<(f64, f64)>,
    /// Holt-Winters' season, one term per position in it.
    season: Vec<f64>,
    /// Values seen.
    seen: usize,
}

impl Forecaster {
    /// A series with nothing seen yet.
    pub fn new(predictor: Predictor) -> Self {
        let season = match predictor {
            Predictor::HoltWinters { season, .. } if season > 1 => vec![0.0; season],
            _ => Vec::new(),
        };
        Self {
            predictor,
            recent: VecDeque::new(),
            level_trend: None,
            season,
            seen: 0,
        }
    }

    /// Takes one interval's value.
    pub fn observe(&mut self, value: f64) {
        let value = if value.is_finite() { value } else { 0.0 };
        let keep = match self.predictor {
            Predictor::MovingAverage { window } => window.max(1),
            _ => 1,
        };
        self.recent.push_back(value);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        if let Predictor::HoltWinters {
            alpha, beta, gamma, ..
        } = self.predictor
        {
            let position = if self.season.is_empty() {
                0
            } else {
                self.seen % self.season.len()
            };
            let seasonal = self.season.get(position).copied().unwrap_or(0.0);
            let (level, trend) = match self.level_trend {
                None => (value, 0.0),
                Some((level, trend)) => {
                    let new_level = alpha * (value - seasonal) + (1.0 - alpha) * (level + trend);
                    let new_trend = beta * (new_level - level) + (1.0 - beta) * trend;
                    (new_level, new_trend)
                }
            };
            // The first season only learns the level: its terms start from there.
            let first_season = self.seen < self.season.len();
            if let Some(term) = self.season.get_mut(position) {
                *term = if first_season {
                    0.0
                } else {
                    gamma * (value - level) + (1.0 - gamma) * *term
                };
            }
            self.level_trend = Some((level, trend));
        }
        self.seen += 1;
    }

    /// The next interval's value; 0 before anything was seen. Never negative.
    pub fn predict(&self) -> f64 {
        let prediction = match self.predictor {
            Predictor::Constant => self.recent.back().copied().unwrap_or(0.0),
            Predictor::MovingAverage { .. } => {
                if self.recent.is_empty() {
                    0.0
                } else {
                    self.recent.iter().sum::<f64>() / self.recent.len() as f64
                }
            }
            Predictor::HoltWinters { .. } => match self.level_trend {
                None => 0.0,
                Some((level, trend)) => {
                    let next = if self.season.is_empty() {
                        0.0
                    } else {
                        self.season[self.seen % self.season.len()]
                    };
                    level + trend + next
                }
            },
        };
        prediction.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(predictor: Predictor, values: &[f64]) -> f64 {
        let mut f = Forecaster::new(predictor);
        values.iter().for_each(|v| f.observe(*v));
        f.predict()
    }

    #[test]
    fn constant_and_moving_average_predict_the_last_and_the_mean() {
        assert_eq!(fed(Predictor::Constant, &[]), 0.0);
        assert_eq!(fed(Predictor::Constant, &[3.0, 5.0]), 5.0);
        let ma = Predictor::MovingAverage { window: 2 };
        assert_eq!(fed(ma, &[1.0, 3.0, 5.0]), 4.0);
    }

    #[test]
    fn holt_follows_a_trend_and_holt_winters_a_season() {
        let holt = Predictor::HoltWinters {
            alpha: 0.8,
            beta: 0.5,
            gamma: 0.0,
            season: 0,
        };
        let ramp: Vec<f64> = (0..30).map(|i| 10.0 + 2.0 * i as f64).collect();
        let next = fed(holt, &ramp);
        assert!((next - 70.0).abs() < 1.0, "{next}");
        let winters = Predictor::HoltWinters {
            alpha: 0.3,
            beta: 0.0,
            gamma: 0.5,
            season: 4,
        };
        let pattern = [10.0, 20.0, 30.0, 20.0];
        let seasons: Vec<f64> = (0..40).map(|i| pattern[i % 4]).collect();
        // After ten seasons, the next value is the pattern's first again.
        let next = fed(winters, &seasons);
        assert!((next - 10.0).abs() < 2.0, "{next}");
        assert_eq!(fed(winters, &seasons), next, "deterministic");
    }
}
