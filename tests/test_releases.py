"Every recorded release vector and trace reproduced; profiles equal where the recordings' README says, differ where the changelog says."
import json, os, subprocess, sys
from dataclasses import replace
from pathlib import Path
import pytest
from hypothesis import given, strategies as st
from kvref.core.hashing import LoRARequest, MultiModalItem
from kvref.core.fast_hashing import hash_request_tokens
from kvref.oracle.replay import TraceDriver, load_decisions
from kvref.oracle import releases
from kvref.oracle.releases import (PROFILES, profile_for_version, release_block_hashes, check_release_vectors, python_hash,
                            load_release_trace, replay_release, ReleaseKVCacheManager, ReleaseTraceReplayer,
                            _builtin_chain, _hash_value_chain, _hash_value_fn)

GOLDEN = Path(__file__).parent.parent / "golden" / "versions"
RELEASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
TRACES = [(v, t) for v in RELEASES for t in sorted((GOLDEN / v / "traces").glob("*.jsonl")) if ".vllm-" not in t.name]

def test_releases_present(): assert len(RELEASES) == 12 and len(TRACES) == 96

@pytest.mark.parametrize("release", RELEASES)
def test_vectors(release):
    count, mismatch = check_release_vectors(GOLDEN / release / "block-hashes.json")
    assert mismatch is None and count == 12

@pytest.mark.parametrize("release,trace", TRACES, ids=[f"{v}-{t.stem}" for v, t in TRACES])
def test_traces(release, trace):
    want = load_decisions(trace.with_name(f"{trace.stem}.vllm-{release}.jsonl"))
    assert list(replay_release(load_release_trace(trace), release)) == want

def test_release_replayer_is_a_trace_driver():
    replayer = ReleaseTraceReplayer(PROFILES["vllm_0_9"], True)
    assert isinstance(replayer, TraceDriver) and replayer.manager is None
    config = replayer.apply({"op": "config", "num_blocks": 4, "block_size": 4, "hash_algo": "xxhash"})
    assert config["hash_algo_used"] == "builtin" and isinstance(replayer.manager, ReleaseKVCacheManager)
    replayer.apply({"op": "add", "id": "r", "prompt": [1, 2, 3, 4]})
    assert replayer.apply({"op": "schedule", "id": "r"})["allocated"] is True
    assert replayer.apply({"op": "schedule", "id": "r"})["error"] == PROFILES["vllm_0_9"].zero_step_error
    with pytest.raises(ValueError, match="unknown or already freed"): replayer.apply({"op": "free", "id": "q"})

@pytest.mark.parametrize("version,name", [("0.8.5", "vllm_0_8_5"), ("0.9.0.1", "vllm_0_9"), ("0.9.1", "vllm_0_9_1"), ("0.10.0", "vllm_0_10"), ("0.10.1", "vllm_0_10_1"),
    ("0.11.0", "vllm_0_10_2"), ("0.12.3", "vllm_0_11_1"), ("0.13.0", "vllm_0_13"), ("0.18.1", "vllm_0_14"), ("0.23.9", "vllm_0_19"),
    ("0.27.1", "vllm_0_27"), ("0.28.0", "vllm_0_24"), ("0.30.0", "vllm_0_29"), ("0.32.0", "vllm_0_31"), ("v0.33.2+cpu", "vllm_0_33")])
def test_profile_for_version(version, name): assert profile_for_version(version).name == name

@pytest.mark.parametrize("version", ["0.8.4", "0.7.3", "0.34.0", "1.0.0", "", "0.x"])
def test_unknown_versions_refused(version):
    with pytest.raises(ValueError, match="0.8.5 to 0.33.x|not a vLLM release"): profile_for_version(version)

tokens = st.lists(st.integers(0, 2**20), min_size=0, max_size=40)
salts = st.none() | st.sampled_from(["X", "tenant-a", "sålt"])
loras = st.none() | st.builds(LoRARequest, st.sampled_from(["X", "sql"]), st.sampled_from(["/p", "/q"]))

def hashes(profile, toks, size, **kw):
    return release_block_hashes(PROFILES[profile], toks, size, "sha256", pythonhashseed="0", lora_int_id=1, **kw)

@given(tokens, st.integers(1, 8), salts, loras)
def test_vllm_0_33_is_kvref(toks, size, salt, lora):
    assert hashes("vllm_0_33", toks, size, cache_salt=salt, lora=lora) == hash_request_tokens(
        toks, size, "sha256", cache_salt=salt, lora=lora, seed="0")

