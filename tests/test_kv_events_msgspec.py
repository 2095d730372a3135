"""kvref's plain msgpack encoder against msgspec, the library vLLM's publisher uses (skipped when msgspec is absent).

The structs below restate vLLM 0.33.0's `vllm/distributed/kv_events.py` wire types (fields, defaults, tags,
array-like batch); every batch hypothesis draws must encode to the same bytes and decode back the same way."""
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

msgspec = pytest.importorskip("msgspec")

from kvref.kv_events import KVEventBatch, decode_batch, encode_batch, encode_batch_fast, event_from_json  # noqa: E402
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
