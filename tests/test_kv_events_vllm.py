"""kvref's payloads decoded by vLLM 0.33.0 itself: skipped unless KVREF_VLLM_VENV names a vLLM 0.33.0 environment
(a virtual environment with a READY marker). vLLM's own KVEventBatch decoder reads every batch kvref emits for every recorded trace, in
both hash forms, and its encoder writes the same bytes back."""
import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from kvref.oracle.router_conformance import op_batches
from test_router_conformance import NAMES, trace

VENV = Path(os.environ.get("KVREF_VLLM_VENV", "")).expanduser()
pytestmark = pytest.mark.skipif(not os.environ.get("KVREF_VLLM_VENV") or not (VENV / "READY").exists(),
                                reason="set KVREF_VLLM_VENV to a virtual environment with vLLM 0.33.0 (and a READY file) to run")

SCRIPT = r'''
import base64, json, sys
import msgspec
from vllm.distributed.kv_events import KVEventBatch
decoder, encoder, bad = msgspec.msgpack.Decoder(KVEventBatch), msgspec.msgpack.Encoder(), []
for i, b64 in enumerate(json.load(sys.stdin)):
    payload = base64.b64decode(b64)
    if encoder.encode(decoder.decode(payload)) != payload: bad.append(i)
print(json.dumps(bad))
'''


@pytest.mark.parametrize("form", ["int", "bytes"])
def test_vllm_reads_and_rewrites_kvref_payloads(form):
    payloads = [base64.b64encode(b.payload).decode() for name in NAMES for b in op_batches(trace(name), form, 0) if b.payload]
    out = subprocess.run([str(VENV / "bin/python"), "-c", SCRIPT], input=json.dumps(payloads), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