EQUIVALENT = [("vllm_0_10_2", "vllm_0_11_1", dict(lora=None)), ("vllm_0_11_1", "vllm_0_13", {}), ("vllm_0_19", "vllm_0_24", {}),
              ("vllm_0_24", "vllm_0_27", {}), ("vllm_0_24", "vllm_0_29", {}), ("vllm_0_31", "vllm_0_33", {}),
              ("vllm_0_8_5", "vllm_0_9", dict(cache_salt=None)), ("vllm_0_9", "vllm_0_10_1", {}),
              ("vllm_0_13", "vllm_0_19", dict(mm=False)), ("vllm_0_29", "vllm_0_31", dict(lora=None, cache_salt=None, mm=False))]

@pytest.mark.parametrize("a,b,only", EQUIVALENT)
@given(toks=tokens, size=st.integers(1, 8), salt=salts, lora=loras, offset=st.integers(0, 10))
def test_equivalent_profiles_hash_equal(a, b, only, toks, size, salt, lora, offset):
    kw = dict(cache_salt=only.get("cache_salt", salt), lora=only.get("lora", lora))
    items = [MultiModalItem("img", offset, 2)] if only.get("mm", True) and offset + 2 <= len(toks) else []
    if PROFILES[a].cache_salt is False or PROFILES[b].cache_salt is False: kw["cache_salt"] = None
    ha, hb = hashes(a, toks, size, mm_items=items, **kw), hashes(b, toks, size, mm_items=items, **kw)
    assert [h.to_bytes(32, "big") if type(h) is int else h for h in ha] == [h.to_bytes(32, "big") if type(h) is int else h for h in hb]

NEIGHBOURS = [("vllm_0_8_5", "vllm_0_9", dict(cache_salt="X"), dict()), ("vllm_0_10_2", "vllm_0_11_1", dict(lora=LoRARequest("X", "/p")), {}),
              ("vllm_0_13", "vllm_0_19", dict(mm_items=[MultiModalItem("img", 1, 2)]), {}),
              ("vllm_0_29", "vllm_0_31", dict(cache_salt="X"), {}), ("vllm_0_29", "vllm_0_31", dict(lora=LoRARequest("X", "/p")), {})]

def as_bytes(hs): return [h.to_bytes(32, "big") if type(h) is int else h for h in hs]

@pytest.mark.parametrize("a,b,kw,_", NEIGHBOURS)
@given(toks=st.lists(st.integers(0, 2**20), min_size=4, max_size=40), size=st.integers(1, 4))
def test_neighbours_differ_where_the_changelog_says(a, b, kw, _, toks, size):
    ka = dict(kw) if PROFILES[a].cache_salt or "cache_salt" not in kw else {}
    assert as_bytes(hashes(a, toks, size, **ka)) != as_bytes(hashes(b, toks, size, **kw))
    assert as_bytes(hashes(a, toks, size)) == as_bytes(hashes(b, toks, size))  # the plain prompt: unchanged

@pytest.mark.parametrize("seed", ["0", "1", "4294967295"])
def test_python_hash_is_cpython(seed):
    objs = ["", "0", "sålt-ü", "日本", "\U0001F600", 2**300, -5, (7, (1, 2), ("x", 3))]
    real = subprocess.run([sys.executable, "-c", f"print([hash(o) for o in {objs!r}])"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
    assert [python_hash(o, int(seed)) for o in objs] == json.loads(real)

seeds = st.one_of(st.just(0), st.integers(1, 2**32 - 1))
key_atoms = st.lists(st.recursive(st.one_of(st.text(max_size=6), st.integers(-2**70, 2**70)),
                              lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=4), min_size=1, max_size=5)

def outcome(f):
    "What `f()` returns, or the type and message of the refusal it raises."
    try: return f()
    except (TypeError, ValueError) as e: return type(e), str(e)

def fresh(x):
    "An equal object sharing no part with `x` (small ints and 1-character strings excepted: CPython shares them)."
    return tuple(map(fresh, x)) if type(x) is tuple else "".join(list(x)) if type(x) is str else -(-x)

def both_chains(seed, none_hash, parent, tokens, size, make_keys):
    "The fast `builtin` chain and the plain definition (`_hash_value_chain` with `python_hash`) on the same input."
    fn = _hash_value_fn("builtin", str(seed))
    return [outcome(lambda: chain(fn, none_hash, parent, tokens, size, make_keys()))
            for chain in (_builtin_chain, _hash_value_chain)]

@given(seeds, st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), st.integers(-2**300, 2**300), st.text(max_size=4)),
       st.lists(st.integers(0, 2**64 - 1), max_size=40).map(tuple), st.integers(1, 8), key_atoms,
       st.lists(st.lists(st.integers(0, 4), max_size=4), min_size=1, max_size=4), st.lists(st.integers(0, 3), max_size=40),
       st.sampled_from(["shared", "copies", "fresh"]))
