"""Finished runs logged to a real local MLflow store (sqlite) and read back with MLflow's own client: one
MLflow run per psrv run with its config as params, steps.csv and evals.csv as metric histories, summary.json's
numbers and its files; the report as the run `report`; logged once, and replaced when the folder ran again."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from psrv.experiments.harness.collect import collect, read_csv, run_dir
from psrv.experiments.harness.runner import run_experiment
from psrv.experiments.harness.tracking_mlflow import EXTRA, check_uri, log_runs, param_value
from tests.unit.test_report import PNG, _fabricate, _spec


def _runs(out: Path) -> list[tuple[str, int, Path]]:
    spec = _spec("sync", "ddp")
    return [(v.name, seed, run_dir(out, v.name, repeat)) for v, seed, repeat in spec.runs()]


def MlflowClient(**kwargs) -> "mlflow.tracking.MlflowClient":  # noqa: F821, N802
    """MLflow's own client, imported at first use: MLflow's import costs about 1 s of CPU, which every pytest
    process would pay in collecting this file, where only the one that runs it needs it."""
    from mlflow.tracking import MlflowClient as client
    return client(**kwargs)


def _by_name(client, experiment: str) -> dict[str, object]:
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    names = [r.info.run_name for r in found]
    assert len(names) == len(set(names)), f"duplicate MLflow runs: {names}"
    return {r.info.run_name: r for r in found}


def test_each_finished_run_is_logged_once_and_read_back(tmp_path: Path) -> None:
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path}/store/mlflow.db"
    _fabricate(out, "ddp")  # sync and ddp (no staleness), seeds 0 and 1
    collect(out, _spec("sync", "ddp"))  # summary.csv, runs.csv
    for _, _, path in _runs(out):  # settings a real summary.json repeats
        summary = path / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "lr": 0.05, "staleness": 0}))
    (out / "report.md").write_text("# fab\n")
    (out / "plots").mkdir()
    (out / "plots" / "loss_curves.png").write_bytes(PNG)
    said = log_runs(uri, "fab", _runs(out), report=out)
    assert said == f"MLflow {uri}, experiment 'fab': runs 4 logged; report logged"

    client = MlflowClient(tracking_uri=uri)
    runs = _by_name(client, "fab")
    assert set(runs) == {"sync/seed-0", "sync/seed-1", "ddp/seed-0", "ddp/seed-1", "report"}
    for variant, seed, path in _runs(out):
        run = runs[f"{variant}/seed-{seed}"]
        params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
        stored = json.loads((path / "config.json").read_text())
        assert (params["mode"], params["optimizer.lr"], params["job.steps"]) == (variant, "0.05", "3")
        assert params["seed"] == str(seed) and params["optimizer.betas"] == json.dumps(stored["optimizer"]["betas"])
        assert "tensorboard" not in params and "mlflow" not in params  # where results go is no setting of training
        assert (tags["psrv.variant"], tags["psrv.seed"], tags["psrv.mode"]) == (variant, str(seed), variant)
        assert tags["psrv.run_dir"] == str(path.resolve()) and run.info.status == "FINISHED"
        steps = [r for r in read_csv(path / "steps.csv") if r["worker"] == "0"]
        history = client.get_metric_history(run.info.run_id, "worker-0/loss")
        assert [(m.step, m.value) for m in history] == [(int(r["step"]), float(r["loss"])) for r in steps]
        assert ("worker-1/staleness" in metrics) == (variant == "sync")  # DDP's steps.csv has none
        evals = read_csv(path / "evals.csv")
        history = client.get_metric_history(run.info.run_id, "eval/accuracy")
        assert [(m.step, m.value) for m in history] == [(int(r["step"]), float(r["eval_accuracy"])) for r in evals]
        summary = json.loads((path / "summary.json").read_text())
        assert metrics["final_loss"] == summary["final_loss"] and "mode" not in metrics
        assert "lr" not in metrics and "staleness" not in metrics  # settings summary.json repeats: params only
        assert {f.path for f in client.list_artifacts(run.info.run_id)} == {"config.json", "summary.json"}
    report = runs["report"].info.run_id
    assert {f.path for f in client.list_artifacts(report)} == {"report.md", "summary.csv", "runs.csv", "plots"}
    assert [f.path for f in client.list_artifacts(report, "plots")] == ["plots/loss_curves.png"]
    # a local store's artifacts lie beside its database
    assert client.get_experiment_by_name("fab").artifact_location == (tmp_path / "store/mlartifacts/fab").as_uri()

    ids = {name: r.info.run_id for name, r in runs.items()}
    assert log_runs(uri, "fab", _runs(out), report=out) == f"MLflow {uri}, experiment 'fab': runs 4 already there"
    assert {name: r.info.run_id for name, r in _by_name(client, "fab").items()} == ids

    rerun = run_dir(out, "sync", 1) / "summary.json"  # the folder ran again: new results replace the old run
    rerun.write_text(json.dumps({**json.loads(rerun.read_text()), "final_loss": 0.25}))
    said = log_runs(uri, "fab", _runs(out), report=out)
    assert said == f"MLflow {uri}, experiment 'fab': runs 1 replaced, 3 already there"
    after = _by_name(client, "fab")
    assert after["sync/seed-1"].info.run_id != ids["sync/seed-1"] and after["sync/seed-1"].data.metrics["final_loss"] == 0.25
    assert {name: r.info.run_id for name, r in after.items() if name != "sync/seed-1"} == \
        {name: i for name, i in ids.items() if name != "sync/seed-1"}


def test_a_param_over_the_limit_is_cut_with_a_note() -> None:
    assert (param_value("sgd", 10), param_value(0.05, 10), param_value(True, 10)) == ("sgd", "0.05", "true")
    assert param_value(None, 10) == "null" and param_value([0.9, 0.999], 20) == "[0.9, 0.999]"
    cut = param_value("x" * 7000, 6000)
    assert len(cut) == 6000 and cut.endswith(" [cut: 7000 characters; config.json has the whole value]")


def test_without_mlflow_installed_the_experiment_names_the_extra_before_any_run(tmp_path: Path, monkeypatch) -> None:
    spec = tmp_path / "fab.toml"
    spec.write_text('name = "fab"\n[job]\nname = "digits_mlp"\nsteps = 3\n[target]\neval_accuracy = 0.9\n'
                    '[[variants]]\nmode = "sync"\n')
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` finds where it is not installed
    with pytest.raises(ValueError, match=r"needs MLflow's client, which is not installed here: pip install psrv\[mlflow\]"):
        run_experiment(spec, out=tmp_path / "out", mlflow=f"sqlite:///{tmp_path}/mlflow.db")
    assert not (tmp_path / "out").exists() and EXTRA == "pip install psrv[mlflow]"
    with pytest.raises(ValueError, match="not installed here"):
        check_uri("http://127.0.0.1:1")


def test_a_server_uri_where_none_answers_is_refused_before_any_run(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError, match=rf"--mlflow http://127.0.0.1:{port}: no server answers there"):
        check_uri(f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="--mlflow ./mlruns: The filesystem tracking backend"):
        check_uri("./mlruns")  # MLflow 3's file store, refused by MLflow itself: its reason in one line
