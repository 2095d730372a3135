"""Every release's KV event layout against batches encoded by that release's own classes (`golden/events/wire/`)."""
import base64
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from kvref.distributed.kv_events import (EVENT_TYPES, WIRE_SCHEMA, BlockRemoved, BlockStored, KVEventBatch, decode_batch, encode_batch,
                             event_from_json)
from kvref.oracle.releases import PROFILES, RELEASE_RANGES, WIRE_SCHEMAS, parse_version, wire_schema

WIRE = Path(__file__).resolve().parents[1] / "golden" / "events" / "wire"
RELEASES = sorted((p.stem for p in WIRE.glob("*.jsonl")), key=lambda v: [int(x) for x in v.split(".")])


def golden(version: str) -> tuple[dict, list[dict]]:
    meta, *lines = [json.loads(line) for line in (WIRE / f"{version}.jsonl").open(encoding="utf-8")]
    return meta["meta"], lines


def batch_of(line: dict) -> KVEventBatch:
    "The batch a golden line describes, as kvref's dataclasses (fields the release lacks left at None)."
    events = [event_from_json(e, line["hash_form"]) for e in line["events"]]
    return KVEventBatch(line["ts"], events, line.get("data_parallel_rank"))


def test_every_release_with_events_is_recorded():
    assert len(RELEASES) == 43 and RELEASES[0] == "0.9.0" and RELEASES[-1] == "0.33.0"
    assert {wire_schema(v) for v in RELEASES} == set(WIRE_SCHEMAS)  # every layout is some release's


@pytest.mark.parametrize("version", RELEASES)
def test_layout_is_the_releases(version):
    "The fields and options the release's classes declare, read from them at recording time."
    layout, schema = golden(version)[0]["layout"], wire_schema(version)
    for cls in (*EVENT_TYPES.values(), KVEventBatch):
        assert tuple(layout[cls.__name__]["fields"]) == schema.names(cls), cls.__name__
    for name in EVENT_TYPES:
        assert layout[name]["array_like"] == schema.events_as_arrays and layout[name]["tag"] == name
        assert layout[name]["omit_defaults"]
    assert layout["KVEventBatch"]["array_like"] and layout["KVEventBatch"]["tag"] is None
    # the fields with defaults are kvref's None-default ones: the others are always written
    for cls in (*EVENT_TYPES.values(), KVEventBatch):
        defaulted = [f.name for f in fields(cls) if f.default is None and f.name in schema.names(cls)]
        assert layout[cls.__name__]["defaults"] == len(defaulted), cls.__name__


@pytest.mark.parametrize("version", RELEASES)
def test_encode_is_byte_exact(version):
    schema = wire_schema(version)
    for line in golden(version)[1]:
        assert encode_batch(batch_of(line), schema) == base64.b64decode(line["payload_b64"]), line["name"]


@pytest.mark.parametrize("version", RELEASES)
def test_decode_gives_the_batch(version):
    schema = wire_schema(version)
    for line in golden(version)[1]:
        payload = base64.b64decode(line["payload_b64"])
        if line["name"] == "signed-hashes" and not schema.signed_hashes:  # encodable, but never sent from 0.10.2 on
            with pytest.raises(ValueError, match="64-bit unsigned int"): decode_batch(payload, schema=schema)
            continue
        assert decode_batch(payload, line["hash_form"], line["name"], schema) == batch_of(line), line["name"]


def test_neighbours_do_not_decode_each_other():
    "Every-field batches of one layout, read with the layout before or after: refused, or they re-encode differently."
    for before, after in zip(WIRE_SCHEMAS, WIRE_SCHEMAS[1:]):
        newer = base64.b64decode(next(l for l in golden(after.first)[1] if l["name"] == "every-field")["payload_b64"])
        with pytest.raises(ValueError): decode_batch(newer, schema=before)
        older = base64.b64decode(next(l for l in golden(before.first)[1] if l["name"] == "every-field")["payload_b64"])
        try: decoded = decode_batch(older, schema=after)
        except ValueError: continue
        # maps whose new fields are None-default and whose header forms stay the same send the same bytes
        same_header = all((len(before.names(c)) + 1 < 16) == (len(after.names(c)) + 1 < 16) for c in (BlockStored, BlockRemoved))
        assert (encode_batch(decoded, after) == older) == (not after.events_as_arrays and same_header), after.first


def test_the_issue_example_0_32_against_0_33():
    "0.32's BlockStored map header is the fixmap 0x8b, 0.33's the map16 de 00 0b: two bytes per event."
    a = base64.b64decode(golden("0.32.0")[1][0]["payload_b64"])
    b = base64.b64decode(golden("0.33.0")[1][0]["payload_b64"])
    assert (a[11], b[11:14], len(b) - len(a)) == (0x8B, b"\xde\x00\x0b", 2)


def test_planted_bug_is_caught():
    "A layout with two fields swapped, or the events as arrays, no longer gives a release's bytes."
    line = next(l for l in golden("0.32.0")[1] if l["name"] == "every-field")
    want, schema = base64.b64decode(line["payload_b64"]), wire_schema("0.32.0")
    swapped = replace(schema, stored=schema.stored[:4] + (schema.stored[5], schema.stored[4]) + schema.stored[6:])
    assert encode_batch(batch_of(line), swapped) != want
    assert encode_batch(batch_of(line), replace(schema, events_as_arrays=True)) != want


def test_signed_hashes_only_before_0_10_2():
    line = next(l for l in golden("0.10.1.1")[1] if l["name"] == "signed-hashes")
    payload = base64.b64decode(line["payload_b64"])
    assert decode_batch(payload, schema=wire_schema("0.10.1.1")).events[0].block_hashes == [-5, -(2**63)]
    with pytest.raises(ValueError, match="64-bit unsigned int"):
        decode_batch(payload, schema=replace(wire_schema("0.10.1.1"), signed_hashes=False))


def test_every_profile_with_events_has_a_layout():
    for first, name in RELEASE_RANGES:
        if name is None: continue
        version = ".".join(map(str, first))
        if PROFILES[name].kv_events is None:
            with pytest.raises(ValueError, match="no KV events"): wire_schema(version)
        else: assert wire_schema(version) in WIRE_SCHEMAS
    assert wire_schema("0.33.0") is WIRE_SCHEMA


def test_cli_events_writes_the_releases_bytes(capsys):
    "`kvref events --vllm-version 0.32.0` on design-doc-example gives 0.32.0's own bytes for its four batches."
    from kvref.cli import main
    trace = WIRE.parents[1] / "traces" / "design-doc-example.jsonl"
    for version in ("0.32.0", "0.23.0", "0.33.0"):
        assert main(["events", str(trace), "--dp-rank", "0", "--vllm-version", version]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        got = [r["payload_b64"] for r in records if r["payload_b64"]]
        want = [l["payload_b64"] for l in golden(version)[1] if l["name"].startswith("design-doc-example")]
        assert got == want, version
        first = next(r for r in records if r["events"])["events"][0]
        assert list(first)[1:] == list(wire_schema(version).stored)
    assert main(["events", str(trace), "--vllm-version", "0.9.2"]) == 2
    assert "publishes int hash values" in capsys.readouterr().err


def test_provenance_lists_every_file():
    lines = (WIRE / "PROVENANCE.md").read_text(encoding="utf-8").split("sha256:")[1].split()
    import hashlib
    listed = dict(zip(lines[1::2], lines[::2]))
    assert listed == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in WIRE.glob("*.jsonl")}
