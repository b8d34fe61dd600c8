//! A vLLM engine's HTTP endpoints as the profile and `validate --engine` use them: what
//! it serves and how its cache is sized (`/v1/models`, `vllm:cache_config_info`), a GET
//! or a JSON POST with errors that name the URL, and emptying its prefix cache.
//!
//! Owns: those calls and the Prometheus label reading they need. Never: measures time
//! (`engine_time` reads the engine's clocks) or retries anything but a prefix-cache
//! reset that vLLM refuses while blocks are held.

use super::EngineInfo;
use anyhow::{bail, Context, Result};
use kvtwin_plane::service::frontend::engine_client::{BodyReader, EngineClient};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The model, its cache's block size and blocks, and the longest prompt it takes.
pub(crate) async fn engine_info(client: &EngineClient, url: &str) -> Result<EngineInfo> {
    let body = get_ok(client, url, "/v1/models", 1 << 20).await?;
    let models: Value =
        serde_json::from_slice(&body).with_context(|| format!("{url}/v1/models: not JSON"))?;
    let first = &models["data"][0];
    let model = first["id"]
        .as_str()
        .with_context(|| format!("{url}/v1/models lists no model"))?
        .to_string();
    let metrics = get_ok(client, url, "/metrics", 16 << 20).await?;
    let metrics = String::from_utf8_lossy(&metrics);
    let line = metrics
        .lines()
        .find(|line| line.starts_with("vllm:cache_config_info{"))
        .with_context(|| {
            format!(
                "{url}/metrics has no vllm:cache_config_info: kvtwin profile --engine reads \
                 the cache's size and block size off a vLLM engine's metrics"
            )
        })?;
    let number = |name: &str| -> Result<u64> {
        label(line, name)
            .and_then(|value| value.parse().ok())
            .with_context(|| format!("{url}/metrics: vllm:cache_config_info has no {name}"))
    };
    let block_size = number("block_size")?;
    let num_gpu_blocks = number("num_gpu_blocks")?;
    if block_size == 0 || num_gpu_blocks < 2 {
        bail!("{url}: a cache of {num_gpu_blocks} blocks of {block_size} tokens");
    }
    // vLLM lists it per model; without it, the cache is the bound.
    let max_model_len = first["max_model_len"]
        .as_u64()
        .unwrap_or((num_gpu_blocks - 1) * block_size);
    Ok(EngineInfo {
        model,
        block_size,
        num_gpu_blocks,
        max_model_len,
    })
}

/// The body of `GET url path` (at most `limit` bytes), or an error naming both.
pub(crate) async fn get_ok(
    client: &EngineClient,
    url: &str,
    path: &str,
    limit: usize,
) -> Result<Vec<u8>> {
    let (status, body) = client
        .get(url, path, limit)
        .await
        .with_context(|| format!("{url}{path}"))?;
    if !status.is_success() {
        bail!("{url}{path} answered {status}");
    }
    Ok(body.to_vec())
}

/// `POST url path` with a JSON `body`; the answer's JSON, or an error naming the URL
/// (a 404 from /reset_prefix_cache says the engine runs without its dev endpoints).
pub(crate) async fn post(
    client: &EngineClient,
    url: &str,
    path: &str,
    body: String,
) -> Result<Value> {
    let response = client
        .post_json(url, path, body.into(), &[])
        .await
        .with_context(|| format!("POST {url}{path}"))?;
    let status = response.status();
    let idle = client.timeouts().idle;
    let body = BodyReader::new(response.into_body(), idle, 1 << 20)
        .read_all()
        .await
        .with_context(|| format!("POST {url}{path}: the answer"))?;
    if !status.is_success() {
        let hint = if path == "/reset_prefix_cache" {
            ": the engine must run with VLLM_SERVER_DEV_MODE=1 (scripts/engines/cluster.py sets it) so that each repeat starts from an empty cache"
        } else {
            ""
        };
        bail!("POST {url}{path} answered {status}{hint}");
    }
    serde_json::from_slice(&body).with_context(|| format!("POST {url}{path}: not JSON"))
}

/// Empties vLLM's prefix cache at `url` (`POST /reset_prefix_cache`, a dev endpoint).
/// vLLM refuses while blocks are held (`{"success": false}`: requests still finishing),
/// so a refusal is retried for up to `within`.
pub(crate) async fn reset_prefix_cache(
    client: &EngineClient,
    url: &str,
    within: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let answer = post(client, url, "/reset_prefix_cache", String::new()).await?;
        if answer["success"] == Value::Bool(true) {
            return Ok(());
        }
        if start.elapsed() > within {
            bail!(
                "POST {url}/reset_prefix_cache answered {answer} for {}s: its blocks stay held",
                within.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of label `name` in a Prometheus sample line (`name="value"`, the name
/// whole: `hash_block_size` is not `block_size`).
pub(super) fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let open = line.find('{')?;
    let close = line.rfind('}')?;
    let labels = line.get(open + 1..close)?;
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim_start_matches(',').trim();
        let value_start = eq + 2;
        let value_end = rest[value_start..].find('"')? + value_start;
        if key == name {
            return Some(&rest[value_start..value_end]);
        }
        rest = &rest[value_end + 1..];
    }
    None
}
