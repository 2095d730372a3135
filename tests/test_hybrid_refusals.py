"""Issue 32: the hybrid and Mamba managers trust nothing a caller hands `allocate_slots`. A hit is exactly what a
lookup finds now (per group, the blocks cached under the request's own hashes, in order, and as many tokens as they
make), a second request object under a live id is refused, and a request's own fields are checked before the first
block is taken. Every refusal leaves the whole manager as it was (`fuzz_support.snap`).

The corrupted hits themselves (a block never cached, another request's, the same block twice, another request's
unhashed block, hit tokens without blocks and blocks without tokens) are cases of the whole-API fuzz table:
`fuzz_table.HYBRID_HITS`, one entry per manager."""
import pytest

from fuzz_support import snap
from kvref.core.hybrid import FullAttentionSpec, HybridKVCacheManager, HybridRequest, SlidingWindowSpec
from kvref.core.mamba import MambaSpec

MANAGERS = {
    "hybrid": lambda: HybridKVCacheManager([SlidingWindowSpec(4, 8), FullAttentionSpec(4)], 24),
    "mamba": lambda: HybridKVCacheManager([MambaSpec(4), FullAttentionSpec(4)], 24, retention_interval=8),
    "mamba-checkpoints": lambda: HybridKVCacheManager([MambaSpec(8, 8), FullAttentionSpec(8)], 24, prefix_match_unit=2),
}
PROMPT_LENGTH = {"hybrid": 17, "mamba": 16, "mamba-checkpoints": 17}  # where each caches a state a later prompt hits


def cached(kind):
    "A manager where request `a` computed and cached its prompt's blocks, and `u` holds blocks never cached."
    m, prompt = MANAGERS[kind](), list(range(PROMPT_LENGTH[kind]))
    a = HybridRequest("a", prompt)
    assert m.allocate_slots(a, len(prompt)) is not None; a.num_computed_tokens = len(prompt)
    m.new_step_starts()  # a Mamba state cached in this step is hit from the next one
    u = HybridRequest("u", [900 + i for i in range(3)])  # fewer tokens than a block: nothing of it is cached
    assert m.allocate_slots(u, 3) is not None
    return m, a, u


def refused(m, call, match):
    before = snap(m)
    with pytest.raises((TypeError, ValueError), match=match): call()
    assert snap(m) == before, "a refused call changed the manager"


def lookup(m, request):
    hits, num_hit, _ = m.get_computed_blocks(request)
    assert num_hit > 0, "the fixture must give a hit"
    return hits, num_hit


@pytest.mark.parametrize("kind", MANAGERS)
def test_true_hits_still_go_through(kind):
    m, a, _ = cached(kind)
    b = HybridRequest("b", a.all_token_ids + [5])
    hits, num_hit = lookup(m, b)
    assert m.allocate_slots(b, b.num_tokens - num_hit, num_hit, hits) is not None


@pytest.mark.parametrize("kind", MANAGERS)
def test_a_second_request_object_under_a_live_id_is_refused(kind):
    m, a, _ = cached(kind)
    impostor = HybridRequest("a", a.all_token_ids + [1, 2, 3])
    for call in (lambda: m.allocate_slots(impostor, 1), lambda: m.get_computed_blocks(impostor), lambda: m.free(impostor)):
        refused(m, call, "is live as another Request object")
    m.free("a")
    assert m.allocate_slots(impostor, impostor.num_tokens) is not None, "once freed, the id is free for a new object"


@pytest.mark.parametrize("kind", MANAGERS)
@pytest.mark.parametrize("field, value", [("shared_prefix_boundary", "4"), ("shared_prefix_boundary", -1),
                                          ("shared_prefix_boundary", 4.0), ("shared_prefix_boundary", None),
                                          ("num_computed_tokens", 1.5), ("num_computed_tokens", -1)])
def test_a_requests_bad_field_is_refused_before_any_block_is_taken(kind, field, value):
    m, _, _ = cached(kind)
    r = HybridRequest("r", list(range(100, 117)))
    setattr(r, field, value)  # the scheduler's fields, set after the request is built
    refused(m, lambda: m.allocate_slots(r, 16), f"request 'r': {field} must be an int >= 0")


@pytest.mark.parametrize("value, error", [("4", TypeError), (-1, ValueError), (4.0, TypeError), (None, TypeError), (True, TypeError)])
def test_hybrid_request_checks_the_field_it_adds(value, error):
    "A value of the wrong kind is a TypeError, an int out of range a ValueError (kvref.guards), both naming the field."
    with pytest.raises(error, match="request 'r': shared_prefix_boundary must be an int >= 0"):
        HybridRequest("r", [1, 2, 3], shared_prefix_boundary=value)
