"""The pages for engine authors keep their promises: the worked adapter in docs/engine-authors.md runs, and
`kvref check` prints the report the page shows; the trace-format page lists every field the format has."""
from pathlib import Path

from kvref.cli import check_main
from kvref.oracle.conformance import check, load_adapter
from kvref.oracle.replay import OP_FIELDS, load_trace

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "engine-authors.md").read_text()
GOLDEN = ROOT / "golden" / "traces"


def blocks(lang):
    "The fenced code blocks of the page in language `lang` ('' for a bare fence)."
    found, current, kind = [], None, None
    for line in PAGE.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None: current, kind = [], line[3:].strip()
            else:
                if kind == lang: found.append("".join(current))
                current = None
        elif current is not None: current.append(line)
    return found


def test_worked_adapter_is_about_forty_lines_and_speaks_protocol_2(tmp_path):
    code = blocks("python")[0]
    assert 35 <= len(code.splitlines()) <= 55
    (tmp_path / "nano_engine.py").write_text(code)
    engine = load_adapter(f"{tmp_path / 'nano_engine.py'}:NanoEngine")
    assert engine.protocol_version == 2
    assert check(engine, GOLDEN / "design-doc-example.jsonl", "design_doc") is None


def test_the_report_on_the_page_is_what_kvref_check_prints(tmp_path, monkeypatch, capsys):
    (tmp_path / "nano_engine.py").write_text(blocks("python")[0])
    (tmp_path / "room.jsonl").write_text(blocks("json")[0])
    shown = next(b for b in blocks("") if b.startswith("$ kvref check --adapter nano_engine.py:NanoEngine --behavior"))
    monkeypatch.chdir(tmp_path)
    assert check_main(["--adapter", "nano_engine.py:NanoEngine", "--behavior", "design_doc", "room.jsonl"]) == 1
    assert capsys.readouterr().out == shown.split("\n", 1)[1]
    assert load_trace(tmp_path / "room.min.jsonl") == load_trace(tmp_path / "room.jsonl")


def test_the_adapter_error_on_the_page(tmp_path, monkeypatch, capsys):
    (tmp_path / "nano_engine.py").write_text(blocks("python")[0])
    monkeypatch.chdir(tmp_path)
    assert check_main(["--adapter", "nano_engine.py:NanoEngine", "--fields", "hit_tokens,num_new_tokens,allocated",
                       str(GOLDEN / "trace-11-1.jsonl")]) == 1
    out = capsys.readouterr().out
    shown = next(b for b in blocks("") if "the adapter raised" in b)
    for line in shown.splitlines()[2:]:
        if line.startswith(("$", "    File")): continue
        assert line.replace("trace-11-1.min.jsonl", str(Path("trace-11-1.min.jsonl"))) in out + \
            (tmp_path / "trace-11-1.min.jsonl").read_text(), line


def test_trace_format_page_lists_every_field():
    page = (ROOT / "docs" / "trace-format.md").read_text()
    for op, fields in OP_FIELDS.items():
        assert f"| `{op}` |" in page
        for name in fields: assert f"| `{name}` |" in page, (op, name)
    for name in ("hit_tokens", "num_new_tokens", "allocated", "block_ids", "ok", "free_queue", "taken", "to_head",
                 "to_tail", "num_free"):
        assert f"| `{name}` |" in page, name
