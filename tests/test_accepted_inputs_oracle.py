"""Issue 32, the accepted inputs, second part: the oracle chapters and the offload replay.

The same census as `test_accepted_inputs.py` (its `MENU`, its verdict rules, its `census`), over the fuzz table's
oracle entry points (replay, conformance, workloads, production traces, releases, router conformance, live audit,
event replay, hybrid replay) and a few more (`EXTRA`: `replay`, `list_vectors`, `vector_path`, `load_recording`,
`MooncakeRequest`, `replay_offload`, `audit_files`). Each accepted value has a verdict: "refused" rows are in `REFUSED`
(a named `TypeError`/`ValueError`, nothing changed); every other one is "accepted as vLLM 0.33 does: <where>" or
"in range: <why>". These are kvref's own tools where vLLM has no counterpart: a value that would give a wrong or
empty answer (a check comparing nothing, a hit rate of no requests, an algorithm silently defaulted) is refused.

10**18 as a workload generator's count or size ran until the machine gave out; each size now has a named limit
(`workloads.MAX_WORKLOAD_SIZE`), so the census tries it like any other value. (`synthesize_prompt` with a hash block
of 10**18 tokens built the whole block before cutting it at the prompt's length; it now builds only the prompt.)
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import test_accepted_inputs as base
from fuzz_support import Entry
from fuzz_table import ENTRIES, TRACE
from kvref import kv_offload
from kvref.oracle import conformance, live_audit, workloads, production_traces, recorded_engine, releases, replay, router_conformance

ROOT = Path(__file__).resolve().parents[1]
HUGE = base.HUGE
SCOPE = re.compile(r"^(replay\.|TraceReplayer|TraceDriver|conformance|workloads|production_traces|releases|"
                   r"router_conformance|live_audit|EngineAudit|event_replay|hybrid_replay|HybridTrace)")
GENERATORS = ("shared_system_prompts", "multi_turn_chat", "long_documents", "adversarial_tiny_pool", "salted_tenants", "lora_mix")
MOONCAKE = list(production_traces.read_mooncake(ROOT / "golden" / "mooncake" / "synthetic-trace-last300.jsonl"))[:3]
VECTOR = replay.list_vectors()[0].name
RECORDING = ROOT / "golden" / "events" / "real-engine" / "0.32.0" / "seed-0"
AUDIT = ROOT / "golden" / "events" / "audit" / "engine-a.jsonl"


def nothing(): return None


EXTRA = [
    Entry("replay.replay", nothing, lambda _, o, b, s: list(replay.replay(o, b, s)), (TRACE, "vllm_0_33", False),
          ("seq", "name", "bool")),
    Entry("replay.list_vectors", nothing, lambda _, k, v, c: replay.list_vectors(k, v, c), (None, None, False),
          ("name", "name", "bool")),
    Entry("replay.vector_path", nothing, lambda _, n: replay.vector_path(n), (VECTOR,), ("name",)),
    Entry("recorded_engine.load_recording", nothing, lambda _, f: recorded_engine.load_recording(f), (RECORDING,), ("str",)),
    Entry("production_traces.MooncakeRequest", nothing,
          lambda _, t, i, o, h: production_traces.read_mooncake.__globals__["_check_mooncake"](
              production_traces.MooncakeRequest(t, i, o, h), 512, 16), (0, 20, 2, [1]), ("count", "positive", "count", "tokens")),
    Entry("kv_offload.replay_offload", nothing, lambda _, r, g, c, p: kv_offload.replay_offload(r, g, c, p, block_size=256),
          (MOONCAKE, 900, 600, "lru"), ("seq", "positive", "count", "name")),
    Entry("kv_offload.offload_sweep", nothing,
          lambda _, r, g, c, p: kv_offload.offload_sweep(r, g, c, p, block_size=256, jobs=1),
          (MOONCAKE, [900], [0], ("lru",)), ("seq", "seq", "seq", "seq")),
    Entry("recorded_engine.check_recording", nothing, lambda _, f: recorded_engine.check_recording(f), (RECORDING,), ("str",)),
    Entry("live_audit.audit_files", nothing, lambda _, c, p: live_audit.audit_files(c, p),
          ([live_audit.EngineConfig("a", "0.33.0", "sha256", 4)], [AUDIT]), ("seq", "seq")),
]
TARGETS = [e for e in ENTRIES if SCOPE.match(e.name)] + EXTRA

EMPTY_TRACE = "in range: an empty trace replays to nothing; the commands and checks refuse a run that compared nothing"
SEED = ("accepted as vLLM 0.33 does: init_none_hash hashes any PYTHONHASHSEED that is set, '' included "
        "(05a, Hash functions and NONE_HASH)")
BY_CALL = {
    ("workloads.RequestSpec lora", 0, "None"): "in range: None is the default (no LoRA)",
    ("workloads.RequestSpec cache_salt", 0, "''"): base.SALT,
    ("workloads.RequestSpec cache_salt", 0, "None"): "in range: None is the default (no salt)",
    ("workloads.RequestSpec output", 0, "[]"): "in range: a request that finishes on its first step",
    ("workloads.write_trace", 0, "b'x'"): "in range: a bytes path, as open() takes",
    ("releases.siphash13", 2, "b'x'"): "in range: the bytes siphash13 hashes",
    ("releases.release_hash_fn", 2, "''"): SEED, ("releases.release_none_hash", 2, "''"): SEED,
    ("live_audit.EngineConfig", 4, "''"): SEED,
    ("releases.release_block_hashes salt", 0, "''"): base.SALT,
    ("router_conformance.offset_endpoint_port", 0, "''"): (
        "accepted as vLLM 0.33 does: ZmqEventPublisher.offset_endpoint_port returns an empty endpoint as given "
        "(07d, Publishing over ZMQ)"),
    ("router_conformance.trace_prompts", 0, "''"): "in range: a stream name is any str, used only to name the trace",
    ("EngineAudit.check", 1, "b'x'"): "in range: the payload is bytes; one that does not decode is a finding, not an error",
    ("conformance.check_recorded", 0, "[]"): "in range: no recorded decisions is a divergence at op 0, not a pass",
    ("conformance.check_recorded", 0, "()"): "in range: no recorded decisions is a divergence at op 0, not a pass",
    ("workloads.Workload", 0, "[]"): ("in range: a workload of no requests runs no steps; 06 builds one to get a manager "
                                      "from a config alone"),
    ("releases.release_block_hashes", 1, "[]"): "in range: no tokens, no full blocks: no hashes, as vLLM 0.33",
    ("releases.release_event_block_hashes", 1, "[]"): "in range: no hashes published, none mapped",
    ("releases.release_event_block_hashes", 1, "()"): "in range: no hashes published, none mapped",
    ("production_traces.format_results", 0, "[]"): "in range: a table of no rows",
    ("production_traces.format_results", 0, "()"): "in range: a table of no rows",
    ("replay.list_vectors", 0, "None"): "in range: None is every kind",
    ("replay.list_vectors", 1, "None"): "in range: None is every release",
}
for _name in ("hybrid_replay.replay_hybrid", "releases.replay_release", "router_conformance.op_batches",
              "router_conformance.event_records", "router_conformance.trace_prompts", "replay.replay"):
    for _v in ("[]", "()"): BY_CALL[(_name, 0 if _name != "router_conformance.trace_prompts" else 1, _v)] = EMPTY_TRACE


def verdict(entry, i, value) -> str | None:
    return BY_CALL.get((entry.name, i, repr(value))) or base.verdict(entry, i, value)


def census():
    "(tried, [(entry, argument, value, verdict or None)] for every value accepted)."
    tried, accepted = 0, []
    for entry in TARGETS:
        for i, kind in enumerate(entry.kinds):
            for value in base.MENU.get(kind, ()) if kind else ():
                args = list(entry.args); args[i] = value
                tried += 1
                try: entry.call(entry.make(), *args)
                except Exception: continue
                accepted.append((entry.name, i, repr(value)[:40], verdict(entry, i, value)))
    return tried, accepted


P033 = releases.profile_for_version("0.33.0")
CONFIG = {"op": "config", "num_blocks": 8, "block_size": 4}
# Accepted before this round, refused now: each gave a wrong or empty answer.
REFUSED = [
    (lambda v: releases.release_block_hashes(P033, [1, 2, 3, 4], 4, v), ("",), ValueError,
     "offers hash algorithms"),  # '' was read as "the release default"
    (lambda v: conformance.check(conformance.kvref_factory(), [CONFIG], fields=v), ([], ()), ValueError,
     "fields must be at least one decision field"),  # a pass that compared nothing
    (lambda v: router_conformance.ExampleRouter(v), (None, np.int64(1), b"x"), TypeError,
     "config must be a dict"),  # failed later, on the first event, with a KeyError
    (lambda v: production_traces.ideal_hit_rate(v), ([], ()), ValueError,
     "requests must be at least one request"),  # 0.0: the hit rate of no requests
    (lambda v: list(replay.replay(TRACE, "vllm_0_33", v)), (None, 0, 1, "True", np.True_), TypeError,
     "strict must be a bool"),  # 'True' and None were read as truthiness
    (lambda v: workloads.write_trace(v, "/nonexistent/kvref/never-written.jsonl"), ([], ), ValueError,
     "ops must hold at least the config op"),  # wrote an empty file that every reader refuses
    (lambda v: replay.list_vectors(vllm=v), ("", "SHA256"), ValueError, "vllm must be a release"),  # matched nothing: []
    (lambda v: replay.list_vectors(checkable=v), (None, 0, 1, "True", np.True_), TypeError, "checkable must be a bool"),
]
REFUSED_CALLS = {("releases.release_block_hashes", 3, "''"), ("conformance.check fields", 0, "[]"),
                 ("conformance.check fields", 0, "()"), ("router_conformance.ExampleRouter", 0, "None"),
                 ("router_conformance.ExampleRouter", 0, "np.int64(1)"), ("router_conformance.ExampleRouter", 0, "b'x'"),
                 ("production_traces.ideal_hit_rate", 0, "[]"), ("production_traces.ideal_hit_rate", 0, "()"),
                 ("replay.replay", 2, "None"), ("replay.list_vectors", 1, "''"), ("workloads.write_trace", 0, "[]"), ("replay.list_vectors", 2, "None")}


def test_every_accepted_oracle_input_has_a_verdict():
    tried, accepted = census()
    undecided = [a for a in accepted if a[3] is None]
    assert not undecided, "accepted with no verdict:\n" + "\n".join(map(str, undecided))
    assert tried > 500 and len(accepted) > 60
    assert not [a for a in accepted if a[:3] in REFUSED_CALLS]  # what REFUSED names, the census sees refused too


@pytest.mark.parametrize("row", range(len(REFUSED)))
def test_refused_by_name(row):
    base.assert_refused(*REFUSED[row])


def test_accepted_as_vllm_behave_as_vllm():
    "The executed checks behind this file's 'accepted as vLLM 0.33 does' rows."
    assert router_conformance.offset_endpoint_port("", 1) == ""  # vLLM: `if not endpoint ...: return endpoint`
    # PYTHONHASHSEED='' is set: hashed as '', not the unset default
    assert releases.release_none_hash(P033, "sha256", "") != releases.release_none_hash(P033, "sha256", None)


# The command line: every subcommand's flags that take a number or a choice, each given the bad texts of `BAD_TEXT`.
# A text the parser takes must be refused by the command (exit 2, one line on stderr) or be in range (`CLI_IN_RANGE`).
from kvref import cli  # noqa: E402

BAD_TEXT = ["-1", "0", "1.5", "x", "", "1e3", "9" * 30, "nan", "SHA256"]
CLI_FILL = {"hash": ["1"], "events": [str(ROOT / "golden" / "traces" / "design-doc-example.jsonl")]}
CLI_IN_RANGE = {("cudagraph", "--num-speculative-tokens", "0"): "no speculative tokens, the default",
                ("events", "--dp-rank", "0"): "rank 0, the first engine", ("events", "--wait-s", "0"): "publish at once",
                ("events", "--wait-s", "1.5"): "in 0-60", ("events", "--serve-s", "0"): "no replays served, the default",
                ("events", "--serve-s", "1.5"): "in 0-3600", ("events", "--serve-s", "1e3"): "in 0-3600"}


class _Parsed(Exception): pass


def cli_parsers(monkeypatch) -> dict:
    "Each subcommand's parser, caught as it is asked to parse."
    found = {}
    def grab(self, args=None, namespace=None): raise _Parsed(self)
    with monkeypatch.context() as m:
        m.setattr(cli.CommandParser, "parse_args", grab)
        for sub in cli.SUBCOMMANDS:
            try: cli.main([sub])
            except _Parsed as p: found[sub] = p.args[0]
    return found


def test_every_cli_flag_value_is_refused_or_in_range(monkeypatch, capsys):
    parsers, tried, parsed = cli_parsers(monkeypatch), 0, []
    assert len(parsers) == len(cli.SUBCOMMANDS)
    original = cli.CommandParser.parse_args
    def parse(self, args=None, namespace=None): raise _Parsed(original(self, args, namespace))
    for sub, p in parsers.items():
        fill = CLI_FILL.get(sub, ["x"] * sum(1 for a in p._actions if not a.option_strings and a.nargs in (None, "+", 1)))
        for a in p._actions:
            if not a.option_strings or (a.type is None and a.choices is None) or a.nargs == 0: continue
            for text in BAD_TEXT:
                tried += 1
                with monkeypatch.context() as m:
                    m.setattr(cli.CommandParser, "parse_args", parse)
                    try: cli.main([sub, *fill, a.option_strings[-1], text])
                    except _Parsed: parsed.append((sub, a.option_strings[-1], text))
                    except SystemExit as e: assert e.code == 2
                capsys.readouterr()
    undecided = []
    for sub, flag, text in parsed:  # the parser took it: the command refuses it, or it is in range
        if (sub, flag, text) in CLI_IN_RANGE: continue
        status, err = cli.main([sub, *CLI_FILL.get(sub, []), flag, text]), capsys.readouterr().err
        if not (status == 2 and err.count("\n") == 1 and "Traceback" not in err): undecided.append((sub, flag, text, status, err))
    assert not undecided, undecided
    assert tried > 250 and len(parsed) >= 20


@pytest.mark.parametrize("name", GENERATORS)
def test_a_workload_generator_refuses_a_size_past_its_limit(name):
    "A count of 10**18 is refused at once, by name and limit (it ran until memory gave out)."
    generator = getattr(workloads, name)
    first = next(iter(__import__("inspect").signature(generator).parameters))
    with pytest.raises(ValueError, match=rf"{first} must be an int >= 1 and <= {workloads.MAX_WORKLOAD_SIZE}, got {HUGE}"):
        generator(**{first: HUGE})
