"""`kvref replay` against vLLM 0.33's own `KVCacheManager` on the same trace file, file reading and parsing included.

Three sides replay one trace file (format 2, one op per JSON line) and emit each op's decision as a JSON line:

- **kvref CLI**: `kvref replay FILE` as a subprocess (`python -c "from kvref.cli import main; main()" replay FILE`,
  stdout to /dev/null). Its clock covers everything a user waits for: the interpreter starting, importing kvref,
  reading, parsing and validating the file, the replay, writing every decision. Measured as the child's CPU time
  (user + system, `os.wait4`) and wall time.
- **kvref in-process**: `kvref.cli.main(["replay", FILE])` in this process (kvref already imported), stdout to
  /dev/null: the same as the CLI less interpreter start and imports. CPU (`time.process_time`) and wall time.
- **vLLM**: vLLM 0.33's `KVCacheManager` (`vllm/v1/core/kv_cache_manager.py`, one full-attention group, on the
  CPU; vLLM already imported) driven by a minimal loop written here: read the file, `json.loads` each line, then per
  op the calls kvref's trace driver makes (`Request(...)` with vLLM's block hasher, `get_computed_blocks` for a
  request with nothing computed, `allocate_slots`, `append_output_token_ids`, `free`), and each op's decision
  (`hit_tokens`, `num_new_tokens`, `allocated`, `block_ids`, `num_free`) written as a JSON line to /dev/null. It
  validates nothing and reports no free-queue changes (kvref's decisions carry `taken`/`to_head`/`to_tail` too):
  the least a tool needs to print vLLM's decisions for a trace file. Like `kvref replay`, it pauses Python's cyclic
  garbage collector while it reads and replays (without that, its time grows by 0-8 %; kvref's by 23-51 %).

Before timing, one untimed run of each: kvref's printed decisions and vLLM's must agree on every field vLLM's
decisions carry, op by op, and the final free queues must be equal. Then `--repeat` interleaved repetitions, the
order of the sides rotated each time; ratios kvref / vLLM are taken per repetition (CPU time; wall time beside it)
and reported as median and range, with the load average; beside them each side's least CPU time and the ratio of the
least times, which on a machine shared with other work is the steadier of the two.

Run (a Python where vLLM 0.33 imports, kvref on the path):
    PYTHONPATH=$PWD /work/vvenv/bin/python bench/replay_vs_vllm.py [--trace FILE] [--repeat 5] [--mooncake] [--before TREE] [--check]
        [--fresh-vllm]
Without --trace it writes the default trace (`shared_system_prompts`, 2,400 requests, 120,001 ops) to a temporary
folder. `--mooncake` also replays the shipped Mooncake sample converted by `kvref convert` (set to format 2).
`--profile` runs the in-process kvref side under cProfile and prints the top functions. `--before TREE` also times
`kvref replay` of another kvref tree (PYTHONPATH=TREE; e.g. a worktree of main before a change) in the same rotation.
`--check` also times `kvref check TRACE --expect DECISIONS` (kvref's own format 2 decisions, written once), of both
trees, in the same rotation: it reads and parses a second file of the same length, so vLLM's replay is its yardstick
only as "the same trace, replayed". `--fresh-vllm` also times vLLM's loop in a fresh process, vLLM imported first
and not counted: what a new process pays for the memory it maps, which the in-process sides have already mapped.

Both trees' modules are compiled to bytecode first, as `pip install` does: this environment sets
PYTHONDONTWRITEBYTECODE=1, under which every run of the command would compile kvref's modules from source again.
"""
from __future__ import annotations
import argparse, compileall, cProfile, datetime, gc, io, json, os, platform, pstats, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from kvref.oracle.workloads import shared_system_prompts, to_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from kvref.cli import main; sys.exit(main())"


def default_trace(path: Path) -> Path:
    "2,400 requests: 16 system prompts of 512 tokens, 64 user tokens each, 24 output tokens, 32 live, 2,048 blocks."
    w = shared_system_prompts(num_prompts=16, num_users=150, system_len=512, user_len=64, output_len=24,
                              block_size=16, num_blocks=2048, seed=0)
    ops = to_trace(w, max_live=32)
    ops[0]["version"] = 2
    return write_trace(ops, path)


