"""The allocator's speed-ups against its definitions (issue 15): random workloads, bad calls included, run in
lockstep through kvref's fast twins and through the plain definitions, comparing every result, every error
and the whole state after each call.

- `FastKVCacheManager` (chapter 04c, the decode-step fast path of `allocate_slots`) against `KVCacheManager`, with
  random seeds and with hypothesis, and a planted bug in the twin that the lockstep must catch;
- the pool's unchecked work methods (`_touch`, `_cache_full_blocks`, `_free_blocks`), which the manager calls with
  its own tables: on the plain side each first runs the checks of its public twin, which must pass;
- `BlockHashToBlockMap.get_cached_prefix` against `get_one_block` per hash;
- a long prompt checked by pickling it (`Request._checked_prompt_token_ids`, chapter 01b's `pickle_prompt`) and its
  blocks hashed from that pickle (`update_block_hashes`) against the definitions: the same error, or the same tokens and the same hashes
  as `request_block_hashes`."""
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

from kvref.core.block_pool import BlockHashToBlockMap, BlockPool
from kvref.core.free_queue import KVCacheBlock, block_ids
from kvref.core.hashing import LoRARequest, MultiModalItem, request_block_hashes
import kvref.core.fast_allocator as fast_allocator
import kvref.core.fast_hashing as fh
from kvref.core.fast_allocator import FastKVCacheManager
from kvref.core.kv_cache_manager import KVCacheManager, Request, checked_token_list, update_block_hashes


class CheckingPool(BlockPool):
    "A pool whose unchecked work methods first run their public twins' checks, which must pass."
    def _touch(self, blocks):
        assert self._checked_own(blocks, "touch") == blocks
        super()._touch(blocks)

    def _cache_full_blocks(self, blocks, block_hashes, num_cached_blocks, num_full_blocks, block_size, token_ids=(),
                           lora_name=None, extra_keys=None):
        new_blocks, _ = self._checked_cache_args(blocks, block_hashes, num_cached_blocks, num_full_blocks,
                                                 block_size, lora_name)
        assert extra_keys is None or len(extra_keys) == len(new_blocks)
        super()._cache_full_blocks(blocks, block_hashes, num_cached_blocks, num_full_blocks, block_size, token_ids,
                                   lora_name, extra_keys)

    def _free_blocks(self, blocks, unhashed_first=False):
        assert self._checked_own(blocks, "free_blocks") == blocks and not any(b.is_null for b in blocks)
        assert all(b.ref_cnt >= n for b, n in Counter(blocks).items())
        super()._free_blocks(blocks, unhashed_first)


class PlainManager(KVCacheManager):
    "The definitions: chapter 04's `allocate_slots`, the pool's work methods behind their checks."
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.block_pool.__class__ = CheckingPool


def outcome(call):
    "What a call gave: its result as block ids (or as is), or its error's type and message."
    try:
        got = call()
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)
    return block_ids(got) if isinstance(got, list) and all(isinstance(b, KVCacheBlock) for b in got) else got


def state(m, reqs) -> tuple:
    "The manager's whole state by block ids (the two sides' blocks and requests are different objects)."
    pool, queue = m.block_pool, m.block_pool.free_block_queue
    link = lambda b: None if b is None else b.block_id
    blocks = [(b.ref_cnt, b.block_hash, b.is_null, link(b.prev_free_block), link(b.next_free_block),
               b.free_queue is queue) for b in pool.blocks]
    return (block_ids(queue.get_all_free_blocks()), queue.num_free_blocks, blocks,
            {h: list(v) for h, v in pool.cached_block_hash_to_block.items()}, pool.kv_event_queue,
            {r: block_ids(t) for r, t in m.req_to_blocks.items()}, dict(m.num_cached_block), sorted(m.live_requests),
            [(r.request_id, list(r.all_token_ids), r.num_computed_tokens, list(r.block_hashes)) for r in reqs.values()])


