"""`make gpu-check`: psrv's GPU paths measured in one go on a machine with CUDA, each figure a ratio against a
baseline of the same run; without CUDA every GPU part says in one line that it was skipped, and it exits 0.

python -m psrv.experiments.bench.gpu_check --out DIR            # all parts, within --budget seconds (540)
python -m psrv.experiments.bench.gpu_check --out DIR --rehearse # no CUDA: the GPU parts run on the CPU, tiny
python -m psrv.experiments.bench.gpu_check --markdown DIR/results.json   # the table for docs/benchmarks.md
Parts, in order (--parts): tests (the GPU-marked tests and the CUDA-relevant ones, output in DIR/pytest-gpu.txt),
mutants (the mutants only CUDA can tell apart, tests/conformance/device_mutants.py: DIR/device-mutants.md), apply
(a GPU0 shard's step against a device-to-device copy), copies (host<->device per step, pageable against
pinned), samples (GPU workers' samples/s with a CPU server and a GPU0 server against DDP), placement
(placement.toml's GPU0 rows), suite (the whole test suite with what time is left, DIR/pytest-suite.txt).
Writes DIR/results.json (rows like `make bench`'s) and DIR/results.md after every part.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from psrv.experiments.bench import gpu_measure, gpu_runs

ROOT = Path(__file__).resolve().parents[2]  # the repository (an editable install's): tests/ is beside it
PARTS = ("tests", "mutants", "apply", "copies", "samples", "placement", "suite")
# Each part's share of --budget, by its expected time on a 16-core H200 machine; what a part leaves passes on.
SHARE = {"tests": 0.12, "mutants": 0.25, "apply": 0.04, "copies": 0.03, "samples": 0.50, "placement": 0.15,
         "suite": 0.16}
# Every test file with a `gpu` mark or a CUDA branch (tests/unit/test_gpu_check.py checks the list is whole);
# -k also matches marker names, so the selection is the gpu-marked tests and those named for cuda or a device.
GPU_TEST_FILES = ("tests/unit/test_gpu.py", "tests/integration/test_user_mistakes.py",
                  "tests/integration/test_library.py")
GPU_TEST_KEYWORDS = "gpu or cuda or device"
INTERRUPT_GRACE = 30.0  # seconds an interrupted pytest has to print its failures and summary
# module -> the test files (or a file's tests, FILE::TEST) that need it; the extras installed by `make setup`
SUITE_NEEDS = {"kubernetes_validate": ("tests/unit/test_kubernetes_manifests.py",),
               "mlflow": ("tests/unit/test_tracking_mlflow.py",
                          "tests/integration/test_experiment.py::test_experiment_runs_every_variant_then_resumes",
                          "tests/integration/test_run_folder.py::"
                          "test_a_reused_folder_keeps_nothing_of_the_run_before_and_says_so")}
JOBS = ("psrv.experiments.bench.gpu_jobs:synthetic_mlp_large", "psrv.experiments.bench.gpu_jobs:code_lm_large")
WHAT = {"tests": "the GPU-marked tests and the CUDA-relevant subset, with CUDA present",
        "mutants": "the mutants equivalent_mutants.toml marks cuda = true, each put in and tests/unit/test_gpu.py run",
        "apply": "a GPU0 shard's SGD and Adam step against a device-to-device copy of the same bytes",
        "copies": "host<->device copies of a GPU worker's step, pageable (psrv now) against pinned",
        "samples": "samples/s of GPU workers with a CPU server and a cuda:0 server, against DDP",
        "placement": "placement.toml's gpu0-server rows against its cpu-1server rows",
        "suite": "the whole test suite with CUDA present"}


def no_cuda() -> str:
    built = f"built with CUDA {torch.version.cuda}, no device seen" if torch.version.cuda else "built without CUDA"
    return f"for lack of CUDA (torch {torch.__version__}, {built})"


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    found = {"cores": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "cuda": torch.version.cuda,
             "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                 timespec="minutes")}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            found["driver"] = smi.stdout.strip()
    return found


# `python -m pytest`, whose threads faulthandler writes to its output on SIGUSR1: sent before a kill, it says where
# an interrupted pytest waited instead of ending (to a copy of its stderr: pytest's capture takes fd 2 during a test)
_PYTEST_DUMPING = ("import faulthandler, os, signal, sys; out = open(os.dup(2), 'w'); "
                   "faulthandler.register(signal.SIGUSR1, file=out, all_threads=True); "
                   "import pytest; sys.exit(pytest.main())")


def pytest(args: list[str], log: Path, timeout: float, *, grace: float | None = None) -> dict:
    """Run pytest with `args` from the repository root, its output in `log`; its exit code and last line. At the
    budget its process group is interrupted (SIGINT), as Ctrl-C would, so that it still prints the failures'
    tracebacks and its summary (the first lent H200's suite was killed at 84% and kept 6 failures' names only);
    killed if it has not ended `grace` seconds later (default: INTERRUPT_GRACE, at most a quarter of the budget;
    the interrupt comes `grace` before the budget's end), its controller's threads dumped into the log first. A
    stopped run's summary counts the outcomes `-v` printed."""
    argv = [sys.executable, "-c", _PYTEST_DUMPING, "-p", "no:cacheprovider", "-rfEs", *args]
    grace = min(INTERRUPT_GRACE, max(timeout, 1) / 4) if grace is None else grace
    with open(log, "w") as f:
        f.write(" ".join(argv) + "\n\n")
        f.flush()
        # its own process group, and Ctrl-C's default there: a caller that ignores SIGINT (a shell's background
        # job does) would hand that on through exec, and pytest would never be interrupted
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            code = proc.wait(timeout=max(timeout - grace, 1))
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGINT)  # the controller and its xdist workers, as Ctrl-C in a terminal
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                f.write(f"\n\n[gpu_check] no end {grace:.0f} s after the interrupt: the controller's threads, "
                        "then a kill\n")
                f.flush()
                os.kill(proc.pid, signal.SIGUSR1)  # faulthandler's dump of where it waits, into this log
                time.sleep(1)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip("= ") if lines else ""
    if code is None:
        counts = collections.Counter(re.findall(r"^\[gw\d+\] \[ *\d+%\] ([A-Z]+) ", text, re.M))
        seen = ", ".join(f"{n} {outcome.lower()}" for outcome, n in sorted(counts.items()))
        last = f"stopped at the budget ({timeout:.0f} s){': ' + seen if seen else ''}"
    return {"returncode": code, "summary": last, "log": log.name}


