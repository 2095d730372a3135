"""KV events (nbs/03a_kv_events.ipynb): every recorded vLLM 0.33 payload reproduced from its events, decoded back,
and consumed by KVIndex; the decoder and the index never crash on a malformed stream and never half-apply one."""
import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import sys

from kvref.core import block_pool
from kvref.distributed import kv_events
from kvref.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KVIndex, decode_batch,
                             encode_batch, event_from_json, event_to_json)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "events"
FILES = sorted(GOLDEN.glob("*.events*.jsonl"))
FORM = {f: "bytes" if f.name.endswith(".bytes.jsonl") else "int" for f in FILES}


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_all_recordings_present():
    assert len(FILES) == 12 and sum(FORM[f] == "bytes" for f in FILES) == 6


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_payloads_byte_for_byte(path):
    "Each op's recorded events, encoded, give the recorded payload (rank nil) and the rank-0 payload."
    n = 0
    for line in lines(path):
        if line["seq"] is None:
            assert line["events"] == [] and line["payload_b64"] is None
            continue
        events = [event_from_json(e, FORM[path]) for e in line["events"]]
        assert [event_to_json(e) for e in events] == line["events"]
        assert base64.b64encode(encode_batch(KVEventBatch(0.0, events))).decode() == line["payload_b64"]
        assert base64.b64encode(encode_batch(KVEventBatch(0.0, events, 0))).decode() == line["payload_dp0_b64"]
        assert decode_batch(base64.b64decode(line["payload_b64"]), FORM[path]) == KVEventBatch(0.0, events)
        n += 1
    assert n > 0


def block_size(path):
    return next(e for line in lines(path) for e in line["events"] if e["type"] == "BlockStored")["block_size"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_index_consumes_every_recording(path):
    "KVIndex takes each recorded stream whole: no gap, no unknown parent, no removal of a hash not stored."
    index = KVIndex(block_size(path), hash_form=FORM[path])
    for line in lines(path):
        if line["seq"] is not None: index.apply("e", line["seq"], base64.b64decode(line["payload_dp0_b64"]))
    assert index.next_seq["e"] == max(line["seq"] for line in lines(path) if line["seq"] is not None) + 1


def test_duplicates_are_counted_in_recordings():
    "The recordings hold duplicate stores (a hash stored while a copy is cached): the index counts 2 copies."
    seen_two = 0
    for path in (p for p in FILES if FORM[p] == "int"):
        index = KVIndex(block_size(path))
        for line in lines(path):
            if line["seq"] is None: continue
            index.apply("e", line["seq"], base64.b64decode(line["payload_dp0_b64"]))
            seen_two += any(n == 2 for n in index.engines[("e", 0)].values())
    assert seen_two > 0


def test_other_hash_form_refused_by_name():
    path = GOLDEN / "design-doc-example.events.bytes.jsonl"
    payload = base64.b64decode(next(l for l in lines(path) if l["seq"] == 0)["payload_b64"])
    with pytest.raises(ValueError, match=r"stream 'e', batch seq 0, events\[0\]: BlockStored.block_hashes must be .*hash form 'int'"):
        KVIndex(4).apply("e", 0, payload)


def test_map_header_trap():
    "BlockStored's header is map16 even with 11 entries; BlockRemoved's is a fixmap; the batch is a 3-array."
    stored = encode_batch(KVEventBatch(0.0, [BlockStored([1], None, [1, 2], 2, None, "GPU", None, [None], 0)]))
    assert stored[10:14] == bytes.fromhex("91 de 00 0a")
    removed = encode_batch(KVEventBatch(0.0, [BlockRemoved([1], "GPU", 0)]))
    assert removed[:1] == b"\x93" and removed[10:12] == bytes.fromhex("91 84") and removed[-1:] == b"\xc0"


@pytest.mark.parametrize("n, hexed", [(0, "00"), (127, "7f"), (128, "cc 80"), (255, "cc ff"), (256, "cd 01 00"),
                                      (65536, "ce 00 01 00 00"), (2**32, "cf 00 00 00 01 00 00 00 00"), (-1, "ff"),
                                      (-32, "e0"), (-33, "d0 df"), (-128, "d0 80"), (-129, "d1 ff 7f"),
                                      (-32769, "d2 ff ff 7f ff"), (-2**31 - 1, "d3 ff ff ff ff 7f ff ff ff")])
def test_int_widths(n, hexed):
    payload = encode_batch(KVEventBatch(0.0, [BlockStored([1], None, [], 1, None, None, None, [[n]])]))
    assert bytes.fromhex(hexed) in payload
    assert decode_batch(payload).events[0].extra_keys == [[n]]


@pytest.mark.parametrize("text, head", [("", "a0"), ("x" * 31, "bf"), ("x" * 32, "d9 20"), ("x" * 256, "da 01 00")])
def test_str_widths(text, head):
    payload = encode_batch(KVEventBatch(0.0, [BlockStored([1], None, [], 1, None, None, text)]))
    assert bytes.fromhex(head) + text.encode() in payload and decode_batch(payload).events[0].lora_name == text


def test_array_widths():
    for n, head in ((15, "9f"), (16, "dc 00 10"), (70000, "dd 00 01 11 70")):
        payload = encode_batch(KVEventBatch(0.0, [BlockStored([1], None, [5] * n, 1, None, None, None)]))
        assert bytes.fromhex(head) + b"\x05" * n in payload
        assert len(decode_batch(payload).events[0].token_ids) == n


hashes_int = st.integers(0, 2**64 - 1)
extra = st.recursive(st.none() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=40),
                     lambda inner: st.lists(inner, max_size=4), max_leaves=8)


