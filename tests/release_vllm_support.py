"""Support for `test_releases_vs_vllm.py`: kvref's release profiles against the releases' own code.

Where the releases live: `KVREF_VLLM_RELEASES` names a folder with one entry per release, named by its version
(`0.9.2`, `0.10.1.1`, ...): a virtual environment (`bin/python`), or a `pip install --no-deps --target` folder of that
release and the pure-Python packages its core imports, run by `KVREF_VLLM_PYTHON` (default: this interpreter; it needs
torch 2.13 and the rest of vLLM's core requirements). `tests/release_vllm_driver.py` runs there and answers with the
release's code; this module makes random cases (hashing) and workloads (allocator traces), asks the release, asks
kvref's profile for that version, and reports where they differ.

Run as a script to record the divergences as goldens: `KVREF_VLLM_RELEASES=DIR python tests/release_vllm_support.py
SEED NUM_CASES NUM_TRACES [VERSION...]` writes `golden/versions-vllm/<version>/` (vectors and traces that kvref got
wrong, with the release's answers) and prints a summary."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from kvref.core.hashing import LoRARequest, MultiModalItem
from kvref.oracle.releases import (profile_for_version, release_block_hashes, release_extra_keys, release_none_hash,
                            load_release_trace, replay_release, _encoded, _event_answer, _vector_answers, _vector_inputs)

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "release_vllm_driver.py"
GOLDEN = ROOT / "golden" / "versions-vllm"
PROVENANCE = "recorded from vLLM {version}'s own code on CPU by tests/release_vllm_support.py (tests/release_vllm_driver.py)"


def release_dirs() -> dict[str, Path]:
    "version -> where that release is installed, from `KVREF_VLLM_RELEASES` (empty when unset)."
    root = os.environ.get("KVREF_VLLM_RELEASES")
    if not root: return {}
    return {p.name: p for p in sorted(Path(root).iterdir())
            if p.name[:1].isdigit() and ((p / "vllm").exists() or (p / "bin" / "python").exists())}


def _command(where: Path) -> tuple[list[str], str]:
    "(interpreter, PYTHONPATH) that runs the release installed at `where`."
    path = os.pathsep.join([str(ROOT), str(DRIVER.parent)])
    if (where / "bin" / "python").exists(): return [str(where / "bin" / "python")], path
    return [os.environ.get("KVREF_VLLM_PYTHON", sys.executable)], os.pathsep.join([str(where), path])


def ask(where: Path, query: dict, pythonhashseed: str | None = "0", timeout: int = 900):
    "The release's answer to one driver query, in a fresh process with PYTHONHASHSEED=`pythonhashseed` (None: unset)."
    python, path = _command(where)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONPATH")}
    env.update(PYTHONPATH=path, VLLM_LOGGING_LEVEL="ERROR", OMP_NUM_THREADS="1")
    if pythonhashseed is not None: env["PYTHONHASHSEED"] = pythonhashseed
    done = subprocess.run(python + [str(DRIVER)], input=json.dumps(query), capture_output=True, text=True, env=env,
                          timeout=timeout)
    if done.returncode: raise RuntimeError(f"driver failed under {where}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


# ---- hashing cases ---------------------------------------------------------------------------------------------

def _token(rng: random.Random) -> int:
    "A token id: mostly a vocabulary's, sometimes a large int (the hash functions take any int)."
    r = rng.random()
    return rng.randrange(200_000) if r < 0.85 else rng.randrange(2**31) if r < 0.95 else rng.randrange(2**63)


def _mm_items(rng: random.Random, num_prompt: int, block_size: int) -> list[dict]:
    "Sorted, disjoint image items inside the prompt: at block starts, mid-block, across boundaries, ending at one."
    items, pos = [], rng.randrange(0, max(1, num_prompt // 2) + 1)
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3: pos = -(-pos // block_size) * block_size  # a block start
        length = rng.randint(1, 2 * block_size + 1)
        if rng.random() < 0.3: length = max(1, (pos // block_size + 1) * block_size - pos)  # ends at a block boundary
        if pos + length > num_prompt: break
        items.append(dict(identifier=f"img{rng.randrange(10**6):06d}", offset=pos, length=length))
        pos += length + rng.choice([0, 0, 1, block_size])
    return items


def random_case(rng: random.Random, info: dict) -> dict:
    "One random hashing case for the release `info` describes."
    algo, size = rng.choice(info["hash_algos"]), rng.choice([1, 2, 3, 4, 4, 5, 8, 16])
    num_prompt = rng.choice([1, max(1, size - 1), size, 2 * size, 3 * size + 1]) if rng.random() < 0.3 else rng.randint(1, 60)
    prompt = [_token(rng) for _ in range(num_prompt)]
    outputs = [_token(rng) for _ in range(rng.choice([0, 0, 1, size, 2 * size + rng.randrange(size + 1)]))]
    lora = None
    if rng.random() < 0.4:
        lora = dict(name=rng.choice(["X", "sql", "tenant-a", "ådapter"]), path=rng.choice(["/p", "/adapters/x"]),
                    int_id=rng.randint(1, 20))
    salt = rng.choice([None, None, "X", "tenant-a", "sålt-ü", "sql"]) if info["cache_salt"] else None
    mm = _mm_items(rng, num_prompt, size) if rng.random() < 0.45 else []
    if mm and rng.random() < 0.3 and num_prompt % size == 0 and num_prompt >= 2:  # an item ending where the first decode block starts
        end = num_prompt
        mm = [i for i in mm if i["offset"] + i["length"] < end - 1][:1]
        mm.append(dict(identifier="img-end", offset=end - 2, length=2))
    seeds = ["0", "0", "0", "42", None] + ([None] if algo in ("sha256", "sha256_cbor") else [])
    return dict(algo=algo, block_size=size, prompt_token_ids=prompt, output_token_ids=outputs, cache_salt=salt,
                lora=lora, mm=mm or None, pythonhashseed=rng.choice(seeds))


def kvref_answers(version: str, case: dict) -> dict:
    "What kvref's profile for `version` says the release computes for `case` (its refusal as {'refused': ...})."
    try: return _vector_answers(profile_for_version(version), case)
    except ValueError as e: return {"refused": str(e)}


def reproducible(version: str, case: dict, answer: dict) -> bool:
    "Whether the release gives the same hashes in every process: else kvref rightly refuses (see the chapter)."
    profile = profile_for_version(version)
    if case["pythonhashseed"] is None: return profile.default_seed is not None and case["algo"] in ("sha256", "sha256_cbor")
    return not (case["algo"] == "builtin" and None in answer["extra_keys"])  # hash(None): an address on CPython 3.11


def hash_divergences(version: str, cases: list[dict], answers: list[dict]) -> list[dict]:
    "Each case where kvref and the release differ: the case with the release's answers and what kvref said."
    out = []
    for case, want in zip(cases, answers):
        got = kvref_answers(version, json.loads(json.dumps(case)))  # its strings decoded apart, as the release got them
        if not reproducible(version, case, want):
            if "refused" not in got: out.append(dict(case=case, vllm=want, kvref=got, field="refusal"))
            continue
        want = {k: v for k, v in want.items() if k != "none_hash_seed"}
        fields = [f for f in want if got.get(f) != want[f]]
        if fields: out.append(dict(case=case, vllm=want, kvref=got, field=fields[0]))
    return out


def ask_hashes(where: Path, cases: list[dict]) -> list[dict]:
    "The release's answers to `cases`, one process per PYTHONHASHSEED (releases up to 0.10.0 read it at import)."
    answers: list = [None] * len(cases)
    for seed in {c["pythonhashseed"] for c in cases}:
        idx = [i for i, c in enumerate(cases) if c["pythonhashseed"] == seed]
        for i, a in zip(idx, ask(where, {"kind": "hash", "cases": [cases[i] for i in idx]}, seed)): answers[i] = a
    return answers


# ---- allocator traces ------------------------------------------------------------------------------------------

def random_trace(rng: random.Random, info: dict, num_ops: int = 60) -> list[dict]:
    "A random allocator trace in the release recordings' format (`mm` items, `lora` {name, path})."
    size = rng.choice([2, 3, 4, 8])
    algos = ["sha256", "sha256_cbor", "xxhash", "builtin", "sha256_cbor_64bit"]
    ops = [dict(op="config", num_blocks=rng.randint(6, 40), block_size=size, enable_caching=rng.random() < 0.85,
                hash_algo=rng.choice(algos), max_model_len=65536)]
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(1, 3 * size))] for _ in range(3)]
    live: dict[str, dict] = {}
    for n in range(num_ops):
        r = rng.random()
        if r < 0.25 or not live:
            rid = f"r{n}"
            prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randint(0 if n else 1, 3 * size))]
            prompt = prompt or [rng.randrange(1000)]
            mm, offset = [], rng.randrange(len(prompt))
            if rng.random() < 0.25:  # one image, anywhere in the prompt, the unfinished block included
                mm = [dict(identifier=rng.choice(["imgA", "imgB"]), offset=offset,
                           length=rng.randint(1, min(len(prompt) - offset, size + 2)))]
            ops.append(dict(op="add", id=rid, prompt=prompt, cache_salt=rng.choice([None, None, None, "a", "X"]),
                            lora=rng.choice([None, None, None, dict(name="X", path="/x"), dict(name="L", path="/l")]),
                            **({"mm": mm} if mm else {})))
            live[rid] = dict(tokens=len(prompt), computed=0)
            continue
        rid = rng.choice(sorted(live))
        state = live[rid]
        if r < 0.6:
            ops.append(dict(op="schedule", id=rid, budget=rng.choice([None, None, 1, 2, size + 1])))
            state["scheduled"] = True
        elif r < 0.78:
            if state.get("scheduled"): ops.append(dict(op="append", id=rid, tokens=[rng.randrange(1000) for _ in range(rng.randint(1, 3))]))
        elif r < 0.86:
            if state.get("scheduled"): ops.append(dict(op="preempt", id=rid))
        elif r < 0.97:
            ops.append(dict(op="free", id=rid)); del live[rid]
        else: ops.append(dict(op="reset_prefix_cache"))
    return ops + [dict(op="free", id=rid) for rid in sorted(live)]


def as_ops(trace: list[dict]) -> list[dict]:
    "The trace's ops as kvref reads a release trace file."
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        path.write_text("".join(json.dumps(op) + "\n" for op in trace))
        return load_release_trace(path)


def trace_divergence(version: str, trace: list[dict], want: list[dict]) -> int | None:
    "The index of the first op whose decision kvref gets wrong, or None."
    got = list(replay_release(as_ops(trace), version))
    return next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None if len(got) == len(want) else len(got))


# ---- recording -------------------------------------------------------------------------------------------------

def record(version: str, where: Path, seed: int, num_cases: int, num_traces: int, out: Path = GOLDEN) -> dict:
    "Compare `num_cases` random hashing cases and `num_traces` random traces; write the divergences under `out`."
    rng = random.Random(f"{version}-{seed}")
    info = ask(where, {"kind": "info"})
    cases = [random_case(rng, info) for _ in range(num_cases)]
    hash_diffs = hash_divergences(version, cases, ask_hashes(where, cases))
    traces = [random_trace(rng, info) for _ in range(num_traces)]
    trace_diffs = []
    answers = ask(where, {"kind": "traces", "traces": [as_ops(trace) for trace in traces]}) if traces else []
    for k, (trace, want) in enumerate(zip(traces, answers)):
        at = trace_divergence(version, trace, want)
        if at is not None: trace_diffs.append((f"diff-{seed}-{k}", trace, want, at))
    folder = out / version
    if hash_diffs:
        folder.mkdir(parents=True, exist_ok=True)
        vectors = [dict(d["case"], **d["vllm"]) for d in hash_diffs]
        (folder / f"block-hashes-{seed}.json").write_text(json.dumps(dict(
            vllm_version=version, provenance=PROVENANCE.format(version=version), vectors=vectors), indent=1) + "\n")
    for name, trace, want, _ in trace_diffs:
        (folder / "traces").mkdir(parents=True, exist_ok=True)
        (folder / "traces" / f"{name}.jsonl").write_text("".join(json.dumps(op) + "\n" for op in trace))
        (folder / "traces" / f"{name}.vllm-{version}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in want))
    return dict(version=version, cases=len(cases), hash_divergences=len(hash_diffs), traces=len(traces),
                trace_divergences=len(trace_diffs), first=hash_diffs[:1] + [t[:1] + t[3:] for t in trace_diffs[:1]])


if __name__ == "__main__":
    seed, num_cases, num_traces, *versions = sys.argv[1:]
    dirs = release_dirs()
    for version in versions or sorted(dirs):
        print(json.dumps(record(version, dirs[version], int(seed), int(num_cases), int(num_traces)))[:3000], flush=True)
