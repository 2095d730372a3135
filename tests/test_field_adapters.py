"""Recorded answers of systems of the field (golden/field/): kvref's side always, the system's where it is installed.

Re-check a new release of Dynamo or kvcached with one command (see golden/field/PROVENANCE.md):
    PYTHONPATH=DYNAMO_DIR:KVCACHED_SDIST_DIR python -m pytest tests/test_field_adapters.py
SGLang and LMCache need torch, transformers and (for LMCache) vLLM, so they are driven in a subprocess of the Python
named by KVREF_FIELD_PYTHON (one with sglang 0.5.x and lmcache 0.5.x installed):
    KVREF_FIELD_PYTHON=/path/to/venv/bin/python python -m pytest tests/test_field_adapters.py
"""
import json, os, subprocess
from pathlib import Path

import pytest

from kvref.adapters.field import (KVCACHED_FIELDS, answer_to_json, block_mm_infos, kvindex_answer, lmcache_chunk_hashes,
                                  load_dynamo, load_kvcached, load_lmcache, load_sglang, prompt_from_json)
from kvref.core.hashing import LoRARequest, MultiModalItem, get_hash_fn_by_name, init_none_hash
from kvref.core.fast_hashing import hash_request_tokens
from kvref.oracle.replay import load_trace, replay

FIELD = Path(__file__).resolve().parents[1] / "golden" / "field"
FINDINGS = json.loads((FIELD / "findings.json").read_text())
ROUTER = [f for f in FINDINGS if f["kind"] == "router"]
DYNAMO_ROUTER = [f for f in ROUTER if f["system"] == "dynamo"]
SGLANG = next(f for f in FINDINGS if f["system"] == "sglang")
LMCACHE = {f["name"]: f for f in FINDINGS if f["system"] == "lmcache"}
CHAINED, PER_PROCESS, NO_SALT = (LMCACHE[n] for n in ("vLLM's hash and seed, chained differently",
                                                      "Python's per-process hash() by default", "salt, LoRA and images not in its key"))
FIELD_PYTHON = os.environ.get("KVREF_FIELD_PYTHON")
ALLOCATOR = [f for f in FINDINGS if f["kind"] == "allocator"]
LAYOUTS = next(f for f in FINDINGS if f["kind"] == "hash")["layouts"]


def _available(load) -> str | None:
    "None if the system imports, else why not (the skip reason)."
    try: load()
    except ImportError as e: return str(e)
    return None


NO_DYNAMO, NO_KVCACHED = _available(load_dynamo), _available(load_kvcached)


