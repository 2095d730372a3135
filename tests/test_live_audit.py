"""The live audit (nbs/07e_live_audit.ipynb): vLLM 0.33's own recorded streams pass; every kind of finding is caught
when planted; other releases' hashes are rebuilt from their events; memory stays bounded; the live ZMQ path
replays what it missed; `kvref audit`'s exit codes and report."""
import base64
import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvref.core.hashing import LoRARequest, MultiModalItem
from kvref.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, decode_batch, encode_batch,
                             event_extra_keys, external_block_hash)
from kvref.oracle.live_audit import (EngineAudit, EngineConfig, FleetAudit, audit_files, audit_live, read_stream,
                              sharing_causes)
from kvref.oracle.releases import PROFILES, release_block_hashes, release_extra_keys, wire_schema
from kvref.oracle.router_conformance import op_batches
from kvref.oracle.workloads import shared_system_prompts, to_trace

ROOT = Path(__file__).resolve().parents[1]
EVENTS, AUDIT = ROOT / "golden" / "events", ROOT / "golden" / "events" / "audit"
STATED = dict(vllm_version="0.33.0", hash_algo="sha256", block_size=4)


def config_of(name: str) -> tuple[int, str]:
    source = EVENTS / f"{name}.jsonl" if name.startswith("trace-mm") else ROOT / "golden" / "traces" / f"{name}.jsonl"
    config = json.loads(source.open().readline())
    return config["block_size"], config.get("hash_algo", "sha256")


@pytest.mark.parametrize("name", ["design-doc-example", "trace-11-0", "trace-11-1", "trace-11-2", "trace-11-3", "trace-mm-15-0"])
@pytest.mark.parametrize("form", ["int", "bytes"])
def test_vllm_0_33s_own_streams_are_consistent(name, form):
    "Streams recorded from vLLM 0.33.0's own KVCacheManager: nothing found, every non-LoRA block hash rebuilt."
    size, algo = config_of(name)
    path = EVENTS / f"{name}.events{'.bytes' if form == 'bytes' else ''}.jsonl"
    fleet = audit_files([EngineConfig(name, "0.33.0", algo, size, hash_form=form)], [path])
    engine = fleet.engines[name]
    assert fleet.exit_status() == 0, fleet.summary()
    lora_blocks = sum(len(e.block_hashes) for _, p in read_stream(path) for e in decode_batch(p, form).events
                      if isinstance(e, BlockStored) and e.lora_name)
    assert engine.counts["hashes_checked"] + lora_blocks == engine.counts["blocks_stored"] > 0


def stream(path=AUDIT / "engine-a.jsonl"):
    return list(read_stream(path))


def findings(batches, **config):
    engine = EngineAudit(EngineConfig("a", **{**STATED, **config}))
    for seq, payload in batches: engine.check(seq, payload)
    return engine


def test_each_planted_fault_is_its_finding():
    a = stream()
    removal = encode_batch(KVEventBatch(0.0, [BlockRemoved([7], "GPU", 0)], 0))
    orphan = encode_batch(KVEventBatch(0.0, [BlockStored([9], 12345, [1, 2, 3, 4], 4, None, "GPU", None, [None], 0)], 0))
    first = decode_batch(a[0][1])
    tampered = replace(first.events[0], block_hashes=[first.events[0].block_hashes[0] ^ 1] + first.events[0].block_hashes[1:])
    planted = {
        "gap": a[:2] + a[3:], "order": a[:3] + a[2:],
        "layout": [(s, encode_batch(decode_batch(p), wire_schema("0.30.0"))) for s, p in a],
        "undecodable": a[:1] + [(1, a[1][1][:-1])], "removal": a + [(len(a), removal)],
        "parent": a + [(len(a), orphan)],
        "rank": a[:1] + [(1, encode_batch(replace(decode_batch(a[1][1]), data_parallel_rank=2)))],
        "hash": [(0, encode_batch(replace(first, events=[tampered])))] + a[1:],
    }
    for kind, batches in planted.items():
        assert set(findings(batches).findings) == {kind}, kind
    assert set(findings(a, block_size=8).findings) == {"block-size"}
    assert set(findings(a, hash_algo="sha256_cbor").findings) == {"hash"}
    assert set(findings(a, vllm_version="0.32.0").findings) == {"layout"}  # the case: map16 headers, not fixmaps


