"""Build kvref's site offline: nbdev-test executes the notebooks, nbdev processes them, Sphinx renders them.

Notebooks are committed without outputs. `execute` runs `nbdev-test --save` over copies of them (the same run
`scripts/test` makes as its notebook test, so no notebook runs twice), keyed by content so an unchanged
notebook is not run again. nbdev's own processors then decide what a reader sees (`#| hide` cells dropped,
export markers stripped, a `show_doc` after each exported definition), with one change: `show_doc` is rendered
by `apidoc.py` from the exported package (classes as classes, Protocols with their methods, Enums with their
members, long signatures wrapped) instead of in a kernel. This script then turns nbdev's Quarto-flavoured
output into plain MyST notebooks (front matter becomes the page's H1 and lead, links into the docs stay on the
site), adds the API reference page and runs `sphinx-build`.
Usage: `python docs/build.py [--out DIR]`, or `--execute` to run the notebooks only.
"""
from __future__ import annotations

import argparse, json, re, shutil, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apidoc  # noqa: E402  (docs/apidoc.py, beside this script)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NBS = ROOT / "nbs"
SRC = ROOT / "_build" / "site_src"
PROC = ROOT / "_proc"  # nbdev's processed notebooks
EXECUTED = ROOT / "_build" / "executed"  # the notebooks as `nbdev-test --save` left them, with content keys
BATCH = ROOT / "_exec"  # where they run: beside nbs/, so relative paths such as ../golden hold
DOC_URL = "https://kvref.github.io/kvref/"
HAND_WRITTEN = ["trace-format.md", "engine-authors.md", "contributing.md"]  # docs/ pages that join the navigation after the chapters


def _content_key(nb: Path) -> str:
    "What a notebook's outputs depend on: its own bytes, the package, the golden files and this script."
    import hashlib
    digest = hashlib.sha256(nb.read_bytes())
    for f in sorted([*(ROOT / "kvref").rglob("*.py"), *(ROOT / "golden").rglob("*"), ROOT / "pyproject.toml",
                     Path(__file__), DOCS / "apidoc.py"]):
        if f.is_file() and "__pycache__" not in f.parts: digest.update(f.as_posix().encode() + f.read_bytes())
    return digest.hexdigest()


def execute(force: bool = False) -> Path:
    """Run `nbdev-test --save` over copies of the notebooks: the test run and the site share one execution.
    Without `force`, only the notebooks whose content key changed since their last run."""
    EXECUTED.mkdir(parents=True, exist_ok=True)
    keys_file = EXECUTED / ".keys.json"
    keys = json.loads(keys_file.read_text()) if keys_file.exists() and not force else {}
    for stale in set(p.name for p in EXECUTED.glob("*.ipynb")) - set(p.name for p in NBS.glob("*.ipynb")):
        (EXECUTED / stale).unlink()
    want = {src.name: _content_key(src) for src in sorted(NBS.glob("*.ipynb"))}
    todo = [name for name, key in want.items() if keys.get(name) != key or not (EXECUTED / name).exists()]
    print(f"docs: executing {len(todo)} of {len(want)} notebooks with nbdev-test --save"
          + ("" if todo else " (every executed copy is current)"), flush=True)
    if not todo: return EXECUTED
    if BATCH.exists(): shutil.rmtree(BATCH)
    BATCH.mkdir()
    for name in todo: shutil.copy(NBS / name, BATCH / name)
    done = subprocess.run(["nbdev-test", str(BATCH), "--save", "--n-workers", "2", "--do-print"], cwd=ROOT)
    if done.returncode: sys.exit(f"docs: nbdev-test failed (see above)")
    for name in todo:
        shutil.move(str(BATCH / name), EXECUTED / name)
        keys[name] = want[name]
    shutil.rmtree(BATCH)
    keys_file.write_text(json.dumps(keys, indent=1, sort_keys=True))
    return EXECUTED


def _default_exp(nb) -> str | None:
    "The module a notebook exports to (`#| default_exp name`), as imported: `core.hashing`, or `` for the package root."
    for cell in nb.cells:
        if (m := re.search(r"^#\|\s*default_exp\s+(\S+)", cell.source, re.M)):
            return m.group(1).removesuffix("__init__").rstrip(".")
    return None


def _module_name(module: str) -> str:
    "The full name of a chapter's module: `kvref.core.hashing`, `kvref` for the package root."
    return f"kvref.{module}" if module else "kvref"


