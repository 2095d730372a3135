"""ZMQ publishing (nbs/07d_router_conformance.ipynb) on loopback: the PUB frames and the replay frames equal those
vLLM 0.33's ZmqEventPublisher sent in the recorded session. Every wait is bounded; every socket is closed."""
import base64
import json
import sys
import threading
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from kvref.distributed.kv_events import KVEventBatch, decode_batch  # noqa: E402
from kvref.oracle.replay import load_trace  # noqa: E402
from kvref.oracle.router_conformance import END_SEQ, EventPublisher, offset_endpoint_port, op_batches, publish_trace  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SESSION = json.loads((GOLDEN / "events/zmq-session.json").read_text())
DESIGN = load_trace(GOLDEN / "traces/design-doc-example.jsonl")
WAIT_MS = 5000
JOIN_S = 1.0  # time for a subscription to reach the PUB on a loaded machine


def b64(frames):
    return [base64.b64encode(f).decode() for f in frames]


def socket(kind, endpoint):
    s = zmq.Context.instance().socket(kind)
    s.connect(endpoint)
    return s


def recv(s, n):
    out = []
    while len(out) < n and s.poll(WAIT_MS): out.append(s.recv_multipart())
    return out


def batches():
    return [KVEventBatch(0.0, b.events) for b in op_batches(DESIGN) if b.events]


def test_pub_frames_equal_the_recorded_session():
    with EventPublisher("tcp://127.0.0.1:*") as publisher:
        sub = socket(zmq.SUB, publisher.endpoints()[0])
        try:
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            time.sleep(JOIN_S)  # let the subscription reach the PUB (a late subscriber would replay instead)
            for batch in batches(): publisher.publish(batch)
            got = recv(sub, 4)
        finally: sub.close(linger=0)
    assert [b64(m) for m in got] == [m["frames_b64"] for m in SESSION["pub_messages"]]


@pytest.mark.parametrize("start", [0, 1, 3, 4, 99])
def test_replay_from(start):
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        for batch in batches(): publisher.publish(batch)
        client = socket(zmq.DEALER, publisher.endpoints()[1])
        try:
            client.send_multipart([b"", start.to_bytes(8, "big")])
            assert publisher.serve_replay(timeout_ms=WAIT_MS) == 1
            got = recv(client, max(0, 4 - start) + 1)
        finally: client.close(linger=0)
    assert got[-1] == [b"", b"", END_SEQ, b""]
    assert [int.from_bytes(m[2], "big") for m in got[:-1]] == list(range(start, 4))
    if start == 1: assert [b64(m) for m in got] == [m["frames_b64"] for m in SESSION["replay_messages"]]


def test_malformed_replay_request_is_ignored():
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        publisher.publish(batches()[0])
        client = socket(zmq.DEALER, publisher.endpoints()[1])
        try:
            client.send_multipart([b"", b"x", b"y"])
            assert publisher.serve_replay(timeout_ms=WAIT_MS) == 0
            assert not client.poll(200)
        finally: client.close(linger=0)


def test_rank_and_topic():
    with EventPublisher("tcp://127.0.0.1:*", data_parallel_rank=2, topic="kv@a") as publisher:
        sub = socket(zmq.SUB, publisher.endpoints()[0])
        try:
            sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
            time.sleep(JOIN_S)
            publisher.publish(batches()[0])
            (frames,) = recv(sub, 1)
        finally: sub.close(linger=0)
    assert frames[0] == b"kv@a" and frames[1] == bytes(8) and decode_batch(frames[2]).data_parallel_rank == 2


def test_offset_endpoint_port():
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    assert offset_endpoint_port("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"
    for bad in ("tcp://host", "ipc:///tmp/kv"):
        with pytest.raises(ValueError, match="expected tcp://host:port or inproc://name"):
            offset_endpoint_port(bad, 1)


def test_replay_topic_and_marker():
    "Replayed batches carry the topic; the end marker's topic frame is empty (vLLM 0.33's _service_replay)."
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv") as publisher:
        publisher.publish(batches()[0])
        client = socket(zmq.DEALER, publisher.endpoints()[1])
        try:
            client.send_multipart([b"", bytes(8)])
            assert publisher.serve_replay(timeout_ms=WAIT_MS) == 1
            got = recv(client, 2)
        finally: client.close(linger=0)
    assert [m[:3] for m in got] == [[b"", b"kv", bytes(8)], [b"", b"", END_SEQ]]


def free_port_below_the_ephemeral_range() -> int:
    """A free loopback port the kernel never hands out as a connection's own port. A SUB that keeps reconnecting to a
    port nobody listens on can be given that very port as its local end (a TCP self-connect), and then the
    publisher's bind fails with 'Address already in use': a probe bound to port 0 picks from that same range."""
    import random, socket as sockets
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(range_file.read_text().split()[0]) if range_file.exists() else 32768
    for port in random.sample(range(10_000, low), 200):
        with sockets.socket() as probe:
            try: probe.bind(("127.0.0.1", port)); return port
            except OSError: continue
    pytest.skip("no free loopback port below the ephemeral range")


def test_publish_trace_reaches_a_subscriber_that_joined_first():
    endpoint = f"tcp://127.0.0.1:{free_port_below_the_ephemeral_range()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RECONNECT_IVL, 20)  # it connects before the publisher binds: retry soon
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        worker = threading.Thread(target=publish_trace, args=(DESIGN, endpoint), kwargs=dict(wait_s=3 * JOIN_S))  # slow joiners on a loaded box; < WAIT_MS
        worker.start()
        got = recv(sub, 4)
        worker.join(timeout=10)
    finally: sub.close(linger=0)
    assert not worker.is_alive()
    assert [int.from_bytes(m[1], "big") for m in got] == [0, 1, 2, 3]


def test_without_pyzmq(monkeypatch):
    monkeypatch.setitem(sys.modules, "zmq", None)
    with pytest.raises(ImportError, match="needs pyzmq: pip install pyzmq"):
        EventPublisher("tcp://127.0.0.1:*")
