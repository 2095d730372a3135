"""kvref's plain msgpack encoder against msgspec, the library vLLM's publisher uses (skipped when msgspec is absent).

The structs below restate vLLM 0.33.0's `vllm/distributed/kv_events.py` wire types (fields, defaults, tags,
array-like batch); every batch hypothesis draws must encode to the same bytes and decode back the same way."""
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

msgspec = pytest.importorskip("msgspec")

from kvref.core import block_pool  # noqa: E402
from kvref.distributed.kv_events import (KVEventBatch, decode_batch, encode_batch, encode_batch_fast, event_from_json,  # noqa: E402
                             msgspec_types, wire_batch_fast, wire_events)
from kvref.distributed.kv_events import BlockRemoved as WireRemoved  # noqa: E402
from test_kv_events import FILES, FORM, batches, lines  # noqa: E402


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: Any = None
    ownership: Any = None
    session_id: Any = None
    lookahead_token_ids: Any = None


class BlockRemoved(_Event):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: Any = None
    ownership: Any = None


class AllBlocksCleared(_Event):
    pass


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


CLASSES = {c.__name__: c for c in (BlockStored, BlockRemoved, AllBlocksCleared)}


def as_msgspec(batch: KVEventBatch) -> Batch:
    events = [CLASSES[type(e).__name__](**{f: getattr(e, f) for f in CLASSES[type(e).__name__].__struct_fields__})
              for e in batch.events]
    return Batch(batch.ts, events, batch.data_parallel_rank)


@given(batches)
def test_same_bytes_as_msgspec(batch):
    assert encode_batch(batch) == msgspec.msgpack.encode(as_msgspec(batch))


@given(batches)
def test_msgspec_decodes_kvref_bytes(batch):
    decoded = msgspec.msgpack.decode(encode_batch(batch), type=Batch)
    assert msgspec.msgpack.encode(decoded) == encode_batch(batch)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_msgspec_agrees_on_recordings(path):
    for line in lines(path):
        if line["seq"] is None: continue
        batch = KVEventBatch(0.0, [event_from_json(e, FORM[path]) for e in line["events"]])
        assert base64.b64encode(msgspec.msgpack.encode(as_msgspec(batch))).decode() == line["payload_b64"]


@given(batches)
def test_fast_path_equals_plain(batch):
    assert encode_batch_fast(batch) == encode_batch(batch)


digests = st.binary(min_size=32, max_size=32)
tagged_key = (st.tuples(st.just("mm"), st.text(max_size=8), st.integers(-2**20, 2**20))
              | st.tuples(st.just("salt"), st.text(max_size=8)))


@st.composite
def pool_stored(draw):
    "A pool BlockStored: digests, maybe a LoRA (its key first in the first block's keys), tagged extra keys."
    n = draw(st.integers(1, 4))
    lora = draw(st.none() | st.tuples(st.text(min_size=1, max_size=6), st.sampled_from(["/a", "/b"])))
    keys = draw(st.none() | st.lists(st.none() | st.tuples(tagged_key), min_size=n, max_size=n))
    if lora:
        keys = keys or [None] * n
        keys[0] = (("lora", *lora),) + (keys[0] or ())
    return block_pool.BlockStored(draw(st.lists(digests, min_size=n, max_size=n)), draw(st.none() | digests),
                                  draw(st.lists(st.integers(0, 2**20), max_size=3 * n)), 3, lora and lora[0], keys)


pool_events = st.lists(pool_stored() | st.builds(block_pool.BlockRemoved, st.lists(digests, min_size=1, max_size=3))
                       | st.just(block_pool.AllBlocksCleared()), max_size=12)


@given(pool_events, st.sampled_from(["int", "bytes"]), st.floats(allow_nan=False, allow_infinity=False),
       st.none() | st.integers(0, 2**16))
def test_fast_batch_equals_plain(events, form, ts, rank):
    "Pool events built straight into msgspec twins encode to the plain encoder's bytes for the plain wire events."
    fast = wire_batch_fast(events, form, {}, ts=ts, data_parallel_rank=rank)
    assert type(fast) is not KVEventBatch  # the twin, not the dataclass
    assert encode_batch_fast(fast) == encode_batch(KVEventBatch(ts, wire_events(events, form, {}), rank))


@given(batches)
def test_any_twin_batch_equals_plain(batch):
    "Any wire batch, restated as twins, encodes to the plain bytes."
    twins, _ = msgspec_types()
    events = [twins[type(e)](*(getattr(e, n) for n in twins[type(e)].__struct_fields__)) for e in batch.events]
    assert encode_batch_fast(twins[KVEventBatch](batch.ts, events, batch.data_parallel_rank)) == encode_batch(batch)


def test_fast_batch_refusals_name_the_field():
    twins, _ = msgspec_types()
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        encode_batch_fast(twins[KVEventBatch](0.0, [twins[WireRemoved]([2**64], "GPU")]))
    with pytest.raises(TypeError, match="KVEventBatch.ts must be a float"):
        wire_batch_fast([], ts=1)
    with pytest.raises(TypeError, match=r"KVEventBatch.events\[0\] must be a BlockStored, BlockRemoved or AllBlocksCleared, got Foreign"):
        encode_batch_fast(twins[KVEventBatch](0.0, [Foreign(2**64)]))


class Foreign(msgspec.Struct):
    "A Struct that is no wire event's twin."
    n: int
