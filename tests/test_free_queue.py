"""Free queue: a stateful comparison against a plain Python list, link consistency, and misuse errors."""
import re

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvref.core.free_queue import FreeKVCacheBlockQueue, KVCacheBlock, block_ids


def links_consistent(q: FreeKVCacheBlockQueue) -> list[int]:
    "Walk the list both ways; assert every link agrees; return ids head to tail."
    forward, node = [], q.fake_head
    while node.next_free_block is not None:
        assert node.next_free_block.prev_free_block is node
        node = node.next_free_block
        forward.append(node)
    assert node is q.fake_tail
    backward, node = [], q.fake_tail
    while node.prev_free_block is not None:
        node = node.prev_free_block
        backward.append(node)
    assert node is q.fake_head
    assert forward[:-1] == backward[::-1][1:]
    inner = forward[:-1]
    assert len(inner) == q.num_free_blocks == len(q)
    assert all(b.free_queue is q for b in inner)
    return block_ids(inner)


class QueueVsList(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.blocks = [KVCacheBlock(i) for i in range(12)]
        self.q = FreeKVCacheBlockQueue(self.blocks)
        self.model = list(range(12))

    def outside(self):
        return [i for i in range(12) if i not in self.model]

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self):
        assert self.q.popleft().block_id == self.model.pop(0)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def popleft_n(self, data):
        n = data.draw(st.integers(0, len(self.model)))
        assert block_ids(self.q.popleft_n(n)) == self.model[:n]
        del self.model[:n]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        i = data.draw(st.sampled_from(self.model))
        self.q.remove(self.blocks[i])
        self.model.remove(i)

    @precondition(lambda self: len(self.model) < 12)
    @rule(data=st.data(), front=st.booleans())
    def put_back(self, data, front):
        ids = data.draw(st.lists(st.sampled_from(self.outside()), unique=True, max_size=4))
        blocks = [self.blocks[i] for i in ids]
        if front:
            self.q.prepend_n(blocks)
            self.model[:0] = ids
        elif len(ids) == 1:
            self.q.append(blocks[0])
            self.model += ids
        else:
            self.q.append_n(blocks)
            self.model += ids

    @rule(data=st.data())
    def misuse_changes_nothing(self, data):
        i = data.draw(st.integers(0, 11))
        before = list(self.model)
        if i in self.model:
            with pytest.raises(ValueError, match=f"block {i} is already in the free queue"):
                self.q.append_n([self.blocks[i]])
        else:
            with pytest.raises(ValueError, match=f"block {i} is not in the free queue"):
                self.q.remove(self.blocks[i])
        assert self.model == before

    @invariant()
    def same_as_list(self):
        assert links_consistent(self.q) == self.model
        assert block_ids(self.q.get_all_free_blocks()) == self.model
        for b in self.blocks:
            assert (b.prev_free_block is None) == (b.block_id not in self.model)


TestQueueVsList = QueueVsList.TestCase


def test_empty_queue_errors():
    q = FreeKVCacheBlockQueue([])
    assert len(q) == 0 and q.get_all_free_blocks() == []
    with pytest.raises(ValueError, match="no free blocks available"):
        q.popleft()
    with pytest.raises(ValueError, match="asked for 1 free blocks but only 0 are free"):
        q.popleft_n(1)
    q.append_n([]); q.prepend_n([])
    assert links_consistent(q) == []


def test_prepend_keeps_run_order_and_append_n_of_many_is_one_splice():
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks[:2])
    q.prepend_n([blocks[4], blocks[3]])
    q.append_n([blocks[5], blocks[2]])
    assert links_consistent(q) == [4, 3, 0, 1, 5, 2]


def test_design_doc_queue_after_time_6():
    blocks = [KVCacheBlock(i) for i in range(10)]
    q = FreeKVCacheBlockQueue(blocks)
    q.popleft_n(7)
    q.append_n([blocks[i] for i in (4, 3, 2)])
    q.append_n([blocks[i] for i in (6, 5, 1, 0)])
    assert links_consistent(q) == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]


def test_block_repr_does_not_walk_links():
    blocks = [KVCacheBlock(i) for i in range(3)]
    FreeKVCacheBlockQueue(blocks)
    assert repr(blocks[1]) == "KVCacheBlock(1, ref_cnt=0)"
    blocks[1].block_hash = bytes.fromhex("0123456789")
    assert repr(blocks[1]) == "KVCacheBlock(1, ref_cnt=0, hash=01234567)"
    assert blocks[0] != KVCacheBlock(0)  # identity, not value


@pytest.mark.parametrize("block_id", [None, "3", 3.0, True, -1, [3]])
def test_block_refuses_an_id_that_is_not_a_non_negative_int(block_id):
    "A negative int is out of range (ValueError); anything but an int, a bool included, is the wrong kind (TypeError)."
    with pytest.raises(ValueError if type(block_id) is int else TypeError, match=re.escape(f"block_id must be an int >= 0, got {block_id!r}")):
        KVCacheBlock(block_id)


def test_queue_sentinels_are_the_only_blocks_with_id_minus_one():
    q = FreeKVCacheBlockQueue([KVCacheBlock(0)])
    assert (q.fake_head.block_id, q.fake_tail.block_id) == (-1, -1)
    assert q.fake_head is not q.fake_tail
    assert links_consistent(q) == [0]


@pytest.mark.parametrize("run", [lambda q: [q.fake_tail], lambda q: [q.fake_head], lambda q: [KVCacheBlock(7), q.fake_tail],
                                 lambda q: [FreeKVCacheBlockQueue([]).fake_head]])
@pytest.mark.parametrize("put", ["append", "append_n", "prepend_n"])
def test_a_sentinel_is_never_queued(run, put):
    "Issue 32: appending a queue's own fake head or tail linked it into the list (counts and walks disagreed)."
    q = FreeKVCacheBlockQueue([KVCacheBlock(0), KVCacheBlock(1)])
    blocks = run(q)
    if put == "append" and len(blocks) > 1: pytest.skip("append takes one block")
    with pytest.raises(ValueError, match="block -1 is a free queue's sentinel"):
        getattr(q, put)(blocks[0] if put == "append" else blocks)
    assert links_consistent(q) == [0, 1]
