"""Known answers: vLLM 0.33.0's recorded block hashes, kvref's own vector file, and what holds across processes."""
from __future__ import annotations
import hashlib, importlib.util, json, os, re, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pytest

from kvref.core.hashing import (LoRARequest, MultiModalItem, block_hash_to_int64, check_vectors,
                           load_vectors)
from kvref.core.fast_hashing import hash_request_tokens
from kvref.cli import hash_main

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden" / "hashing"
VLLM = GOLDEN / "vllm-0.33-block-hashes.json"
KVREF = GOLDEN / "kvref-block-hashes-v1.json"
VLLM_SHA256 = "b73783d66c515e0b4a22fbc9b870a06bad1bb12f5b75b34a6bc9131e30064c1e"  # see PROVENANCE.md


def _request(v: dict) -> dict:
    embeds = v.get("prompt_embeds")
    return dict(token_ids=v["prompt_token_ids"], block_size=v["block_size"], algo=v["algo"],
                cache_salt=v["cache_salt"], seed=v["none_hash_seed"],
                lora=LoRARequest(**v["lora"]) if v["lora"] else None,
                mm_items=[MultiModalItem(**m) for m in v["mm"] or ()],
                prompt_embeds=None if embeds is None else np.asarray(embeds["rows"], dtype=embeds["dtype"]))


def test_vllm_file_is_the_recorded_one():
    assert hashlib.sha256(VLLM.read_bytes()).hexdigest() == VLLM_SHA256


@pytest.mark.parametrize("index", range(len(json.loads(VLLM.read_text(encoding="utf-8"))["vectors"])))
def test_every_vllm_vector(index):
    v = load_vectors(VLLM)[index]
    assert [h.hex() for h in hash_request_tokens(**_request(v))] == v["block_hashes"]


def test_vllm_vectors_cover_the_extra_keys():
    vectors = load_vectors(VLLM)
    assert {v["algo"] for v in vectors} == {"sha256", "sha256_cbor"}
    assert any(v["mm"] for v in vectors) and any(v["lora"] for v in vectors) and any(v["cache_salt"] for v in vectors)
    assert any(v["lora"] and v["lora"]["name"] == v["cache_salt"] for v in vectors)  # the "X"/"X" case


def test_check_vectors_counts_and_matches():
    assert check_vectors([VLLM]) == (16, None)
    count, mismatch = check_vectors([VLLM, KVREF])
    assert mismatch is None and count == 16 + len(load_vectors(KVREF))


