"""Render kvref's API reference as markdown, from the installed package, without running any notebook.

nbdev's `show_doc` renders every class as `def ClassName(...)`, Protocols and Enums as `(*args, **kwargs)`, and
needs a kernel that has run the notebook's definitions. This renders from the exported module instead: classes as
classes with their fields and the methods defined in their body, Protocols with their methods, Enums with their
members, functions with a signature that wraps one parameter a line when it is long. `build.py` uses it for the
`show_doc` cells nbdev adds after each exported definition, and for the reference page.
"""
from __future__ import annotations

import dataclasses, enum, inspect, re, typing
from typing import Any, Callable

WIDTH = 88  # a signature longer than this is written one parameter a line
DOC_URL = "https://kvref.github.io/kvref/"


def _annotation(a: Any) -> str:
    "An annotation as the source wrote it (`from __future__ import annotations` keeps them strings)."
    if a is inspect.Parameter.empty: return ""
    if isinstance(a, str): return a
    return inspect.formatannotation(a)


def _comments(obj: Callable) -> dict[str, str]:
    "The docments comment beside each parameter (`name: int,  # what it is`), and `return`'s."
    from fastcore.docments import docments
    try: found = docments(obj, full=False)
    except Exception: return {}
    return {k: v for k, v in found.items() if isinstance(v, str) and v}


def _param(p: inspect.Parameter) -> str:
    "One parameter as source: `*args`, `name: type = default`."
    star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
    text = star + p.name
    if (ann := _annotation(p.annotation)): text += f": {ann}"
    if p.default is not p.empty: text += (" = " if ann else "=") + repr(p.default)
    return text


def signature_lines(name: str, fn: Callable, keyword: str = "def", skip_self: bool = False) -> str:
    "`def name(params) -> ret`, on one line when short, else one parameter a line with its comment."
    try: sig = inspect.signature(fn)
    except (TypeError, ValueError): return f"{keyword} {name}(...)"
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"): params = params[1:]
    parts, notes = [], _comments(fn)
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and (i == 0 or params[i - 1].kind is not p.KEYWORD_ONLY) \
                and not any(q.kind is q.VAR_POSITIONAL for q in params):
            parts.append(("*", ""))
        parts.append((_param(p), notes.get(p.name, "")))
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append(("/", ""))
    ret = _annotation(sig.return_annotation)
    tail = f" -> {ret}" if ret and keyword == "def" else ""
    one = f"{keyword} {name}(" + ", ".join(p for p, _ in parts) + ")" + tail
    if len(one) <= WIDTH and not any(n for _, n in parts): return one
    lines = [f"{keyword} {name}("]
    for p, note in parts: lines.append(f"    {p}," + (f"  # {note}" if note else ""))
    return "\n".join(lines + [")" + tail])


def _doc(obj: Any) -> str:
    "The object's own docstring (not one inherited from `object`, `Enum` or `Protocol`)."
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    if not doc or (isinstance(obj, type) and doc in (enum.Enum.__doc__, typing.Protocol.__doc__)): return ""
    return inspect.cleandoc(doc)


def _is_protocol(cls: type) -> bool: return bool(getattr(cls, "_is_protocol", False))


def _methods(cls: type, all_methods: bool) -> list[tuple[str, Any]]:
    """Public methods and properties of `cls`: all of them, or only those written in the class body (a chapter
    shows those added later with `@patch` where they are added)."""
    try: lines, start = inspect.getsourcelines(cls)
    except (OSError, TypeError): return []
    stop, found = start + len(lines), []
    for name, member in cls.__dict__.items():
        if name.startswith("_") and name != "__call__": continue
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        code = getattr(fn, "__code__", None)
        if code is not None and (all_methods or start <= code.co_firstlineno < stop): found.append((name, member))
    return found


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def _code(text: str) -> str: return f"```python\n{text}\n```"


def _class_markdown(name: str, cls: type, all_methods: bool) -> list[str]:
    bases = [b.__name__ for b in cls.__bases__ if b is not object and b.__name__ != "Generic"]
    out = [_code(f"class {name}" + (f"({', '.join(bases)})" if bases else "") + ":")]
    if (doc := _doc(cls)): out.append(f"*{doc}*")
    if isinstance(cls, enum.EnumMeta):
        out.append(_table(("member", "value"), [(f"`{m.name}`", f"`{m.value!r}`") for m in cls]))
        return out
    if dataclasses.is_dataclass(cls):
        notes = _comments(cls)
        rows = [(f"`{f.name}`", f"`{_annotation(f.type)}`" if f.type else "",
                 "" if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                 else f"`{f.default!r}`" if f.default is not dataclasses.MISSING else f"`{f.default_factory.__name__}()`",
                 notes.get(f.name, "")) for f in dataclasses.fields(cls) if f.init]
        if rows: out.append(_table(("field", "type", "default", "meaning"), rows))
    elif not _is_protocol(cls) and "__init__" in cls.__dict__:
        out.append(_code(signature_lines(name, cls.__init__, keyword="class", skip_self=True)))
    methods = _methods(cls, all_methods)
    if methods:
        out.append("**Protocol methods** (what an implementation provides)" if _is_protocol(cls) else "**Methods**")
        items = []
        for mname, member in methods:
            if isinstance(member, property):
                items.append(f"- `{mname}` (property): {_doc(member.fget)}".rstrip(": "))
            else:
                fn = getattr(member, "__func__", member)
                sig = signature_lines(mname, fn, skip_self=not isinstance(member, staticmethod))
                note = _doc(fn) or _comments(fn).get("return", "")
                items.append(_code(sig) + (f"\n\n  {note}" if note else ""))
        out.extend(items)
    return out


def render(obj: Any, name: str | None = None, level: int = 3, all_methods: bool = False) -> str:
    "Markdown for one documented object: a heading, its signature or class outline, and its docstring."
    name = name or getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    out = [f"{'#' * level} {name}"]
    if isinstance(obj, type): out += _class_markdown(name.rsplit(".", 1)[-1], obj, all_methods)
    elif callable(obj):
        fn = getattr(obj, "__func__", obj)
        out.append(_code(signature_lines(name.rsplit(".", 1)[-1], fn,
                                          skip_self="." in name and not isinstance(obj, staticmethod))))
        if (doc := _doc(fn)): out.append(f"*{doc}*")
    else:  # a constant: functions by name, not by address
        out.append(_code(re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", f"{name} = {obj!r}")[:2000]))
    return "\n\n".join(out) + "\n"


def module_reference(module, level: int = 2, all_methods: bool = False) -> str:
    "Markdown for every name a module exports (`__all__`), in source order."
    names = list(getattr(module, "__all__", []))
    out = [f"{'#' * level} `{module.__name__}`"]
    if (doc := (module.__doc__ or "").split("\n\nDocs:")[0].strip()): out.append(doc)
    for n in names:
        obj = getattr(module, n, None)
        if obj is None: continue
        out.append(render(obj, n, level + 1, all_methods))
    return "\n\n".join(out) + "\n"


def rewrite_doc_links(text: str) -> str:
    "nbdev writes docstring links as `.../page.html.md`; point them at the page."
    return re.sub(r"(" + re.escape(DOC_URL) + r"[\w\-]+)\.html\.md", r"\1.html", text)
