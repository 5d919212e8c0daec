"""The report of a mutation run (tests/conformance/mutants.py): each mutant of the chosen files with
mutmut's verdict (its files in mutants/), its place and diff, the equivalent ones (equivalent_mutants.toml)
left out, and the score per package: killed / non-equivalent mutants."""
from __future__ import annotations

import ast
import json
import re
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

EQUIVALENT = Path(__file__).with_name("equivalent_mutants.toml")
# mutmut's verdicts (mutmut.stats.status_by_exit_code) as the score counts them: a case failed, a case hung
# past its timeout (or a mutant ran out of CPU time), the process died
KILLED = ("killed", "timeout", "segfault")
SURVIVED, UNREACHED = "survived", "no tests"  # no case failed; no case reaches the mutated function


@dataclass
class Mutant:
    name: str  # mutmut's: module.xǁClassǁmethod__mutmut_N or module.x_function__mutmut_N
    file: str
    status: str
    line: int = 0
    diff: str = ""
    source: str = ""  # the mutated lines as the file has them, whitespace collapsed
    mutated: str = ""  # and as the mutant has them
    before: str = ""  # the line above the first mutated one, whitespace collapsed
    reason: str = ""  # why it is equivalent (equivalent_mutants.toml), if it is

    @property
    def function(self) -> str:
        mangled = self.name.partition("__mutmut_")[0].rpartition(".")[2]
        if "ǁ" in mangled:
            _, cls, fn = mangled.split("ǁ")
            return f"{cls}.{fn}"
        return mangled.removeprefix("x_")

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What names a mutant in equivalent_mutants.toml: not mutmut's number, which moves when the
        function changes, but the file, the function and the text it mutates, before and after."""
        return self.file, self.function, self.source, self.mutated


def collapse(text: str) -> str:
    return " ".join(text.split())


def module_of(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def package_of(file: str) -> str:
    return str(Path(file).parent)


def verdicts(root: Path, files: list[str]) -> list[Mutant]:
    """Every mutant of `files` mutmut generated, with its verdict so far ('not checked' before its run)."""
    from mutmut.stats import status_by_exit_code

    out = []
    for file in files:
        meta = root / "mutants" / f"{file}.meta"
        try:
            codes = json.loads(meta.read_text())["exit_code_by_key"]
        except (FileNotFoundError, json.JSONDecodeError):  # not generated yet, or mid-write
            continue
        out += [Mutant(name, file, status_by_exit_code[code]) for name, code in sorted(codes.items())]
    return out


def _def_lines(path: Path) -> dict[str, int]:
    """`function` or `Class.method` -> its first line (its first decorator's), as mutmut names them (top
    level and one class deep)."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, functions):
            found.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            found += [(f"{node.name}.{item.name}", item) for item in node.body if isinstance(item, functions)]
    return {name: min([f.lineno] + [d.lineno for d in f.decorator_list]) for name, f in found}


def _offset(diff_body: list[str]) -> int:
    """The first changed line's place in the function as the diff shows it (1: its first line)."""
    at = int(re.match(r"@@ -(\d+)", diff_body[0]).group(1))
    return at + next(i for i, line in enumerate(diff_body[1:]) if line[:1] in "-+")


def describe(root: Path, mutants: list[Mutant]) -> None:
    """Fill in each mutant's diff (mutmut's own, of the function), the lines it changes and its line."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # reads mutants/ from the working directory

    defs: dict[str, dict[str, int]] = {}
    for m in mutants:
        m.diff = get_diff_for_mutant(m.name, path=m.file)
        body = m.diff.splitlines()[2:]  # past the ---/+++ header
        removed = [line[1:] for line in body if line.startswith("-")]
        m.source = collapse("\n".join(removed))
        m.mutated = collapse("\n".join(line[1:] for line in body if line.startswith("+")))
        if m.file not in defs:
            defs[m.file] = _def_lines(root / m.file)
        first = defs[m.file].get(m.function, 1)
        text = (root / m.file).read_text().splitlines()
        wanted = removed[0].strip() if removed else None
        guess = first + _offset(body) - 1  # off by the comment lines above the def, which mutmut's diff shows
        places = [i + 1 for i in range(first - 1, len(text)) if text[i].strip() == wanted]
        m.line = min(places, key=lambda n: abs(n - guess)) if places else guess
        m.before = collapse(next((text[i] for i in range(m.line - 2, -1, -1) if text[i].strip()), ""))


@dataclass
class Entry:
    """One [[mutant]] of equivalent_mutants.toml; `after` (optional) tells apart the same change to two
    equal lines of one function: the line above the one it means."""

    file: str
    function: str
    source: str
    mutant: str
    reason: str
    after: str | None = None
    cuda: bool = False  # not equivalent where CUDA is: tests/conformance/device_mutants.py tests it there

    def matches(self, m: Mutant) -> bool:
        return (self.file, self.function, self.source, self.mutant) == m.key and self.after in (None, m.before)


def load_equivalent(path: Path = EQUIVALENT) -> list[Entry]:
    """The list's [[mutant]] tables."""
    out = []
    for e in tomllib.loads(path.read_text()).get("mutant", []):
        keys = {"file", "function", "source", "mutant", "reason"}
        if not keys <= set(e) <= keys | {"after", "cuda"}:
            raise ValueError(f"{path}: an entry has {sorted(e)}: give each [[mutant]] {sorted(keys)}, `after` "
                             "only where two equal lines of one function take the same change, and `cuda` only "
                             "where a machine with CUDA can tell the mutant apart")
        if not isinstance(e.get("cuda", False), bool):
            raise ValueError(f"{path}: {e['file']} {e['function']}: cuda = {e['cuda']!r}; true or nothing")
        out.append(Entry(e["file"], e["function"], collapse(e["source"]), collapse(e["mutant"]), e["reason"],
                         collapse(e["after"]) if "after" in e else None, e.get("cuda", False)))
    return out