def _process_one(src: Path, dest: Path) -> None:
    """nbdev's doc processors over one executed notebook; `show_doc` cells are rendered from the exported
    package by `apidoc` (classes as classes, Protocols with methods, Enums with members), not re-executed."""
    import importlib, os
    from fastcore.xtras import working_directory
    from fastcore.nbio import read_nb, write_nb
    from nbdev.processors import FilterDefaults, exec_show_docs
    from nbdev.process import Processor

    class render_show_docs(Processor):
        "Replace each `show_doc(name)` cell by the markdown `apidoc` renders for `name`."
        def begin(self):
            self.namespace = vars(importlib.import_module(_module_name(module))) if module is not None else {}
        def __call__(self, cell):
            m = re.search(r"^show_doc\(([\w.]+)\)\s*$", cell.source, re.M) if cell.cell_type == "code" else None
            if not m: return
            head, *rest = m.group(1).split(".")
            if head not in self.namespace: raise RuntimeError(f"docs: {src.name}: show_doc({m.group(1)}): "
                                                             f"{head!r} is not exported by this chapter's module")
            obj = self.namespace[head]
            for attr in rest: obj = getattr(obj, attr)
            cell.cell_type, cell.source, cell.outputs = "markdown", apidoc.render(obj, m.group(1)), []
            cell.pop("execution_count", None)

    class Filter(FilterDefaults):
        def base_procs(self): return [render_show_docs if p is exec_show_docs else p for p in super().base_procs()]

    os.environ["IN_TEST"] = "1"
    nb = read_nb(src)
    module = _default_exp(nb)
    with working_directory(NBS): Filter()(nb)
    write_nb(nb, dest)


def process_notebooks(executed: Path) -> Path:
    "Run nbdev's documentation processors over the executed notebooks into `_proc/`."
    if PROC.exists(): shutil.rmtree(PROC)
    PROC.mkdir()
    for src in sorted(executed.glob("*.ipynb")): _process_one(src, PROC / src.name)
    return PROC


def _cell(kind: str, source: str) -> dict:
    "A new notebook cell with a stable id."
    import hashlib
    return {"cell_type": kind, "id": hashlib.sha1(source.encode()).hexdigest()[:8], "metadata": {}, "source": source}


def _text(source) -> str: return "".join(source) if isinstance(source, list) else source


def _front_matter(cell) -> dict[str, str]:
    "Parse the YAML block nbdev writes as the first raw cell (flat keys only, as nbdev writes them)."
    import yaml
    text = _text(cell["source"]).strip().strip("-").strip()
    return yaml.safe_load(text) or {}


def _slug(anchor: str) -> str:
    "MyST's heading slug for an nbdev anchor such as `blockpool.touch`."
    return re.sub(r"[^\w\- ]", "", anchor.strip().lower()).replace(" ", "-")


