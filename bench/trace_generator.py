"""Time and peak memory of `kvref gen-trace` writing a large trace, and how close its shape comes to its source's.

Run: `.venv/bin/python bench/trace_generator.py [--requests 1000000] [--like TRACE.jsonl] [--cut 100000] [--out PATH]`.
The command runs in a child process (its CPU time and peak RSS are the child's own); a one-request run gives the
memory of Python and kvref alone. The shape is compared on the first `--cut` requests of the written trace.
"""
import argparse, json, resource, subprocess, sys, time
from itertools import islice
from pathlib import Path

from kvref.oracle.production_traces import ideal_hit_rate, read_mooncake
from kvref.oracle.trace_generator import trace_shape

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "golden" / "mooncake" / "synthetic_trace.jsonl"


def run_child(out: str, requests: int, like: str | None) -> dict:
    "Run `kvref gen-trace` in a child process: wall and CPU seconds, peak RSS in MB."
    code = "import sys; from kvref.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "gen-trace", out, "--requests", str(requests)] + (["--like", like] if like else [])
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL) as child:
        _, status, usage = __import__("os").wait4(child.pid, 0)
    wall = time.perf_counter() - start
    assert status == 0, f"gen-trace exited {status}"
    return dict(wall_s=round(wall, 1), cpu_s=round(usage.ru_utime + usage.ru_stime, 1), peak_rss_mb=round(usage.ru_maxrss / 1024, 1))


def compare(source: list, drawn: list) -> dict:
    "The shares a replay notices, source against drawn; the ideal hit rate at block sizes 512 and (on 10,000) 16."
    s, d = trace_shape(source), trace_shape(drawn)
    row = lambda t, sh: dict(requests=len(t), turn_share=round(sh.turn_share, 4), branch_share=round(sh.branch_share, 4),
                             shared_token_share=round(sh.shared_token_share, 4), ideal_512=round(ideal_hit_rate(t, 512), 4),
                             ideal_16_first_10k=round(ideal_hit_rate(t[:10_000], 16), 4),
                             input_p10_p50_p90=[sorted(r.input_length for r in t)[len(t) * q // 10] for q in (1, 5, 9)],
                             mean_input=round(sum(r.input_length for r in t) / len(t)))
    return dict(source=row(source, s), drawn=row(drawn, d))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--like", help="the source trace (default: the shipped synthetic trace)")
    p.add_argument("--cut", type=int, default=100_000, help="requests of the written trace whose shape is compared")
    p.add_argument("--out", default="/tmp/gen-trace-bench.jsonl")
    a = p.parse_args()
    alone = run_child(a.out, 1, a.like)
    full = run_child(a.out, a.requests, a.like)
    size = Path(a.out).stat().st_size
    source = list(read_mooncake(a.like or SOURCE))
    shape = compare(source, list(islice(read_mooncake(a.out), a.cut)))
    print(json.dumps(dict(requests=a.requests, like=a.like or "the shipped synthetic trace", one_request=alone, run=full,
                          file_mb=round(size / 1e6), shape_on_first=a.cut, **shape), indent=1))


if __name__ == "__main__":
    main()
