"""Support for `test_public_api_fuzz.py`: a structural snapshot of any object graph, the bad values tried for each
kind of parameter, and one call's verdict."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

# Exceptions a public entry point may raise on bad input: the two the house rules name, and OSError for a path
# that cannot be read or written (FileNotFoundError names the file).
NAMED = (TypeError, ValueError, OSError)


def snap(obj: Any, _seen: dict | None = None, _path: str = "$") -> Any:
    "A comparable picture of everything reachable from `obj` (cycles shown as the path first seen, so aliasing counts)."
    seen = {} if _seen is None else _seen
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, complex, enum.Enum, type, range)):
        return obj
    if callable(obj) and not hasattr(obj, "__dict__") and not hasattr(obj, "__slots__"):
        return ("callable", getattr(obj, "__qualname__", repr(type(obj))))
    if id(obj) in seen: return ("alias", seen[id(obj)])
    seen[id(obj)] = _path
    if isinstance(obj, torch.Tensor): return ("tensor", obj.dtype, tuple(obj.shape), obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray): return ("ndarray", obj.dtype.str, obj.shape, obj.tolist())
    if isinstance(obj, torch.device): return ("device", str(obj))
    if isinstance(obj, dict):
        return ("dict", [(snap(k, seen, _path), snap(v, seen, f"{_path}[{k!r}]")) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "deque":
        return (type(obj).__name__, [snap(v, seen, f"{_path}[{i}]") for i, v in enumerate(obj)])
    if isinstance(obj, (set, frozenset)): return ("set", sorted(map(repr, obj)))
    attrs = {}
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(obj, name): attrs[name] = getattr(obj, name)
    if hasattr(obj, "__dict__"): attrs.update(vars(obj))
    if not attrs and callable(obj): return ("callable", repr(type(obj)))
    return (type(obj).__name__, [(k, snap(v, seen, f"{_path}.{k}")) for k, v in sorted(attrs.items())])


class Wrong:
    "An object of no expected type."
    def __repr__(self): return "Wrong()"


# Bad values per parameter kind: `must` ones a correct entry point refuses; `may` ones it may accept or refuse by name.
BAD: dict[str, tuple[tuple, tuple]] = {
    "count": ((None, "3", 3.0, True, -1, Wrong(), [3]), (0, 10**30)),  # a non-negative int
    "positive": ((None, "3", 3.0, True, 0, -1, Wrong()), (10**30,)),  # an int >= 1
    "int": ((None, "3", 3.5, True, Wrong()), (-1, 10**30, -(10**30))),  # an int, any sign the API allows
    "token": ((None, "3", 3.0, True, -1, 2**64, Wrong()), (2**63,)),  # one token id
    "tokens": ((None, "abc", 5, [1.0], [True], [-1], [2**64], [[1, 2]], [None], Wrong()), ([], [2**63])),
    "str": ((Wrong(),), (None, 3, "", b"x", 1.5)),  # an id or a name
    "name": ((None, 3, Wrong(), "no-such-name"), ("", b"x")),  # one of a fixed set of names
    "bool": ((None, "yes", 2, Wrong()), (0, 1)),
    "float": ((None, "1.0", Wrong(), float("nan")), (True, -1.0, float("inf"), 1e308)),
    "path": ((None, 3, Wrong(), "/nonexistent/kvref/x"), ()),
    "any": ((), (None, "x", 1.5, True, -1, 10**30, [], {}, Wrong(), [None])),
    "tensor": ((None, Wrong(), [[0.0]]), (np.zeros((2, 8), np.float32), torch.zeros(8), torch.zeros(2, 8, 2),
                                          torch.zeros(2, 8, dtype=torch.int64), torch.zeros(5, 8), torch.zeros(2, 3))),
    "seq": ((None, 3, Wrong()), ([None], ["x"], [Wrong()], [10**30], [-1], "abc")),  # a sequence of things
}


# Short spellings allowed in `Entry.skip`.
ALIASES = {"10**30": repr(10**30), "-(10**30)": repr(-(10**30)), "2**63": repr(2**63), "[2**63]": repr([2**63]),
           "2**64": repr(2**64), "[10**30]": repr([10**30])}


@dataclass
class Verdict:
    "What one bad call did."
    entry: str
    arg: str
    value: str
    outcome: str  # "ok", "crash", "state", "accepted" (a value to refuse), "refused" (a value vLLM accepts)
    detail: str = ""


@dataclass
class Entry:
    "One public entry point: how to make a fresh context, call it, and read the context's state."
    name: str  # module.qualname
    make: Callable[[], Any]  # a fresh context (object under test, or anything the call needs)
    call: Callable[..., Any]  # call(ctx, *args)
    args: tuple  # valid positional arguments
    kinds: tuple  # one kind per argument (keys of BAD), or None to leave an argument alone
    state: Callable[[Any], Any] = snap  # the context's observable state
    owner: str = ""  # who fixes defects here (empty: this helper's modules)
    skip: dict = field(default_factory=dict)  # (arg index, repr(value)) -> why this value is legitimately accepted
    # (arg index, value, verdict): values of this entry's own; verdict "refuse" (a clean refusal, state unchanged), or
    # "accept: why" (vLLM 0.33 accepts it too, and the chapter says so)
    cases: tuple = ()


def judge(entry: Entry) -> list[Verdict]:
    "Call `entry` once per (argument, bad value); classify every call."
    base = entry.make()
    entry.call(base, *entry.args)  # the valid call must go through, or the table is wrong
    out, skip = [], {(i, ALIASES.get(v, v)) for i, v in entry.skip}
    tries = [(i, v, True) for i, kind in enumerate(entry.kinds) if kind is not None for v in BAD[kind][0]]
    tries += [(i, v, False) for i, kind in enumerate(entry.kinds) if kind is not None for v in BAD[kind][1]]
    tries += [(i, v, verdict) for i, v, verdict in entry.cases]
    for i, value, required in tries:
        kind = entry.kinds[i] if required in (True, False) else "case"
        if required in (True, False) and (i, repr(value)) in skip: continue
        args = list(entry.args); args[i] = value
        ctx = entry.make()
        before = entry.state(ctx)
        verdict = Verdict(entry.name, f"arg{i}:{kind}", repr(value)[:60], "ok")
        try:
            entry.call(ctx, *args)
        except NAMED as e:
            if entry.state(ctx) != before: verdict.outcome, verdict.detail = "state", f"{type(e).__name__}: {e}"
            elif str(required).startswith("accept"): verdict.outcome, verdict.detail = "refused", f"{type(e).__name__}: {e} ({required})"
        except RecursionError as e:  # noqa: PERF203
            verdict.outcome, verdict.detail = "crash", f"RecursionError: {str(e)[:80]}"
        except Exception as e:
            verdict.outcome, verdict.detail = "crash", f"{type(e).__name__}: {str(e)[:100]}"
        else:
            if required is True or required == "refuse": verdict.outcome = "accepted"
        out.append(verdict)
    return out
