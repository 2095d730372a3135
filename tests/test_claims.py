"""Claims the front page and the README make that can drift from the code: each is recomputed here."""
import json
import re
import tomllib
from pathlib import Path

from kvref.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"


def front_page() -> str:
    return "\n".join("".join(c["source"]) for c in json.loads((NBS / "index.ipynb").read_text())["cells"])


def runtime_dependencies() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.split(r"[<>=!~; \[]", d, maxsplit=1)[0] for d in deps]


def test_front_page_names_every_runtime_dependency():
    claim = re.search(r"`import kvref` needs ([^;]+);", front_page()).group(1)
    named = re.findall(r"\w+", claim.replace(" and ", " "))
    assert named == runtime_dependencies()


def test_front_page_chapter_table_lists_every_notebook_in_order():
    linked = re.findall(r"^\| \[[^]]+\]\((\w+)\.ipynb\)", front_page(), re.M)
    assert linked == sorted(p.stem for p in NBS.glob("*.ipynb") if p.stem != "index")


def test_front_page_names_every_subcommand():
    row = next(line for line in front_page().splitlines() if "(12_cli.ipynb)" in line)
    assert re.findall(r"`(?:kvref )?([\w-]+)`", row) == list(SUBCOMMANDS)


def test_planted_drift_is_caught(monkeypatch):
    "A dependency added to pyproject.toml but not to the front page fails the check."
    real = runtime_dependencies()
    monkeypatch.setitem(globals(), "runtime_dependencies", lambda: [*real, "msgspec"])
    try: test_front_page_names_every_runtime_dependency()
    except AssertionError: return
    raise AssertionError("the planted dependency was not noticed")
