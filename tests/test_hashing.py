"""Properties of kvref.core.hashing: a naive model of vLLM 0.33's block hasher, prefix/salt/LoRA properties,
incremental == batch (a state machine), the CBOR fast path, errors and the `kvref hash` command."""
from __future__ import annotations
import hashlib, json, pickle, re, struct
from array import array
from unittest.mock import patch

import cbor2
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvref.core import hashing as H
from kvref.core import fast_hashing as F
from kvref.core.hashing import (LoRARequest, MultiModalItem, block_hash_to_int64, generate_block_hash_extra_keys,
                           get_hash_fn_by_name, hash_block_tokens, init_none_hash,
                           request_block_hashes)
from kvref.core.fast_hashing import hash_request_tokens
from kvref.cli import hash_main

xxhash = pytest.importorskip("xxhash")
SEED = "vllm-none-hash"
ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


# --- a deliberately naive model, written from the description, one block at a time --------------------
def _serialize(algo, obj):
    return pickle.dumps(obj, protocol=5) if algo in ("sha256", "xxhash") else cbor2.dumps(obj, canonical=True)

def _digest(algo, data):
    return hashlib.sha256(data).digest() if algo.startswith("sha256") else xxhash.xxh3_128_digest(data)

def own(s: str) -> str:
    "An equal string as a separate object, as a server decodes each string of a request (pickle memoizes by identity)."
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def naive_hashes(tokens, block_size, algo="sha256", salt=None, lora=None, mm=(), embeds=None, seed=SEED):
    H_ = lambda obj: _digest(algo, _serialize(algo, obj))
    parent, out = H_(seed), []
    for b in range(len(tokens) // block_size):
        start, end = b * block_size, (b + 1) * block_size
        keys = []
        if lora is not None: keys.append(("lora", own(lora.name), own(lora.path)))
        for item in sorted(mm, key=lambda m: m.offset):
            if item.offset < end and item.offset + item.length > start:
                keys.append(("mm", own(item.identifier), item.offset - start))
        if b == 0 and salt: keys.append(("cache_salt", own(salt)))
        if embeds is not None:
            keys.append(("prompt_embeds", hashlib.sha256(np.ascontiguousarray(embeds[start:end]).tobytes()).digest()))
        parent = H_((parent, tuple(tokens[start:end]), tuple(keys) if keys else None))
        out.append(parent)
    return out


# --- strategies -----------------------------------------------------------------------------------------------
token = st.one_of(st.integers(0, 200_000), st.sampled_from([0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
                                                             2**63, 2**64 - 1]))
long_tokens = st.builds(lambda n, seed: np.random.default_rng(seed).integers(0, 200_000, n).tolist(),
                        st.integers(41, 400), st.integers(0, 2**32 - 1))  # many blocks, cheaply: chunk edges get crossed
tokens_st = st.one_of(st.lists(token, max_size=40), long_tokens)
block_sizes = st.one_of(st.integers(1, 9), st.integers(10, 100))  # small ones often; odd sizes that divide no chunk
salts = st.one_of(st.none(), st.text(max_size=6))
loras = st.one_of(st.none(), st.builds(LoRARequest, st.text(max_size=4), st.text(max_size=6)))

@st.composite
def mm_items_for(draw, num_tokens):
    "Disjoint placeholder ranges inside `num_tokens` tokens, in random order."
    items, cursor = [], draw(st.integers(0, 3))
    for k in range(draw(st.integers(0, 4))):
        length = draw(st.integers(1, 20))
        if cursor + length > num_tokens: break
        items.append(MultiModalItem(f"img{k}-{draw(st.integers(0, 9))}", cursor, length))
        cursor += length + draw(st.integers(0, 5))
    return draw(st.permutations(items))

@st.composite
def requests(draw, algos=ALGOS, embeds=True):
    toks = draw(tokens_st)
    req = dict(token_ids=toks, block_size=draw(block_sizes), algo=draw(st.sampled_from(algos)),
               cache_salt=draw(salts), lora=draw(loras), mm_items=draw(mm_items_for(len(toks))), seed=SEED)
    if embeds and draw(st.booleans()):
        req["prompt_embeds"] = np.arange(len(toks) * 3, dtype=np.float32).reshape(len(toks), 3) * draw(st.integers(1, 9))
    return req

def naive_of(req):
    return naive_hashes(req["token_ids"], req["block_size"], req["algo"], req["cache_salt"], req["lora"],
                        req["mm_items"], req.get("prompt_embeds"), req["seed"])


# --- differential: kvref equals the naive model -----------------------------------------------------------------
@given(requests(), st.one_of(st.integers(1, 300), st.just(F._CHUNK_TOKENS)))
def test_matches_naive_model(req, chunk_tokens):
    with patch.object(F, "_CHUNK_TOKENS", chunk_tokens):  # chunk boundaries anywhere, not only past 8192 tokens
        assert hash_request_tokens(**req) == naive_of(req)

@given(requests(), st.one_of(st.integers(1, 300), st.just(F._CHUNK_TOKENS)))
def test_fast_path_equals_the_definition(req, chunk_tokens):
    "hash_request_tokens (checked, chunked, shared keys, pre-encoded CBOR) == the chapter's request_block_hashes."
    with patch.object(F, "_CHUNK_TOKENS", chunk_tokens):
        assert hash_request_tokens(**req) == request_block_hashes(**req)
    cut = len(req["token_ids"]) // 2  # incrementally too: the definition chains onto known hashes the same way
    inside = [item for item in req["mm_items"] if item.offset + item.length <= cut]  # items the prefix holds whole
    known = request_block_hashes(**{**req, "token_ids": req["token_ids"][:cut], "mm_items": inside})
    assert hash_request_tokens(**req, known_hashes=known) == request_block_hashes(**req, known_hashes=known)

@given(requests(), st.one_of(st.integers(1, 300), st.just(F._CHUNK_TOKENS)))
def test_trusted_body_equals_the_checked_path(req, chunk_tokens):
    "`_hash_request_blocks` with `ids_checked=True` (what the KV cache manager calls) == hash_request_tokens."
    items = sorted(req["mm_items"], key=lambda item: item.offset)
    body = dict(req, mm_items=items, prompt_embeds=req.get("prompt_embeds"), ids_checked=True)
    with patch.object(F, "_CHUNK_TOKENS", chunk_tokens):
        want = hash_request_tokens(**req)
        assert F._hash_request_blocks(**body, known_hashes=[]) == want
        known = want[:len(want) // 2]  # incrementally too
        assert F._hash_request_blocks(**body, known_hashes=known) == want

uint_edges = st.lists(st.one_of(st.integers(0, 2**32 + 5), st.sampled_from([0, 255, 256, 2**31, 2**32 - 1, 2**32,
                                                                               2**63, 2**64 - 1, 2**64, -1])),
                      max_size=40)

@given(uint_edges, st.sampled_from("IQ"), st.booleans())
def test_uint_values_by_array_equal_struct(values, code, odd):
    "`array`'s values (native order) == `struct`'s (little-endian, the fallback), and both refuse the same ids."
    if odd and values: values[len(values) // 2] = 1.0
    values = tuple(values)
    layout = f"<{len(values)}{code}"
    try: want = list(struct.unpack(layout, struct.pack(layout, *values)))
    except Exception: want = None
    got = F._uint_values(values, code)
    assert (got if got is None else got.tolist()) == want
    with patch.object(F, "_array_dtypes", lambda: {}):  # a platform where C's unsigned int is not 4 bytes: struct does it
        got = F._uint_values(values, code)
        assert (got if got is None else got.tolist()) == want
    assert code in F._array_dtypes()  # this platform takes the array route

@pytest.mark.parametrize("algo", ALGOS)
def test_long_request_crosses_chunks(algo):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 200_000, 3 * F._CHUNK_TOKENS + 100).tolist()
    mm = [MultiModalItem("a", 8000, 500), MultiModalItem("b", 16380, 20)]
    req = dict(token_ids=toks, block_size=16, algo=algo, cache_salt="t", lora=LoRARequest("l", "/p"), mm_items=mm, seed=SEED)
    assert hash_request_tokens(**req) == naive_of(req)
    assert hash_request_tokens(toks, 64, algo, seed=SEED) == naive_hashes(toks, 64, algo)

@given(requests(embeds=False), st.data())
def test_hash_block_tokens_chain_matches_request(req, data):
    fn, bs, toks = get_hash_fn_by_name(req["algo"]), req["block_size"], req["token_ids"]
    items = sorted(req["mm_items"], key=lambda m: m.offset)
    parent, chain = None, []
    for s in range(0, len(toks) - bs + 1, bs):
        keys = generate_block_hash_extra_keys(s, s + bs, lora=req["lora"], mm_items=items, cache_salt=req["cache_salt"])
        parent = hash_block_tokens(fn, parent, toks[s:s + bs], keys, init_none_hash(req["algo"], SEED))
        chain.append(parent)
    assert chain == hash_request_tokens(**req)

@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=80), block_sizes)
def test_cbor_token_encoding_is_cbor2(toks, bs):
    toks = toks[:len(toks) // bs * bs]
    expected = [cbor2.dumps(tuple(toks[s:s + bs]), canonical=True) for s in range(0, len(toks), bs)]
    assert F._cbor_token_blocks(toks, bs) == expected

keys_st = st.one_of(st.none(), st.lists(st.one_of(
    st.tuples(st.just("lora"), st.sampled_from(["a", "X", "sql"]), st.sampled_from(["a", "/p", ""])),
    st.tuples(st.just("mm"), st.sampled_from(["img", "a"]), st.integers(-50, 50)),
    st.tuples(st.just("cache_salt"), st.text(max_size=4)),
    st.tuples(st.just("prompt_embeds"), st.binary(min_size=32, max_size=32))), min_size=1, max_size=4).map(tuple))

@given(st.sampled_from(["sha256_cbor", "xxhash_cbor"]), st.sampled_from([8, 16, 23, 24, 32, 256, 300]),
       st.lists(token, min_size=1, max_size=60), block_sizes, st.lists(keys_st, min_size=1, max_size=4))
def test_preencoded_cbor_equals_the_definition(algo, parent_len, toks, bs, key_cycle):
    "Pre-encoded CBOR chaining == hash_fn((parent, tuple, keys)) block by block, for any parent length and keys."
    toks = toks[:len(toks) // bs * bs]
    n = len(toks) // bs
    keys = [key_cycle[i % len(key_cycle)] for i in range(n)]
    parent = (bytes(range(256)) * 2)[:parent_len]
    got = F._hash_blocks_cbor(algo, parent, F._cbor_token_blocks(toks, bs), keys)
    fn, expected, p = get_hash_fn_by_name(algo), [], parent
    for i in range(n):
        p = fn((p, tuple(toks[i * bs:(i + 1) * bs]), keys[i]))
        expected.append(p)
    assert got == expected


pickle_token = st.one_of(st.integers(0, 200_000), st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1, 2**31,
                                                                    2**32, 2**64 - 1]))