def test_a_gap_suspends_holdings_checks_until_a_reset():
    a = stream()
    engine = findings(a[3:])  # joined late: the first three batches are missing
    assert engine.findings == {"gap": 1} and not engine.synced
    engine.check(len(a), encode_batch(KVEventBatch(0.0, [AllBlocksCleared()], 0)))
    assert engine.synced and not engine.digests and not engine.index.engines[engine.engine]
    engine.check(len(a) + 1, encode_batch(KVEventBatch(0.0, [BlockRemoved([7], "GPU", 0)], 0)))
    assert engine.findings["removal"] == 1


def release_event(profile_name, version, tokens, size, **request):
    "A BlockStored of a prompt's full blocks as `version` sends it (its hashes, its untagged extra keys)."
    profile = PROFILES[profile_name]
    hashes = release_block_hashes(profile, tokens, size, "sha256", **request)
    keys = [release_extra_keys(profile, s, s + size, **{k: v for k, v in request.items() if k != "pythonhashseed"})
            for s in range(0, len(hashes) * size, size)]
    listed = ([event_extra_keys(k) for k in keys] if profile.lora_key == "tagged" else
              [None if k is None else [list(x) if isinstance(x, tuple) else x for x in k] for k in keys])
    event = BlockStored([external_block_hash(h) for h in hashes], None, list(tokens[:len(hashes) * size]), size, None,
                        "GPU", None, listed, 0, "full_attention")
    return encode_batch(KVEventBatch(0.0, [event], 0), wire_schema(version))


@pytest.mark.parametrize("profile_name,version", [("vllm_0_19", "0.19.1"), ("vllm_0_29", "0.30.0"), ("vllm_0_33", "0.33.0")])
def test_salted_and_multimodal_blocks_are_rebuilt_for_each_release(profile_name, version):
    request = dict(cache_salt="tenant", mm_items=[MultiModalItem("img", 3, 6)], pythonhashseed="7")
    payload = release_event(profile_name, version, list(range(20)), 4, **request)
    ok = findings([(0, payload)], vllm_version=version, pythonhashseed="7")
    assert ok.findings == {} and ok.counts["hashes_checked"] == 5
    assert set(findings([(0, payload)], vllm_version=version, pythonhashseed="8").findings) == {"hash"}


def test_releases_without_extra_keys_or_digests_are_unverifiable_not_wrong():
    payload = release_event("vllm_0_14", "0.16.0", list(range(8)), 4, pythonhashseed="0")
    engine = findings([(0, payload)], vllm_version="0.16.0", pythonhashseed="0")
    assert engine.findings == {} and engine.counts["hashes_unverifiable"] == 2 and "no extra keys" in engine.why_unverifiable


def test_lora_on_0_33_is_unverifiable():
    size, algo = config_of("trace-mm-15-0")
    engine = audit_files([EngineConfig("m", "0.33.0", algo, size)], [EVENTS / "trace-mm-15-0.events.jsonl"]).engines["m"]
    assert engine.counts["hashes_unverifiable"] > 0 and engine.findings == {}


def long_stream(num_blocks=24, users=40):
    ops = to_trace(shared_system_prompts(num_prompts=6, num_users=users, system_len=48, user_len=16, output_len=12,
                                         block_size=4, num_blocks=num_blocks), max_live=4)
    return [(b.seq, b.payload) for b in op_batches(ops, data_parallel_rank=0) if b.events]


def test_memory_is_bounded_by_the_engines_cache():
    batches = long_stream()
    engine = EngineAudit(EngineConfig("a", **STATED), max_roots=16)
    peak = 0
    for seq, payload in batches:
        engine.check(seq, payload)
        held = engine.index.engines.get(engine.engine, {})
        peak = max(peak, len(engine.digests), len(held))
        assert set(engine.digests) <= set(held)
    assert len(batches) > 500 and engine.findings == {}
    assert peak <= 24 and len(engine.roots) <= 16 and len(engine.examples) == 0
    assert engine.counts["hashes_checked"] == engine.counts["blocks_stored"] > 1000


def test_examples_are_capped_but_all_counted():
    a = stream()
    engine = EngineAudit(EngineConfig("a", **STATED, pythonhashseed="3"), max_examples=1)
    for seq, payload in a: engine.check(seq, payload)
    assert engine.findings["hash"] > 1 and len(engine.examples) == 1


def test_fleet_names_each_cause():
    base = EngineConfig("a", **STATED)
    assert sharing_causes(base, replace(base, name="b", block_size=8)) == ["block size 4 vs 8"]
    assert sharing_causes(base, replace(base, name="b", hash_form="bytes")) == ["hash form int vs bytes"]
    assert sharing_causes(base, replace(base, name="b", vllm_version="0.11.1"))[0].startswith("NONE_HASH drawn at random")
    fleet = audit_files([base, replace(base, name="b", pythonhashseed="1")], [AUDIT / "engine-a.jsonl", AUDIT / "engine-b.jsonl"])
    assert [f.message for f in fleet.fleet_findings()] == ["engines a/b cannot share hits: NONE_HASH: PYTHONHASHSEED unset vs 1"]
    assert fleet.exit_status() == 1 and fleet.report()["consistent"] is False
    with pytest.raises(ValueError, match="two engines share a name"): FleetAudit([base, base])


