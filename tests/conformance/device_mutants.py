"""The mutants only a machine with CUDA can tell apart, each put into psrv and tests/unit/test_gpu.py run against it.

equivalent_mutants.toml's entries marked `cuda = true` are not equivalent: `make mutants` runs on the CPU, where `.to(None)` and `.to(x.device)` are the same call, so no case of
it can fail them. On a machine with CUDA this writes each into its own copy of psrv and runs tests/unit/test_gpu.py
against it: the fast cases first, with -x, then the ones that start processes if those all passed. A mutant that no
case fails survives there too, and the list's claim for it is wrong.

    python -m tests.conformance.device_mutants --out DIR [--jobs 8]   # where CUDA is: DIR/device-mutants.json, .md
    python -m tests.conformance.device_mutants --check                 # anywhere: each marked entry is put in, once

Each mutant's text is its entry's `mutant`, written over the one line of its function whose text (whitespace
collapsed) is the entry's `source` (and whose line above is its `after`, where given).
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conformance.mutant_report import EQUIVALENT, Entry, collapse, load_equivalent

ROOT = Path(__file__).resolve().parents[2]
GPU_TESTS = "tests/unit/test_gpu.py"
# the cases of GPU_TESTS that start processes (tens of seconds each): run only for a mutant the others let through
SLOW = ("test_a_cuda_worker_against_a_cpu_server_trains_like_a_cpu_worker",
        "test_gpu0_as_the_parameter_server_matches_the_cpu_server")
PER_MUTANT_SECONDS = 300


def marked(entries: list[Entry]) -> list[Entry]:
    """The entries that only a machine with CUDA can tell from psrv."""
    return [e for e in entries if e.cuda]


def _span(tree: ast.Module, function: str) -> tuple[int, int]:
    """The first and last line of `function` (`name` or `Class.method`, as mutmut names them)."""
    owner, _, name = function.rpartition(".")
    body = tree.body
    if owner:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner), [])
    found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    if len(found) != 1:
        raise ValueError(f"{function}: defined {len(found)} times")
    return found[0].lineno, found[0].end_lineno


def mutated(root: Path, entry: Entry) -> str:
    """Entry's file as `root` has it, with the mutant written over its one source line; ValueError where that line
    is not there exactly once, or where the result does not parse."""
    path = root / entry.file
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    first, last = _span(ast.parse(text), entry.function)

    def above(i: int) -> str:
        return collapse(next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), ""))

    places = [i for i in range(first - 1, last) if collapse(lines[i]) == entry.source
              and (entry.after is None or above(i) == entry.after)]
    if len(places) != 1:
        raise ValueError(f"{entry.file} {entry.function}: `{entry.source}` is there {len(places)} times")
    i = places[0]
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines[i] = f"{indent}{entry.mutant}\n"
    out = "".join(lines)
    try:
        ast.parse(out)
    except SyntaxError as exc:
        raise ValueError(f"{entry.file} {entry.function}: the mutant does not parse ({exc.msg})") from None
    return out


def _pytest(work: Path, tests: str, args: list[str], timeout: float) -> tuple[int | None, str]:
    argv = [sys.executable, "-m", "pytest", tests, "-q", "-rf", "-p", "no:cacheprovider", *args]
    env = {**os.environ, "PYTHONPATH": str(work)}  # the copy's psrv, also in the processes the cases start
    try:
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as exc:  # its output so far, bytes though text was asked for
        out = exc.stdout or b""
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out
    return done.returncode, done.stdout + done.stderr


def _copy(work: Path, entry: Entry | None) -> Path:
    """psrv, tests and pyproject.toml under `work`, with `entry`'s mutant put in (None: as they are)."""
    shutil.copytree(ROOT / "psrv", work / "psrv", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work)
    if entry is not None:
        (work / entry.file).write_text(mutated(ROOT, entry))
    return work


def baseline(work: Path, *, timeout: float = PER_MUTANT_SECONDS, workers: int = 8, tests: str = GPU_TESTS
             ) -> tuple[list[str], str]:
    """The cases that fail without a mutant (each then left out of every mutant's run, which it would otherwise
    count as killed), and pytest's last line."""
    code, out = _pytest(_copy(work, None), tests, ["-n", str(workers)] if workers > 1 else ["-p", "no:xdist"], timeout)
    counts = re.findall(r"^=* ?(\d+ (?:passed|failed).*?) ?=*$", out, re.M)  # pytest's summary (warnings follow it)
    if code not in (0, 1) or not counts:
        raise RuntimeError(f"the cases did not run without a mutant (exit code {code}): {out[-2000:]}")
    return re.findall(r"^FAILED (\S+)", out, re.M), counts[-1]