def random_calls(rng: random.Random, m: KVCacheManager, reqs: dict, next_id: int) -> tuple[list, int]:
    "One random op as (name, args) over request ids, valid or not; most are decode steps of running requests."
    running = [rid for rid in sorted(reqs) if rid in m.req_to_blocks]
    kind = rng.choices(["add", "prefill", "decode", "bad_decode", "free", "reset"], [2, 3, 12, 2, 2, 0.2])[0]
    if kind == "add" or not reqs:
        prompt = rng.choice([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9], [5] * 9]) + [rng.randrange(4) for _ in range(rng.randint(0, 6))]
        return [("add", f"r{next_id}", prompt, rng.choice([None, None, "salt"]))], next_id + 1
    rid = rng.choice(running) if running and kind in ("decode", "bad_decode") else rng.choice(sorted(reqs))
    if kind == "prefill":
        return [("prefill", rid, rng.randint(1, 8), rng.choice([0, 0, 0, 1, 2]))], next_id
    if kind == "decode":
        return [("append", rid, rng.randrange(4)), ("step", rid, rng.choice([1, 1, 1, 2]), 0, None, 0)], next_id
    if kind == "bad_decode":
        bad = rng.choice([("step", rid, 0, 0, None, 0), ("step", rid, True, 0, None, 0), ("step", rid, 1, False, None, 0),
                          ("step", rid, 1, 0, None, True), ("step", rid, 1, 0, [], 0), ("step", rid, 50, 0, None, 0),
                          ("step", rid, 1.0, 0, None, 0), ("computed", rid, rng.choice([-1, True, 1.5, 10**6, "beyond"])),
                          ("stranger", rid)])
        return [bad], next_id
    if kind == "free":
        return [("free", rid, rng.random() < 0.5, rng.random() < 0.5)], next_id
    return [("reset",)], next_id


def apply(m: KVCacheManager, reqs: dict, op: tuple):
    "Apply one op to one side; return its outcome."
    name, args = op[0], op[1:]
    if name == "add":
        rid, prompt, salt = args
        reqs[rid] = Request(rid, prompt, cache_salt=salt, lora_request=LoRARequest("L", "/l") if salt else None)
        return None
    if name == "reset": return m.reset_prefix_cache()
    r = reqs[args[0]]
    if name == "append": return outcome(lambda: r.append_output_token_ids(args[1]))
    if name == "step": return outcome(lambda: m.allocate_slots(r, *args[1:]))
    if name == "stranger":  # a second object under a live id is refused; under a free id it would be a new request
        if r.request_id not in m.live_requests: return "not live"
        return outcome(lambda: m.allocate_slots(Request(r.request_id, [1, 2]), 1))
    if name == "computed":
        slots = len(m.req_to_blocks.get(r.request_id, ())) * m.block_size
        if args[1] == "beyond": r.append_output_token_ids([1] * max(0, slots + 3 - r.num_tokens))  # room to compute
        before, r.num_computed_tokens = r.num_computed_tokens, slots + 1 if args[1] == "beyond" else args[1]
        got = outcome(lambda: m.allocate_slots(r, 1))
        r.num_computed_tokens = before
        return got
    if name == "prefill":
        budget, lookahead = args[1:]
        if r.num_computed_tokens == r.num_tokens: return outcome(lambda: r.append_output_token_ids([7]))
        hits, num_hit = m.get_computed_blocks(r) if r.num_computed_tokens == 0 else ([], 0)
        n = min(budget, r.num_tokens - r.num_computed_tokens - num_hit)
        got = outcome(lambda: m.allocate_slots(r, n, num_hit, hits, num_lookahead_tokens=lookahead))
        if isinstance(got, list): r.num_computed_tokens += num_hit + n
        return got, num_hit
    if name == "free":
        _, by_id, finish = args
        got = outcome(lambda: m.free(r.request_id if by_id else r))
        r.num_computed_tokens = 0
        if finish: del reqs[r.request_id]
        return got
    raise AssertionError(name)


def lockstep(seed: int, num_ops: int, fast_cls: type = FastKVCacheManager) -> Counter:
    "Run `num_ops` random ops through both sides over fresh random configurations; count outcomes by op."
    rng, counts = random.Random(seed), Counter()
    for op_index in range(num_ops):
        if op_index % 400 == 0:
            config = dict(num_blocks=rng.randint(2, 20), block_size=rng.randint(1, 4),
                          behavior=rng.choice(["vllm_0_33", "design_doc"]), enable_caching=rng.random() < 0.85,
                          max_model_len=rng.choice([None, None, 12, 20]), enable_kv_cache_events=rng.random() < 0.4)
            if config["behavior"] == "design_doc": config["num_preallocate_tokens"] = rng.choice([0, 0, 3])
            fast, plain, fast_reqs, plain_reqs, next_id = fast_cls(**config), PlainManager(**config), {}, {}, 0
        ops, next_id = random_calls(rng, fast, fast_reqs, next_id)
        for op in ops:
            got = apply(fast, fast_reqs, op), apply(plain, plain_reqs, op)
            assert got[0] == got[1], (op_index, op, got)
            assert state(fast, fast_reqs) == state(plain, plain_reqs), (op_index, op)
            counts[(op[0], "error" if isinstance(got[0], tuple) and isinstance(got[0][0], str)
                    else "refused" if got[0] is None and op[0] == "step" else "ok")] += 1
        if rng.random() < 0.05: assert fast.take_events() == plain.take_events()
    return counts


