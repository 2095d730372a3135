"""Build kvref's site offline: nbdev processes the notebooks, Sphinx (MyST-NB + Furo) renders them.

nbdev's own processors decide what a reader sees (`#| hide` cells dropped, export markers stripped, `show_doc`
run and its markdown kept). Notebooks are committed without outputs, so where nbdev would execute only the cells
`show_doc` needs, this build executes every cell `nbdev-test` runs, in `nbs/` as the tests do. This script then turns nbdev's Quarto-flavoured output into plain MyST notebooks (front
matter becomes the page's H1 and lead, `show_doc` output becomes real sections, links into the docs stay
on the site) and runs `sphinx-build`. Usage: `python docs/build.py [--out DIR]`.
"""
from __future__ import annotations

import argparse, json, re, shutil, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NBS = ROOT / "nbs"
SRC = ROOT / "_build" / "site_src"
PROC = ROOT / "_proc"  # nbdev's processed notebooks, executed
DOC_URL = "https://kvref.github.io/kvref/"
HAND_WRITTEN = ["trace-format.md", "engine-authors.md", "contributing.md"]  # docs/ pages that join the navigation after the chapters


def _newest_source() -> float:
    "Modification time of the newest file a notebook's outputs depend on (the package and golden files)."
    files = [*(ROOT / "kvref").rglob("*.py"), *(ROOT / "golden").rglob("*"), Path(__file__)]
    return max((f.stat().st_mtime for f in files if f.is_file()), default=0.0)


def _process_one(paths: tuple[Path, Path]) -> None:
    "Execute and process one notebook (`src`, `dest`) with nbdev's doc processors, every cell executed."
    src, dest = paths
    import os
    from fastcore.xtras import working_directory
    from nbdev.config import get_config
    from nbdev.processors import FilterDefaults, exec_show_docs
    from fastcore.nbio import read_nb, write_nb
    flags = get_config().tst_flags
    flags = set(flags.split() if isinstance(flags, str) else flags)

    class execute_all(exec_show_docs):
        "nbdev runs only the cells `show_doc` needs; notebooks are committed without outputs, so run them all."
        def __call__(self, cell):
            if cell.cell_type != "code" or not hasattr(self, "k") or "nbdev_export()" in cell.source: return
            directives = getattr(cell, "directives_", None) or {}
            if flags & directives.keys() or str(directives.get("eval", "")).lower() == "false": return
            self.k.cell(cell)
            if self.k.exc:
                raise RuntimeError(f"docs: {src.name}, cell {cell.idx_} failed:\n{cell.source}\n"
                                   f"{type(self.k.exc).__name__}: {self.k.exc}")

    class Filter(FilterDefaults):
        def base_procs(self): return [execute_all if p is exec_show_docs else p for p in super().base_procs()]

    os.environ["IN_TEST"] = "1"
    nb = read_nb(src)
    with working_directory(NBS): Filter()(nb)
    write_nb(nb, dest)


def process_notebooks() -> Path:
    """Run nbdev's documentation processors over `nbs/` into `_proc/`, executing every notebook top to bottom
    as `nbdev-test` does (cells flagged in `tst_flags` skipped). Unchanged notebooks are reused."""
    from concurrent.futures import ThreadPoolExecutor
    PROC.mkdir(exist_ok=True)
    for stale in set(p.name for p in PROC.glob("*.ipynb")) - set(p.name for p in NBS.glob("*.ipynb")):
        (PROC / stale).unlink()
    newest = _newest_source()
    todo = [src for src in sorted(NBS.glob("*.ipynb"))
            if not (PROC / src.name).exists()
            or (PROC / src.name).stat().st_mtime <= max(src.stat().st_mtime, newest)]
    for src in todo: (PROC / src.name).unlink(missing_ok=True)
    def run(src: Path) -> str | None:  # a fresh interpreter per notebook, as nbdev-test gives each a fresh kernel
        done = subprocess.run([sys.executable, __file__, "--process-one", str(src), str(PROC / src.name)],
                              capture_output=True, text=True)
        return None if done.returncode == 0 else f"{src.name}:\n{done.stderr[-3000:]}"
    with ThreadPoolExecutor(2) as pool: failures = [f for f in pool.map(run, todo) if f]
    if failures: sys.exit("\n\n".join(failures))
    missing = [p.name for p in NBS.glob("*.ipynb") if not (PROC / p.name).exists()]
    if missing: sys.exit(f"docs: could not process {', '.join(missing)} (see the errors above)")
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
            if found.get("output") == "asis":  # show_doc: its markdown becomes part of the page
                md = "".join(_text(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", []))
                cells.append(_cell("markdown", re.sub(r"\A\s*---\s*\n", "", md)))
                continue
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
    for stem, nb in converted.items():
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown": cell["source"] = _rewrite_links(_text(cell["source"]), pages, anchors)
        (SRC / f"{stem}.ipynb").write_text(json.dumps(nb, indent=1))
    for name in HAND_WRITTEN: shutil.copy(DOCS / name, SRC / name)
    order = [p.stem for p in notebooks if p.stem != "index"] + [Path(n).stem for n in HAND_WRITTEN]
    index = json.loads((SRC / "index.ipynb").read_text())
    toc = "```{toctree}\n:hidden:\n:maxdepth: 1\n:caption: Chapters\n\n" + "\n".join(order) + "\n```"
    index["cells"].append(_cell("markdown", toc))
    (SRC / "index.ipynb").write_text(json.dumps(index, indent=1))
    shutil.copy(DOCS / "conf.py", SRC / "conf.py")
    shutil.copytree(DOCS / "_static", SRC / "_static")


def build(out: Path) -> None:
    "Process, stage and render the site into `out`."
    stage(process_notebooks())
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(SRC), str(out)]
    if subprocess.run(cmd).returncode: sys.exit("docs: sphinx-build failed")
    print(f"docs: built {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_site", help="where the HTML goes (default: _site)")
    parser.add_argument("--process-one", nargs=2, type=Path, metavar=("SRC", "DEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_one: _process_one(tuple(args.process_one))
    else: build(args.out)