def _indented(diff: str) -> list[str]:
    return ["    " + line for line in diff.splitlines()[2:]]


def report(root: Path, files: list[str], *, equivalent_path: Path = EQUIVALENT) -> list[str]:
    """The score table, the surviving mutants with their diffs, the functions no case reaches, the
    equivalent mutants with their reasons, and what in the equivalent list no longer holds."""
    mutants = verdicts(root, files)
    equivalent = load_equivalent(equivalent_path)
    listed_files = {e.file for e in equivalent}
    # the diff of every mutant that is not killed, and of the killed ones in files the list names (so
    # that a listed mutant some case kills is seen)
    describe(root, [m for m in mutants if m.status not in KILLED or m.file in listed_files])
    matched: dict[int, list[Mutant]] = defaultdict(list)  # entry -> the mutants it names
    for m in mutants:
        hit = next((i for i, e in enumerate(equivalent) if m.diff and e.matches(m)), None)
        if hit is not None:
            matched[hit].append(m)
            if m.status not in KILLED:
                m.reason = equivalent[hit].reason
    out = _table(mutants) + _survivors(mutants)
    equivalents = [m for m in mutants if m.reason]
    out += ["", f"Equivalent mutants ({len(equivalents)}; left out of the score; {equivalent_path.name})"]
    for m in sorted(equivalents, key=lambda m: (m.file, m.line)):
        out += [f"  {m.file}:{m.line}  {m.function}: {m.reason}", f"    - {m.source}", f"    + {m.mutated}"]
    killed_listed = [m for ms in matched.values() for m in ms if m.status in KILLED]
    stale = [e for i, e in enumerate(equivalent) if e.file in files and i not in matched]
    if killed_listed or stale:
        out += ["", f"{equivalent_path.name} no longer holds: fix these entries"]
        out += [f"  killed, so not equivalent: {m.file}:{m.line} {m.function}: {m.source} -> {m.mutated}"
                for m in killed_listed]
        out += [f"  no such mutant now: {e.file} {e.function}: {e.source} -> {e.mutant}" for e in stale]
    return out


def _table(mutants: list[Mutant]) -> list[str]:
    out = ["", "Mutation score: killed / non-equivalent mutants (killed counts a case's timeout as a kill)", ""]
    columns = ("mutants", "equiv.", "killed", "survived", "unreached", "other")
    head = f"{'package':<28} " + " ".join(f"{c:>9}" for c in columns) + "   score"
    out += [head, "-" * len(head)]
    by_package: dict[str, list[Mutant]] = defaultdict(list)
    for m in mutants:
        by_package[package_of(m.file)].append(m)
    for package, ms in sorted(by_package.items()) + [("total", mutants)]:
        equiv = sum(1 for m in ms if m.reason)
        killed = sum(1 for m in ms if m.status in KILLED)
        survived = sum(1 for m in ms if m.status == SURVIVED and not m.reason)
        unreached = sum(1 for m in ms if m.status == UNREACHED and not m.reason)
        other = len(ms) - equiv - killed - survived - unreached
        score = f"{100 * killed / (len(ms) - equiv):6.1f}%" if len(ms) > equiv else "      -"
        counts = (len(ms), equiv, killed, survived, unreached, other)
        out.append(f"{package:<28} " + " ".join(f"{n:>9}" for n in counts) + f"  {score}")
    return out


def _survivors(mutants: list[Mutant]) -> list[str]:
    """Each surviving mutant with its diff; the functions no case reaches, their mutants counted; the rest."""
    survivors = [m for m in mutants if m.status == SURVIVED and not m.reason]
    out = ["", f"Surviving mutants ({len(survivors)}): no case that reaches the function failed"]
    for m in sorted(survivors, key=lambda m: (m.file, m.line)):
        out += ["", f"{m.file}:{m.line}  {m.function}  ({m.name.rpartition('.')[2]})"] + _indented(m.diff)
    unreached: dict[tuple[str, str], list[Mutant]] = defaultdict(list)
    for m in mutants:
        if m.status == UNREACHED and not m.reason:
            unreached[(m.file, m.function)].append(m)
    out += ["", f"Functions no conformance case reaches ({len(unreached)}; their mutants count as not killed)"]
    out += [f"  {file}:{min(m.line for m in ms)}  {fn}: {len(ms)} mutants"
            for (file, fn), ms in sorted(unreached.items())]
    others = [m for m in mutants if not m.reason and m.status not in (*KILLED, SURVIVED, UNREACHED)]
    if others:
        out += ["", f"Mutants without a verdict ({len(others)}; counted as not killed)"]
        out += [f"  {m.file}:{m.line}  {m.function}: {m.status}  ({m.name.rpartition('.')[2]})" for m in others]
    return out