def test_fast_paths_agree_with_the_definitions():
    counts = lockstep(seed=0, num_ops=6000)
    assert counts[("step", "ok")] > 1000 and counts[("step", "error")] > 300 and counts[("step", "refused")] > 20
    assert counts[("free", "ok")] > 100 and counts[("prefill", "ok")] > 300


@pytest.mark.slow
def test_fast_paths_agree_with_the_definitions_long():
    for seed in range(1, 11): lockstep(seed, 20_000)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fast_twin_in_lockstep_with_the_definition(seed):
    "Hypothesis picks the workloads: random ops through `FastKVCacheManager` and `KVCacheManager`, every decision equal."
    lockstep(seed, 400)


def test_a_planted_bug_in_the_fast_twin_is_caught(monkeypatch):
    "The lockstep has teeth: a decode step that rounds its block count down (a floor for `cdiv`) must fail it."
    monkeypatch.setattr(fast_allocator, "cdiv", lambda a, b: a // b)
    with pytest.raises(AssertionError):
        lockstep(seed=0, num_ops=2000)
    monkeypatch.undo()
    lockstep(seed=0, num_ops=300)


def test_the_fast_twin_is_a_kv_cache_manager_with_its_own_allocate_slots():
    assert issubclass(FastKVCacheManager, KVCacheManager)
    assert FastKVCacheManager.allocate_slots is not KVCacheManager.allocate_slots


@given(st.lists(st.tuples(st.sampled_from(b"ABCDE"), st.integers(0, 9)), max_size=12),
       st.lists(st.sampled_from(b"ABCDEF"), max_size=8))
def test_get_cached_prefix_is_get_one_block_up_to_the_first_miss(inserts, lookups):
    cache = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(10)]
    for h, i in inserts:
        if i not in cache.get(bytes([h]), {}): cache.insert(bytes([h]), blocks[i])
    hashes, expected = [bytes([h]) for h in lookups], []
    for h in hashes:
        if cache.get_one_block(h) is None: break
        expected.append(cache.get_one_block(h))
    assert cache.get_cached_prefix(hashes) == expected


class PlainRequest(Request):
    "A request checked by the definition alone (`checked_token_ids`, token by token): no pickle kept."
    def _checked_prompt_token_ids(self) -> list[int]: return checked_token_list(self.prompt_token_ids, "prompt_token_ids")


def plain_update(request, block_size, algo) -> list[bytes]:
    "The definition: chapter 01's `request_block_hashes` after the request's known hashes."
    request.block_hashes = request_block_hashes(request.all_token_ids, block_size, algo, cache_salt=request.cache_salt,
                                                lora=request.lora_request, mm_items=request.mm_items,
                                                known_hashes=request.block_hashes)
    return request.block_hashes


class Small(int):
    "An int subclass: a valid token id (the definition converts it), never pickled as a plain int."


odd_ids = st.sampled_from([True, False, np.int64(7), np.uint32(300), Small(5), 2**31, 2**32 - 1, 2**32, 2**64 - 1,
                           2**64, -1, 1.0, "7", None])  # valid (the definition converts or accepts them) or refused


def random_prompt(rng: random.Random) -> list:
    "Up to 80 ids that pickle in one, two or four bytes (the pickled path)."
    return [rng.choice((rng.randrange(256), rng.randrange(256, 65536), rng.randrange(65536, 2**31)))
            for _ in range(rng.randrange(80))]


def outcome_of(make):
    "A built request, or its error's type and message."
    try: return make()
    except (TypeError, ValueError) as e: return type(e).__name__, str(e)


def hashes_after(hash_update, request, block_size, algo, more) -> list:
    "The request's hashes through `hash_update` after it is built, then after each batch of tokens in `more`."
    got = [list(hash_update(request, block_size, algo))]
    for batch in more:
        request.append_output_token_ids(batch)
        got.append(list(hash_update(request, block_size, algo)))
    return got


@given(st.randoms(use_true_random=False), st.one_of(st.none(), st.none(), odd_ids), st.integers(1, 40),
       st.sampled_from(["sha256", "sha256", "sha256_cbor", "builtin"]), st.sampled_from([None, "", "salt"]),
       st.booleans(), st.booleans(), st.booleans(), st.data())
