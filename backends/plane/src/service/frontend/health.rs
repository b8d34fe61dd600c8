//! Engine health from the engines themselves: every engine's `GET /health` on a fixed
//! period, and its `GET /v1/models` (the models and LoRA adapters it serves) when it
//! comes up and now and then after.
//!
//! Owns: [`HealthConfig`], [`run_health_checks`] (the task) and [`models_of`] (the
//! `/v1/models` answer read).
//! An engine is up after one answered check, down after `failures_to_down` failed ones
//! in a row (or at once when a request to it finds its port refusing: the proxy marks
//! that), so a killed engine is out of the choice within about `period ×
//! failures_to_down + probe timeout` (3 s by default), and an idle healthy engine stays
//! up however long it publishes no events (vLLM sends no heartbeats). An engine whose
//! port refuses is gone, its cache with it (`RouterState::mark_engine_gone`); one
//! that times out or answers errors is down but keeps the router's view of its cache.
//! Never: hold the state's lock across a probe (the engines are probed together, then
//! the results applied).

use super::engine_client::EngineClient;
use crate::service::http::{lock, SharedState};
use crate::service::state::EngineHealth;
use kvtwin::ids::WorkerId;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// `/v1/models` answers larger than this are refused (a list of names).
const MODELS_BODY_LIMIT: usize = 1 << 20;

/// `/health` answers larger than this are refused.
const HEALTH_BODY_LIMIT: usize = 64 << 10;

/// How engines are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Time between two checks of every engine.
    pub period: Duration,
    /// Failed checks in a row that mark an engine down.
    pub failures_to_down: u32,
    /// Checks between two model listings of an engine that is up.
    pub models_every: u32,
}

impl Default for HealthConfig {
    /// Every second; down after 2 failures; models every 30 checks.
    fn default() -> Self {
        Self {
            period: Duration::from_secs(1),
            failures_to_down: 2,
            models_every: 30,
        }
    }
}

/// The base models and LoRA adapters (entries with a `parent`) of an OpenAI
/// `/v1/models` answer, each in the order listed.
pub fn models_of(answer: &Value) -> Option<(Vec<String>, Vec<String>)> {
    let data = answer.get("data")?.as_array()?;
    let mut models = Vec::new();
    let mut adapters = Vec::new();
    for entry in data {
        let Some(id) = entry.get("id").and_then(Value::as_str) else {
            continue;
        };
        let parent = entry.get("parent").and_then(Value::as_str);
        match parent {
            Some(_) => adapters.push(id.to_string()),
            None => models.push(id.to_string()),
        }
    }
    Some((models, adapters))
}

/// A failed check: why, and whether the engine's process is gone (its port refuses).
struct Failed {
    reason: String,
    gone: bool,
}

/// One engine's check: `Ok` when `/health` answered 200, else why not.
async fn check(client: &EngineClient, url: &str) -> Result<(), Failed> {
    match client.get(url, "/health", HEALTH_BODY_LIMIT).await {
        Ok((status, _)) if status.is_success() => Ok(()),
        Ok((status, _)) => Err(Failed {
            reason: format!("/health answered HTTP {}", status.as_u16()),
            gone: false,
        }),
        Err(error) => Err(Failed {
            reason: format!("/health: {error}"),
            gone: error.engine_gone(),
        }),
    }
}

async fn list_models(client: &EngineClient, url: &str) -> Option<(Vec<String>, Vec<String>)> {
    let (status, body) = client
        .get(url, "/v1/models", MODELS_BODY_LIMIT)
        .await
        .ok()?;
    if !status.is_success() {
        return None;
    }
    models_of(&serde_json::from_slice(&body).ok()?)
}

#[derive(Default)]
struct Tally {
    failures: u32,
    checks_since_models: Option<u32>,
}

/// Checks every engine of `state` each `config.period` until `stop` resolves, marking
/// each up or down and recording the models it serves. Engines added or removed while
/// it runs are picked up at the next period.
pub async fn run_health_checks(
    state: SharedState,
    client: EngineClient,
    config: HealthConfig,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut tallies: BTreeMap<WorkerId, Tally> = BTreeMap::new();
    let mut ticks = tokio::time::interval(config.period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let engines = lock(&state).serving().engine_urls();
        tallies.retain(|worker, _| engines.iter().any(|(known, _)| known == worker));
        let checks = engines.iter().map(|(worker, url)| {
            let client = &client;
            async move { (*worker, url.clone(), check(client, url).await) }
        });
        let results = futures::future::join_all(checks).await;
        let mut listings = Vec::new();
        for (worker, url, result) in results {
            let tally = tallies.entry(worker).or_default();
            let health = match result {
                Ok(()) => {
                    tally.failures = 0;
                    let due = tally
                        .checks_since_models
                        .is_none_or(|checks| checks + 1 >= config.models_every);
                    tally.checks_since_models = Some(if due {
                        listings.push((worker, url));
                        0
                    } else {
                        tally.checks_since_models.unwrap_or(0) + 1
                    });
                    Some(EngineHealth::Up)
                }
                Err(failed) => {
                    tally.failures += 1;
                    tally.checks_since_models = None;
                    if tally.failures >= config.failures_to_down {
                        let mut state = lock(&state);
                        if failed.gone {
                            state.mark_engine_gone(worker, failed.reason);
                        } else {
                            state.set_engine_health(
                                worker,
                                EngineHealth::Down {
                                    reason: failed.reason,
                                },
                            );
                        }
                    }
                    None
                }
            };
            if let Some(health) = health {
                lock(&state).set_engine_health(worker, health);
            }
        }
        for (worker, url) in listings {
            if let Some((models, adapters)) = list_models(&client, &url).await {
                lock(&state).set_engine_models(worker, models, adapters);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_and_adapters_are_told_apart_by_parent() {
        let answer = serde_json::json!({"object": "list", "data": [
            {"id": "tiny", "object": "model", "root": "/models/tiny", "parent": null},
            {"id": "sql-lora", "object": "model", "root": "/loras/sql", "parent": "tiny"},
            {"object": "model"}
        ]});
        assert_eq!(
            models_of(&answer),
            Some((vec!["tiny".to_string()], vec!["sql-lora".to_string()]))
        );
        assert_eq!(models_of(&serde_json::json!({"data": 3})), None);
    }
}