def test_read_stream_refuses_bad_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    for text, message in (("[1]\n", "seq must be an int"), ("{\n", "line 1: not JSON"),
                          ('{"seq": 0, "payload_b64": 5}\n', "not base64")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message): list(read_stream(path))


# ---- live, over ZMQ on loopback
zmq = pytest.importorskip("zmq")
from kvref.oracle.router_conformance import EventPublisher  # noqa: E402


def serve(publisher, payloads, first, pause_s=0.3, serve_s=1.5, skip=()):
    def run():
        for i, p in enumerate(payloads):
            if i == first:
                end = time.monotonic() + pause_s
                while time.monotonic() < end: publisher.serve_replay(timeout_ms=20)
            batch = decode_batch(p)
            if i in skip:  # lost on the PUB socket, still in the replay buffer
                publisher.buffer.append((publisher.next_seq, encode_batch(replace(batch, data_parallel_rank=0))))
                publisher.next_seq += 1
            else: publisher.publish(batch)
        end = time.monotonic() + serve_s
        while time.monotonic() < end: publisher.serve_replay(timeout_ms=20)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("with_replay", [True, False])
def test_live_audit_replays_what_it_missed(with_replay):
    payloads = [p for _, p in stream()]
    publisher = EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*" if with_replay else None)
    pub, rep = publisher.endpoints()
    thread = serve(publisher, payloads, first=3, skip={5})
    fleet = audit_live([EngineConfig("a", **STATED)], [pub], [rep], duration_s=3 if with_replay else 1.5,
                       max_batches=len(payloads))
    thread.join(); publisher.close()
    engine = fleet.engines["a"]
    if with_replay:
        assert fleet.exit_status() == 0 and engine.counts["batches"] == len(payloads), fleet.summary()
    else:
        assert engine.findings["gap"] >= 1 and fleet.exit_status() == 1


def test_live_fleet_of_two_engines():
    a, b = [p for _, p in stream()], [p for _, p in stream(AUDIT / "engine-b.jsonl")]
    pubs = [EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") for _ in range(2)]
    ends = [p.endpoints() for p in pubs]
    threads = [serve(p, s, first=0) for p, s in zip(pubs, (a, b))]
    fleet = audit_live([EngineConfig("a", **STATED), EngineConfig("b", **STATED)], [e[0] for e in ends],
                       [e[1] for e in ends], duration_s=3, max_batches=len(a) + len(b))
    for t in threads: t.join()
    for p in pubs: p.close()
    assert fleet.engines["a"].findings == {} and set(fleet.engines["b"].findings) == {"hash"}
    assert [f.kind for f in fleet.fleet_findings()] == ["fleet"]


def test_live_without_pyzmq_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "zmq", None)
    with pytest.raises(ImportError, match="needs pyzmq: pip install pyzmq"):
        audit_live([EngineConfig("a", **STATED)], ["tcp://127.0.0.1:1"], duration_s=0.1)


# ---- the command
def test_cli_exit_codes_and_report(tmp_path, capsys):
    from kvref.cli import main
    stated = ["--vllm-version", "0.33.0", "--hash-algo", "sha256", "--block-size", "4"]
    a, b = str(AUDIT / "engine-a.jsonl"), str(AUDIT / "engine-b.jsonl")
    assert main(["audit", "--file", a, *stated]) == 0
    report = tmp_path / "r.json"
    assert main(["audit", "--file", a, "--file", b, "--engine", "a", "--engine", "b", *stated, "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert "it hashes as sha256 with PYTHONHASHSEED=1" in out
    data = json.loads(report.read_text())
    assert data["engines"]["b"]["findings"] == {"hash": 2} and data["fleet"][0]["kind"] == "fleet"
    for bad in (["--file", a, "--file", b, "--engine", "x", *stated],                 # one name for two files
                ["--file", a, *stated, "--block-size", "8"],                           # two block sizes, one file
                ["--file", str(ROOT / "golden" / "traces" / "design-doc-example.jsonl"), *stated],  # no batch in it
                ["--file", a, "--vllm-version", "0.8.5", "--hash-algo", "sha256", "--block-size", "4"],
                ["tcp://127.0.0.1:1", "--file", a, *stated]):
        assert main(["audit", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("kvref audit: error:"), err