def test_kvref_file_is_what_make_vectors_writes():
    "Regenerating kvref's vectors gives the committed file byte for byte: the algorithm did not drift."
    spec = importlib.util.spec_from_file_location("make_vectors", GOLDEN / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dumps(module.build_vectors()) == KVREF.read_text(encoding="utf-8")


def test_kvref_file_covers_what_it_promises():
    vectors = load_vectors(KVREF)
    assert {v["algo"] for v in vectors} == {"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}
    assert {v["block_size"] for v in vectors} == set(range(1, 33))
    assert any(not v["prompt_token_ids"] for v in vectors)
    assert any(len(v["block_hashes"]) >= 3 for v in vectors)
    assert any(v["mm"] and any(m["length"] > v["block_size"] for m in v["mm"]) for v in vectors)
    assert any("prompt_embeds" in v for v in vectors) and any(v["cache_salt"] for v in vectors)
    assert any(v["lora"] for v in vectors)
    for v in vectors:
        assert v["block_ids_int64"] == [block_hash_to_int64(bytes.fromhex(h)) for h in v["block_hashes"]]


def _tampered(tmp_path, mutate) -> Path:
    data = json.loads(VLLM.read_text(encoding="utf-8"))
    mutate(data)
    path = tmp_path / "vectors.json"
    path.write_text(json.dumps(data))
    return path


def test_cli_check(capsys, tmp_path):
    assert hash_main(["--check", str(VLLM), str(KVREF)]) == 0
    n = 16 + len(load_vectors(KVREF))
    assert capsys.readouterr().out == f"{n} vectors, {n} match\n"

    def flip(data): data["vectors"][3]["block_hashes"][2] = "00" * 32
    path = _tampered(tmp_path, flip)
    assert hash_main(["--check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "vector 3, block 2" in out and "expected " + "00" * 32 in out and str(path) in out

    def short(data): data["vectors"][5]["block_hashes"].pop()
    assert hash_main(["--check", str(_tampered(tmp_path, short))]) == 1
    assert "got " in capsys.readouterr().out


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["vectors"][4].pop("block_size"), r"vector 4: missing field\(s\) block_size"),
    (lambda d: d["vectors"][2].update(algo="md5"), "vector 2: unknown hash algorithm 'md5'"),
    (lambda d: d["vectors"][1].update(lora={"name": "x"}), "vector 1: malformed lora"),
    (lambda d: d["vectors"][7].update(mm=[{"identifier": "i", "offset": 3, "length": 9}]), "vector 7: multimodal item"),
    (lambda d: d["vectors"][0].update(prompt_token_ids=[1, -1]), r"vector 0: token_ids\[1\] is -1"),
    (lambda d: d.pop("vectors"), "no 'vectors' list"),
    (lambda d: d["vectors"][3]["block_hashes"].__setitem__(0, "zz"), "vector 3: block_hashes must be a list of hex strings"),
    (lambda d: d["vectors"][3].update(block_hashes="00ff"), "vector 3: block_hashes must be a list of hex strings"),
    (lambda d: d["vectors"][2].update(block_ids_int64=["12"]), r"vector 2: block_ids_int64 must be a list of ints"),
])
def test_cli_check_malformed_file_is_exit_2(capsys, tmp_path, mutate, message):
    path = _tampered(tmp_path, mutate)
    assert hash_main(["--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
    assert re.search(message, err), err


EMBEDS = {"dtype": "float32", "rows": [[0.5, 1.5]] * 11}

@pytest.mark.parametrize("field, value, message", [
    ("prompt_embeds", "x", "expected"),
    ("prompt_embeds", [1, 2], "expected"),
    ("prompt_embeds", {"rows": [[1.0]] * 11}, "dtype"),
    ("prompt_embeds", {**EMBEDS, "dtype": "nope"}, "nope"),
    ("prompt_embeds", {**EMBEDS, "dtype": "object"}, "numbers"),
    ("prompt_embeds", {**EMBEDS, "dtype": [1]}, "dtype"),
    ("prompt_embeds", {**EMBEDS, "rows": [["a"]] * 11}, "rows"),
    ("prompt_embeds", {**EMBEDS, "rows": [[1.0], [1.0, 2.0]]}, "rows"),
    ("prompt_embeds", {**EMBEDS, "rows": 5}, "2-D"),
    ("prompt_embeds", {**EMBEDS, "rows": [[[1.0]]] * 11}, "2-D"),
    ("prompt_embeds", {"dtype": "int8", "rows": [[1000]] * 11}, "rows"),
    ("lora", [1], "expected"),
    ("lora", {"name": "x"}, "path"),
    ("lora", {"name": 1, "path": "x"}, "must be a str"),
    ("mm", {"a": 1}, "expected"),
    ("mm", "abc", "expected"),
    ("mm", 5, "expected"),
    ("mm", [[1]], "expected"),
    ("mm", [{"identifier": "i", "offset": "1", "length": 1}], "offset must be an int"),
    ("cache_salt", 5, "cache_salt must be a str"),
    ("none_hash_seed", 5, "malformed none_hash_seed field: expected a str"),
    ("block_size", "4", "block_size must be an int >= 1"),
    ("block_size", True, "block_size must be an int >= 1"),
    ("algo", ["x"], "unknown hash algorithm"),
    ("prompt_token_ids", [[1]] * 11, r"token_ids\[0\] is \[1\] \(list\)"),
    ("prompt_token_ids", [1, 2, 3, 2**64], r"token_ids\[3\]"),
    ("block_hashes", ["abc"], "block_hashes"),
])
def test_malformed_field_names_file_vector_and_field(tmp_path, field, value, message):
    "load_vectors and check_vectors refuse a malformed field with one ValueError naming file, vector and field."
    path = _tampered(tmp_path, lambda d: d["vectors"][6].update({field: value}))
    for read in (load_vectors, lambda p: check_vectors([p])):
        with pytest.raises(ValueError) as e:
            read(path)
        assert str(e.value).startswith(f"{path}: vector 6: "), e.value
        assert field.replace("prompt_token_ids", "token_ids") in str(e.value) and re.search(message, str(e.value)), e.value


@pytest.mark.parametrize("text, message", [
    ('{"vectors": []}', "no vectors"),
    ('{"source": "x", "vectors": []}', "no vectors"),
    ("[" * 100_000 + "]" * 100_000, "cannot read"),
    ('{"vectors": [' + "9" * 5000 + "]}", "cannot read"),
])
def test_vector_files_that_check_nothing_or_cannot_be_read(tmp_path, text, message):
    (tmp_path / "v.json").write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        check_vectors([tmp_path / "v.json"])
    assert str(tmp_path / "v.json") in str(e.value)


def test_check_vectors_of_no_files_is_an_error():
    with pytest.raises(ValueError, match="no vector files"):
        check_vectors([])


def test_cli_check_not_json(capsys, tmp_path):
    (tmp_path / "bad.json").write_text("{nope")
    assert hash_main(["--check", str(tmp_path / "bad.json")]) == 2
    assert "bad.json is not JSON" in capsys.readouterr().err


# --- across processes ---------------------------------------------------------------------------------------------
PROBE = ("import sys; from kvref.core.fast_hashing import hash_request_tokens as h; "
         "print(' '.join(x.hex() for a in sys.argv[1:] for x in h(list(range(64)), 16, a)))")

def _hashes_in_fresh_process(*algos: str, env_seed: str | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if env_seed is not None: env["PYTHONHASHSEED"] = env_seed
    out = subprocess.run([sys.executable, "-c", PROBE, *algos], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_sha256_family_agrees_across_processes_xxhash_does_not():
    a = _hashes_in_fresh_process("sha256", "sha256_cbor", "xxhash", "builtin")
    b = _hashes_in_fresh_process("sha256", "sha256_cbor", "xxhash", "builtin")
    assert a[:8] == b[:8]  # sha256 and sha256_cbor: 4 blocks each, equal everywhere
    assert a[:4] == [h.hex() for h in hash_request_tokens(list(range(64)), 16, "sha256", seed="vllm-none-hash")]
    assert not set(a[8:12]) & set(b[8:12])  # xxhash, no seed: a random NONE_HASH per process
    assert a[12:] != b[12:]  # builtin: Python's hash is randomized per process


def test_pythonhashseed_makes_the_real_algorithms_reproducible():
    a = _hashes_in_fresh_process("xxhash", "xxhash_cbor", "sha256", "builtin", env_seed="7")
    b = _hashes_in_fresh_process("xxhash", "xxhash_cbor", "sha256", "builtin", env_seed="7")
    assert a[:12] == b[:12]
    # builtin is not asserted either way: before Python 3.12 hash(None) is None's address, so with the seed it
    # differs between processes only where the OS randomizes addresses (ASLR; `setarch -R` turns it off)
    assert a[:4] == [h.hex() for h in hash_request_tokens(list(range(64)), 16, "xxhash", seed="7")]
    assert a[8:12] != [h.hex() for h in hash_request_tokens(list(range(64)), 16, "sha256", seed="vllm-none-hash")]


def test_console_command():
    kvref = shutil.which("kvref", path=str(Path(sys.executable).parent))
    if kvref is None: pytest.skip("the kvref console script is not installed")
    done = subprocess.run([kvref, "hash", "--check", str(VLLM)], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "16 vectors, 16 match\n")
    bad = subprocess.run([kvref, "hash", "1", "2", "--algo", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "valid names" in bad.stderr
    piped = subprocess.run([kvref, "hash", "--file", "-", "--block-size", "2", "--format", "int64"], input="1 2\n3 4 5",
                           capture_output=True, text=True)
    expected = [str(block_hash_to_int64(h)) for h in hash_request_tokens([1, 2, 3, 4, 5], 2)]
    assert piped.returncode == 0 and piped.stdout.split() == expected


def test_cli_help_is_exit_0(capsys):
    assert hash_main(["--help"]) == 0
    assert "--block-size" in capsys.readouterr().out
