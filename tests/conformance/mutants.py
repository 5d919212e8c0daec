"""`make mutants`: mutation testing of the data path's math, the conformance matrix as the test command.

mutmut (the Makefile installs its pinned version first) mutates the files pyproject.toml's [tool.mutmut]
names in a copy, mutants/, and for each mutant runs the conformance cases that reach its function
(tests/conformance in process: shards and workers are threads of pytest's process; not test_rpc_pairs,
whose `psrv run` processes take seconds a case). This shows its progress, then the score per package,
the surviving mutants with their diffs and the equivalent ones (tests/conformance/mutant_report.py).

    make mutants MUTANTS_ARGS="--paths psrv/server/rules"      # some files or folders only
    make mutants MUTANTS_ARGS="--paths psrv/server/pulls/copies.py --functions answer state_dict"
    make mutants MUTANTS_ARGS="--paths psrv/codecs/sparse.py --functions largest \\
                               --cases tests/conformance/test_topk_ties.py"   # against those cases only
    python -m tests.conformance.mutants --report-only            # the last run's report again
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.conformance.mutant_report import EQUIVALENT, KILLED, SURVIVED, UNREACHED, module_of, report, verdicts

ROOT = Path(__file__).resolve().parents[2]
CASES = "PSRV_MUTANT_CASES"  # --cases for tests/conformance/mutmut_run.py: a JSON list of pytest arguments
MUTANTS = ROOT / "mutants"
LOG = MUTANTS / "run.log"
REPORT = MUTANTS / "report.txt"
# what mutmut prints as it starts each phase (its log), and what the progress line calls it
PHASES = [("Generating mutants", "generating the mutants"),
          ("Running stats", "coverage: the whole suite once, noting which case reaches which function"),
          ("Listing all tests", "listing the cases"),
          ("Running clean tests", "the cases those mutants need, unmutated"),
          ("Running forced fail test", "checking that a failing function fails the cases"),
          ("Running mutation testing", "mutants")]


def universe() -> list[str]:
    """The files [tool.mutmut] only_mutate names, relative to the repository."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    return sorted({str(p.relative_to(ROOT)) for g in globs for p in ROOT.glob(g) if p.is_file()})


def select(paths: list[str] | None) -> list[str]:
    files = universe()
    if not paths:
        return files
    chosen = []
    for p in paths:
        p = p.rstrip("/")
        hit = [f for f in files if f == p or f.startswith(p + "/") or fnmatch.fnmatch(f, p)]
        if not hit:
            raise ValueError(f"--paths {p}: no file [tool.mutmut] only_mutate (pyproject.toml) names is there; "
                             f"give one of its files or folders, e.g. {files[0]}")
        chosen += [f for f in hit if f not in chosen]
    return chosen


def globs_of(file: str, functions: list[str] | None) -> list[str]:
    """mutmut's names for a file's mutants (mutmut names a mutant module.x_function__mutmut_N, or
    module.xǁClassǁmethod__mutmut_N for a method), all of them or those of some functions' names."""
    module = module_of(file)
    if not functions:
        return [f"{module}.x*"]
    return [g for fn in functions for g in (f"{module}.x_{fn}__mutmut_*", f"{module}.xǁ*ǁ{fn}__mutmut_*")]


def to_run(files: list[str], resume: bool, functions: list[str] | None = None) -> list[str]:
    """mutmut's names of the mutants to test: each file's, by glob (mutmut tests again whatever it is
    named), or only its `functions`' mutants; with `resume`, only those without a verdict yet, where the
    file's mutants exist already."""
    if not resume:
        return [g for f in files for g in globs_of(f, functions)]
    ms = verdicts(ROOT, files)
    known = {m.file for m in ms}
    return [m.name for m in ms if m.status == "not checked"
            and any(fnmatch.fnmatchcase(m.name, g) for g in globs_of(m.file, functions))] + [
        g for f in files if f not in known for g in globs_of(f, functions)]


class Phase:
    """Which of PHASES mutmut is in: the last marker its log shows, read on from where the last look ended."""

    def __init__(self):
        self.offset, self.name, self.carry = 0, "starting", ""

    def now(self) -> str:
        try:
            with open(LOG, "rb") as f:
                f.seek(self.offset)
                new = f.read()
        except FileNotFoundError:
            return self.name
        self.offset += len(new)
        text = self.carry + new.decode(errors="replace")
        seen = [(text.rfind(marker), name) for marker, name in PHASES if marker in text]
        if seen:
            self.name = max(seen)[1]
        self.carry = text[-64:]  # a marker cut in two by a read
        return self.name


