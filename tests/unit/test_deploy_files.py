"""deploy/ hangs together: dashboard and rules use exported metrics, promtool accepts the configs,
and every `psrv serve|worker` line in the recipes and docs/deploy.md parses with psrv's own CLI (the
Kubernetes manifests are generated: tests/unit/test_kubernetes_manifests.py)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from psrv.metrics import METRIC_NAMES

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAME = re.compile(r"psrv_[a-z_]+")
TARGETS = [{"targets": ["127.0.0.1:9100"], "labels": {"job": "psrv", "role": "server"}},
           {"targets": ["127.0.0.1:9200"], "labels": {"job": "psrv", "role": "worker"}}]


def _metric_names(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in NAME.findall(expr)}


def _dashboard_exprs() -> list[str]:
    board = json.loads((DEPLOY / "grafana/psrv.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    return exprs


def _rules() -> list[dict]:
    doc = yaml.safe_load((DEPLOY / "prometheus/rules.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_dashboard_uses_only_exported_metrics():
    board = json.loads((DEPLOY / "grafana/psrv.json").read_text())
    assert board["schemaVersion"] >= 36
    assert any(v["name"] == "DS_PROMETHEUS" and v["type"] == "datasource"
               for v in board["templating"]["list"])
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
    used = set().union(*map(_metric_names, _dashboard_exprs()))
    assert used - set(METRIC_NAMES) == set()
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in ("throughput", "updates", "staleness", "wait", "step time", "loss", "bytes"):
        assert topic in titles


def test_rules_and_config_parse_and_use_exported_metrics():
    rules = _rules()
    used = set().union(*(_metric_names(r["expr"]) for r in rules))
    assert used and used - set(METRIC_NAMES) == set()
    records = {r["record"] for r in rules if "record" in r}
    assert {"psrv:samples_per_second", "psrv:worker_wait_fraction"} <= records
    assert {r["alert"] for r in rules if "alert" in r} == {
        "PsrvWorkerDown", "PsrvStalenessAboveBound", "PsrvNoUpdates"}
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yml"]
    [job] = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == ["targets.json"]


def test_docs_list_every_metric():
    text = (ROOT / "docs/deploy.md").read_text()
    assert [n for n in METRIC_NAMES if f"`{n}`" not in text] == []


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus; .ci/run installs it)")
    return path


def _promtool_ok(*args: str, cwd: Path) -> str:
    done = subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=15)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_promtool_accepts_config_and_rules(tmp_path):
    # prometheus.yml finds rules.yml and targets.json beside it, as after `psrv run --metrics`.
    for name in ("prometheus.yml", "rules.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    (tmp_path / "targets.json").write_text(json.dumps(TARGETS))
    out = _promtool_ok("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "WARNING" not in out, out
    _promtool_ok("check", "rules", "rules.yml", cwd=tmp_path)


def test_promtool_accepts_dashboard_queries(tmp_path):
    # Grafana's variables replaced by what they stand for, each query checked as a recording rule.
    exprs = [e.replace("$__rate_interval", "1m").replace("$mode", ".*") for e in _dashboard_exprs()]
    exprs = [e for e in exprs if not e.startswith("label_values(")]
    rules = [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]
    (tmp_path / "dash.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    _promtool_ok("check", "rules", "dash.yml", cwd=tmp_path)


def test_alerts_fire_on_promtool_series():
    """deploy/prometheus/rules_test.yml, in place: a worker that finished (psrv_worker_finished 1 in its last
    scrape) raises nothing when its target goes away; one killed mid-run, one never scraped, and one that
    finished once and then died on the same host:port raise PsrvWorkerDown."""
    tests = (DEPLOY / "prometheus/rules_test.yml").read_text()
    for instance in ("h1:9201", "h2:9202", "h3:9203", "h4:9204"):
        assert instance in tests
    out = _promtool_ok("test", "rules", "rules_test.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS" in out, out


# --- the psrv command lines in the recipes ------------------------------------------------------

PLAUSIBLE = {"--servers": "tcp://10.0.0.1:5555,tcp://10.0.0.2:5556", "--bind": "tcp://0.0.0.0:5555",
             "--mode": "ssp", "--optimizer": "sgd", "--device": "cpu", "--transport": "zmq",
             "--job": "digits_mlp", "--out": "/tmp/psrv-out.json", "--lr": "0.05"}
SHELL_VAR = re.compile(r"\$\{\w+(?::-[^}]*)?\}|\$\(\w+\)|\$\w+")


def _value(flag: str | None, value: str) -> str:
    if SHELL_VAR.fullmatch(value):
        return PLAUSIBLE.get(flag, "1")
    return SHELL_VAR.sub("1", value)


def _fill(argv: list[str]) -> list[str]:
    """Put plausible values where shell or Kubernetes variables stand in `argv`."""
    out, flag = [], None
    for token in argv:
        name, eq, value = token.partition("=")
        if token.startswith("--") and not eq:
            out.append(token)
            flag = token
            continue
        out.append(f"{name}={_value(name, value)}" if token.startswith("--") else _value(flag, token))
        flag = None
    return out


def _shell_commands(text: str) -> list[list[str]]:
    """`psrv serve|worker ...` commands in shell text, continuation lines joined, up to `&`/`;`."""
    text = re.sub(r"\$\(\([^)]*\)\)", "1", text.replace("\\\n", " "))  # $((arithmetic))
    commands = []
    for line in text.splitlines():
        match = re.search(r"\bpsrv (serve|worker)\b.*", line)
        if match and not line.lstrip().startswith("#"):
            argv = shlex.split(match.group(0), comments=True)
            cut = [i for i, t in enumerate(argv) if t in ("&", ";", "&&", "|", ")")]
            commands.append(argv[1:cut[0]] if cut else argv[1:])
    return commands


def _doc_commands(doc: str = "docs/deploy.md") -> list[list[str]]:
    text = (ROOT / doc).read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)  # every fenced block, so a json one keeps the pairing
    return [c for lang, block in blocks if lang in ("", "bash", "sh", "console") for c in _shell_commands(block)]


@pytest.mark.parametrize("source", ["slurm", "docs", "usage"])
def test_recipe_commands_parse_with_the_cli(source):
    commands = {"slurm": lambda: _shell_commands((DEPLOY / "slurm/psrv.sbatch").read_text()),
                "docs": _doc_commands, "usage": lambda: _doc_commands("docs/usage.md")}[source]()
    assert {"serve", "worker"} <= {c[0] for c in commands}, f"no serve/worker command in {source}"
    from psrv.cli import build_parser  # here, so a broken CLI fails these tests and only these
    parser = build_parser()
    for argv in commands:
        argv = _fill(argv)
        stderr, refused = io.StringIO(), False
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(argv)
        except SystemExit:
            refused = True
        if refused:
            pytest.fail(f"{source}: psrv rejects `psrv {shlex.join(argv)}`:\n{stderr.getvalue()}")


def test_shell_scripts_are_valid_bash():
    scripts = [DEPLOY / "slurm/psrv.sbatch", DEPLOY / "netns/cluster.sh"]
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@pytest.mark.root
def test_netns_cluster_up_exec_down():
    script = str(DEPLOY / "netns/cluster.sh")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root, ip and tc")
    if Path("/run/netns/psrv-h0").exists():
        pytest.skip("a psrv netns cluster is already up; not touching it")
    up = subprocess.run([script, "up", "2", "100mbit"], capture_output=True, text=True, timeout=15)
    try:
        if up.returncode != 0 and "not permitted" in up.stderr.lower():
            pytest.skip(f"no CAP_NET_ADMIN here: {up.stderr.strip()}")
        assert up.returncode == 0, up.stderr
        again = subprocess.run([script, "up", "2", "100mbit"], capture_output=True, text=True, timeout=15)
        assert again.returncode == 0, again.stderr
        addr = subprocess.run([script, "exec", "1", "ip", "-4", "-o", "addr", "show", "eth0"],
                              capture_output=True, text=True, timeout=5)
        assert "10.77.0.11/24" in addr.stdout
        qdisc = subprocess.run([script, "exec", "0", "tc", "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True, timeout=5)
        assert "tbf" in qdisc.stdout and "100Mbit" in qdisc.stdout
        probe = ("import socket; s = socket.create_connection(('10.77.0.11', 7), timeout=2)")
        reach = subprocess.run([script, "exec", "0", "python3", "-c", probe],
                               capture_output=True, text=True, timeout=10)
        assert "Connection refused" in reach.stderr  # routed to host 1, which has nothing on port 7
    finally:
        down = subprocess.run([script, "down"], capture_output=True, text=True, timeout=15)
    assert down.returncode == 0, down.stderr
    assert not Path("/run/netns/psrv-h0").exists()
    assert subprocess.run(["ip", "link", "show", "psrvbr0"], capture_output=True).returncode != 0