def mooncake_trace(path: Path) -> Path:
    "The shipped 300-request Mooncake sample through `kvref convert` (65,536 blocks), its config set to format 2."
    out = subprocess.run([sys.executable, "-c", CLI, "convert", "--from", "mooncake",
                          str(ROOT / "golden/mooncake/synthetic-trace-last300.jsonl")],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    config = json.loads(out[0]); config["version"] = 2
    path.write_text(json.dumps(config) + "\n" + "\n".join(out[1:]) + "\n")
    return path


def load_vllm():
    from kvref.adapters.vllm import load_vllm as load
    return load()


def vllm_replay(path: Path, v, sink, keep: list | None = None):
    "vLLM 0.33's manager over the trace file's ops, the collector paused as `kvref replay` pauses it; each decision to `sink`."
    was_on = gc.isenabled()
    gc.disable()
    try: return _vllm_replay(path, v, sink, keep)
    finally:
        if was_on: gc.enable()


def _vllm_replay(path: Path, v, sink, keep: list | None):
    with open(path, encoding="utf-8") as f: ops = [json.loads(line) for line in f if line.strip()]
    config = ops[0]
    size = config["block_size"]
    spec = v.FullAttentionSpec(block_size=size, num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    kv_config = v.KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[],
                                kv_cache_groups=[v.KVCacheGroupSpec(["layer.0"], spec)])
    hash_fn = v.get_hash_fn_by_name(config.get("hash_algo", "sha256"))
    v.init_none_hash(hash_fn)
    manager = v.KVCacheManager(kv_config, max_model_len=config.get("max_model_len") or 2**31 - 1,
                               scheduler_block_size=size, hash_block_size=size,
                               enable_caching=config.get("enable_caching", True))
    hasher, params, pool = v.get_request_block_hasher(size, hash_fn), v.SamplingParams(max_tokens=1), manager.block_pool
    requests, lora_ids, dumps, write = {}, {}, json.dumps, sink.write
    write(dumps({"op": "config", "num_free": pool.get_num_free_blocks()}) + "\n")
    for op in ops[1:]:
        kind, rid = op["op"], op.get("id")
        d = {"op": kind, "id": rid}
        if kind == "schedule":
            r = requests[rid]
            computed = r.num_computed_tokens
            hits, num_hit = manager.get_computed_blocks(r)[:2] if computed == 0 else (None, 0)
            num_new = r.num_tokens - computed - num_hit
            if op.get("budget") is not None: num_new = min(num_new, op["budget"])
            ok = manager.allocate_slots(r, num_new, num_hit, hits if num_hit else None,
                                        num_lookahead_tokens=op.get("num_lookahead_tokens", 0)) is not None
            if ok: r.num_computed_tokens = computed + num_hit + num_new
            d.update(hit_tokens=num_hit, num_new_tokens=num_new, allocated=ok,
                     block_ids=list(manager.get_block_ids(rid)[0]))
        elif kind == "append": requests[rid].append_output_token_ids(op["tokens"])
        elif kind == "add":
            lora = op.get("lora")
            lora_request = lora and v.LoRARequest(lora["name"], lora_ids.setdefault(lora["name"], len(lora_ids) + 1), lora["path"])
            features = [v.MultiModalFeatureSpec(data=None, modality="image", identifier=m["identifier"],
                                                mm_position=v.PlaceholderRange(m["offset"], m["length"]))
                        for m in op.get("mm_items", ())]
            requests[rid] = v.Request(rid, op["prompt"], params, None, mm_features=features or None,
                                      lora_request=lora_request, cache_salt=op.get("cache_salt"), block_hasher=hasher)
        elif kind == "free":
            r = requests.pop(rid, None)
            if r is not None: manager.free(r)
        elif kind == "preempt":
            manager.free(requests[rid]); requests[rid].num_computed_tokens = 0
        elif kind == "reset_prefix_cache": d["ok"] = bool(manager.reset_prefix_cache())
        d["num_free"] = pool.get_num_free_blocks()
        write(dumps(d) + "\n")
        if keep is not None: keep.append(d)
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def kvref_in_process(path: Path, out) -> None:
    "`kvref replay FILE` in this process, its stdout sent to `out`."
    from kvref.cli import main
    saved, sys.stdout = sys.stdout, out
    try: status = main(["replay", str(path)])
    finally: sys.stdout = saved
    if status != 0: raise RuntimeError(f"kvref replay {path} exited {status}")


def kvref_cli(path: Path, tree: Path | None = None, expect: Path | None = None) -> tuple[float, float]:
    "Wall and CPU seconds (user + system) of `kvref replay FILE` (`kvref check FILE --expect EXPECT`) as a subprocess (kvref from `tree`, else this one's)."
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    command = ["replay", str(path)] if expect is None else ["check", str(path), "--expect", str(expect)]
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CLI, *command], stdout=subprocess.DEVNULL, env=env,
                             cwd=tree or ROOT)  # `python -c` puts the working folder first on sys.path
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0: raise RuntimeError(f"kvref {' '.join(command)} exited {child.returncode}")
    return time.perf_counter() - t, usage.ru_utime + usage.ru_stime