def test_long_prompt_speed_ups_agree_with_the_definitions(rng, odd, block_size, algo, salt, with_lora, as_tuple,
                                                          hash_twice, data):
    fh._PICKLED_PROMPT_MIN_TOKENS, saved = 4, fh._PICKLED_PROMPT_MIN_TOKENS  # every prompt of 4 ids or more
    try:
        tokens = random_prompt(rng)
        if odd is not None: tokens.insert(rng.randrange(len(tokens) + 1), odd)
        lora = LoRARequest("L", "/p") if with_lora else None
        cuts = sorted(data.draw(st.lists(st.integers(0, len(tokens)), max_size=4, unique=True)))
        items = tuple(MultiModalItem(f"m{i}", a, b - a) for i, (a, b) in enumerate(zip(cuts[::2], cuts[1::2])))[::-1]
        prompt = tuple(tokens) if as_tuple else tokens
        kw = dict(cache_salt=salt, lora_request=lora, mm_items=items)
        fast, plain = outcome_of(lambda: Request("r", prompt, **kw)), outcome_of(lambda: PlainRequest("r", prompt, **kw))
        if isinstance(plain, tuple):
            assert fast == plain
            return
        assert fast.all_token_ids == plain.all_token_ids
        event(f"pickled: {fast._prompt_pickle is not None}, {algo}")
        assert list(map(type, fast.all_token_ids)) == list(map(type, plain.all_token_ids))
        if hash_twice: update_block_hashes(fast, block_size + 1, algo)  # the pickle is used once, by another block size
        fast.block_hashes, plain.block_hashes = [], []
        more = [random_prompt(rng)[:20] or [1] for _ in range(rng.randrange(4))]
        got = hashes_after(update_block_hashes, fast, block_size, algo, more)
        assert got == hashes_after(plain_update, plain, block_size, algo, more)
        assert got[-1] == request_block_hashes(plain.all_token_ids, block_size, algo, cache_salt=salt, lora=lora,
                                               mm_items=items)
    finally:
        fh._PICKLED_PROMPT_MIN_TOKENS = saved


def test_a_long_prompt_is_hashed_from_its_pickle():
    prompt = [i * 7919 % 100_003 for i in range(3000)]
    r = Request("long", prompt, cache_salt="s")
    assert r._prompt_pickle is not None and r.all_token_ids == prompt and r.all_token_ids is not prompt
    want = request_block_hashes(prompt, 16, "sha256", cache_salt="s")
    assert update_block_hashes(r, 16, "sha256") == want and r._prompt_pickle is None
    with pytest.raises(TypeError, match=r"request 'bad': token_ids\[2999\] is True"):
        Request("bad", prompt[:-1] + [True])


@given(st.randoms(use_true_random=False), st.one_of(st.none(), st.none(), odd_ids), st.integers(1, 40),
       st.sampled_from(["sha256", "sha256_cbor", "builtin"]), st.sampled_from([None, "", "salt"]), st.booleans(),
       st.data())
def test_short_prompts_hash_unchecked_like_the_definition(rng, odd, block_size, algo, salt, with_lora, data):
    "Below `_PICKLED_PROMPT_MIN_TOKENS` every block goes through the trusted body: the definition's hashes, by step."
    tokens = random_prompt(rng)
    if odd is not None: tokens.insert(rng.randrange(len(tokens) + 1), odd)
    lora = LoRARequest("L", "/p") if with_lora else None
    cuts = sorted(data.draw(st.lists(st.integers(0, len(tokens)), max_size=6, unique=True)))
    items = tuple(MultiModalItem(f"m{i}", a, b - a) for i, (a, b) in enumerate(zip(cuts[::2], cuts[1::2])))[::-1]
    kw = dict(cache_salt=salt, lora_request=lora, mm_items=items)
    fast, plain = outcome_of(lambda: Request("r", tokens, **kw)), outcome_of(lambda: PlainRequest("r", tokens, **kw))
    if isinstance(plain, tuple):
        assert fast == plain
        return
    assert fast._prompt_pickle is None
    m = KVCacheManager(64, block_size, hash_algo=algo)
    more = [random_prompt(rng)[:block_size + 3] or [1] for _ in range(rng.randrange(5))]
    got = hashes_after(lambda r, *_: m._block_hashes(r), fast, block_size, algo, more)
    assert got == hashes_after(plain_update, plain, block_size, algo, more)
    assert got[-1] == request_block_hashes(plain.all_token_ids, block_size, algo, cache_salt=salt, lora=lora,
                                           mm_items=items)


@pytest.mark.parametrize("args, error, message", [
    (("r", 0, "sha256"), ValueError, "block_size must be an int >= 1, got 0"),
    (("r", True, "sha256"), TypeError, "block_size must be an int >= 1, got True"),
    (("r", 4, "sha1"), ValueError, "sha1"),
    ((None, 4, "sha256"), TypeError, "request must be a Request, got None"),
])
def test_update_block_hashes_refuses_bad_arguments(args, error, message):
    r = Request("r", list(range(10)))
    with pytest.raises(error, match=message):
        update_block_hashes(r if args[0] == "r" else args[0], *args[1:])
    assert r.block_hashes == []