@st.composite
def stored(draw):
    block_hashes = draw(st.lists(hashes_int, min_size=1, max_size=5))
    keys = draw(st.none() | st.lists(extra, min_size=len(block_hashes), max_size=len(block_hashes)))
    return BlockStored(block_hashes, draw(st.none() | hashes_int), draw(st.lists(st.integers(0, 2**64 - 1), max_size=40)),
                       draw(st.integers(1, 2**20)), draw(st.none() | st.integers(0, 2**31)), draw(st.none() | st.just("GPU")),
                       draw(st.none() | st.text(max_size=300)), keys, draw(st.none() | st.integers(0, 70000)),
                       draw(st.none() | st.just("full_attention")))



removed = st.builds(BlockRemoved, st.lists(hashes_int, min_size=1, max_size=2), st.none() | st.just("GPU"),
                    st.none() | st.integers(0, 3))
batches = st.builds(KVEventBatch, st.floats(allow_nan=False, allow_infinity=False),
                    st.lists(stored() | removed | st.just(AllBlocksCleared()), max_size=20), st.none() | st.integers(0, 2**16))


@given(batches)
def test_decode_inverts_encode(batch):
    assert decode_batch(encode_batch(batch)) == batch


@given(batches, st.data())
def test_malformed_payloads_get_value_errors(batch, data):
    "Truncated, corrupted or extended payloads: a ValueError naming the batch, never another exception."
    payload = bytearray(encode_batch(batch))
    how = data.draw(st.sampled_from(["cut", "flip", "append"]))
    if how == "cut": payload = payload[:data.draw(st.integers(0, len(payload) - 1))]
    elif how == "flip": payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    else: payload += bytes(data.draw(st.binary(min_size=1, max_size=4)))
    try: decode_batch(bytes(payload), where="stream 's', batch seq 9")
    except ValueError as e: assert str(e).startswith("stream 's', batch seq 9")


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(payload):
    try: decode_batch(payload)
    except ValueError: pass


@given(st.lists(st.sampled_from(["store", "store-dup", "remove", "clear", "bad-parent", "bad-remove"]), max_size=30))
def test_refused_batch_changes_nothing(steps):
    "A batch refused anywhere (even after valid events in the same batch) leaves the index as it was."
    index, seq = KVIndex(2), 0
    for i, step in enumerate(steps):
        held = list(index.engines.get(("s", 0), {}))
        last = held[-1:] or [10**9]
        events = {"store": [BlockStored([i], last[0] if held else None, [1, 2], 2, None, "GPU", None)],
                  "store-dup": [BlockStored(last, None, [1, 2], 2, None, "GPU", None)],
                  "remove": [BlockRemoved(last, "GPU")],
                  "clear": [AllBlocksCleared()],
                  "bad-parent": [BlockStored([i], 10**9 + 1, [1, 2], 2, None, "GPU", None)],
                  "bad-remove": [BlockRemoved([10**9 + 2], "GPU")]}[step]
        before = ({k: dict(v) for k, v in index.engines.items()}, dict(index.next_seq))
        first = BlockStored([10**6 + i], None, [1, 2], 2, None, "GPU", None)  # a valid event before the bad one
        try: index.apply("s", seq, KVEventBatch(0.0, [first] + events, 0))
        except ValueError:
            assert step.startswith("bad") or (step in ("remove", "store-dup") and not held)
            assert ({k: dict(v) for k, v in index.engines.items()}, dict(index.next_seq)) == before
            continue
        seq += 1


def test_fast_path_without_msgspec(monkeypatch):
    "Without msgspec, encode_batch_fast is the plain encoder."
    monkeypatch.setitem(sys.modules, "msgspec", None)
    kv_events.msgspec_types.cache_clear()
    try:
        batch = KVEventBatch(0.0, [BlockRemoved([5], "GPU", 0)])
        assert kv_events.encode_batch_fast(batch) == encode_batch(batch)
        pool = [block_pool.BlockRemoved([bytes(32)]), block_pool.AllBlocksCleared()]
        assert kv_events.wire_batch_fast(pool, "bytes", ts=1.5) == KVEventBatch(1.5, kv_events.wire_events(pool, "bytes"))
        with pytest.raises(TypeError, match="cannot encode set"):
            kv_events.encode_batch_fast(KVEventBatch(0.0, [BlockRemoved([{1}], "GPU")]))
    finally: kv_events.msgspec_types.cache_clear()
