"""Issue 26, "first contact": what a new user met, pinned. Every shipped trace is taken by `kvref check` and
`kvref replay`, a run over many files reports each and exits with the worst status, `kvref vectors` says what
each file is, the docs' hashing rules match the code, the allocator rules of the engine-authors page ship as
vectors, and the README's oracle commands work from outside the clone.
"""
import json
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.oracle.replay import _decisions_of, list_vectors

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
KVREF_ADAPTER = "kvref.oracle.conformance:KVRefAdapter"
RELEASE_TRACES = [v for v in list_vectors() if v.kind == "trace" and v.name.startswith("versions")]


# ------------------------------------------------------------------- item 2: check and replay take every trace

@pytest.mark.parametrize("vector", RELEASE_TRACES, ids=lambda v: v.name)
def test_every_release_recording_checks_against_its_decisions(vector, capsys):
    "The releases chapter's recordings (`mm` on `add`), each with its release's decisions: all conform."
    assert main(["check", str(vector.path), "--expect", str(_decisions_of(vector.path)), "--vllm-version", vector.release]) == 0
    assert "conforms" in capsys.readouterr().out


def test_release_format_trace_replays_and_checks_without_a_version(capsys):
    "A recording with `mm` items on `add` is read as `mm_items`: replayed, and checked against kvref's 0.33 allocator."
    mm = str(GOLDEN / "versions" / "0.33.0" / "traces" / "mm-position.jsonl")
    assert main(["replay", mm]) == 0
    assert main(["check", mm, "--adapter", KVREF_ADAPTER]) == 0
    assert main(["check", mm, "--expect", str(GOLDEN / "versions" / "0.33.0" / "traces" / "mm-position.vllm-0.33.0.jsonl"),
                 "--vllm-version", "0.33.0"]) == 0


@pytest.mark.parametrize("path, holds", [
    ("events/trace-11-0.events.jsonl", "KV events"), ("hybrid/events/hybrid-mamba-0.events.jsonl", "KV events"),
    ("traces/trace-11-0.vllm.jsonl", "decisions"), ("mooncake/synthetic-trace-last300.jsonl", "request log"),
    ("scheduler/workloads.jsonl", "scheduler"), ("scheduler/vllm/min_control.jsonl", "scheduler")])
