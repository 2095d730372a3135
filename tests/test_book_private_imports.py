"""No private names imported across modules (issue 25): `from kvref.x import _y` in another kvref module fails.

A helper another chapter needs gets a public name (and a docstring) in its home chapter, or is replaced by a guard
from `kvref.guards`. Every import counts, including those inside functions. Importing a public name under a
private alias (`import y as _y`) is not flagged: the name imported is public.
"""
import ast
from pathlib import Path

from test_book_order import PACKAGE, module_name

# (importer, imported module, name) triples still being fixed; an entry goes when its import does. Empty: keep it so.
ALLOWED: set[tuple[str, str, str]] = set()


def private_imports(package: Path = PACKAGE) -> set[tuple[str, str, str]]:
    "(importer, module, name) for every `from module import _name` where module is another module of the package."
    found = set()
    for path in sorted(package.rglob("*.py")):
        me = module_name(path, package)
        here = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom): continue
            source = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                source = ".".join(anchor + ([source] if source else []))
            if source.split(".")[0] != package.name or source == me: continue
            found |= {(me, source, a.name) for a in node.names if a.name.startswith("_")}
    return found


def test_no_private_names_imported_across_modules():
    new = private_imports() - ALLOWED
    assert not new, "private names imported from another kvref module (give them a public name): " + ", ".join(
        f"{me} imports {name} from {source}" for me, source, name in sorted(new))


def test_allow_list_only_shrinks():
    assert not ALLOWED - private_imports(), f"remove from ALLOWED: {sorted(ALLOWED - private_imports())}"


def test_a_planted_private_import_is_noticed(tmp_path):
    "A module importing another's private helper (relative, absolute, or inside a function) is caught; its own is not."
    pkg = tmp_path / "kvref"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("def _helper(): pass\ndef public(): pass\n")
    (pkg / "core" / "b.py").write_text("from .a import public, _helper\nfrom os.path import _get_sep\n")
    (pkg / "c.py").write_text("def f():\n    from kvref.core.a import _helper\n    from kvref.core.a import public as _p\n")
    (pkg / "core" / "d.py").write_text("from kvref.core.d import _self\n_self = 1\n")
    assert private_imports(pkg) == {("kvref.core.b", "kvref.core.a", "_helper"), ("kvref.c", "kvref.core.a", "_helper")}
