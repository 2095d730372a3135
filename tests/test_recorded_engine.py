"""A real vLLM engine's recordings (golden/events/real-engine, made by scripts/e2e-vllm-cpu) against kvref.

Each engine's stream: audited against its stated settings, every event equal to kvref's replay of the same requests,
the prefix-cache counters equal. Planted changes (a token flipped in the stream, a setting the engine did not have, a
wrong statement of the seed) must each be caught."""
import base64
import json
import shutil
from pathlib import Path

import pytest

from kvref.oracle.live_audit import EngineConfig, audit_files
from kvref.oracle.recorded_engine import check_recording, engine_events, load_recording, replay_recording

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "events" / "real-engine" / "0.32.0"
ENGINES = ["seed-0", "seed-1"]


@pytest.mark.parametrize("name", ENGINES)
def test_recording_agrees_with_kvref(name):
    result = check_recording(GOLDEN / name)
    assert result.ok, result
    assert result.num_events == (65, 65) and result.counters["engine"] == (1790, 448)


def test_the_stream_covers_what_it_says():
    "Stores, removals (evictions) and a reset are all in it; some tokens were re-admitted after preemption."
    kinds = {e["type"] for e in engine_events(load_recording(GOLDEN / "seed-0"))}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    _, s = replay_recording(load_recording(GOLDEN / "seed-0"))
    assert s.prefix_cache_stats.preempted_queries > 0


def test_a_flipped_token_is_caught(tmp_path):
    "One token changed in the first stored block: the audit rebuilds another hash, and the events differ."
    copy = tmp_path / "seed-0"
    shutil.copytree(GOLDEN / "seed-0", copy)
    lines = (copy / "engine.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    payload = bytearray(base64.b64decode(first["payload_b64"]))
    tokens = json.loads((copy / "requests.json").read_text())[0][0]["prompt"]
    at = payload.find(bytes([0xcd]) + tokens[5].to_bytes(2, "big"))  # msgpack uint16 of the sixth token
    assert at > 0
    payload[at + 2] ^= 1
    first["payload_b64"] = base64.b64encode(bytes(payload)).decode()
    (copy / "engine.jsonl").write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    result = check_recording(copy)
    assert not result.ok and result.audit_status == 1 and result.first_difference == 0 == result.first_block_difference


def test_a_setting_the_engine_did_not_have_is_caught(tmp_path):
    "Replayed with a smaller pool (30 blocks, not 40), kvref's events differ from the engine's: the check says where."
    copy = tmp_path / "seed-0"
    shutil.copytree(GOLDEN / "seed-0", copy)
    settings = json.loads((copy / "settings.json").read_text())
    (copy / "settings.json").write_text(json.dumps({**settings, "num_gpu_blocks": 30}))
    result = check_recording(copy)
    assert not result.ok and result.audit_status == 0 and result.first_block_difference is not None


def test_the_engine_started_with_another_seed_is_named():
    "Stated with the fleet's seed, engine seed-1 fails; audited together, the fleet check names PYTHONHASHSEED."
    believed = audit_files([EngineConfig("seed-1", "0.32.0", "sha256", 32, "0")], [GOLDEN / "seed-1" / "engine.jsonl"])
    assert believed.exit_status() == 1 and "it hashes as sha256 with PYTHONHASHSEED=1" in believed.summary()
    fleet = audit_files([EngineConfig(n, "0.32.0", "sha256", 32, n[-1]) for n in ENGINES], [GOLDEN / n / "engine.jsonl" for n in ENGINES])
    assert fleet.exit_status() == 1 and "NONE_HASH: PYTHONHASHSEED 0 vs 1" in fleet.summary()


def test_replay_leaves_pythonhashseed_as_it_was(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    replay_recording(load_recording(GOLDEN / "seed-1"))
    import os
    assert os.environ["PYTHONHASHSEED"] == "7"


def test_not_a_recording_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not an engine recording: missing settings.json, requests.json, engine.jsonl"):
        load_recording(tmp_path)
    with pytest.raises(TypeError, match="folder must be a path to a recording folder, got 7"):
        load_recording(7)


def test_a_mooncake_log_of_the_traffic_misses_the_generated_block():
    "The Mooncake form of seed-0's traffic: same queries, one 32-token block fewer hits (b0 reuses a0's output)."
    from kvref.oracle.production_traces import replay_mooncake
    from kvref.oracle.recorded_engine import recording_to_mooncake
    rec = load_recording(GOLDEN / "seed-0")
    log = recording_to_mooncake(rec)
    assert len(log) == 13 and log[0].hash_ids[:3] == log[1].hash_ids[:3] != log[2].hash_ids[:3]  # a2 is salted
    s = rec.settings
    got = replay_mooncake(log, s["num_gpu_blocks"], block_size=32, ms_per_step=1, hash_block_size=32,
                          max_num_batched_tokens=s["max_num_batched_tokens"], max_num_seqs=s["max_num_seqs"])
    assert (got.queries, got.hits) == (1790, 448 - 32)


def test_through_vllm_serve_every_block_operation_agrees():
    "Over HTTP a wave's requests straddle a step: events group blocks otherwise, block operations and counters agree."
    result = check_recording(GOLDEN / "serve-seed-0")
    assert result.ok and result.first_block_difference is None and result.counters["engine"] == (1790, 448)
    assert result.num_events == (64, 65) and result.first_difference == 6


def test_llm_recordings_agree_event_by_event():
    for name in ENGINES:
        assert check_recording(GOLDEN / name).first_difference is None