def verdict(entry: Entry, work: Path, *, timeout: float = PER_MUTANT_SECONDS, tests: str = GPU_TESTS,
            slow: tuple[str, ...] = SLOW, deselect: list[str] = ()) -> dict:
    """Put `entry`'s mutant into a copy of psrv under `work` and run `tests` (the GPU cases) against it: those named
    in `slow` only if the others all pass, those in `deselect` not at all. Killed (with the first case it failed),
    survived, timeout, or error (pytest could not run the cases, which answers nothing about the mutant)."""
    _copy(work, entry)
    start, out, code = time.monotonic(), "", 0
    stages = [" and ".join(f"not {name}" for name in slow)] + ([" or ".join(slow)] if slow else [])
    left_out = [arg for node in deselect for arg in ("--deselect", node)]
    for keyword in stages:
        args = ["-x", "-p", "no:xdist", *left_out, *(["-k", keyword] if keyword else [])]
        code, out = _pytest(work, tests, args, timeout - (time.monotonic() - start))
        if code != 0:
            break
    failed = re.search(r"^FAILED (\S+)", out, re.M)
    status = ("survived" if code == 0 else "killed" if code == 1 and failed else
              "timeout" if code is None else "error")
    return {"file": entry.file, "function": entry.function, "source": entry.source, "mutant": entry.mutant,
            "status": status, "case": failed.group(1) if failed else None, "exit_code": code,
            "seconds": round(time.monotonic() - start, 1), "tail": "" if status == "killed" else out[-1500:]}


def markdown(results: list[dict], machine: str, left_out: list[str], clean: str) -> str:
    killed = sum(r["status"] == "killed" for r in results)
    lines = [f"{killed} of {len(results)} device mutants killed by {GPU_TESTS} ({machine}); without a mutant: {clean}"]
    lines += [f"- left out of every mutant's run, failing without one: {node}" for node in left_out]
    lines += ["", "| file | function | mutant | verdict | case |", "|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["status"] == "killed", r["file"], r["function"])):
        case = (r["case"] or "").rpartition("::")[2]
        lines.append(f"| {r['file']} | {r['function']} | `{r['mutant']}` | {r['status']} | {case} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="where device-mutants.json and device-mutants.md go")
    p.add_argument("--jobs", type=int, default=8, help="mutants tested at once (default %(default)s)")
    p.add_argument("--check", action="store_true", help="only put each marked entry in, and say where it fails to")
    p.add_argument("--equivalent", type=Path, default=EQUIVALENT, help="default: %(default)s")
    a = p.parse_args(argv)
    entries = marked(load_equivalent(a.equivalent))
    if a.check:
        bad = []
        for e in entries:
            try:
                mutated(ROOT, e)
            except ValueError as exc:
                bad.append(str(exc))
        print(f"{len(entries) - len(bad)} of {len(entries)} marked entries put in", *bad, sep="\n")
        return 1 if bad else 0
    import torch  # here only: --check runs where torch is slow to import

    if not torch.cuda.is_available():
        p.error("no CUDA here (torch.cuda.is_available() is False): every case would skip; --check runs anywhere")
    if a.out is None:
        p.error("--out DIR: where the verdicts go")
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="psrv-device-mutants-") as tmp:
        left_out, clean = baseline(Path(tmp) / "clean", workers=a.jobs)
        print(f"without a mutant: {clean}", *(f"left out, failing without a mutant: {n}" for n in left_out),
              sep="\n", flush=True)
        with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
            futures = [pool.submit(verdict, e, Path(tmp) / str(i), deselect=left_out) for i, e in enumerate(entries)]
            results = []
            for done in concurrent.futures.as_completed(futures):
                results.append(done.result())
                r = results[-1]
                print(f"[{len(results)}/{len(entries)}] {r['status']:8} {r['file']} {r['function']}: {r['mutant']}",
                      flush=True)
    machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    doc = {"machine": machine, "clean": clean, "left_out": left_out, "results": results}
    (a.out / "device-mutants.json").write_text(json.dumps(doc, indent=1))
    text = markdown(results, machine, left_out, clean)
    (a.out / "device-mutants.md").write_text(text)
    print(text)
    return 0 if all(r["status"] == "killed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
