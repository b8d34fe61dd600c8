"""Measures what scripts/engines/README.md states about a running engine (venv python).

Owns: a bounded set of requests to engine 1 of a cluster that `cluster.py up` started
(its cluster.json), a ZMQ SUB on that engine's events, and what it prints: each answer's
exact JSON and the decoded KV events each request caused. Resets the engine's prefix
cache first (POST /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1), so it changes nothing
but that engine's cache.
Never: starts or stops an engine, or sends more than a few dozen requests.

Usage: python probe.py RUN_DIR/cluster.json
"""

import json
import sys
import time
import urllib.error
import urllib.request

import msgspec
import zmq
from tokenizers import Tokenizer


def post(url, body, raw=False):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            return response.status, text if raw else json.loads(text)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


class Events:
    def __init__(self, endpoint):
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        time.sleep(0.5)  # the slow joiner: let the subscription reach the PUB

    def drain(self, settle=0.5):
        """Every event that arrives until `settle` seconds pass without one."""
        events = []
        while self.sub.poll(int(settle * 1000)):
            _, _, payload = self.sub.recv_multipart()
            events += msgspec.msgpack.decode(payload)[1]
        return events


def short(event):
    """An event with its token ids counted rather than listed."""
    event = dict(event)
    if "token_ids" in event:
        event["token_ids"] = f"<{len(event['token_ids'])} ids>"
    return event


def section(title):
    print(f"\n### {title}")


def main():
    state = json.load(open(sys.argv[1]))
    engine = state["engines"][0]
    url, model = engine["url"], state["served_model_name"]
    tokenizer = Tokenizer.from_file(state["tokenizer"])
    events = Events(engine["events_endpoint"])

    def reset():
        status, _ = post(url + "/reset_prefix_cache", {}, raw=True)
        assert status == 200, status
        # AllBlocksCleared goes out with the next scheduler step: one tiny request.
        post(url + "/v1/completions", {"model": model, "prompt": [5], "max_tokens": 1})
        events.drain(1.0)

    def completion(body, label):
        status, answer = post(url + "/v1/completions", {"model": model, **body})
        print(f"{label}: HTTP {status}")
        print(json.dumps(answer))
        for event in events.drain():
            print("  event", json.dumps(short(event)))
        return answer

    reset()
    section("token-id prompt (64 tokens), twice")
    ids = list(range(1000, 1064))
    for attempt in (1, 2):
        completion({"prompt": ids, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True},
                   f"attempt {attempt}")

    section("text prompt, and the Python tokenizers' ids for it")
    text = "The quick brown fox jumps over the lazy dog."
    answer = completion({"prompt": text, "max_tokens": 4, "ignore_eos": True,
                         "return_token_ids": True}, "text")
    with_special = tokenizer.encode(text, add_special_tokens=True).ids
    print("tokenizers add_special_tokens=True: ", with_special)
    print("tokenizers add_special_tokens=False:", tokenizer.encode(text, add_special_tokens=False).ids)
    print("engine prompt_token_ids equal add_special_tokens=True:",
          answer["choices"][0]["prompt_token_ids"] == with_special)

    section("streamed, include_usage and continuous_usage_stats")
    for continuous in (False, True):
        status, body = post(url + "/v1/completions", {
            "model": model, "prompt": ids, "max_tokens": 3, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": continuous},
        }, raw=True)
        print(f"continuous_usage_stats={continuous}: HTTP {status}")
        for line in body.splitlines():
            if line:
                print("  " + line)
        events.drain()

    section("cache_salt")
    reset()
    salted = list(range(2000, 2096))  # three blocks
    for salt in ("alpha", "alpha", "beta"):
        completion({"prompt": salted, "max_tokens": 1, "ignore_eos": True, "cache_salt": salt},
                   f"completions, cache_salt={salt!r}")
    completion({"prompt": salted + list(range(3000, 3064)), "max_tokens": 1, "ignore_eos": True,
                "cache_salt": "alpha"}, "completions, the 'alpha' prefix continued by two blocks")
    completion({"prompt": salted, "max_tokens": 1, "ignore_eos": True}, "completions, no salt")
    status, answer = post(url + "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hello " * 40}],
        "max_tokens": 1, "cache_salt": "alpha",
    })
    print(f"chat, cache_salt='alpha': HTTP {status}")
    print(json.dumps(answer))
    for event in events.drain():
        print("  event", json.dumps(short(event)))

    section("lora_name")
    completion({"prompt": ids, "max_tokens": 1, "lora_name": "adapter"}, "completions, lora_name")
    completion({"prompt": ids, "max_tokens": 1, "model": "adapter"}, "completions, model=adapter")

    section("/metrics: histograms (TTFT, ITL, ...) and prefix-cache counters")
    _, metrics = get(url + "/metrics")
    for line in metrics.splitlines():
        if line.startswith("# TYPE vllm:") and (line.endswith(" histogram") or "prefix_cache" in line):
            print(" ", line[len("# TYPE "):])


if __name__ == "__main__":
    main()