def test_every_finding_names_its_system_version_and_trace():
    assert {(f["system"], f["version"]) for f in FINDINGS} == {("dynamo", "1.6.1"), ("kvcached", "0.1.6"), ("sglang", "0.5.23"),
                                                               ("lmcache", "0.5.6")}
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
@pytest.mark.parametrize("finding", DYNAMO_ROUTER, ids=lambda f: f["name"])
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
    for name in ("dynamo", "dynamo._core", "kvcached", "kvcached.integration.vllm.patches", "sglang", "sglang.srt",
                 "sglang.srt.mem_cache.radix_cache", "lmcache", "lmcache.v1", "lmcache.v1.token_database"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'kvref\[dynamo\]'"): load_dynamo()
    with pytest.raises(ImportError, match=r"kvref\[kvcached\]'.*PYTHONPATH"): load_kvcached()
    with pytest.raises(ImportError, match=r"pip install --no-deps sglang==0\.5\.23"): load_sglang()
    with pytest.raises(ImportError, match=r"pip install --no-deps lmcache==0\.5\.6"): load_lmcache()


def test_sglang_record_one_chain_unnamed_three_named():
    "SGLang's recorded hashes: the base model, adapter x and adapter y share one chain unless the names are registered."
    assert len({tuple(h) for h in SGLANG["hashes"].values()}) == 1
    assert len({tuple(h) for h in SGLANG["extra_key_hashes"]}) == 1
    assert len({tuple(h) for h in SGLANG["named_hashes"].values()}) == 3 and SGLANG["named_agrees"]
    assert SGLANG["expected"] == [] and SGLANG["got"] == [["e", 0, 2]]


def test_lmcache_chain_rebuilt_by_kvref_and_never_vllms():
    none_hash = init_none_hash("sha256_cbor")
    assert CHAINED["none_hash"] == int.from_bytes(none_hash[:8], "big")
    sha = get_hash_fn_by_name("sha256_cbor")
    assert lmcache_chunk_hashes(CHAINED["tokens"], 4, sha, none_hash, CHAINED["save_unfull_chunk"]) == CHAINED["keys"]
    vllm = hash_request_tokens(CHAINED["tokens"], 4, "sha256_cbor")
    assert not set(CHAINED["keys"]) & {int.from_bytes(h[:8], "big") for h in vllm}


def test_lmcache_default_keys_differ_per_process_and_rebuild_with_python_hash():
    runs = PER_PROCESS["runs"]
    assert [lmcache_chunk_hashes(PER_PROCESS["tokens"], r["chunk_size"], hash, r["none_hash"]) for r in runs] == [r["keys"] for r in runs]
    assert runs[0]["keys"] != runs[1]["keys"] and {r["hash_func"] for r in runs} == {"hash"}


def test_lmcache_key_has_no_salt_lora_or_image_while_vllms_hash_does():
    assert not {"cache_salt", "lora", "lora_request", "mm_items", "mm_hashes", "extra_keys"} & set(NO_SALT["process_tokens_parameters"])
    tokens, plain = NO_SALT["tokens"], hash_request_tokens(NO_SALT["tokens"], 4)[0]
    for request in (dict(cache_salt="tenant-a"), dict(lora=LoRARequest("x", "/p1")), dict(mm_items=(MultiModalItem("img-1", 0, 2),))):
        assert hash_request_tokens(tokens, 4, **request)[0] != plain, request


def test_lmcache_chunk_hashes_full_chunks_only():
    sha, none_hash = get_hash_fn_by_name("sha256_cbor"), init_none_hash("sha256_cbor")
    assert len(lmcache_chunk_hashes(list(range(9)), 4, sha, none_hash)) == 3
    assert lmcache_chunk_hashes(list(range(9)), 4, sha, none_hash, False) == lmcache_chunk_hashes(list(range(8)), 4, sha, none_hash)


@pytest.fixture(scope="module")
def field_answers():
    "SGLang's and LMCache's answers now, from scripts/record-field-sglang-lmcache --print run by KVREF_FIELD_PYTHON."
    root = FIELD.parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PYTHONHASHSEED", None)
    out = subprocess.run([FIELD_PYTHON, str(root / "scripts" / "record-field-sglang-lmcache"), "--print"], env=env, cwd=root,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return {f["name"]: f for f in json.loads(next(l for l in out.stdout.splitlines() if l.startswith("KVREF-JSON "))[11:])}


NO_FIELD_PYTHON = "KVREF_FIELD_PYTHON is not set (a Python with sglang 0.5.x and lmcache 0.5.x, which the default environment lacks)"


@pytest.mark.skipif(not FIELD_PYTHON, reason=NO_FIELD_PYTHON)
def test_sglang_still_answers_as_recorded(field_answers):
    assert field_answers[SGLANG["name"]] == SGLANG, "SGLang answers differently now: record anew"


@pytest.mark.skipif(not FIELD_PYTHON, reason=NO_FIELD_PYTHON)
def test_lmcache_still_answers_as_recorded(field_answers):
    assert field_answers[CHAINED["name"]] == CHAINED and field_answers[NO_SALT["name"]] == NO_SALT
    runs = field_answers[PER_PROCESS["name"]]["runs"]  # fresh processes: fresh keys, each rebuilt by kvref
    assert runs[0]["keys"] != runs[1]["keys"]
    assert [lmcache_chunk_hashes(PER_PROCESS["tokens"], r["chunk_size"], hash, r["none_hash"]) for r in runs] == [r["keys"] for r in runs]
