"""Recorded answers of systems of the field (golden/field/): kvref's side always, the system's where it is installed.

Re-check a new release of Dynamo or kvcached with one command (see golden/field/PROVENANCE.md):
    PYTHONPATH=DYNAMO_DIR:KVCACHED_SDIST_DIR python -m pytest tests/test_field_adapters.py
"""
import json
from pathlib import Path

import pytest

from kvref.adapters.field import (KVCACHED_FIELDS, answer_to_json, block_mm_infos, kvindex_answer, load_dynamo,
                                  load_kvcached, prompt_from_json)
from kvref.core.hashing import MultiModalItem
from kvref.core.fast_hashing import hash_request_tokens
from kvref.oracle.replay import load_trace, replay

FIELD = Path(__file__).resolve().parents[1] / "golden" / "field"
FINDINGS = json.loads((FIELD / "findings.json").read_text())
ROUTER = [f for f in FINDINGS if f["kind"] == "router"]
ALLOCATOR = [f for f in FINDINGS if f["kind"] == "allocator"]
LAYOUTS = next(f for f in FINDINGS if f["kind"] == "hash")["layouts"]


def _available(load) -> str | None:
    "None if the system imports, else why not (the skip reason)."
    try: load()
    except ImportError as e: return str(e)
    return None


NO_DYNAMO, NO_KVCACHED = _available(load_dynamo), _available(load_kvcached)


def test_every_finding_names_its_system_version_and_trace():
    assert {(f["system"], f["version"]) for f in FINDINGS} == {("dynamo", "1.6.1"), ("kvcached", "0.1.6")}
    for f in ROUTER + ALLOCATOR: assert (FIELD / f["trace"]).exists(), f["trace"]
    for f in ROUTER: assert load_trace(FIELD / f["trace"]) == f["traces"]["e"]


@pytest.mark.parametrize("finding", ROUTER, ids=lambda f: f["name"])
def test_kvref_side_of_router_findings(finding):
    "KVIndex (vLLM 0.33's semantics) gives the recorded `expected`, and the system's recorded answer differs."
    answer = kvindex_answer(finding["traces"], prompt_from_json(finding["prompt"]), finding["stream"], finding["seq"])
    assert answer_to_json(answer) == finding["expected"] != finding["got"]


@pytest.mark.parametrize("finding", ALLOCATOR, ids=lambda f: f["name"])
def test_kvref_side_of_allocator_findings(finding):
    decision = list(replay(load_trace(FIELD / finding["trace"]), version=2))[finding["index"]]
    assert {k: decision.get(k) for k in finding["expected"]} == finding["expected"] != finding["got"]


def test_kvref_hashes_three_image_layouts_apart():
    hashes = {hash_request_tokens([1, 2, 3, 4], 4, "sha256", mm_items=tuple(MultiModalItem(**m) for m in l))[0] for l in LAYOUTS}
    assert len(hashes) == 3


@pytest.mark.skipif(NO_DYNAMO is not None, reason=f"Dynamo not importable: {NO_DYNAMO}")
@pytest.mark.parametrize("finding", ROUTER, ids=lambda f: f["name"])
def test_dynamo_still_answers_as_recorded(finding):
    from kvref.adapters.field import DynamoRouter
    from kvref.oracle.router_conformance import check_router
    found = check_router(DynamoRouter, finding["traces"], prompts=[prompt_from_json(finding["prompt"])])
    assert found is not None, f"Dynamo now agrees with vLLM on {finding['name']!r}: record anew"
    assert (found.stream, found.seq, answer_to_json(found.got)) == (finding["stream"], finding["seq"], finding["got"])


@pytest.mark.skipif(NO_DYNAMO is not None, reason=f"Dynamo not importable: {NO_DYNAMO}")
def test_dynamo_hashes_three_image_layouts_alike():
    dynamo = load_dynamo()
    got = {tuple(dynamo.compute_block_hash_for_seq([1, 2, 3, 4], 4, block_mm_infos([MultiModalItem(**m) for m in l], 1, 4)))
           for l in LAYOUTS}
    assert len(got) == 1


@pytest.mark.skipif(NO_KVCACHED is not None, reason=f"kvcached not importable: {NO_KVCACHED}")
@pytest.mark.parametrize("finding", ALLOCATOR, ids=lambda f: f["name"])
def test_kvcached_still_answers_as_recorded(finding):
    from kvref.adapters.field import KvcachedAdapter
    from kvref.oracle.conformance import check
    found = check(KvcachedAdapter, FIELD / finding["trace"], fields=KVCACHED_FIELDS)
    assert found is not None, f"kvcached now agrees with vLLM on {finding['name']!r}: record anew"
    assert (found.index, {k: found.got.get(k) for k in finding["got"]}) == (finding["index"], finding["got"])


@pytest.mark.skipif(NO_KVCACHED is not None, reason=f"kvcached not importable: {NO_KVCACHED}")
def test_kvcached_agrees_elsewhere_on_the_design_doc_example():
    "On a trace without a reset or a long prompt, kvcached's pool makes vLLM's decisions (the adapter is sound)."
    from kvref.adapters.field import KvcachedAdapter
    from kvref.oracle.conformance import check
    assert check(KvcachedAdapter, FIELD.parent / "traces" / "design-doc-example.jsonl", fields=KVCACHED_FIELDS) is None


def test_missing_systems_name_what_to_install(monkeypatch):
    import sys
    for name in ("dynamo", "dynamo._core", "kvcached", "kvcached.integration.vllm.patches"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'kvref\[dynamo\]'"): load_dynamo()
    with pytest.raises(ImportError, match=r"kvref\[kvcached\]'.*PYTHONPATH"): load_kvcached()
