"""Build kvref's site offline: nbdev processes the notebooks, Sphinx (MyST-NB + Furo) renders them.

nbdev decides what a reader sees (`#| hide` cells dropped, export markers stripped, `show_doc` run and its
markdown kept). This script then turns nbdev's Quarto-flavoured output into plain MyST notebooks (front
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
DOC_URL = "https://kvref.github.io/kvref/"
HAND_WRITTEN = ["trace_format_versions.md", "contributing.md"]  # docs/ pages that join the navigation, if present


def process_notebooks() -> Path:
    "Run nbdev's documentation processors over `nbs/`; returns the folder of processed notebooks."
    from nbdev.serve import proc_nbs
    proc = Path(proc_nbs(path=str(NBS), n_workers=2))
    missing = [p.name for p in NBS.glob("*.ipynb") if not (proc / p.name).exists()]
    if missing: sys.exit(f"docs: nbdev did not process {', '.join(missing)} (see the errors above)")
    return proc


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


def _rewrite_links(text: str, pages: dict[str, str]) -> str:
    "Point nbdev's absolute doc links at the notebooks on this site; drop GitHub source links."
    text = re.sub(r"\[source\]\([^)]*\)\{[^}]*\}\n*", "", text)
    def local(m):
        page, anchor = m.group(1), m.group(2)
        stem = pages.get(page)
        if stem is None: return m.group(0)
        return f"({stem}.ipynb" + (f"#{_slug(anchor)}" if anchor else "") + ")"
    return re.sub(r"\((?:" + re.escape(DOC_URL) + r")?([\w\-]+)\.html(?:#([^)\s]+))?\)", local, text)


def _directives(source: str) -> tuple[dict[str, str], str]:
    "Split `#| key: value` lines off the top of a code cell."
    lines, found = source.splitlines(), {}
    while lines and lines[0].startswith("#|"):
        key, _, value = lines.pop(0)[2:].strip().partition(":")
        found[key.strip()] = value.strip()
    return found, "\n".join(lines)


def to_myst(nb: dict, pages: dict[str, str]) -> dict:
    "Turn one nbdev-processed notebook into a MyST-NB notebook with an H1, clean code and local links."
    cells = []
    for cell in nb["cells"]:
        src = _text(cell["source"])
        if cell["cell_type"] == "raw" and src.lstrip().startswith("---"):
            fm = _front_matter(cell)
            lead = f"\n\n> {fm['description']}" if fm.get("description") else ""
            cells.append(_cell("markdown", f"# {fm.get('title', '')}{lead}"))
            continue
        if cell["cell_type"] == "markdown":
            cell["source"] = _rewrite_links(src, pages)
        elif cell["cell_type"] == "code":
            found, body = _directives(src)
            if found.get("output") == "asis":  # show_doc: its markdown becomes part of the page
                md = "".join(_text(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", []))
                cells.append(_cell("markdown", _rewrite_links(md, pages)))
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


def stage(proc: Path) -> list[str]:
    "Write MyST notebooks, hand-written pages and the Sphinx config into SRC; returns the page order."
    if SRC.exists(): shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    notebooks = sorted(proc.glob("*.ipynb"), key=lambda p: (p.stem != "index", p.stem))
    pages = {}
    for p in notebooks:
        first = json.loads(p.read_text())["cells"][0]
        out = _front_matter(first).get("output-file", p.stem + ".html") if first["cell_type"] == "raw" else p.stem
        pages[Path(out).stem] = p.stem
    for p in notebooks:
        nb = to_myst(json.loads(p.read_text()), pages)
        (SRC / p.name).write_text(json.dumps(nb, indent=1))
    extra = [name for name in HAND_WRITTEN if (DOCS / name).exists()]
    for name in extra: shutil.copy(DOCS / name, SRC / name)
    order = [p.stem for p in notebooks if p.stem != "index"] + [Path(n).stem for n in extra]
    index = json.loads((SRC / "index.ipynb").read_text())
    toc = "```{toctree}\n:hidden:\n:maxdepth: 1\n:caption: Chapters\n\n" + "\n".join(order) + "\n```"
    index["cells"].append(_cell("markdown", toc))
    (SRC / "index.ipynb").write_text(json.dumps(index, indent=1))
    shutil.copy(DOCS / "conf.py", SRC / "conf.py")
    shutil.copytree(DOCS / "_static", SRC / "_static")
    return ["index"] + order


def build(out: Path) -> None:
    "Process, stage and render the site into `out`."
    stage(process_notebooks())
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", "2", str(SRC), str(out)]
    if subprocess.run(cmd).returncode: sys.exit("docs: sphinx-build failed")
    print(f"docs: built {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_site", help="where the HTML goes (default: _site)")
    build(parser.parse_args().out)
