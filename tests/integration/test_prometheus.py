"""A real Prometheus scrapes a `psrv run --metrics`: what it stored agrees with the run's summary.

Uses `prometheus` and `promtool` from PATH (Debian's package; .ci/run installs it), on an ephemeral
127.0.0.1 port with a temporary TSDB, and the shipped deploy/prometheus/*.yml copied next to the
run's targets.json.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT, psrv_run
from psrv.experiments.launcher.cluster import free_port as _free_port

DEPLOY = ROOT / "deploy" / "prometheus"
STALENESS_BUCKETS = 13  # psrv.metrics.STALENESS_BUCKETS plus +Inf


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH (apt-get install prometheus; .ci/run installs it)")
    return path


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


class Prometheus:
    """prometheus on 127.0.0.1:PORT reading CONFIG; stop() kills it by PID."""

    def __init__(self, config: Path, tmp: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=config.parent)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
            try:
                if _get(f"{self.url}/-/ready", timeout=1.0):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, f"prometheus not ready:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.2)

    def query(self, promql: str) -> list[dict]:
        body = json.loads(_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets(self) -> dict[str, tuple]:
        """Each active target's instance -> (health, last error, last scrape's time), as Prometheus says now."""
        body = json.loads(_get(f"{self.url}/api/v1/targets?state=active"))
        return {t["labels"].get("instance", t.get("scrapeUrl", "")): (t.get("health"), t.get("lastError"),
                                                                       t.get("lastScrape"))
                for t in body["data"]["activeTargets"]}

    def scalar(self, promql: str) -> float:
        result = self.query(promql)
        assert len(result) == 1, f"{promql} gave {result}; log:\n{self.log.read_text()[-2000:]}"
        return float(result[0]["value"][1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def prometheus_for(tmp_path):
    started: list[Prometheus] = []

    def start(config: Path) -> Prometheus:
        p = Prometheus(config, tmp_path)
        started.append(p)
        p.wait_ready()
        return p
    yield start
    for p in started:
        p.stop()


def _promtool(*args: str, cwd: Path) -> None:
    done = subprocess.run([_binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(120)
def test_prometheus_scrape_matches_the_run_summary(tmp_path, prometheus_for):
    # stays slow (a 4 s run, a 4 s linger, 4 psrv processes): rate() needs several 1 s scrapes while it
    # trains, the last values need scrapes after it ends, and each process serves its own /metrics
    _binary("promtool")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("prometheus.yml", "rules.yml"):
        shutil.copy(DEPLOY / name, run / name)   # relative paths (rules.yml, targets.json) resolve here
    config = (run / "prometheus.yml").read_text()
    assert "scrape_interval: 1s" in config, "the test relies on the shipped 1 s scrape interval"
    # Prometheus first: file_sd watches for targets.json, which psrv run writes as processes start.
    prom = prometheus_for(run / "prometheus.yml")

    # About 10 s of training, so that rate() sees several 1 s scrapes while it runs: the emulated compute
    # keeps it that long on a fast machine too (400 plain steps took under a second on one). It must outlast
    # prometheus.yml's 5 s file_sd refresh: under load the workers were once found only after they had
    # trained (4 s then), and every recorded rate was 0.
    steps = 400
    s = psrv_run(run, "--metrics", "--metrics-linger", "4", "--steps", str(steps), "--servers", "2", "--workers", "2",
                 "--mode", "async", "--compute-ms", "25", timeout=100)
    targets = json.loads((run / "targets.json").read_text())
    assert sorted(g["labels"]["role"] for g in targets) == ["server", "worker"]
    assert sum(len(g["targets"]) for g in targets) == 4
    _promtool("check", "config", "prometheus.yml", cwd=run)   # with the targets.json psrv wrote
    _promtool("check", "rules", "rules.yml", cwd=run)

    # The processes have exited, so instant vectors are stale: read each series' last value
    # (counters only grow) from the samples scraped during the run and the 4 s linger.
    def last(selector: str) -> str:
        return f"max_over_time({selector}[10m])"
    assert prom.scalar("count(" + last('up{job="psrv"}') + ")") == 4
    applied = prom.scalar(f"sum({last('psrv_updates_applied_total')})")
    assert applied == sum(s["updates_applied_per_shard"]) == 2 * 2 * steps  # 2 shards x 2 workers
    per_shard = {r["metric"]["shard"]: float(r["value"][1])
                 for r in prom.query(f"sum by (shard) ({last('psrv_updates_applied_total')})")}
    assert per_shard == {str(i): float(n) for i, n in enumerate(s["updates_applied_per_shard"])}
    samples = prom.scalar(f"sum({last('psrv_worker_samples_total')})")
    assert samples == s["pushes"] * s["batch_size"] == 2 * steps * 32

    buckets = prom.query(last('psrv_push_staleness_bucket{mode="async"}'))
    assert len(buckets) == 2 * STALENESS_BUCKETS, buckets
    servers = [json.loads((run / f"server-{i}.json").read_text()) for i in range(2)]
    histogram_total = sum(sum(srv["staleness_histogram"].values()) for srv in servers)
    assert prom.scalar("sum(" + last('psrv_push_staleness_bucket{le="+Inf"}') + ")") == histogram_total

    # The recording rules ran on the real series.
    assert prom.scalar("max_over_time(psrv:samples_per_second[10m])") > 0
