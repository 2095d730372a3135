"""The book's shape (issue 25): the lesson before its guards, and one definition of each name.

- A chapter reaches its first lesson definition (an exported cell defining a public name) within its first
  `FIRST_LESSON_WITHIN` cells, and before any exported input check (a cell defining only `_check*`/`_checked*`
  helpers) or speed-up (a cell under a heading that says "Speed" or "Fast path").
- Every exported input check sits under a heading that says "Input checks".
- No module defines a name twice: a plain function, class or `@patch` method (keyed by its class) is defined once;
  a fast variant is a twin with its own name.

`KNOWN` lists what other work is still fixing; an entry goes when its chapter is fixed, so the list only shrinks.
"""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS, PACKAGE = ROOT / "nbs", ROOT / "kvref"
FIRST_LESSON_WITHIN = 12
CHECK = re.compile(r"_check|_require")
SPEED = re.compile(r"speed|fast path", re.I)

# (notebook stem, rule) pairs still being fixed by the book's third edition; rules: "first-lesson", "checks-heading".
KNOWN: set[tuple[str, str]] = set()
# Module names still defining a name twice: (module, name).
KNOWN_TWICE: set[tuple[str, str]] = set()


def _defs(source: str) -> list[str]:
    "Top-level function and class names defined by a cell's source (directives stripped)."
    code = "\n".join(l for l in source.splitlines() if not l.startswith("#|"))
    try: tree = ast.parse(code)
    except SyntaxError: return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def cells(notebook: Path) -> list[tuple[str, str, list[str]]]:
    "(nearest heading, kind, exported names) for every cell: kind is 'lesson', 'check', 'speed' or ''."
    heading, out = "", []
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = next((l for l in reversed(source.splitlines()) if l.startswith("#")), heading)
            out.append((heading, "", [])); continue
        names = _defs(source) if source.lstrip().startswith("#| export") else []
        kind = ""
        if names and all(CHECK.match(n) for n in names): kind = "check"
        elif names and SPEED.search(heading): kind = "speed"
        elif any(not n.startswith("_") for n in names): kind = "lesson"
        out.append((heading, kind, names))
    return out


def violations(notebook: Path) -> set[str]:
    "The shape rules `notebook` breaks."
    found, kinds = set(), [k for _, k, _ in cells(notebook)]
    if "lesson" in kinds:
        first = kinds.index("lesson")
        if first >= FIRST_LESSON_WITHIN or any(k in ("check", "speed") for k in kinds[:first]): found.add("first-lesson")
    if any(k == "check" and "input checks" not in h.lower() for h, k, _ in cells(notebook)): found.add("checks-heading")
    return found


CHAPTERS = [p for p in sorted(NBS.glob("*.ipynb")) if any(k for _, k, _ in cells(p))]


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_lesson_before_guards(notebook):
    new = {r for r in violations(notebook) if (notebook.stem, r) not in KNOWN}
    assert not new, f"{notebook.stem}: {sorted(new)} (see this file's docstring)"


def test_known_list_only_shrinks():
    fixed = {(s, r) for s, r in KNOWN if r not in violations(NBS / f"{s}.ipynb")}
    assert not fixed, f"remove from KNOWN: {sorted(fixed)}"


def defined_twice(path: Path) -> set[str]:
    "Names a module defines more than once; an `@patch` method counts as `Class.name`."
    seen, twice = set(), set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): continue
        name = node.name
        patched = any(isinstance(d, ast.Name) and d.id == "patch"  # `@patch`, or `@patch(cls_method=True)`
                      or isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "patch"
                      for d in getattr(node, "decorator_list", []))
        if patched and node.args.args and (ann := node.args.args[0].annotation) is not None:
            name = f"{ast.unparse(ann)}.{node.name}"
        (twice if name in seen else seen).add(name)
    return twice


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "_modidx.py")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_name_defined_twice():
    new = {(_module(p), n) for p in MODULES for n in defined_twice(p)} - KNOWN_TWICE
    assert not new, f"defined twice (give the fast variant its own name): {sorted(new)}"


def test_known_twice_only_shrinks():
    now = {(_module(p), n) for p in MODULES for n in defined_twice(p)}
    assert not KNOWN_TWICE - now, f"remove from KNOWN_TWICE: {sorted(KNOWN_TWICE - now)}"


def test_a_planted_redefinition_and_an_early_guard_are_caught(tmp_path):
    "A module defining `f` twice, and a chapter whose first exported cell is a check, both fail."
    (tmp_path / "m.py").write_text("def f(): pass\ndef f(): pass\n")
    assert defined_twice(tmp_path / "m.py") == {"f"}
    classmethods = "@patch(cls_method=True)\ndef g(cls: A): pass\n@patch(cls_method=True)\ndef g(cls: B): pass\n"
    (tmp_path / "c.py").write_text(classmethods)  # one `g` per class: not a redefinition
    assert defined_twice(tmp_path / "c.py") == set()
    (tmp_path / "c.py").write_text(classmethods.replace("cls: B", "cls: A"))
    assert defined_twice(tmp_path / "c.py") == {"A.g"}
    nb = {"cells": [{"cell_type": "code", "source": ["#| export\n", "def _check_x(v): pass\n"]},
                    {"cell_type": "code", "source": ["#| export\n", "def lesson(): pass\n"]}]}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert violations(tmp_path / "nb.ipynb") == {"first-lesson", "checks-heading"}
