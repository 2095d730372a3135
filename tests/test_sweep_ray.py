"""Sweep grids on Ray (chapter 06c, *Beyond one machine: Ray*): a Ray head node that this module starts on loopback
gives exactly the local processes' results, for the cache-size sweep, the GPU x CPU grid and `kvref sweep --ray`,
with the trace put in the object store once and the results streamed in grid order. The node is stopped after the
module, also when a test fails. Without Ray installed only the refusals run."""
import contextlib, io, os, shutil, signal, socket, subprocess, sys, tempfile, time
from pathlib import Path
import pytest
from kvref.cli import sweep_main
from kvref.kv_offload import offload_sweep
from kvref.oracle import production_traces
from kvref.oracle.production_traces import map_grid, read_mooncake, sweep

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "golden/mooncake/synthetic-trace-last300.jsonl"
TINY = list(read_mooncake(SAMPLE))[:30]
SIZES = [40_000, 12_500, 20_000]  # not in order: results come back in the grid's order, not by size or by finish


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


# Refusals first: they run before this process joins the cluster below (a joined process keeps its connection).
def test_without_ray_the_sweep_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'kvref\[ray\]'"): sweep(TINY, [40_000], ray="local")
    with pytest.raises(TypeError, match="ray must be None or a Ray address"): sweep(TINY, [40_000], ray=6379)
    status, out, err = _sweep_cli(SAMPLE, "--blocks", "40000", "--ray")
    assert (status, out) == (2, "") and err == "kvref sweep: error: --ray needs Ray: pip install 'kvref[ray]'\n"


@pytest.mark.parametrize("args, words", [
    (["--ray", "nowhere"], "--ray 'nowhere': give host:port, ray://host:port or auto"),
    (["--ray", "10.0.0.1:x"], "--ray '10.0.0.1:x': give host:port"),
    (["--jobs", "2", "--ray"], "--jobs and --ray: choose one"),
    (["--ray", "127.0.0.1:6379", "--jobs", "1"], "--jobs and --ray: choose one"),
    (["--ray", "127.0.0.1:9"], "no Ray cluster answers at 127.0.0.1:9"),  # at once: Ray would retry for minutes
])
def test_kvref_sweep_refuses_bad_ray_use_in_one_line(args, words):
    if "127.0.0.1:9" in args: pytest.importorskip("ray")
    status, out, err = _sweep_cli(SAMPLE, "--blocks", "40000", *args)
    assert (status, out) == (2, "") and err.count("\n") == 1 and err.startswith("kvref sweep: error: ") and words in err, err


@pytest.fixture(scope="module")
def cluster():
    """A Ray head node with 2 CPUs listening on 127.0.0.1 only (`ray start --block`): its address and its Ray client's
    address, yielded once both accept connections. SIGTERM stops every process it started. Its sessions and logs go to
    a folder of its own (short: Ray's socket paths are limited), removed after. Ray replaces a loopback address by the
    machine's own unless, as on one-machine platforms, its cluster mode is off: off in the node's environment and in
    this process, so nothing listens beyond loopback."""
    pytest.importorskip("ray")
    import ray._private.ray_constants as ray_constants
    temp = Path(tempfile.mkdtemp(prefix="kvref-ray-"))
    log = temp / "head.log"
    port, client_port = _free_port(), _free_port()  # every port named: the raylet waits at most 15 s for an agent to
    ports = [f"--{name}-port={_free_port()}" for name in ("dashboard-agent-grpc", "dashboard-agent-listen",  # report one
                                                          "runtime-env-agent", "metrics-export")]  # it chose itself
    env = dict(os.environ, **{ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"},  # gRPC's fork handlers off: the head's
               GRPC_ENABLE_FORK_SUPPORT="0")  # client proxy forks a server per client, and with them on the child sometimes
    # dies before it runs, its logs empty (ray-project/ray#63202; 3 of 6 tries on this loaded 2-core machine, 0 of 10 off)
    with open(log, "w") as out:
        node = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
                                 f"--ray-client-server-port={client_port}", *ports, f"--temp-dir={temp}",
                                 "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
                                 "--disable-usage-stats"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
            deadline = time.monotonic() + 180
            while "Ray runtime started" not in log.read_text() or not _answers(client_port):
                assert node.poll() is None and time.monotonic() < deadline, f"ray start failed:\n{log.read_text()[-2000:]}"
                time.sleep(0.5)
            yield f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}", temp
    finally:
        node.send_signal(signal.SIGTERM)
        try: node.wait(60)
        except subprocess.TimeoutExpired: node.kill(); node.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _answers(port: int) -> bool:
    "Whether something on loopback accepts a connection at `port`."
    try: socket.create_connection(("127.0.0.1", port), 1).close(); return True
    except OSError: return False


def _client_server_logs(temp: Path) -> str:
    "The tail of each Ray client server log under the node's folder (not twice through `session_latest`): what to read when a `ray://` connection fails."
    return "".join(f"\n--- {f.name}\n{f.read_text(errors='replace')[-4000:]}" for session in sorted(temp.glob("session_*"))
                   if not session.is_symlink() for f in sorted(session.glob("logs/ray_client_server*")))


@pytest.fixture(scope="module")
def head(cluster) -> str:
    return cluster[0]


