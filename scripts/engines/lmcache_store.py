"""LMCache's Redis remote connectors against a server: a chunk stored and retrieved.

    python lmcache_store.py HOST PORT

Run with the engines' venv and LMCache beside it (`cluster.py lmcache` prints both).
For each of LMCache's two Redis connectors, `resp://` (RESPConnector, its native
client) and `redis://` (RedisConnector, redis-py's asyncio client, which asks for RESP3),
it stores one chunk of a tiny model's KV (2 layers, 256 tokens, 2 heads of 64, fp16:
256 KiB) under an LMCache key, asks whether the key exists, reads the chunk back and
compares it with what it stored. Prints one JSON line per connector; exits 1 if any
step failed, with the reason in the line.
"""

import asyncio
import json
import sys
import threading
import traceback

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.connector.redis_connector import RedisConnector, RESPConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend


def check(scheme, host, port, loop):
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=256, local_cpu=True, max_local_cpu_size=0.05,
        remote_url=f"{scheme}://{host}:{port}", remote_serde="naive")
    metadata = LMCacheMetadata(
        model_name="tiny", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
        kv_dtype=torch.float16, kv_shape=(2, 2, 256, 2, 64))
    backend = LocalCPUBackend(config, metadata)
    if scheme == "resp":
        connector = RESPConnector(host, port, loop, backend)
    else:
        connector = RedisConnector(f"redis://{host}:{port}", loop, backend)
    chunk = backend.allocate(connector.meta_shapes, connector.meta_dtypes, connector.meta_fmt)
    generator = torch.Generator().manual_seed(32)
    chunk.tensor.copy_(torch.randn(chunk.tensor.shape, generator=generator).to(chunk.tensor.dtype))
    stored = chunk.tensor.clone()
    # A chunk hash of each connector's own, so the two never read each other's chunk.
    tag = "a" if scheme == "resp" else "b"
    key = CacheEngineKey.from_string(f"tiny@1@0@{tag}123456789abcdef@half")
    absent = CacheEngineKey.from_string(f"tiny@1@0@{tag}fedcba987654321@half")

    def run(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)

    run(connector.put(key, chunk))
    found = run(connector.exists(key))
    missing = run(connector.exists(absent))
    back = run(connector.get(key))
    equal = back is not None and torch.equal(back.tensor, stored)
    return {
        "connector": scheme,
        "chunk_bytes": stored.numel() * stored.element_size(),
        "exists": found,
        "absent_exists": missing,
        "equal": equal,
        "ok": bool(found and not missing and equal),
    }


def main(argv):
    host, port = argv[1], int(argv[2])
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    failed = False
    for scheme in ("resp", "redis"):
        try:
            result = check(scheme, host, port, loop)
        except Exception as error:  # what failed is the report
            result = {"connector": scheme, "ok": False, "error": f"{type(error).__name__}: {error}",
                      "trace": traceback.format_exc().splitlines()[-3:]}
        failed |= not result["ok"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