class Progress:
    """One line, rewritten in place on a terminal, else printed every `every` seconds or on a new phase."""

    def __init__(self, files: list[str], every: float = 30.0):
        self.files, self.every, self.start = files, every, time.monotonic()
        self.tty, self.last, self.last_phase = sys.stdout.isatty(), 0.0, ""
        self.mutating_since: tuple[float, int] | None = None
        self.phase = Phase()

    def show(self) -> None:
        now, name = time.monotonic(), self.phase.now()
        ms = verdicts(ROOT, self.files)
        done = [m for m in ms if m.status != "not checked"]
        line = f"[mutants {_clock(now - self.start)}] {name}"
        if name == "mutants":
            if self.mutating_since is None:
                self.mutating_since = (now, len(done))
            t0, d0 = self.mutating_since
            rate = (len(done) - d0) / max(now - t0, 1e-9)
            left = f", about {_clock((len(ms) - len(done)) / rate)} left" if rate > 0 else ""
            killed, survived, unreached = (sum(1 for m in done if m.status in s)
                                           for s in (KILLED, (SURVIVED,), (UNREACHED,)))
            line += (f": {len(done)}/{len(ms)} tested, {killed} killed, {survived} survived, "
                     f"{unreached} unreached{left}")
        if self.tty:
            print("\r" + line[:200].ljust(120), end="", flush=True)
        elif now - self.last >= self.every or name != self.last_phase:
            print(line, flush=True)
            self.last = now
        self.last_phase = name

    def end(self) -> None:
        if self.tty:
            print()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run(files: list[str], *, jobs: int, resume: bool, functions: list[str] | None = None,
        cases: list[str] | None = None) -> int:
    """mutmut over `files` (or their `functions`), its output in mutants/run.log; its exit code. `cases`: test
    files (or node ids) that take the place of pyproject.toml's test selection (tests/conformance/mutmut_run.py)."""
    if not resume:
        shutil.rmtree(MUTANTS, ignore_errors=True)  # fresh: mutmut's cache cannot see a change to the tests
    MUTANTS.mkdir(exist_ok=True)
    names = to_run(files, resume, functions)
    if not names:
        print("every mutant of those files has its verdict already")
        return 0
    mutmut = ([sys.executable, "-m", "tests.conformance.mutmut_run"] if cases
              else [str(Path(sys.executable).with_name("mutmut"))])
    cmd = [*mutmut, "run", "--max-children", str(jobs), *names]
    env = {**os.environ, CASES: json.dumps(cases)} if cases else None
    print(f"{len(files)} files; mutmut run --max-children {jobs} ({len(names)} names); "
          f"its output: {LOG.relative_to(ROOT)}")
    progress = Progress(files)
    with open(LOG, "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while proc.poll() is None:
                progress.show()
                time.sleep(2)
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached mutmut too: it stops its workers
            proc.wait()
            progress.end()
            print("interrupted: --resume tests the rest")
            return 130
    progress.show()
    progress.end()
    if proc.returncode:
        lines = [s for s in LOG.read_text(errors="replace").replace("\r", "\n").splitlines()
                 if s.strip() and not "\u2800" <= s[0] <= "\u28ff"]  # without the spinner's frames
        print("\n".join(lines[-30:]))
        print(f"mutmut exited {proc.returncode}: its whole output is in {LOG.relative_to(ROOT)}")
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.mutants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", nargs="+", metavar="PATH",
                        help="files or folders (or globs) among [tool.mutmut] only_mutate; default: all of them")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1: 2 shared cores)")
    parser.add_argument("--resume", action="store_true",
                        help="keep mutants/ and test only the mutants without a verdict (after an interruption, "
                             "with no change to psrv or the tests in between)")
    parser.add_argument("--functions", nargs="+", metavar="NAME",
                        help="only the mutants of these functions or methods (by name, e.g. answer "
                             "load_state_dict), where a run stopped part way and the tests have changed since")
    parser.add_argument("--cases", nargs="+", metavar="TEST",
                        help="run the mutants against these test files (or pytest node ids) of tests/conformance "
                             "only, not the whole matrix: minutes where a function every top-k case reaches takes "
                             "hours; a survivor here may still die in a whole run")
    parser.add_argument("--report-only", action="store_true", help="print the last run's report; run nothing")
    parser.add_argument("--equivalent", type=Path, default=EQUIVALENT,
                        help="the list of equivalent mutants, with a reason each "
                             f"(default: {EQUIVALENT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    try:
        files = select(args.paths)
    except ValueError as e:
        parser.error(str(e))
    for case in args.cases or ():
        if not (ROOT / case.partition("::")[0]).is_file() or not case.startswith("tests/conformance/"):
            parser.error(f"--cases {case}: give test files (or node ids) under tests/conformance/, e.g. "
                         "tests/conformance/test_topk_ties.py")
    start = time.monotonic()
    rc = 0 if args.report_only else run(files, jobs=args.jobs, resume=args.resume,
                                                functions=args.functions, cases=args.cases)
    if rc and rc != 130:
        return rc
    os.chdir(ROOT)  # mutmut's own diff reads mutants/ from the working directory
    lines = report(ROOT, files, equivalent_path=args.equivalent)
    if not args.report_only:
        lines.insert(0, f"{len(files)} files, {_clock(time.monotonic() - start)} (mutants/run.log has mutmut's output)")
        if args.cases:
            lines.insert(1, f"against {' '.join(args.cases)} only, not the whole matrix: a survivor may die there")
    print("\n".join(lines))
    REPORT.write_text("\n".join(lines) + "\n")
    print(f"\n(also in {REPORT.relative_to(ROOT)})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