repeated_keys = st.one_of(st.none(), st.lists(st.one_of(
    st.tuples(st.just("lora"), st.sampled_from(["a", "X"]), st.sampled_from(["a", "X", ""])),
    st.tuples(st.just("mm"), st.sampled_from(["a", "X"]), st.integers(-300, 300)),
    st.tuples(st.just("cache_salt"), st.sampled_from(["a", "X", "tenant"]))), min_size=1, max_size=4).map(tuple))

@given(st.integers(1, 100), st.lists(repeated_keys, min_size=1, max_size=3), st.sampled_from(["bytes", "int"]), st.data())
def test_pickled_blocks_equal_the_definition(bs, key_cycle, parent_kind, data):
    "The one-pickle-per-chunk path == sha256((parent, tuple, keys)) block by block: ids at every opcode boundary,"
    " block sizes 1 to 100, keys whose repeated strings pickle as memo references, digest and int (<= 0.10.1) parents."
    n = data.draw(st.integers(1, max(1, 300 // bs)))
    toks = data.draw(st.lists(pickle_token, min_size=n * bs, max_size=n * bs))
    keys = [key_cycle[i % len(key_cycle)] for i in range(n)]
    parent = hashlib.sha256(b"p").digest() if parent_kind == "bytes" else 2**255 + 12345
    expected, p = [], parent
    for i in range(n):
        d = hashlib.sha256(pickle.dumps((p, tuple(toks[i * bs:(i + 1) * bs]), keys[i]), 5)).digest()
        p = d if parent_kind == "bytes" else int.from_bytes(d, "big")
        expected.append(p)
    with patch.object(F, "_PICKLE_MIN_BLOCKS", 1):
        assert F.hash_blocks("sha256", parent, toks, 0, len(toks), bs, keys) == expected
    if len(toks) > 3 and max(toks) < 2**31:  # the fast path itself, not its fallback
        cut = F._pickled_token_blocks(tuple(toks), bs)
        assert cut is not None and F._hash_pickled_blocks(parent, *cut, bs, keys) == expected

class _ForcedLeadSha256:
    "hashlib stand-in: SHA-256 with its first bytes replaced by `leads`, one after another (digests starting 00 ...)."
    def __init__(self, leads): self.leads, self.n = leads, 0
    def sha256(self, data):
        lead, self.n = self.leads[self.n % len(self.leads)], self.n + 1
        digest = lead + hashlib.sha256(data).digest()[len(lead):]
        return type("Digest", (), {"digest": lambda _: digest})()

digest_leads = st.sampled_from([b"\x00\x80", b"\x00\x00", b"\x00\x00\x00\x7f", b"\x00\x01", b"\x7f", b"\x80", b"\xff",
                                b"\x01"])

@given(st.integers(1, 40), st.lists(digest_leads, min_size=1, max_size=6), st.lists(repeated_keys, min_size=1, max_size=3),
       st.data())
def test_int_parents_pickle_as_long1_from_the_digest(bs, leads, key_cycle, data):
    "Int parents (<= 0.10.1): each digest's LONG1 built from its bytes == pickle of the int, digests starting 00, 00 80,"
    " 7f, 80, ff included (SHA-256 forced to start with them)."
    n = data.draw(st.integers(1, max(1, 200 // bs)))
    toks = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=max(4, n * bs), max_size=max(4, n * bs)))[:n * bs]
    assume(len(toks) > 3)
    keys = [key_cycle[i % len(key_cycle)] for i in range(n)]
    parent = data.draw(st.sampled_from([2**255 + 12345, 2**248 - 1, 7, 2**31]))
    expected, p, fake = [], parent, _ForcedLeadSha256(leads)
    for i in range(n):
        p = int.from_bytes(fake.sha256(pickle.dumps((p, tuple(toks[i * bs:(i + 1) * bs]), keys[i]), 5)).digest(), "big")
        expected.append(p)
    with patch.object(F, "hashlib", _ForcedLeadSha256(leads)):
        assert F._hash_pickled_blocks(parent, *F._pickled_token_blocks(tuple(toks), bs), bs, keys) == expected

@pytest.mark.parametrize("bs", [1, 2, 3, 4, 5, 7, 16])
def test_pickle_cut_takes_every_width(bs):
    "Ids at each width's edges take the fast path (a wrong width only declines: this catches it) and cut right."
    toks = [0, 255, 256, 65535, 65536, 2**31 - 1, 1, 70_000] * 7
    toks = tuple(toks[:len(toks) // bs * bs])
    raw, cuts = F._pickled_token_blocks(toks, bs)
    assert [raw[a:b] for a, b in zip(cuts, cuts[1:])] == [
        pickle.dumps(toks[s:s + bs] + (0, 0, 0), 5)[12:-9] if bs < 4 else pickle.dumps(toks[s:s + bs], 5)[12:-3]
        for s in range(0, len(toks), bs)]

@given(st.lists(st.integers(0, 70_000), min_size=4, max_size=60), st.integers(0, 59),
       st.sampled_from([True, False, np.int64(5), np.uint32(7), 2**31, 1.0]))
def test_pickled_blocks_decline_what_is_no_exact_int(toks, at, bad):
    "A bool, a numpy integer, an id from 2**31 on or a float anywhere: the pickle cut declines (the definition decides)."
    toks[at % len(toks)] = bad
    assert F._pickled_token_blocks(tuple(toks), 2) is None


# --- properties the issue names ---------------------------------------------------------------------------------
@given(st.sampled_from(("sha256", "sha256_cbor")), block_sizes, st.integers(0, 4), st.lists(token, max_size=40),
       st.lists(token, max_size=40), st.data())
def test_prefix_property(algo, bs, k, tail_a, tail_b, data):
    prefix = data.draw(st.lists(token, min_size=k * bs, max_size=k * bs))
    a, b = prefix + tail_a, prefix + tail_b
    # the prompts share exactly k full blocks: block k (if both have it) differs
    if len(a) >= (k + 1) * bs and len(b) >= (k + 1) * bs:
        assume(a[k * bs:(k + 1) * bs] != b[k * bs:(k + 1) * bs])
    ha, hb = hash_request_tokens(a, bs, algo), hash_request_tokens(b, bs, algo)
    assert ha[:k] == hb[:k]
    assert len(set(ha) & set(hb)) == min(k, len(ha), len(hb))

@given(st.sampled_from(ALGOS), block_sizes, st.lists(token, min_size=1, max_size=100), st.text(min_size=1, max_size=5),
       st.text(min_size=1, max_size=5), loras)
def test_distinct_salts_share_no_block(algo, bs, toks, s1, s2, lora):
    assume(s1 != s2)
    h1 = hash_request_tokens(toks, bs, algo, cache_salt=s1, lora=lora, seed=SEED)
    h2 = hash_request_tokens(toks, bs, algo, cache_salt=s2, lora=lora, seed=SEED)
    h0 = hash_request_tokens(toks, bs, algo, lora=lora, seed=SEED)
    assert not set(h1) & set(h2) and not set(h1) & set(h0)

@given(st.sampled_from(ALGOS), block_sizes, st.lists(token, min_size=1, max_size=100), st.text(max_size=5), st.text(max_size=8))
def test_lora_name_never_collides_with_salt(algo, bs, toks, name, path):
    assume(name)  # an empty salt is no salt
    by_lora = hash_request_tokens(toks, bs, algo, lora=LoRARequest(name, path), seed=SEED)
    by_salt = hash_request_tokens(toks, bs, algo, cache_salt=name, seed=SEED)
    assert not set(by_lora) & set(by_salt)

def test_untagged_keys_would_collide():
    "The reason for the tags: vLLM's old bare keys make LoRA 'X' and salt 'X' the same block."
    fn, none = H.sha256, init_none_hash("sha256", SEED)
    assert hash_block_tokens(fn, None, [1, 2], ("X",), none) == hash_block_tokens(fn, None, [1, 2], ("X",), none)
    assert hash_request_tokens([1, 2], 2, lora=LoRARequest("X", "/x")) != hash_request_tokens([1, 2], 2, cache_salt="X")

@given(requests(), st.lists(st.integers(1, 40), max_size=8))
def test_incremental_equals_batch(req, arrivals):
    toks, cuts = req.pop("token_ids"), []
    n = max((m.offset + m.length for m in req["mm_items"]), default=0)  # the prompt holds every placeholder
    for step in arrivals:
        n = min(len(toks), n + step)
        cuts.append(n)
    known: list[bytes] = []
    for n in cuts + [len(toks)]:
        known = hash_request_tokens(toks[:n], known_hashes=known, **req)
        assert known == hash_request_tokens(toks[:n], **req)


class DecodingRequest(RuleBasedStateMachine):
    "A request whose tokens grow in random steps; its incrementally kept hashes always equal a fresh hash."
    @initialize(req=requests(embeds=False))
    def start(self, req):
        self.req = req
        self.tokens = list(req.pop("token_ids"))
        self.hashes = hash_request_tokens(self.tokens, **req)

    @rule(new=st.lists(token, min_size=1, max_size=20))
    def decode(self, new):
        self.tokens += new
        self.hashes = hash_request_tokens(self.tokens, known_hashes=self.hashes, **self.req)

    @rule()
    def nothing_new(self):
        assert hash_request_tokens(self.tokens, known_hashes=self.hashes, **self.req) == self.hashes

    @invariant()
    def equals_batch(self):
        assert self.hashes == hash_request_tokens(self.tokens, **self.req)
        assert len(self.hashes) == len(self.tokens) // self.req["block_size"]

TestDecodingRequest = DecodingRequest.TestCase


# --- the 64-bit id and NONE_HASH ------------------------------------------------------------------------------
@given(st.binary(min_size=8, max_size=40))
def test_int64_is_last_8_bytes_big_endian(h):
    assert block_hash_to_int64(h) == int.from_bytes(h, "big") % 2**64
    assert 0 <= block_hash_to_int64(h) < 2**64

def test_none_hash_rules(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert init_none_hash("sha256") == H.sha256("vllm-none-hash")
    assert init_none_hash("sha256_cbor") == H.sha256_cbor("vllm-none-hash")
    assert init_none_hash("xxhash") == init_none_hash("xxhash") != H.xxhash("vllm-none-hash")
    assert init_none_hash("sha256", seed="7") == H.sha256("7")
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    assert init_none_hash("sha256") == H.sha256("123") and init_none_hash("xxhash") == H.xxhash("123")
    assert init_none_hash("xxhash", seed="9") == H.xxhash("9")

class _Seed(str):
    "A str subclass: pickled as a subclass, so its hash differs from the plain string's."

@pytest.mark.parametrize("algo", ALGOS)
def test_seeded_none_hash_is_cached_by_algorithm_and_exact_seed(monkeypatch, algo):
    "The seed's hash is made once (a cache), yet a new PYTHONHASHSEED and a str subclass are each hashed for real."
    fn = H.HASH_FUNCTIONS[algo]
    for seed in ("a", "b", "a"):
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        assert init_none_hash(algo) == fn(seed) == init_none_hash(algo, seed=seed)
    assert init_none_hash(algo, seed=_Seed("a")) == fn(_Seed("a"))  # "a" is cached by now
    assert (fn(_Seed("a")) != fn("a")) == (algo in ("sha256", "xxhash"))  # pickled apart; CBOR writes a string
    assert init_none_hash("sha256", seed="a") != init_none_hash("sha256_cbor", seed="a")

def test_hash_block_tokens_defaults_to_none_hash(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert hash_block_tokens(H.sha256, None, [1, 2]) == H.sha256((H.sha256(SEED), (1, 2), None))
    with pytest.raises(ValueError, match="none_hash="):
        hash_block_tokens(lambda obj: b"x", None, [1])

def test_numpy_token_ids_hash_like_ints():
    toks = list(range(1000, 1040))
    assert hash_request_tokens(np.array(toks), 8) == hash_request_tokens(toks, 8)
    assert hash_request_tokens([np.int64(t) for t in toks], 8) == hash_request_tokens(toks, 8)

def test_torch_token_ids_hash_like_ints():
    "Integer tensors (and 0-d integer tensors in a list) stand for the Python ints they hold, like numpy's."
    torch = pytest.importorskip("torch")
    assert hash_request_tokens(torch.arange(8), 4) == hash_request_tokens(list(range(8)), 4)
    assert hash_request_tokens(list(torch.arange(8)), 4) == hash_request_tokens(list(range(8)), 4)
    assert hash_request_tokens(torch.arange(8, dtype=torch.int32), 4, "sha256_cbor") == hash_request_tokens(list(range(8)), 4, "sha256_cbor")
    with pytest.raises(TypeError, match=r"token_ids\[0\] is 0.0 \(float\)"):
        hash_request_tokens(torch.zeros(4), 4)
    with pytest.raises(TypeError, match=r"token_ids\[0\] is True \(bool\)"):
        hash_request_tokens(torch.ones(4, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match=r"token_ids\[1\] is -1"):
        hash_request_tokens(torch.tensor([1, -1, 2, 3]), 4)

@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_numpy_scalars_at_the_top_of_the_range(algo):
    "Token ids in [2**63, 2**64) given as numpy uint64 scalars are accepted and hash like the Python ints."
    big = [2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1]
    assert hash_request_tokens([np.uint64(t) for t in big], 2, algo) == hash_request_tokens(big, 2, algo)
    assert hash_request_tokens(np.array(big, dtype=np.uint64), 2, algo) == hash_request_tokens(big, 2, algo)

@pytest.mark.parametrize("block_size", [3, 5, 7, 24, 100, 127])
def test_block_sizes_that_do_not_divide_the_chunk(block_size):
    "Chunks must hold whole blocks whatever the block size (a chunk of `CHUNK // block_size` tokens would not)."
    toks = list(range(2 * F._CHUNK_TOKENS + 300))
    for algo in ("sha256", "sha256_cbor"):
        got = hash_request_tokens(toks, block_size, algo, seed=SEED)
        assert len(got) == len(toks) // block_size and got == naive_hashes(toks, block_size, algo)

def test_block_size_5_over_2000_tokens():
    assert hash_request_tokens(range(2000), 5, seed=SEED) == naive_hashes(list(range(2000)), 5)
    assert len(hash_request_tokens(range(2000), 5)) == 400

def test_torch_prompt_embeds_hash_their_raw_bytes():
    torch = pytest.importorskip("torch")
    rows = torch.arange(24, dtype=torch.float32).reshape(8, 3)
    assert hash_request_tokens([0] * 8, 4, prompt_embeds=rows) == hash_request_tokens([0] * 8, 4, prompt_embeds=rows.numpy())
    bf16 = rows.to(torch.bfloat16)
    assert hash_request_tokens([0] * 8, 4, prompt_embeds=bf16) != hash_request_tokens([0] * 8, 4, prompt_embeds=rows)


# --- errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, error, message", [
    (lambda: hash_request_tokens([1, -2], 1), ValueError, r"token_ids\[1\] is -2"),
    (lambda: hash_request_tokens([1, "2"], 1), TypeError, r"token_ids\[1\] is '2' \(str\)"),
    (lambda: hash_request_tokens([1.5, 2], 1), TypeError, r"token_ids\[0\] is 1.5 \(float\)"),
    (lambda: hash_request_tokens([2**64], 1), ValueError, r"token_ids\[0\]"),
    (lambda: hash_request_tokens([1, True], 1), TypeError, r"token_ids\[1\] is True \(bool\)"),
    (lambda: hash_request_tokens([1], 0), ValueError, "block_size must be an int >= 1, got 0"),
    (lambda: hash_request_tokens([1], 2.0), TypeError, "block_size"),
    (lambda: hash_request_tokens([1], 1, "sha1"), ValueError, "valid names: sha256, sha256_cbor, xxhash, xxhash_cbor, builtin"),
    (lambda: get_hash_fn_by_name(None), ValueError, "unknown hash algorithm None"),
    (lambda: hash_request_tokens([1], 1, cache_salt=b"s"), TypeError, "cache_salt must be a str or None, got bytes"),
    (lambda: hash_request_tokens([1], 1, lora=("a", "b")), TypeError, "lora must be a LoRARequest"),
    (lambda: hash_request_tokens([1, 2], 1, mm_items=[MultiModalItem("i", 1, 2)]), ValueError, r"covers tokens \[1, 3\) but the prompt has only 2"),
    (lambda: hash_request_tokens([1] * 9, 1, mm_items=[MultiModalItem("a", 4, 2), MultiModalItem("b", 0, 5)]), ValueError, "overlap"),
    (lambda: hash_request_tokens([1], 1, mm_items=[("a", 0, 1)]), TypeError, "MultiModalItem"),
    (lambda: hash_request_tokens([1, 2], 1, known_hashes=[b"a", b"b", b"c"]), ValueError, "known_hashes has 3 hashes"),
    (lambda: hash_request_tokens([1, 2], 1, known_hashes=["ab"]), TypeError, "known_hashes must hold non-empty bytes"),
    (lambda: hash_request_tokens([1, 2], 1, known_hashes=[b""]), TypeError, "known_hashes must hold non-empty bytes"),
    (lambda: hash_request_tokens([1, 2], 1, prompt_embeds=[[0.0]] * 2), TypeError, "prompt_embeds must be a numpy array"),
    (lambda: init_none_hash("sha256", seed=5), TypeError, "seed must be a str"),
    (lambda: MultiModalItem("i", 0, 0), ValueError, "length must be an int >= 1"),
    (lambda: MultiModalItem(3, 0, 1), TypeError, "identifier must be a str"),
    (lambda: LoRARequest("a", None), TypeError, "LoRARequest.path must be a str"),
    (lambda: block_hash_to_int64(b"1234567"), ValueError, "at least 8 bytes"),
    (lambda: block_hash_to_int64("ab" * 8), TypeError, "must be bytes"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()

@pytest.mark.parametrize("tail, error, message", [
    (["1", "2"], TypeError, r"token_ids\[4\] is '1' \(str\)"),
    ([1.0], TypeError, r"token_ids\[4\] is 1.0 \(float\)"),
    ([[1, 2]], TypeError, r"token_ids\[4\] is \[1, 2\] \(list\)"),
    ([True], TypeError, r"token_ids\[4\] is True \(bool\)"),
    ([1, 2, "x"], TypeError, r"token_ids\[6\] is 'x' \(str\)"),
    ([None], TypeError, r"token_ids\[4\] is None"),
    ([-1], ValueError, r"token_ids\[4\] is -1; token ids must be ints in \[0, 2\*\*64\)"),
    ([2**64], ValueError, r"token_ids\[4\] is 18446744073709551616"),
    ([np.float32(1)], TypeError, r"token_ids\[4\]"),
])
def test_trailing_partial_block_is_checked_too(tail, error, message):
    "Tokens that fill no block yet are refused like the others: nothing is hashed, decode step or not."
    with pytest.raises(error, match=message):
        hash_request_tokens([1, 2, 3, 4] + tail, 4)
    known = hash_request_tokens([1, 2, 3, 4], 4)
    with pytest.raises(error, match=message):
        hash_request_tokens([1, 2, 3, 4] + tail, 4, known_hashes=known)
    with pytest.raises(error, match=message):
        hash_request_tokens([1, 2, 3, 4] + tail, 16)  # no block full at all

@pytest.mark.parametrize("token_ids, message", [
    (5, "token_ids must be a sequence of ints"),
    ("1234", "token_ids must be a sequence of ints"),
    (b"1234", "token_ids must be a sequence of ints"),
    ({1: 2}, "token_ids must be a sequence of ints"),
    (np.array(3), r"token_ids must be one-dimensional, got shape \(\)"),
    (np.zeros((2, 4), dtype=np.int64), r"token_ids must be one-dimensional, got shape \(2, 4\)"),
])
def test_token_containers_are_named(token_ids, message):
    with pytest.raises(TypeError, match=message):
        hash_request_tokens(token_ids, 2)

@pytest.mark.parametrize("embeds, error, message", [
    (np.zeros(8, np.float32), ValueError, r"prompt_embeds must be 2-D \[num_prompt_tokens, hidden\], got shape \(8,\)"),
    (np.float32(1), TypeError, "prompt_embeds must be a numpy array or a torch tensor"),
    (np.array([[object()]] * 8), TypeError, "prompt_embeds must be a numpy array or a torch tensor of numbers, got a numpy array of object"),
    (np.array([["a"]] * 8), TypeError, "of numbers, got a numpy array of <U1"),
])
def test_prompt_embeds_are_checked(embeds, error, message):
    with pytest.raises(error, match=message):
        hash_request_tokens([0] * 8, 4, prompt_embeds=embeds)
    with pytest.raises(error, match=message):  # even when no block is full yet
        hash_request_tokens([0] * 3, 4, prompt_embeds=embeds)

def test_xxhash_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(H, "_xxhash", None)
    for name in ("xxhash", "xxhash_cbor"):
        with pytest.raises(ValueError, match=r"needs the optional package xxhash"):
            hash_request_tokens([1, 2], 1, name, seed="s")


# --- kvref hash ---------------------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    code = hash_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err

def test_cli_prints_one_hash_per_full_block(capsys):
    code, out, err = run_cli(capsys, *map(str, range(10)), "--block-size", "4", "--seed", SEED)
    assert code == 0 and err == ""
    assert out.split() == [h.hex() for h in hash_request_tokens(list(range(10)), 4, seed=SEED)]

def test_cli_extra_keys_and_formats(capsys, tmp_path):
    toks = list(range(100, 140))
    expected = hash_request_tokens(toks, 8, "sha256_cbor", cache_salt="t", lora=LoRARequest("sql", "/a:b"),
                                   mm_items=[MultiModalItem("img:1", 3, 9), MultiModalItem("img2", 20, 2)], seed="s")
    (tmp_path / "t.json").write_text(json.dumps(toks))
    (tmp_path / "t.txt").write_text(", ".join(map(str, toks)))
    common = ["--block-size", "8", "--algo", "sha256_cbor", "--salt", "t", "--lora", "sql:/a:b",
              "--mm", "img:1:3:9", "--mm", "img2:20:2", "--seed", "s"]
    for source in (["--file", str(tmp_path / "t.json")], ["--file", str(tmp_path / "t.txt")], list(map(str, toks))):
        code, out, _ = run_cli(capsys, *source, *common)
        assert code == 0 and out.split() == [h.hex() for h in expected]
    code, out, _ = run_cli(capsys, *map(str, toks), *common, "--format", "int64")
    assert [int(x) for x in out.split()] == [block_hash_to_int64(h) for h in expected]
    code, out, _ = run_cli(capsys, *map(str, toks), *common, "--format", "json")
    doc = json.loads(out)
    assert doc["block_hashes"] == [h.hex() for h in expected] and doc["block_ids_int64"] == [block_hash_to_int64(h) for h in expected]

@pytest.mark.parametrize("argv, message", [
    (["1", "x"], "token ids must be integers, got 'x'"),
    (["1", "-2", "--block-size", "1"], r"token_ids\[1\] is -2"),
    (["1", "2", "--block-size", "0"], "block_size must be an int >= 1"),
    (["1", "2", "--algo", "md5"], "valid names"),
    (["1", "2", "--mm", "img:0"], "ID:OFFSET:LENGTH"),
    (["1", "2", "--mm", "img:1:5"], "but the prompt has only 2 tokens"),
    (["1", "2", "--lora", "nopath"], "NAME:PATH"),
    (["--file", "/nonexistent/tokens.json"], "--file /nonexistent/tokens.json: cannot read: .*No such file"),
    (["--file", "/proc/self/status/x"], "--file /proc/self/status/x: cannot read"),
    ([], "give token ids, --file, --check or --diagnose"),
    (["--format", "xml", "1"], "invalid choice"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("kvref hash: error:"), err
    assert re.search(message, err), err

# --- the lesson's definitions refuse what the fast path refuses ----------------------------------------------
BAD_REQUESTS = [  # (token_ids, block_size, keyword arguments): each refused by name
    ("abc", 2, {}), ([1.0], 1, {}), ([True], 1, {}), ([-1], 1, {}), ([2**64], 1, {}), ([None], 1, {}),
    ([1, 2, 3, 4, 5.0], 4, {}), ([1, 2, -3, 4], 2, {}), ([1, 2, 3, 4, 2**64], 4, {}), (5, 2, {}),
    ([1, 2], True, {}), ([1, 2], -1, {}), ([1, 2], 0, {}), ([1, 2], 2.0, {}), ([1, 2], None, {}),
    ([1, 2], 1, {"algo": "md5"}), ([1, 2], 1, {"cache_salt": 7}), ([1, 2], 1, {"lora": ("a", "b")}),
    ([1, 2], 1, {"mm_items": [MultiModalItem("i", 1, 5)]}), ([1, 2], 1, {"mm_items": [("i", 0, 1)]}),
    ([1, 2], 1, {"known_hashes": [b"a", b"b", b"c"]}), ([1, 2], 1, {"known_hashes": ["ab"]}),
    ([1, 2], 1, {"prompt_embeds": [[0.0]] * 2}), (np.zeros((2, 2), dtype=np.int64), 2, {}),
]

@pytest.mark.parametrize("token_ids, block_size, kwargs", BAD_REQUESTS)
def test_definition_and_fast_path_refuse_alike(token_ids, block_size, kwargs):
    "request_block_hashes (the lesson) and hash_request_tokens (the fast path): same error type, same message."
    with pytest.raises((TypeError, ValueError)) as fast:
        hash_request_tokens(token_ids, block_size, **kwargs)
    with pytest.raises((TypeError, ValueError)) as lesson:
        request_block_hashes(token_ids, block_size, **kwargs)
    assert (type(lesson.value), str(lesson.value)) == (type(fast.value), str(fast.value))

@pytest.mark.parametrize("tokens, error, message", [
    ("abc", TypeError, "token_ids must be a sequence of ints, got 'abc'"), (None, TypeError, "token_ids must be a sequence of ints, got None"), ([1.0], TypeError, "token_ids[0] is 1.0 (float)"),
    ([True], TypeError, "token_ids[0] is True (bool)"), ([None], TypeError, "token_ids[0] is None (NoneType)"),
    ([-1], ValueError, "token_ids[0] is -1; token ids must be ints in [0, 2**64)"),
    ([1, 2**64], ValueError, "token_ids[1] is 18446744073709551616"),
])
def test_hash_block_tokens_refuses_bad_tokens(tokens, error, message):
    with pytest.raises(error) as got:
        hash_block_tokens(H.sha256, None, tokens)
    assert message in str(got.value)

def test_hash_block_tokens_hashes_numpy_ints_as_ints():
    assert hash_block_tokens(H.sha256, None, np.arange(4)) == hash_block_tokens(H.sha256, None, [0, 1, 2, 3])

@pytest.mark.parametrize("start, end, message", [
    (None, 4, "start_token_idx must be an int >= 0, got None"), ("3", 4, "start_token_idx must be an int >= 0, got '3'"),
    (3.0, 4, "start_token_idx must be an int >= 0, got 3.0"), (True, 4, "start_token_idx must be an int >= 0, got True"),
    (-1, 4, "start_token_idx must be an int >= 0, got -1"), (0, None, "end_token_idx must be an int >= 0, got None"),
    (0, "3", "end_token_idx must be an int >= 0, got '3'"), (0, 3.0, "end_token_idx must be an int >= 0, got 3.0"),
    (0, True, "end_token_idx must be an int >= 0, got True"), (0, -1, "end_token_idx must be an int >= 0, got -1"),
    (8, 4, "end_token_idx must be an int >= 8, got 4"),
])
def test_extra_keys_refuse_a_bad_block_range(start, end, message):
    "Wrong kind (not an int, or a bool): TypeError; an int out of range: ValueError (kvref.guards' rule)."
    wrong_kind = any(type(v) is not int for v in (start, end))
    with pytest.raises(TypeError if wrong_kind else ValueError) as got:
        generate_block_hash_extra_keys(start, end, cache_salt="x")
    assert str(got.value) == message


@pytest.mark.parametrize("call", [
    lambda: hash_block_tokens(H.sha256, b"parent", None),
    lambda: request_block_hashes(None, 4),
    lambda: hash_request_tokens(None, 4),
    lambda: H.checked_token_ids(None),
])
def test_no_token_ids_is_named(call):
    "Issue 32: `None` (or anything that is no sequence) for the token ids names the argument, not Python's generic error."
    with pytest.raises(TypeError, match=r"^token_ids must be a sequence of ints, got None$"):
        call()
