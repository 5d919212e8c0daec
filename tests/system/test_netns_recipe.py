"""docs/deploy.md's emulated-hosts recipe run as written (deploy/netns/cluster.sh: a shard on h0, a worker
each on h1 and h2), scraped by a real Prometheus in the root namespace with the doc's targets.json and the
shipped prometheus.yml and rules.yml: every target reached from outside its namespace, the final counts
seen (--metrics-linger), the workers' mode label, and no PsrvWorkerDown for workers that finished.

Needs root, iproute2, tc and prometheus; skipped otherwise, or while an emulated cluster is up.
"""
from __future__ import annotations

import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
from tests.integration.test_prometheus import prometheus_for  # noqa: F401 (the fixture)
from tests.system.test_netns import _skip_unless_netns

pytestmark = [pytest.mark.root, pytest.mark.slow]  # about 30 s: three torch imports, 200 sync steps, lingers

CLUSTER = ROOT / "deploy" / "netns" / "cluster.sh"
WORKERS = ("10.77.0.11:9200", "10.77.0.12:9200")
SERVER = "10.77.0.10:9100"


def _doc_blocks() -> tuple[str, list]:
    """The recipe's bash block and the targets.json block after it, from docs/deploy.md."""
    text = (ROOT / "docs/deploy.md").read_text()
    recipe = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "cluster.sh up 3" in b)
    targets = next(json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S) if "10.77.0.10" in b)
    return recipe, targets


def _as_root_here(recipe: str) -> str:
    """The recipe as this test runs it: already root (no sudo), psrv from this interpreter's environment."""
    psrv = Path(sys.executable).parent / "psrv"
    return recipe.replace("sudo ", "").replace(".venv/bin/psrv", str(psrv))


@pytest.mark.timeout(120)
def test_the_netns_recipe_as_written_is_scraped_from_the_root_namespace(tmp_path, prometheus_for):  # noqa: F811
    _skip_unless_netns()
    recipe, targets = _doc_blocks()
    assert {t for group in targets for t in group["targets"]} == {SERVER, *WORKERS}
    for name in ("prometheus.yml", "rules.yml"):
        shutil.copy(ROOT / "deploy/prometheus" / name, tmp_path / name)
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    prom = prometheus_for(tmp_path / "prometheus.yml")
    found = time.monotonic() + 30  # ready is not yet discovered (file_sd): a run shorter than the wait went unseen
    while set(prom.targets()) != {SERVER, *WORKERS}:
        assert time.monotonic() < found, f"prometheus found {prom.targets()} of targets.json"
        time.sleep(0.2)
    started = time.monotonic()
    script = tmp_path / "recipe.sh"
    script.write_text("set -e\n" + _as_root_here(recipe))
    seen: list[str] = []  # each change in a target's scrape state while the recipe runs: why one was never up
    logs = tmp_path / "recipe.out", tmp_path / "recipe.err"
    try:
        with open(logs[0], "w") as out, open(logs[1], "w") as err:
            done = subprocess.Popen(["bash", str(script)], cwd=ROOT, stdout=out, stderr=err, text=True,
                                    start_new_session=True)  # its background processes share its group
        try:
            _watch(prom, done, seen, started + 90)
            done.wait(timeout=max(1.0, started + 90 - time.monotonic()))
        finally:
            if done.poll() is None:
                os.killpg(done.pid, signal.SIGKILL)
                done.wait(10)
    finally:
        subprocess.run([str(CLUSTER), "down"], capture_output=True, timeout=30)
    out, err = (f.read_text() for f in logs)
    said = "\nscrapes seen:\n" + "\n".join(seen[-40:]) + f"\nrecipe's stderr:\n{err[-3000:]}"
    assert done.returncode == 0, out[-3000:] + said
    assert "torch threads" in err, said  # each process said its share of the cores

    def values(promql: str) -> dict[str, float]:
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in prom.query(promql)}

    deadline = time.monotonic() + 15  # the processes are gone: wait for a failed scrape of each worker
    while set(values('up{role="worker"} == 0')) != set(WORKERS):
        assert time.monotonic() < deadline, str(values('up{role="worker"}')) + said
        time.sleep(0.5)
    assert values("max_over_time(up[5m])") == {SERVER: 1, WORKERS[0]: 1, WORKERS[1]: 1}, said
    assert values('last_over_time(psrv_worker_steps_total{mode="sync"}[5m])') == {w: 200 for w in WORKERS}
    assert values('last_over_time(psrv_worker_finished{mode="sync"}[5m])') == {w: 1 for w in WORKERS}
    assert values('last_over_time(psrv_shard_version{mode="sync"}[5m])') == {SERVER: 200}
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text())
    [down] = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == "PsrvWorkerDown"]
    assert prom.query(down) == []  # both targets down, both finished: nothing to alert on


def _watch(prom, proc: subprocess.Popen, seen: list[str], deadline: float) -> None:
    """Poll Prometheus's targets every 0.25 s until `proc` ends (or the deadline), noting each change of a
    target's health or last error, with the seconds since the watch began."""
    began, last = time.monotonic(), {}
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            now = {t: (health, error) for t, (health, error, _) in prom.targets().items()}
        except OSError as e:  # Prometheus busy: say so, try again
            now = {"prometheus": (type(e).__name__, str(e))}
        for target, state in sorted(now.items()):
            if last.get(target) != state:
                seen.append(f"{time.monotonic() - began:6.2f}s {target}: {state[0]} {state[1] or ''}")
        last = now
        time.sleep(0.25)