def _sweep_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): status = sweep_main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def test_kvref_sweep_through_the_ray_client_prints_what_jobs_prints_and_disconnects(cluster, tmp_path):
    """The whole path, as from a laptop: `--ray ray://HOST:PORT` connects through the Ray client's server (shipping
    this kvref to the workers), prints the same table as local processes, and disconnects."""
    import ray
    sigterm = signal.getsignal(signal.SIGTERM)
    trace = tmp_path / "tiny.jsonl"
    trace.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:30]))
    sizes = ",".join(map(str, SIZES))
    on_ray = _sweep_cli(trace, "--blocks", sizes, "--ray", cluster[1], "--format", "json")
    if "Initialization failure from server" in on_ray[2]:  # Ray's own client server did not start (the fork race above,
        first = on_ray[2] + _client_server_logs(cluster[2])  # should it come back another way): one more connection
        on_ray = _sweep_cli(trace, "--blocks", sizes, "--ray", cluster[1], "--format", "json")
        on_ray = (*on_ray[:2], f"first try: {first}\nsecond try: {on_ray[2]}")
    assert on_ray[:2] == _sweep_cli(trace, "--blocks", sizes, "--jobs", "2", "--format", "json")[:2], \
        on_ray[2] + _client_server_logs(cluster[2])
    assert on_ray[0] == 0 and not ray.is_initialized()
    assert signal.getsignal(signal.SIGTERM) is sigterm  # `ray.init` set its own: the `--jobs` pool above could hang on it


@pytest.fixture(scope="module")
def joined(head):
    "This process joined to the head node once (workers reused across the tests below); left after them."
    import ray
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(address=head, log_to_driver=False, logging_level="WARNING", **production_traces._ray_start_options(head))
    yield head
    ray.shutdown(); signal.signal(signal.SIGTERM, sigterm)  # as `ray_map_grid` does: later modules' fork pools need it


def test_sweep_on_ray_equals_the_local_processes_and_puts_the_trace_once(joined, monkeypatch):
    import ray
    puts = []
    monkeypatch.setattr(ray, "put", lambda value, put=ray.put: puts.append(value) or put(value))
    on_ray = sweep(TINY, SIZES, ray=joined)
    assert [r.num_blocks for r in on_ray] == SIZES
    assert on_ray == sweep(TINY, SIZES, jobs=2) == sweep(TINY, SIZES, jobs=1)
    assert len(puts) == 1 and puts[0][0] is TINY  # the trace, once: each task carries only a reference to it
    assert ray.is_initialized()  # a caller's own connection is kept


def test_the_offload_grid_on_ray_equals_the_local_processes(joined):
    grid = dict(blocks=[12_500, 20_000], cpu_blocks=[0, 8_000], policies=("lru", "arc"))
    assert offload_sweep(TINY, **grid, ray=joined) == offload_sweep(TINY, **grid, jobs=1)


def test_the_array_sweep_on_ray_equals_the_reference(joined):
    from kvref.oracle.array_replay import sweep_arrays
    assert sweep_arrays(TINY, SIZES, ray=joined) == sweep(TINY, SIZES, jobs=1)


def test_a_sweep_grid_on_ray_equals_the_local_processes_and_puts_each_trace_once(joined, monkeypatch):
    "Chapter 06h: two traces x two max_num_seqs x three sizes, one task per point; the traces reach Ray in one `ray.put`."
    import ray
    from kvref.oracle.sweep_grids import sweep_grid
    from kvref.oracle.trace_generator import generate_trace
    traces = {"tiny": TINY, "drawn": list(generate_trace(30, seed=1))}
    puts = []
    monkeypatch.setattr(ray, "put", lambda value, put=ray.put: puts.append(value) or put(value))
    on_ray = sweep_grid(traces, SIZES, {"max_num_seqs": [4, 256]}, ray=joined)
    assert len(puts) == 1 and all(puts[0][0][name] is trace for name, trace in traces.items())  # each trace once, by reference
    assert on_ray == sweep_grid(traces, SIZES, {"max_num_seqs": [4, 256]}, jobs=2)
    assert [(r.point.trace, r.point.settings["max_num_seqs"], r.point.gpu_blocks) for r in on_ray] == \
        [(t, s, g) for t in traces for s in (4, 256) for g in SIZES]


def test_kvref_sweep_of_a_grid_on_ray_prints_what_jobs_prints(joined, tmp_path):
    from kvref.oracle.trace_generator import generate_trace, write_mooncake
    write_mooncake(TINY, tmp_path / "tiny.jsonl"); write_mooncake(generate_trace(30, seed=1), tmp_path / "drawn.jsonl")
    argv = [tmp_path / "tiny.jsonl", tmp_path / "drawn.jsonl", "--blocks", "12500,4000", "--max-num-seqs", "4,256",
            "--scheduling-policy", "fcfs,priority", "--format", "csv"]
    on_ray = _sweep_cli(*argv, "--ray", joined)
    assert on_ray == _sweep_cli(*argv, "--jobs", "2") and on_ray[0] == 0 and on_ray[1].count("\n") == 1 + 2 * 2 * 2 * 2


def test_results_stream_back_in_grid_order_as_they_are_done(joined):
    "A point that takes 3 s does not hold back the one before it: the first result arrives while the second runs."
    results = map_grid(time.sleep, [0.0, 3.0], time.sleep, (0.0,), ray=joined)
    next(results); first = time.monotonic()
    next(results); assert time.monotonic() - first > 1.5
    assert list(results) == []