def vllm_fresh(path: Path) -> tuple[float, float]:
    "Wall and CPU seconds of `vllm_replay` in a fresh process, after vLLM's import (not counted): the memory a new process maps, counted."
    code = ("import json, os, sys, time; sys.path.insert(0, sys.argv[1]); import replay_vs_vllm as b; from pathlib import Path\n"
            "v = b.load_vllm(); sink = open(os.devnull, 'w'); w, c = time.perf_counter(), time.process_time()\n"
            "b.vllm_replay(Path(sys.argv[2]), v, sink); print(json.dumps([time.perf_counter() - w, time.process_time() - c]))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(path)], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return tuple(json.loads(out.splitlines()[-1]))


def timed(fn) -> tuple[float, float]:
    "Wall and CPU seconds of `fn()` in this process."
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def same_decisions(path: Path, v) -> str:
    "Check kvref's printed decisions against vLLM's, op by op; a one-line summary, or AssertionError."
    buffer = io.StringIO()
    kvref_in_process(path, buffer)
    ours = [json.loads(line) for line in buffer.getvalue().splitlines()]
    theirs: list[dict] = []
    their_queue = vllm_replay(path, v, io.StringIO(), theirs)
    assert len(ours) == len(theirs) + 1, (len(ours), len(theirs))
    for i, (a, b) in enumerate(zip(ours[1:], theirs), 1):
        differ = [k for k in b if k != "id" and a.get(k) != b[k]]
        assert not differ, f"op {i}: {differ}: kvref {a} vLLM {b}"
    from kvref.oracle.replay import TraceReplayer, load_trace
    replayer = TraceReplayer()
    for op in load_trace(path): replayer.apply(op)
    assert replayer.manager.get_free_queue_ids() == their_queue, "final free queues differ"
    schedules = sum(1 for d in theirs if d["op"] == "schedule")
    return (f"same decisions: {len(theirs)} ops ({schedules} schedules, "
            f"{sum(d['hit_tokens'] for d in theirs if d['op'] == 'schedule'):,} hit tokens), final free queue equal")


def compare(path: Path, v, repeat: int, before: Path | None = None, expect: Path | None = None, fresh: bool = False) -> dict:
    "Interleaved repetitions of the sides (the CLI of kvref tree `before` too, if given; `kvref check --expect` too, if `expect`); per-repetition times."
    devnull = open(os.devnull, "w")
    sides = {"cli": lambda: kvref_cli(path), "kvref": lambda: timed(lambda: kvref_in_process(path, devnull)),
             "vllm": lambda: timed(lambda: vllm_replay(path, v, devnull))}
    if before is not None: sides["before"] = lambda: kvref_cli(path, before.resolve())
    if expect is not None: sides["check"] = lambda: kvref_cli(path, None, expect)
    if expect is not None and before is not None: sides["check_before"] = lambda: kvref_cli(path, before.resolve(), expect)
    if fresh: sides["vllm_fresh"] = lambda: vllm_fresh(path)
    runs = {k: [] for k in sides}
    loads = [os.getloadavg()[0]]
    for i in range(repeat):
        order = list(sides)[i % len(sides):] + list(sides)[:i % len(sides)]
        for k in order: runs[k].append(sides[k]())
        loads.append(os.getloadavg()[0])
    return {"runs": runs, "loads": loads}


def summary(result: dict) -> list[str]:
    runs, rows = result["runs"], []
    med = lambda xs: statistics.median(xs)
    names = (("before", "kvref CLI before (subprocess)"), ("cli", "kvref CLI (subprocess)"), ("kvref", "kvref in-process"),
             ("check_before", "`kvref check --expect` before (subprocess)"), ("check", "`kvref check --expect` (subprocess)"),
             ("vllm", "vLLM 0.33 manager"), ("vllm_fresh", "vLLM 0.33 manager, fresh process (import not counted)"))
    least = lambda k: min(c for _, c in runs[k])
    for k, name in ((k, name) for k, name in names if k in runs):
        rows.append(f"| {name} | {med([c for _, c in runs[k]]):.2f} | {least(k):.2f} | {med([w for w, _ in runs[k]]):.2f} "
                    + (f"| {ratio(runs[k], runs['vllm'], 1)} | {least(k) / least('vllm'):.2f} | {ratio(runs[k], runs['vllm'], 0)} |"
                       if k != "vllm" else "| 1 | 1 | 1 |"))
    return rows


def ratio(ours, theirs, which: int) -> str:
    "Median (range) of ours / theirs per repetition; which: 1 CPU, 0 wall."
    r = sorted(a[which] / b[which] for a, b in zip(ours, theirs))
    return f"{statistics.median(r):.2f} ({r[0]:.2f}-{r[-1]:.2f})"


def profile(path: Path) -> None:
    devnull = open(os.devnull, "w")
    p = cProfile.Profile(); p.enable(); kvref_in_process(path, devnull); p.disable()
    pstats.Stats(p).sort_stats("tottime").print_stats(25)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, help="a format 2 trace file (default: written, see the docstring)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--mooncake", action="store_true", help="also the Mooncake sample through `kvref convert`")
    p.add_argument("--profile", action="store_true", help="profile kvref in-process on the trace, and stop")
    p.add_argument("--before", type=Path, help="another kvref tree (say main) whose `kvref replay` is timed beside")
    p.add_argument("--check", action="store_true", help="also time `kvref check TRACE --expect DECISIONS` (both trees)")
    p.add_argument("--fresh-vllm", action="store_true", help="also time vLLM's loop in a fresh process (its import not counted)")
    a = p.parse_args()
    for tree in (ROOT, a.before):  # bytecode, as an install has it (see the docstring)
        if tree is not None: compileall.compile_dir(Path(tree) / "kvref", quiet=1)
    folder = Path(tempfile.mkdtemp(prefix="kvref-replay-bench-"))
    traces = [a.trace.resolve() if a.trace else default_trace(folder / "shared-system-prompts.jsonl")]
    if a.mooncake: traces.append(mooncake_trace(folder / "mooncake-sample.jsonl"))
    if a.profile: profile(traces[0]); return 0
    v = load_vllm()
    import vllm
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, vLLM {vllm.__version__}\n")
    for path in traces:
        lines = sum(1 for _ in open(path))
        print(f"{path.name}: {lines:,} ops, {path.stat().st_size / 1e6:.1f} MB; " + same_decisions(path, v))
        expect = None
        if a.check:
            expect = folder / (path.stem + ".decisions.jsonl")
            with open(expect, "w") as f: kvref_in_process(path, f)
        result = compare(path, v, a.repeat, a.before, expect, a.fresh_vllm)
        print(f"{a.repeat} interleaved repetitions, load average {min(result['loads']):.1f}-{max(result['loads']):.1f}\n")
        print("| side | CPU s (median) | CPU s (least) | wall s (median) | kvref / vLLM, CPU | kvref / vLLM, least CPU | kvref / vLLM, wall |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(summary(result)) + "\n")
        print("per repetition (wall, CPU): " + "; ".join(f"{k} " + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in runs)
                                                      for k, runs in result["runs"].items()) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