def _headings(nb: dict) -> set[str]:
    "MyST anchors of the headings in a notebook's markdown cells."
    found = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            found |= {_slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*$", _text(cell["source"]), re.M)}
    return found


def _rewrite_links(text: str, pages: dict[str, str], anchors: dict[str, set[str]]) -> str:
    "Point nbdev's absolute doc links at the notebooks on this site; drop GitHub source links and dead anchors."
    text = re.sub(r"\[source\]\([^)]*\)\{[^}]*\}\n*", "", text)
    def local(m):
        page, anchor = m.group(1), m.group(2)
        stem = pages.get(page)
        if stem is None: return m.group(0)
        anchor = _slug(anchor) if anchor else ""
        return f"({stem}.ipynb" + (f"#{anchor}" if anchor in anchors.get(stem, ()) else "") + ")"
    return re.sub(r"\((?:" + re.escape(DOC_URL) + r")?([\w\-]+)\.html(?:#([^)\s]+))?\)", local, text)


def _directives(source: str) -> tuple[dict[str, str], str]:
    "Split `#| key: value` lines off the top of a code cell."
    lines, found = source.splitlines(), {}
    while lines and lines[0].startswith("#|"):
        key, _, value = lines.pop(0)[2:].strip().partition(":")
        found[key.strip()] = value.strip()
    return found, "\n".join(lines)


def to_myst(nb: dict) -> dict:
    "Turn one nbdev-processed notebook into a MyST-NB notebook with an H1, clean code and local links."
    cells = []
    for cell in nb["cells"]:
        src = _text(cell["source"])
        if cell["cell_type"] == "raw" and src.lstrip().startswith("---"):
            fm = _front_matter(cell)
            lead = f"\n\n> {fm['description']}" if fm.get("description") else ""
            cells.append(_cell("markdown", f"# {fm.get('title', '')}{lead}"))
            continue
        if cell["cell_type"] == "code":
            found, body = _directives(src)
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if found.get("echo") == "false": tags.append("remove-input")
            if found.get("output") == "false": tags.append("remove-output")
            if found.get("include") == "false": continue
            cell["source"] = body
            if not body.strip() and not cell.get("outputs"): continue
        cells.append(cell)
    nb["cells"] = cells
    nb.setdefault("metadata", {}).setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"})
    return nb


def reference_pages() -> dict[str, str]:
    "The API reference: an index page, then one page per module in the book's order (page name -> markdown)."
    import importlib
    from fastcore.nbio import read_nb
    index = ["# API reference\n\n> Every name kvref exports, one page per module in the book's order: classes with "
             "their fields and methods, Protocols with the methods an implementation provides, Enums with their "
             "members. Each chapter explains why; these pages are for looking things up.\n"]
    pages = {}
    for nb_path in sorted(NBS.glob("*.ipynb")):
        if (module := _default_exp(read_nb(nb_path))) is not None:
            name = _module_name(module)
            stem = "reference-" + name.replace(".", "-")
            pages[stem] = apidoc.module_reference(importlib.import_module(name), level=1, all_methods=True)
            index.append(f"- [`{name}`]({stem}.md) (chapter [{nb_path.stem}]({nb_path.stem}.ipynb))")
    index.append("\n```{toctree}\n:hidden:\n:maxdepth: 1\n\n" + "\n".join(pages) + "\n```")
    return {"reference": "\n".join(index) + "\n", **pages}


def stage(proc: Path) -> None:
    "Write MyST notebooks, hand-written pages, the navigation and the Sphinx config into SRC."
    if SRC.exists(): shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    notebooks = sorted(proc.glob("*.ipynb"), key=lambda p: (p.stem != "index", p.stem))
    pages = {}
    for p in notebooks:
        first = json.loads(p.read_text())["cells"][0]
        out = _front_matter(first).get("output-file", p.stem + ".html") if first["cell_type"] == "raw" else p.stem
        pages[Path(out).stem] = p.stem
    converted = {p.stem: to_myst(json.loads(p.read_text())) for p in notebooks}
    anchors = {stem: _headings(nb) for stem, nb in converted.items()}
    link = lambda text: _rewrite_links(apidoc.rewrite_doc_links(text), pages, anchors)
    for stem, nb in converted.items():
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown": cell["source"] = link(_text(cell["source"]))
        (SRC / f"{stem}.ipynb").write_text(json.dumps(nb, indent=1))
    for stem, text in reference_pages().items(): (SRC / f"{stem}.md").write_text(link(text))
    for name in HAND_WRITTEN: shutil.copy(DOCS / name, SRC / name)
    order = [p.stem for p in notebooks if p.stem != "index"] + ["reference"] + [Path(n).stem for n in HAND_WRITTEN]
    index = json.loads((SRC / "index.ipynb").read_text())
    toc = "```{toctree}\n:hidden:\n:maxdepth: 1\n:caption: Chapters\n\n" + "\n".join(order) + "\n```"
    index["cells"].append(_cell("markdown", toc))
    (SRC / "index.ipynb").write_text(json.dumps(index, indent=1))
    shutil.copy(DOCS / "conf.py", SRC / "conf.py")
    shutil.copytree(DOCS / "_static", SRC / "_static")


SITE_KEY = ".kvref-site-key"  # in the built site: the `site_key` it was built from


def site_key() -> str:
    "What the whole site depends on: the notebooks, the package, the golden files, the docs folder (this script too)."
    import hashlib
    digest = hashlib.sha256()
    for f in sorted([*NBS.glob("*.ipynb"), *(ROOT / "kvref").rglob("*.py"), *(ROOT / "golden").rglob("*"),
                     *DOCS.rglob("*"), ROOT / "pyproject.toml"]):
        if f.is_file() and "__pycache__" not in f.parts: digest.update(f.as_posix().encode() + f.read_bytes())
    return digest.hexdigest()


def build(out: Path, force: bool = False) -> None:
    "Process, stage and render the site into `out`; nothing to do when it was built from the same sources."
    key, stamp = site_key(), out / SITE_KEY
    if not force and stamp.is_file() and stamp.read_text() == key:
        print(f"docs: {out} is current (nothing changed since it was built; --force rebuilds it)"); return
    stage(process_notebooks(execute()))
    if out.exists(): shutil.rmtree(out)  # no page of a renamed or removed chapter lingers
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", str(SRC), str(out)]  # not -q: its progress shows
    if subprocess.run(cmd).returncode: sys.exit("docs: sphinx-build failed")
    stamp.write_text(key)
    print(f"docs: built {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_site", help="where the HTML goes (default: _site)")
    parser.add_argument("--execute", action="store_true",
                        help="only run every notebook with nbdev-test --save (the test step; the build reuses it)")
    parser.add_argument("--force", action="store_true", help="rebuild the site even when nothing changed")
    args = parser.parse_args()
    if args.execute: execute(force=True)
    else: build(args.out, args.force)