def test_builtin_chain_is_the_plain_definition(seed, none_hash, parent, tokens, size, atoms, shapes, picks, how):
    pool = [tuple(atoms[i % len(atoms)] for i in shape) for shape in shapes]  # keys tuples sharing items
    keys = [pool[i % len(pool)] for i in picks]  # and tuples shared by blocks, as `_block_keys` shares them
    make_keys = {"shared": lambda: keys, "copies": lambda: [tuple(list(k)) for k in keys],  # equal, distinct tuples
                 "fresh": lambda: (fresh(k) for k in keys)}[how]  # made as consumed: each freed once hashed
    fast, plain = both_chains(seed, none_hash, parent, tokens, size, make_keys)
    assert fast == plain

@given(seeds, st.sampled_from([None, True, 1.5, b"x", [1]]), st.sampled_from(["parent", "keys", "nested"]),
       st.lists(st.integers(0, 2**64 - 1), max_size=12).map(tuple), st.integers(1, 4))
def test_builtin_chain_refuses_what_the_definition_refuses(seed, bad, where, tokens, size):
    keys = [("salt", 1), (1, ("img", bad)) if where == "nested" else bad if where == "keys" else (1,), (1,)] * 4
    fast, plain = both_chains(seed, 7, bad if where == "parent" else None, tokens, size, lambda: keys)
    assert fast == plain
    reached = len(tokens) > size if where != "parent" else bool(tokens) and bad is not None  # None: NONE_HASH
    assert (type(plain) is tuple) == reached  # refused exactly when the bad item is hashed

@pytest.mark.parametrize("seed", ["0", "7", "4294967295"])
def test_builtin_chain_is_cpython(seed):
    tokens, keys = tuple(range(100, 120)), [("sålt-ü", 1), (1,), (1,), (1, "img-0"), (1, ("img-0", -2), "日本")]
    code = f"h = 5\nfor i, k in enumerate({keys!r}): h = hash((h, {tokens!r}[4 * i:4 * i + 4], k)); print(h)"
    real = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
    assert _builtin_chain(_hash_value_fn("builtin", seed), 5, None, tokens, 4, keys) == [int(h) for h in real.split()]

def test_builtin_without_the_native_hash_is_the_plain_chain(monkeypatch):
    request = dict(pythonhashseed="3", cache_salt="s", lora=LoRARequest("a", "/a"), lora_int_id=2,
                   mm_items=[MultiModalItem("img", 5, 9)])
    fast = release_block_hashes(PROFILES["vllm_0_10_1"], range(40), 4, "builtin", **request)
    monkeypatch.setattr(releases, "_NATIVE_TUPLE_HASH", False)
    assert release_block_hashes(PROFILES["vllm_0_10_1"], range(40), 4, "builtin", **request) == fast

@given(st.sampled_from(list(PROFILES)), st.integers(1, 6), st.integers(0, 40), st.integers(0, 40), st.booleans(), loras,
       st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8)), max_size=3))
def test_block_keys_share_only_where_the_definition_agrees(name, size, num_tokens, prompt_end, salted, lora, spans):
    "The shared-tuple fast path of `_block_keys` equals `release_extra_keys` block by block."
    from kvref.oracle.releases import _block_keys, release_extra_keys
    items = sorted((MultiModalItem(f"i{k}", o, n) for k, (o, n) in enumerate(spans)), key=lambda m: m.offset)
    request = dict(lora=lora, lora_int_id=1, mm_items=items, cache_salt="s" if salted else None)
    want = [release_extra_keys(PROFILES[name], s, s + size, decode=s + size > prompt_end, **request)
            for s in range(0, num_tokens // size * size, size)]
    assert _block_keys(PROFILES[name], size, 0, num_tokens // size, prompt_end, **request) == want


def test_every_profile_boundary_is_exact():
    "Issue 32 (planted bug: the 0.19.0 boundary moved): each profile's own first release selects it; the one before does not."
    for name, profile in PROFILES.items():
        assert profile_for_version(profile.first).name == name, profile.first
    assert [profile_for_version(v).name for v in ("0.18.99", "0.19.0", "0.23.99", "0.24.0")] == \
        ["vllm_0_14", "vllm_0_19", "vllm_0_19", "vllm_0_24"]