def device_mutants(out: Path, timeout: float) -> dict:
    """tests/conformance/device_mutants.py into `out` (its table, device-mutants.md, and its log); its exit code
    (1: a mutant survived) and the table's first line, or where the budget stopped it."""
    argv = [sys.executable, "-m", "tests.conformance.device_mutants", "--out", str(out),
            "--jobs", str(min(os.cpu_count() or 1, 12))]
    with open(out / "device-mutants.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:  # it, and the pytest processes it started (its process group)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    table = out / "device-mutants.md"
    summary = (table.read_text().splitlines()[0] if code is not None and table.exists()
               else f"stopped at the budget ({timeout:.0f} s): the verdicts so far in device-mutants.log")
    return {"returncode": code, "summary": summary, "log": "device-mutants.log"}


def describe(r: dict) -> str:
    b = r["bench"]
    if b == "gpu_apply":
        return (f"GPU0 apply {r['optimizer']} {r['size_mb']} MB on {r['device']}, gradient on the {r['grad']}: "
                f"{r['bytes_per_second'] / 1e9:.0f} GB/s vs D2D copy {r['copy_bytes_per_second'] / 1e9:.0f} GB/s")
    if b == "gpu_copy":
        return (f"{r['direction']} {r['size_mb']} MB, {r['host']}: {r['gb_per_s']:.1f} GB/s vs pinned "
                f"{r['pinned_gb_per_s']:.1f} GB/s")
    if b == "gpu_e2e":
        where = (f"{r['server']} server on {r['server_device']}, workers on {r['worker_device']}" if r["server"]
                 else r["backend"])
        return (f"{r['job'].rsplit(':', 1)[-1]} x{r['workers']} {r['mode']} ({where}): "
                f"{r['samples_per_second']:.0f} samples/s vs {r['baseline']} {r['baseline_samples_per_second']:.0f}")
    busy = r.get("busiest") or {}
    traffic = (f"; busiest {busy['in'] / 1024:.1f} KiB in, {busy['out'] / 1024:.1f} out per step" if busy else "")
    return (f"placement {r['variant']} on {r['device']}: {r['ms_per_step']:.1f} ms/step, {r['samples_per_second']:.0f} "
            f"samples/s vs {r['baseline']} {r['baseline_ms_per_step']:.1f} ms/step, "
            f"{r['baseline_samples_per_second']:.0f}{traffic}")


def judge(r: dict) -> None:
    """The issue's goal where it sets one: a GPU0 shard's step at least half a device-to-device copy's rate."""
    if r["bench"] == "gpu_apply" and r["grad"] == "device":
        r["goal"], r["goal_met"] = ">= 0.5", r["ratio"] >= 0.5


def markdown(doc: dict) -> str:
    m = doc["machine"]
    gpu = (f"{m['gpu']} ({m.get('gpu_memory_gib')} GiB, driver {m.get('driver', '?')}), CUDA {m['cuda']}"
           if m.get("gpu") else "no GPU")
    head = ("**REHEARSAL on the CPU: these are not GPU figures.** " if doc.get("rehearsal") else "")
    lines = [f"{head}{gpu}; {m['cores']} cores, {m['cpu']}, torch {m['torch']}, Python {m['python']}, {m['date']}; "
             f"seconds per part: {doc['part_seconds']}"]
    lines += [""] if doc["tests"] or doc["said"] else []
    for name, t in doc["tests"].items():
        lines.append(f"- pytest ({name}): {t['summary']} (exit code {t['returncode']}, output in {t['log']})")
    lines += [f"- {line}" for line in doc["said"]]
    if doc["results"]:
        lines += ["", "| figure | ratio | goal |", "|---|---|---|"]
        for r in doc["results"]:
            goal = "" if "goal" not in r else f"{r['goal']}: {'met' if r['goal_met'] else '**not met**'}"
            lines.append(f"| {describe(r)} | {r['ratio']:.2f} | {goal} |")
    return "\n".join(lines) + "\n"


def run_part(name: str, a: argparse.Namespace, *, cuda: bool, gpu: str | None, deadline: float, work: Path | None,
             doc: dict) -> None:
    """One part into `doc` (rows to results, a line per skip or failure to said, pytest's outcome to tests)."""
    said, rows = doc["said"], doc["results"]
    tiny = a.rehearse
    if name == "tests":
        if cuda:
            doc["tests"]["gpu"] = pytest([*GPU_TEST_FILES, "-k", GPU_TEST_KEYWORDS, "-n", "4"], a.out / "pytest-gpu.txt",
                                         deadline - time.monotonic())
        else:  # collected, so that a broken import shows; every one of them skips itself
            doc["tests"]["gpu-marked, collected"] = pytest(["-m", "gpu", GPU_TEST_FILES[0]], a.out / "pytest-gpu.txt",
                                                           deadline - time.monotonic())
            said.append(f"SKIPPED tests: the GPU-marked tests were collected and each skipped itself, {no_cuda()}; the "
                        f"CUDA-relevant subset ({', '.join(GPU_TEST_FILES[1:])} -k '{GPU_TEST_KEYWORDS}') runs here in "
                        "make test")
    elif name == "suite":
        if not cuda:
            said.append(f"SKIPPED suite: not run {no_cuda()}: {WHAT['suite']} (without CUDA it is make test)")
            return
        left = deadline - time.monotonic()
        if left < 60:
            said.append(f"SKIPPED suite: the time budget is spent ({max(left, 0):.0f} s left)")
            return
        ignore = []
        for module, paths in SUITE_NEEDS.items():
            for path in paths if importlib.util.find_spec(module) is None else ():
                ignore += ["--deselect" if "::" in path else "--ignore", path]
                said.append(f"SKIPPED suite {'test' if '::' in path else 'file'} {path}: {module} is not installed "
                            "here (carry it: deploy/gpu/prepare.sh)")
        doc["tests"]["suite"] = pytest(["-v", "--tb=short", "-n", str(min(os.cpu_count() or 1, 16)), "--dist",
                                        "loadfile", *ignore, "tests"], a.out / "pytest-suite.txt", left - 10)
    elif name == "mutants":
        if not cuda:  # its cases skip without CUDA: every mutant would survive
            said.append(f"SKIPPED mutants: not run {no_cuda()}: {WHAT['mutants']}")
            return
        doc["tests"]["device mutants"] = device_mutants(a.out, deadline - time.monotonic())
    elif name == "copies" and not cuda:
        said.append(f"SKIPPED copies: not run {no_cuda()} (pinned memory needs it): {WHAT['copies']}")
    elif gpu is None:
        said.append(f"SKIPPED {name}: not run {no_cuda()}: {WHAT[name]}")
    elif name == "apply":
        for size in [4] if tiny else a.apply_sizes_mb:
            rows += gpu_measure.apply(size, 3 if tiny else a.repeats, device=gpu)
    elif name == "copies":
        for size in a.copy_sizes_mb:
            rows += gpu_measure.copies(size, a.repeats, device=gpu)
    elif name == "samples":
        rows += gpu_runs.samples(["digits_mlp"] if tiny else a.jobs, [1] if tiny else a.workers, gpu=gpu, modes=a.modes,
                                 steps=5 if tiny else a.steps, batch_size=32 if tiny else a.batch_size,
                                 work=work / "samples", deadline=deadline, said=said)
    elif name == "placement":
        rows += gpu_runs.placement([2] if tiny else a.placement_workers, gpu=gpu, work=work, deadline=deadline,
                                   said=said, steps=5 if tiny else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench/gpu"), help="default: %(default)s")
    p.add_argument("--budget", type=float, default=540.0, metavar="SECONDS",
                   help="the whole check's time (default %(default)s: a lent H200's 10-minute call, less its start)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--rehearse", action="store_true",
                   help="without CUDA: run the GPU parts on the CPU at tiny sizes (their code runs; no GPU figure)")
    p.add_argument("--work", type=Path, help="where the runs' folders go (default: a new temporary folder, kept)")
    p.add_argument("--jobs", nargs="+", default=list(JOBS), help="samples: the jobs (default: gpu_jobs.py's)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="samples: worker processes on the GPU")
    p.add_argument("--modes", nargs="+", choices=("sync", "async", "ssp"), default=["sync"], help="samples: PS modes")
    p.add_argument("--steps", type=int, default=20, help="samples: steps per worker")
    p.add_argument("--batch-size", type=int, default=64, help="samples: per worker")
    p.add_argument("--apply-sizes-mb", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--copy-sizes-mb", type=int, nargs="+", default=[128, 512])
    p.add_argument("--repeats", type=int, default=20, help="apply, copies: timed repeats (the median is kept)")
    p.add_argument("--placement-workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--markdown", type=Path, metavar="RESULTS", help="print a results.json as Markdown and exit")
    a = p.parse_args(argv)
    if a.markdown:
        print(markdown(json.loads(a.markdown.read_text())), end="")
        return 0
    cuda = torch.cuda.is_available()
    if a.rehearse and cuda:
        p.error("--rehearse stands the CPU in for a GPU; this machine has CUDA: run without it")
    gpu = "cuda:0" if cuda else "cpu" if a.rehearse else None
    a.out.mkdir(parents=True, exist_ok=True)
    runs = gpu is not None and {"samples", "placement"} & set(a.parts)
    work = a.work or (Path(tempfile.mkdtemp(prefix="psrv-gpu-check-")) if runs else None)
    doc = {"machine": machine(), "rehearsal": a.rehearse, "budget_seconds": a.budget, "work": work and str(work),
           "part_seconds": {}, "tests": {}, "said": [], "results": []}
    start, share = time.monotonic(), 0.0
    parts = [name for name in PARTS if name in a.parts]
    scale = 1 / sum(SHARE[n] for n in parts)  # the parts asked for share the whole budget
    for name in parts:
        share += SHARE[name] * scale
        t0, before, count, ran = time.monotonic(), len(doc["said"]), len(doc["results"]), set(doc["tests"])
        print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
        run_part(name, a, cuda=cuda, gpu=gpu, deadline=start + share * a.budget, work=work, doc=doc)
        doc["part_seconds"][name] = round(time.monotonic() - t0, 1)
        for r in doc["results"][count:]:
            if not a.rehearse:  # a rehearsal's figures are the CPU's: no goal of a GPU's applies
                judge(r)
            print(f"{describe(r)}  ratio {r['ratio']:.2f}" + (f"  goal {r['goal']}: {'met' if r['goal_met'] else 'NOT met'}"
                                                            if "goal" in r else ""), flush=True)
        for line in doc["said"][before:]:
            print(line, flush=True)
        for t in (t for n, t in doc["tests"].items() if n not in ran):
            print(f"pytest: {t['summary']} (exit code {t['returncode']}, output in {a.out / t['log']})", flush=True)
        (a.out / "results.json").write_text(json.dumps(doc, indent=1))  # after every part: a cut-off run keeps it
        (a.out / "results.md").write_text(markdown(doc))
    print(f"\nwrote {a.out / 'results.json'} and results.md" + (f"; the runs' folders are in {work}" if work else ""),
          file=sys.stderr)
    failed = [line for line in doc["said"] if line.startswith("FAILED")] + \
             [n for n, t in doc["tests"].items() if t["returncode"] not in (0, 5)]  # 5: nothing collected
    return 1 if cuda and failed else 0


if __name__ == "__main__":
    sys.exit(main())
