"""Prints a vLLM engine's KV events as JSON lines (run with the engines' venv).

Owns: one ZMQ SUB on an engine's event endpoint (and, with --replay, one DEALER on its
replay socket), decoding each frame `[topic, seq, payload]` with msgspec's msgpack into
`{"seq": n, "ts": t, "dp_rank": r, "events": [...]}`, each event the engine's own map
(bytes shown as hex). For looking at what an engine sends, not for routing.
Never: binds (vLLM's PUB binds), sends anything on the live stream, or runs without a
bound: it stops after --seconds of silence or --count batches.

Usage: python kv_events.py tcp://127.0.0.1:EVENTS [--replay tcp://127.0.0.1:REPLAY
       [--from SEQ]] [--seconds 10] [--count N] [--topic kv]
"""

import argparse
import json
import sys

import msgspec
import zmq


def plain(value):
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def batch(seq, payload):
    decoded = msgspec.msgpack.decode(payload)
    ts, events = decoded[0], decoded[1]
    dp_rank = decoded[2] if len(decoded) > 2 else None
    return {"seq": seq, "ts": ts, "dp_rank": dp_rank, "events": plain(events)}


def replay(context, endpoint, start, timeout_ms):
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    while dealer.poll(timeout_ms):
        frames = dealer.recv_multipart()
        seq = int.from_bytes(frames[-2], "big", signed=True)
        if seq == -1:
            break
        yield batch(seq, frames[-1])
    dealer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint")
    parser.add_argument("--replay", help="the engine's replay endpoint: replay first")
    parser.add_argument("--from", dest="start", type=int, default=0, help="first seq to replay")
    parser.add_argument("--seconds", type=float, default=10, help="stop after this much silence")
    parser.add_argument("--count", type=int, default=0, help="stop after this many live batches")
    parser.add_argument("--topic", default="kv")
    args = parser.parse_args()

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.endpoint)
    if args.replay:
        for item in replay(context, args.replay, args.start, int(args.seconds * 1000)):
            print(json.dumps({"replayed": True, **item}), flush=True)
    seen = 0
    while sub.poll(int(args.seconds * 1000)):
        topic, seq, payload = sub.recv_multipart()
        print(json.dumps(batch(int.from_bytes(seq, "big"), payload)), flush=True)
        seen += 1
        if args.count and seen >= args.count:
            break
    sub.close()
    context.term()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
