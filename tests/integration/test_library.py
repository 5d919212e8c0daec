"""psrv as a library: a shard served from a thread on port 0 trains a real worker, and no library call
(importing the codec, constructing a PSClient, psrv.serve) changes its host process -- signal
handlers, warning filters, torch's threads, the allocator. psrv.process is what psrv's entry points call instead."""
import json
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import warnings

import pytest
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from psrv.client.psclient import PSClient
from psrv.config import ServerConfig
from psrv.partition import PartitionPlan
from psrv.server.run import Server, serve
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(120)
STEPS = 20


def _cfg() -> ServerConfig:
    return ServerConfig(workers=1, mode="async", bind="tcp://127.0.0.1:0", worker_timeout=30.0)


def _train(address: str, steps: int = STEPS) -> list[float]:
    """One worker fitting y = x @ w through the shard (push_pull every step); the losses it saw."""
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    plan = PartitionPlan.from_module(model, 1)
    flat = parameters_to_vector(model.parameters()).detach().clone()
    losses = []
    with PSClient([address], plan, worker=0, world_size=1, timeout=20) as client:
        client.hello()
        client.init(flat)
        clock = client.pull(clock=0, out=flat).clock
        for _ in range(steps):
            vector_to_parameters(flat, model.parameters())
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grad = parameters_to_vector(p.grad for p in model.parameters())
            clock = client.push_pull(grad, clock=clock, out=flat).clock
            losses.append(loss.item())
        client.leave()
    return losses


def _process_state():
    """What a library call must leave as it was: signal handlers, warning filters, torch's threads (psrv serve
    and psrv worker set those: psrv.process.use_threads)."""
    return ({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}, list(warnings.filters),
            torch.get_num_threads())


def test_serve_in_a_thread_on_port_0_trains_a_worker_and_ends_when_it_leaves():
    before = _process_state()
    ready, result = queue.Queue(), {}
    thread = threading.Thread(target=lambda: result.update(summary=serve(_cfg(), on_ready=ready.put)), daemon=True)
    thread.start()
    server = ready.get(timeout=60)
    assert server.address.startswith("tcp://127.0.0.1:") and not server.address.endswith(":0")

    losses = _train(server.address)

    thread.join(30)
    assert not thread.is_alive(), "the shard kept serving after its only worker left"
    summary = result["summary"]
    assert summary["updates_applied"] == STEPS and summary["active"] == []
    assert losses[-1] < 0.3 * losses[0], losses
    assert _process_state() == before


def test_a_started_server_stops_cleanly_from_another_thread_and_releases_its_metrics_port(tmp_path):
    port_file = tmp_path / "metrics.port"
    with Server(_cfg(), metrics_port=0, metrics_file=port_file) as server:
        url = f"http://127.0.0.1:{port_file.read_text()}/metrics"
        assert "psrv_active_workers" in urllib.request.urlopen(url, timeout=5).read().decode()
        server.start()
        with pytest.raises(TimeoutError):
            server.join(0.3)  # no worker has come: still serving
        server.stop()
        summary = server.join(10)
    assert summary["version"] == 0 and summary["updates_applied"] == 0
    with pytest.raises(RuntimeError, match="already served"):
        server.serve()
    with pytest.raises(urllib.error.URLError):  # the metrics endpoint went with the shard
        urllib.request.urlopen(url, timeout=5)


def test_library_calls_leave_the_host_process_as_it_was():
    """In a fresh interpreter: importing the codec, serving from a thread, and a PSClient that talks
    to the shard change no signal handler or warning filter, and leave glibc's malloc untuned (a 64 MB
    block is still mmapped). The control: psrv.process.tune_malloc does change that."""
    script = textwrap.dedent('''
        import ctypes, json, signal, sys, warnings
        import torch

        libc = ctypes.CDLL("libc.so.6")
        class Mallinfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
        libc.mallinfo2.restype = Mallinfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]

        def mmapped_64mb():
            before = libc.mallinfo2().hblkhd
            block = libc.malloc(64 << 20)
            grew = libc.mallinfo2().hblkhd - before
            libc.free(block)
            return grew >= 64 << 20

        def state():
            return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}, list(warnings.filters)

        before, untuned = state(), mmapped_64mb()
        import psrv.protocol.codec
        after_import = state()
        from tests.integration.test_library import _cfg, _train
        from psrv.server.run import Server
        with Server(_cfg()) as server:
            server.start()
            losses = _train(server.address, steps=3)
            server.join(30)
        after_use = state()
        still_untuned = mmapped_64mb()
        from psrv.process import tune_malloc
        tuned = tune_malloc() and not mmapped_64mb()
        print(json.dumps({"import": after_import == before, "use": after_use == before, "trained": len(losses),
                          "untuned": untuned, "still_untuned": still_untuned, "tuned": tuned}))
    ''')
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"import": True, "use": True, "trained": 3, "untuned": True, "still_untuned": True,
                   "tuned": True}, got


def test_an_entry_point_turns_sigterm_into_a_clean_stop_with_a_final_checkpoint(tmp_path):
    """What `psrv serve` does: psrv.process.stop_on_signals(server.stop) from on_ready. SIGTERM ends
    the shard through its loop (exit 0, the summary returned) and the final checkpoint is written."""
    ready, ckpt = tmp_path / "address", tmp_path / "ck"
    script = textwrap.dedent(f'''
        import json
        from pathlib import Path
        from psrv.config import ServerConfig
        from psrv.process import stop_on_signals
        from psrv.server.run import serve
        cfg = ServerConfig(workers=1, mode="async", bind="tcp://127.0.0.1:0", worker_timeout=60.0,
                           checkpoint_dir={str(ckpt)!r})
        summary = serve(cfg, ready_file=Path({str(ready)!r}), on_ready=lambda server: stop_on_signals(server.stop))
        print(json.dumps({{"version": summary["version"], "checkpoints": summary["checkpoints"]}}))
    ''')
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        plan = PartitionPlan.from_module(torch.nn.Linear(4, 1), 1)
        with PSClient([ready.read_text()], plan, worker=0, world_size=1, timeout=20) as client:
            client.hello()
            client.init(torch.zeros(plan.total))
            for _ in range(3):
                client.push(torch.ones(plan.total), clock=0)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["version"] == 3 and summary["checkpoints"] >= 1
    assert any(ckpt.iterdir())


def test_stop_on_signals_hands_back_the_previous_handler():
    from psrv.process import stop_on_signals
    before = signal.getsignal(signal.SIGTERM)
    stopped = threading.Event()
    restore = stop_on_signals(stopped.set)
    try:
        assert signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)
        assert stopped.wait(5)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_server_on_a_device_that_is_not_here_is_a_value_error_naming_it():
    import torch

    import psrv
    device = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda:0"  # never present
    with pytest.raises(ValueError, match=f"device {device}: "):
        psrv.Server(psrv.ServerConfig(device=device))
