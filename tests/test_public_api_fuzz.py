"""Every public entry point, called with wrong types, wrong sizes and misuse (issue 12): each refusal is a named
`TypeError`/`ValueError` (or `OSError` for a file), never a crash deep inside; a refused call leaves its object's
state exactly as it was; and bad values a correct API must refuse (booleans as counts, negative counts, token ids
outside [0, 2**64), non-tensors as logits) are refused rather than silently accepted.

The table of entry points is `fuzz_table.py`; the bad values and the snapshot are in `fuzz_support.py`. The whole
file is a fixed table (about 2,000 calls, deterministic, a few seconds). Entry points owned by other chapters that
still fail are strict xfails naming the owner, so the fix turns them red until the mark is removed."""
import pytest

from fuzz_support import judge
from fuzz_table import ENTRIES

# Entry points that still fail, by owner (the lead routes them); strict: a fix makes the test fail until removed.
KNOWN: dict[str, str] = {}  # entry -> why it still fails (owner); empty: every public entry point refuses by name


def _id(entry): return entry.name


@pytest.mark.parametrize("entry", [pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=KNOWN[e.name]))
                                   if e.name in KNOWN else e for e in ENTRIES], ids=_id)
def test_bad_input_is_refused_by_name_and_changes_nothing(entry):
    failures = [v for v in judge(entry) if v.outcome != "ok"]
    assert not failures, "\n".join(f"{v.arg} = {v.value}: {v.outcome} {v.detail}" for v in failures)