def test_a_file_that_is_not_a_trace_is_named_as_such(path, holds, capsys):
    for argv in (["replay", str(GOLDEN / path)], ["check", str(GOLDEN / path), "--adapter", KVREF_ADAPTER]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "not an allocator trace" in err and holds in err and len(err.splitlines()) == 1


def test_many_traces_each_reported_worst_status_wins(tmp_path, capsys):
    "One bad file among many no longer aborts the run: each is reported, the exit status is the worst."
    good, events = str(GOLDEN / "traces" / "design-doc-example.jsonl"), str(GOLDEN / "events" / "trace-11-0.events.jsonl")
    assert main(["check", "--adapter", KVREF_ADAPTER, good, events, good]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("conforms") == 2 and "3 traces: 2 conform, 0 diverged, 1 could not be checked" in captured.out
    assert main(["check", "--adapter", "kvref.adapters.nano:NanoAdapter", "--out", str(tmp_path), good, good]) == 1
    assert "2 traces: 0 conform, 2 diverged" in capsys.readouterr().out
    assert main(["check", "--adapter", "kvref.adapters.nano:NanoAdapter", "--out", str(tmp_path), good, events]) == 2


def test_a_trace_on_which_vllm_raised_holds_no_adapter(capsys):
    "A recording whose decisions say vLLM raised is refused for an adapter at that op, and checks with --expect."
    trace = GOLDEN / "versions-vllm" / "0.33.0" / "traces" / "diff-3-2.jsonl"
    assert main(["check", str(trace), "--adapter", KVREF_ADAPTER, "--vllm-version", "0.33.0"]) == 2
    assert "vLLM 0.33.0 raises here" in capsys.readouterr().err
    assert main(["check", str(trace), "--expect", str(_decisions_of(trace)), "--vllm-version", "0.33.0"]) == 0


# ------------------------------------------------------------------- item 3: kvref vectors says what each file is

def test_every_vector_labelled_with_its_own_release_and_kind():
    for v in list_vectors():
        parts = v.name.split("/")
        if parts[0] in ("versions", "versions-vllm"): assert v.release == parts[1] and parts[1] in v.source, v
        if ".events" in v.name: assert v.kind == "events" and "trace (ops)" not in v.source, v
        if v.name.endswith(".vllm") or ".vllm-" in v.name: assert v.kind == "decisions", v


def test_a_recorded_event_stream_is_described_as_one(capsys, tmp_path):
    "A stream recorded from an engine (`seq` and `payload_b64` per line) is no per-op events file, and says so."
    from kvref.oracle.replay import _describe
    streams = [v for v in list_vectors("events") if v.name.startswith("events/real-engine/") and v.name.endswith("/engine")]
    assert len(streams) >= 2
    for v in streams:
        assert v.source == f"a KV event stream recorded from a vLLM {v.release} engine (one published batch per line)", v
    per_op = {v.name: v for v in list_vectors("events")}["events/trace-11-0.events"]
    assert per_op.source == "KV events vLLM 0.33.0 emitted for a trace (one line per op)"
    planted = tmp_path / "events" / "9.9.9" / "engine.jsonl"
    planted.parent.mkdir(parents=True)
    planted.write_text('\n{"seq": 0, "payload_b64": "kQ=="}\n{"seq": 1, "payload_b64": "kQ=="}\n')
    assert _describe(planted, tmp_path) == (
        "a KV event stream recorded from a vLLM 9.9.9 engine (one published batch per line)", 2, "events", "9.9.9")
    assert main(["vectors", "--kind", "events", "--vllm", "0.32.0"]) == 0
    assert "a KV event stream recorded from a vLLM 0.32.0 engine (one published batch per line)" in capsys.readouterr().out


def _paths(capsys, *argv) -> list[str]:
    assert main(["vectors", *argv, "--paths"]) == 0
    return capsys.readouterr().out.split()


def test_vectors_filters(capsys):
    everything = _paths(capsys)
    traces = _paths(capsys, "--kind", "trace", "--vllm", "0.33.0")
    assert 0 < len(traces) < len(everything) / 5
    assert all(json.loads(Path(p).read_text().splitlines()[0])["op"] == "config" for p in traces)
    assert set(_paths(capsys, "--vllm", "0.9")) == {p for v in ("0.9.0", "0.9.1", "0.9.2") for p in _paths(capsys, "--vllm", v)}
    assert main(["vectors", "--kind", "attention", "--vllm", "0.33.0"]) == 2
    assert "no shipped vector file matches --kind attention --vllm 0.33.0" in capsys.readouterr().err


@pytest.mark.parametrize("kind, adapter", [("trace", KVREF_ADAPTER), ("hybrid-trace", "kvref.oracle.hybrid_replay:KVRefHybridAdapter")])
def test_checkable_traces_are_what_an_adapter_is_checked_on(kind, adapter, capsys):
    "Every trace `kvref vectors --checkable` lists is taken by `kvref check --adapter` as it is, and kvref's own conforms."
    paths = _paths(capsys, "--kind", kind, "--checkable")
    assert len(paths) >= 10
    assert main(["check", "--adapter", adapter, *paths]) == 0


# ------------------------------------------------------------------- item 4: every stated hashing rule, checked

def _decide(*adds: dict) -> list[dict]:
    "kvref's decisions for a trace adding and scheduling each request in turn (block size 4)."
    from kvref.oracle.replay import replay
    ops = [{"op": "config", "num_blocks": 32, "block_size": 4}]
    for a in adds: ops += [{"op": "add", **a}, {"op": "schedule", "id": a["id"]}]
    return ops, list(replay(ops))


def _hit(first: dict, second: dict) -> int:
    "The prefix-hit tokens of `second` after `first` (same 9-token prompt unless given)."
    prompt = list(range(9))
    return _decide({"id": "a", "prompt": prompt, **first}, {"id": "b", "prompt": prompt, **second})[1][-1]["hit_tokens"]


def _lora_name_and_path():
    "Name and path both enter every block hash: the same name at another path (or another name) shares nothing."
    from kvref.core.hashing import LoRARequest
    from kvref.core.fast_hashing import hash_request_tokens
    hashes = [hash_request_tokens(list(range(8)), 4, lora=LoRARequest(n, p)) for n, p in (("a", "/p"), ("a", "/q"), ("b", "/p"))]
    assert all(x != y for i, h in enumerate(hashes) for g in hashes[i + 1:] for x, y in zip(h, g))
    same = {"name": "a", "path": "/p"}
    assert _hit({"lora": same}, {"lora": same}) == 8
    assert _hit({"lora": same}, {"lora": {"name": "a", "path": "/q"}}) == 0 == _hit({"lora": same}, {"lora": {"name": "b", "path": "/p"}})


def _pictures_lora_key():
    "The pictures chapter's cache keys: the same prompt under the same LoRA name at two paths is two keys."
    from kvref.pictures import follow
    lora = [{"name": "a", "path": p} for p in ("/p", "/q")]
    ops, decisions = _decide(*({"id": f"r{i}", "prompt": list(range(9)), "lora": lora[i]} for i in range(2)))
    last = list(follow(ops, decisions))[-1]
    keys = [{last.cached[b] for b in last.tables[r] if b in last.cached} for r in ("r0", "r1")]
    assert keys[0] and keys[1] and not keys[0] & keys[1]


def _salt():
    "Only requests with the same salt share blocks."
    assert _hit({"cache_salt": "x"}, {"cache_salt": "x"}) == 8
    assert _hit({"cache_salt": "x"}, {"cache_salt": "y"}) == 0 == _hit({"cache_salt": "x"}, {})


def _mm_relative():
    "A block overlapping an item hashes its identifier and its offset from the block's first token (negative if it began before)."
    from kvref.core.hashing import MultiModalItem, generate_block_hash_extra_keys
    image = [MultiModalItem("img", 2, 4)]
    assert generate_block_hash_extra_keys(0, 4, mm_items=image) == (("mm", "img", 2),)
    assert generate_block_hash_extra_keys(4, 8, mm_items=image) == (("mm", "img", -2),)
    def mm(offset): return {"mm_items": [{"identifier": "img", "offset": offset, "length": 2}]}
    assert _hit(mm(4), mm(4)) == 8 and _hit(mm(4), mm(5)) == 4  # block 0 overlaps neither; block 1 at offsets 0 and 1


HASHING_RULES = [  # (where the rule is stated, the statement, the check of the code)
    ("docs/trace-format.md", "its name and path both enter every block hash", _lora_name_and_path),
    ("docs/engine-authors.md", "LoRA adapter's name and path", _lora_name_and_path),
    ("nbs/05b_workloads.ipynb", "The adapter's name and path are part", _lora_name_and_path),
    ("nbs/01_hashing.ipynb", '`("lora", name, path)` when the request uses a LoRA adapter', _lora_name_and_path),
    ("nbs/01a_pictures.ipynb", "the LoRA adapter (its name and path", _pictures_lora_key),
    ("docs/trace-format.md", "only requests with the same salt share blocks", _salt),
    ("docs/trace-format.md", "its identifier and its offset relative to the block's first token", _mm_relative),
    ("docs/engine-authors.md", "relative to the block's first token", _mm_relative),
]


def _prose(path: Path) -> str:
    "A page's text, or a notebook's cells, with every run of whitespace one space (statements wrap across lines)."
    text = path.read_text()
    if path.suffix == ".ipynb": text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
    return " ".join(text.split())


@pytest.mark.parametrize("doc, statement, rule", HASHING_RULES, ids=lambda x: x.__name__ if callable(x) else None)
def test_stated_hashing_rule_holds(doc, statement, rule):
    assert statement in _prose(ROOT / doc), f"{doc} no longer states {statement!r}"
    rule()


def test_no_page_keys_lora_by_name_alone():
    "The old wording that sent an engine author to a real divergence is gone everywhere."
    for path in [*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("nbs/*.ipynb")]:
        text = _prose(path)
        for wrong in ("its name enters every block hash", "The adapter's name is part of", "the salt and the LoRA name."):
            assert wrong not in text, (path, wrong)


# ------------------------------------------------------------------- item 5: the rules an allocator must follow

from kvref.core.block_pool import BlockHashToBlockMap, BlockPool  # noqa: E402
from kvref.oracle.conformance import check, check_recorded  # noqa: E402
from kvref.oracle.replay import KVRefAdapter, load_trace, vector_path  # noqa: E402


class UnhashedToTail(KVRefAdapter):
    "Wrong: a freed request's blocks all go to the tail (the design doc's order), none to the head."
    def __init__(self, config):
        super().__init__(config)
        pool = self.manager.block_pool
        pool._free_blocks = lambda blocks, unhashed_first=False: BlockPool._free_blocks(pool, blocks, False)


class OneBlockPerHash(BlockHashToBlockMap):
    "nano's map: a hash names one block, the copy cached last; evicting that copy forgets the hash."
    def insert(self, block_hash, block): self._cache[block_hash] = block
    def insert_all(self, block_hashes, blocks):
        for h, b in zip(block_hashes, blocks): self.insert(h, b)
    def pop(self, block_hash, block_id):
        if getattr(self._cache.get(block_hash), "block_id", None) == block_id: del self._cache[block_hash]


class OneIdPerHash(KVRefAdapter):
    "Wrong: one block id per hash."
    def __init__(self, config):
        super().__init__(config)
        self.manager.block_pool.cached_block_hash_to_block = OneBlockPerHash()


class LoRANameOnly(KVRefAdapter):
    "Wrong: LoRA adapters keyed by name alone."
    def add(self, request_id, prompt, *, cache_salt=None, lora=None, mm_items=()):
        super().add(request_id, prompt, cache_salt=cache_salt, lora=lora and {"name": lora["name"], "path": ""}, mm_items=mm_items)


class MMBlockStart(KVRefAdapter):
    "Wrong: a multimodal item keyed by the block it starts in, not by where in the block it starts."
    def __init__(self, config):
        super().__init__(config)
        self.block_size = config["block_size"]
    def add(self, request_id, prompt, *, cache_salt=None, lora=None, mm_items=()):
        moved = [{**m, "offset": m["offset"] - m["offset"] % self.block_size} for m in mm_items]
        super().add(request_id, prompt, cache_salt=cache_salt, lora=lora, mm_items=moved)


RULES = {"free-unhashed-to-head": UnhashedToTail, "duplicate-blocks-stay-reachable": OneIdPerHash,
         "lora-name-and-path": LoRANameOnly, "mm-offset-in-block": MMBlockStart}


@pytest.mark.parametrize("rule, wrong", RULES.items(), ids=list(RULES))
def test_rule_vector_passes_kvref_and_fails_the_planted_allocator(rule, wrong):
    trace = vector_path(f"rules/{rule}")
    assert check_recorded(vector_path(f"rules/{rule}.vllm"), trace) is None  # the shipped decisions are kvref's
    assert check(KVRefAdapter, trace) is None
    found = check(wrong, trace)
    assert found is not None and found.error is None, found  # a divergence in decisions, not a crash
    assert found.index == len(load_trace(trace)) - 1  # the shortest trace: it shows at its last op


def test_rules_are_on_the_engine_authors_page_and_listed_as_vectors(capsys):
    page = (ROOT / "docs" / "engine-authors.md").read_text()
    section = page[page.index("## Rules an allocator must follow"):]
    for rule in RULES: assert f"rules/{rule}" in section, rule
    assert main(["vectors", "--kind", "trace", "--checkable", "--paths"]) == 0
    listed = capsys.readouterr().out
    assert all(f"rules/{rule}.jsonl" in listed for rule in RULES)
    assert (GOLDEN / "rules" / "PROVENANCE.md").is_file()


def test_rule_traces_run_from_the_command_the_page_gives(capsys, tmp_path, monkeypatch):
    "The page's command: every rule trace, kvref's own adapter conforms on each."
    monkeypatch.chdir(tmp_path)
    paths = _paths(capsys, "rules/", "--kind", "trace")
    assert sorted(Path(p).name for p in paths) == sorted(f"{r}.jsonl" for r in RULES)
    assert main(["check", "--adapter", KVREF_ADAPTER, *paths]) == 0


# ------------------------------------------------------------------- item 6: the README's commands, as a pip user runs them

import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

MY_ENGINE = "from kvref.oracle.replay import KVRefAdapter as make  # an engine that conforms: kvref's own allocator\n"


def readme_commands() -> list[str]:
    "The shell lines of the README's 'Use it as an oracle' section, the pip installs left out."
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use it as an oracle"):text.index("From Python, ")]
    return [line for block in re.findall(r"```sh\n(.*?)```", section, re.S) for line in block.splitlines()
            if line.strip() and not line.startswith("pip ")]


def run_readme(bin_dir: Path, cwd: Path, env: dict) -> None:
    "Run every README oracle command from `cwd` with `bin_dir`'s `kvref`: each exits 0 and prints what it claims."
    (cwd / "my_engine.py").write_text(MY_ENGINE)
    shutil.copy(GOLDEN / "traces" / "design-doc-example.jsonl", cwd / "my-engine-trace.jsonl")
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
    env.pop("PYTHONHASHSEED", None)
    commands = readme_commands()
    assert len(commands) >= 12 and not any("golden/" in c for c in commands)
    for command in commands:
        r = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (command, r.stdout[-2000:], r.stderr[-2000:])
        if claim := re.search(r"# (\d+ vectors, \d+ match)", command): assert claim.group(1) in r.stdout, (command, r.stdout)
    assert (cwd / "curve.svg").is_file()


def test_readme_oracle_commands_from_outside_the_clone(tmp_path):
    "The console script of this environment, run from a folder outside the clone: no command needs a `golden/` path."
    run_readme(Path(sys.executable).parent, tmp_path, dict(os.environ))


@pytest.mark.slow
def test_readme_oracle_commands_after_a_non_editable_install(tmp_path):
    "A wheel of the clone installed into a throwaway venv (its dependencies read from this one), the clone out of sight."
    import sysconfig
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=900)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # a plain path: its editable kvref is not activated
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                    str(next(tmp_path.glob("kvref-*.whl")))], env=env, check=True, timeout=900)
    where = subprocess.run([venv / "bin" / "python", "-c", "import kvref.oracle.replay as r; print(r.golden_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy and its packaged vectors, not the clone's
    (work := tmp_path / "work").mkdir()
    run_readme(venv / "bin", work, env)


# ------------------------------------------------------------------- item 8: shrinking

from kvref.oracle.conformance import shrink  # noqa: E402
from kvref.adapters.nano import NanoAdapter  # noqa: E402

SHRINK_CASES = [(NanoAdapter, f"traces/{t}", b) for t in ("trace-11-0", "trace-11-3") for b in ("vllm_0_33", "design_doc")] + \
               [(MMBlockStart, "events/trace-mm-15-0", "vllm_0_33")]  # one pass left it at 3 ops, a second at 2


@pytest.mark.parametrize("adapter, trace, behavior", SHRINK_CASES, ids=lambda x: getattr(x, "__name__", x))
def test_shrinking_reaches_a_fixpoint(adapter, trace, behavior):
    minimal = shrink(adapter, GOLDEN / f"{trace}.jsonl", behavior)
    assert shrink(adapter, minimal, behavior) == minimal


class CountsOneMore(KVRefAdapter):
    "Wrong from the start: one block more free than there is."
    def num_free(self): return super().num_free() + 1


def test_hypothesis_route_prints_the_report_not_the_draws_and_names_its_file(tmp_path, monkeypatch):
    import contextlib, io, unittest
    from kvref.oracle.conformance import conformance_machine
    monkeypatch.chdir(tmp_path)
    machine = conformance_machine(CountsOneMore)
    assert machine.out_path.name.startswith("kvref-divergence-CountsOneMore-") and machine.out_path.name != "kvref-divergence.jsonl"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = unittest.TextTestRunner(stream=out).run(unittest.defaultTestLoader.loadTestsFromTestCase(machine.TestCase))
    text = out.getvalue()
    assert len(result.failures) == 1 and "diverged at op 0" in result.failures[0][1]
    assert "Draw" not in text + result.failures[0][1]
    assert [p.name for p in tmp_path.iterdir()] == [machine.out_path.name]


def test_the_report_shows_the_minimal_traces_own_values(tmp_path, capsys):
    "Re-checking the minimal trace prints the values the first report showed."
    trace = GOLDEN / "traces" / "trace-11-0.jsonl"
    argv = ["check", "--adapter", "kvref.adapters.nano:NanoAdapter", "--behavior", "design_doc", "--out", str(tmp_path)]
    assert main([*argv, str(trace)]) == 1
    first = capsys.readouterr().out
    minimal = tmp_path / "trace-11-0.min.jsonl"
    (again := tmp_path / "again").mkdir()
    assert main([*argv[:-1], str(again), str(minimal)]) == 1
    rerun = capsys.readouterr().out
    report = rerun[:rerun.index("\nminimal trace")]
    assert report in first and first.startswith(f"{trace}: diverged at op ")
    assert (again / "trace-11-0.min.min.jsonl").read_text() == minimal.read_text()  # and it is a fixpoint


# ------------------------------------------------------------------- item 9: adapters

def test_a_file_adapter_imports_its_sibling_modules(tmp_path, monkeypatch, capsys):
    (engine := tmp_path / "engine").mkdir()
    (engine / "pool.py").write_text("from kvref.oracle.replay import KVRefAdapter as Pool\n")
    (engine / "adapter.py").write_text("from pool import Pool\n\nclass Engine(Pool): pass\n")
    (work := tmp_path / "work").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", "--adapter", str(engine / "adapter.py") + ":Engine", str(GOLDEN / "traces" / "design-doc-example.jsonl")]) == 0


class FirstGroupOnly(KVRefAdapter):
    "A single-group adapter that reads a hybrid config as best it can: the first group's block size."
    def __init__(self, config):
        super().__init__({"num_blocks": config["num_blocks"], "block_size": config["groups"][0]["block_size"]})


@pytest.mark.parametrize("adapter, why", [(KVREF_ADAPTER, "raised on its config"),
                                          ("test_first_contact:FirstGroupOnly", "answered with one block table")])
def test_a_single_group_adapter_on_a_hybrid_trace_is_told_so(adapter, why, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    assert main(["check", "--adapter", adapter, str(GOLDEN / "hybrid" / "hybrid-gpt-oss-11-1.jsonl")]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and "this is a hybrid trace" in captured.err and why in captured.err
    assert "File " not in captured.err + captured.out


# ------------------------------------------------------------------- item 10: rough edges

def test_the_site_is_not_rebuilt_when_nothing_changed(tmp_path, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("kvref_docs_build", ROOT / "docs" / "build.py")
    build = importlib.util.module_from_spec(spec); spec.loader.exec_module(build)
    def rebuilt(*args, **kwargs): raise AssertionError("rebuilt although nothing changed")
    monkeypatch.setattr(build, "execute", rebuilt)
    (tmp_path / build.SITE_KEY).write_text(build.site_key())
    build.build(tmp_path)  # current: nothing runs
    (tmp_path / build.SITE_KEY).write_text("an older key")
    with pytest.raises(AssertionError, match="rebuilt"): build.build(tmp_path)
