"""MLflow runs of finished psrv runs (`--mlflow URI`, the spec key `mlflow`), logged from their records when the
experiment or run ends, once each however often the experiment is run again.

In the MLflow experiment named after the spec (`psrv run`: "psrv run"), the run <variant>/seed-<seed> holds:
params, every setting of its config.json by dotted key (`optimizer.lr`, `mode`; the output keys set aside), a
value over MLflow's length limit cut with a note saying so (config.json, an artifact, has it whole); tags
psrv.variant, psrv.seed, psrv.mode, psrv.config_hash (summary.json's) and psrv.version; metrics per step,
steps.csv's per worker (`worker-R/loss`, `worker-R/staleness`, ... at the worker's step) and evals.csv's
(`eval/<metric>` at rank 0's step), each at its wall time, and summary.json's top-level numbers (`final_loss`,
`samples_per_second`, ...; not the settings it repeats) at the last step; artifacts summary.json and config.json. A run named `report`
holds the experiment's report.md, summary.csv, runs.csv and plots/*.png.

Once: each MLflow run carries its psrv folder (tag psrv.run_dir) and, set when all else is logged, the sha256
of what it logged (psrv.sha256: summary.json's, or the report's files'). A run whose sha256 is there already
is skipped; a folder logged before with another one (it ran again since) gets a new MLflow run and its old one
is deleted. For a local sqlite:///PATH store, an experiment psrv creates keeps its artifacts beside the
database, in PATH's folder/mlartifacts/<experiment>.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path

from psrv.experiments.harness.collect import measured, number, read_csv
from psrv.experiments.launcher.provenance import OUTPUT_KEYS, flat, stored_config
from psrv.experiments.harness.tracking import STEP_SCALARS, run_name, run_origin

EXTRA = "pip install psrv[mlflow]"
KIND, RUN_DIR, SHA = "psrv.kind", "psrv.run_dir", "psrv.sha256"
REPORT_FILES = ("report.md", "summary.csv", "runs.csv")
RUN_EXPERIMENT = "psrv run"  # `psrv run --mlflow URI`'s experiment: it has no spec to name one
# settings summary.json repeats (experiments/launcher/summary.py): params already, no metric (its `staleness` is SSP's bound)
SUMMARY_SETTINGS = ("staleness", "num_workers", "steps", "batch_size", "backup_workers", "quorum", "quorum_max_age", "lr",
                    "seed", "freeze_step")


def check_uri(uri: str) -> None:
    """Before any run starts: a ValueError naming the extra when MLflow's client is not installed here, saying
    why MLflow refuses `uri`, or that no server answers at an http(s) URI (MLflow's client would retry for
    minutes, after the training). A sqlite store is created here if it does not exist."""
    if importlib.util.find_spec("mlflow") is None:
        raise ValueError(f"--mlflow needs MLflow's client, which is not installed here: {EXTRA}")
    _client(uri)
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10).close()
        except urllib.error.HTTPError:
            pass  # a server answered (one without /health, or behind a login): MLflow's client says the rest
        except urllib.error.URLError as exc:
            raise ValueError(f"--mlflow {uri}: no server answers there ({exc.reason}); start one (mlflow "
                             "server) or give another URI") from None
        except OSError as exc:  # a timeout
            raise ValueError(f"--mlflow {uri}: no server answers there ({exc}); start one (mlflow server) or "
                             "give another URI") from None


def _client(uri: str):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    try:
        return MlflowClient(tracking_uri=uri)
    except ImportError as exc:  # mlflow-skinny alone: a sqlite store needs sqlalchemy and alembic
        raise ValueError(f"--mlflow {uri}: {exc}; {EXTRA} installs what a local sqlite store needs") from None
    except MlflowException as exc:
        raise ValueError(f"--mlflow {uri}: {' '.join(str(exc.message).split())}") from None


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a local sqlite database (<its folder>/mlartifacts/
    <experiment>); None, the store's own default, for any other store (a server has its artifact store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?")[0]
    if not path or path == ":memory:":
        return None
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)
    return (Path(path).parent / "mlartifacts" / folder).resolve().as_uri()


def _experiment_id(client, name: str, uri: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, artifact_location=artifact_location(uri, name))
    if found.lifecycle_stage == "deleted":  # its name stays taken until MLflow's garbage collection
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


def _logged(client, experiment_id: str, kind: str) -> list:
    """Every active MLflow run of `kind` ("run" or "report") in the experiment."""
    found, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=f"tags.`{KIND}` = '{kind}'",
                                  max_results=1000, page_token=token)
        found.extend(page)
        token = page.token
        if not token:
            return found


def param_value(value, limit: int) -> str:
    """A setting as an MLflow param: a string as it is, anything else as a spec writes it (0.05, true, null,
    [0.9, 0.999]); over `limit` characters, cut with a note that says so."""
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) <= limit:
        return text
    note = f" [cut: {len(text)} characters; config.json has the whole value]"
    return text[:limit - len(note)] + note


def _params(run: Path) -> dict[str, str]:
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
    return {key: param_value(value, MAX_PARAM_VAL_LENGTH)
            for key, value in flat(stored_config(run)).items() if key not in OUTPUT_KEYS}


def _metrics(run: Path, summary: dict) -> tuple[list[tuple[str, float, int, int]], int, int]:
    """(key, value, timestamp in ms, step) of every metric of the run, then its first and last timestamps."""
    origin = run_origin(run)
    rows = [(row, [(f"worker-{row['worker']}/{column}", row.get(column)) for column in STEP_SCALARS])
            for row in read_csv(run / "steps.csv")]
    rows += [(row, [(f"eval/{column[len('eval_'):]}", cell) for column, cell in row.items()
                    if column.startswith("eval_")]) for row in read_csv(run / "evals.csv")]
    found, last_step, last_time = [], 0, 0.0
    for row, cells in rows:
        step, t = int(number(row["step"]) or 0), number(row.get("wall_time")) or 0.0
        last_step, last_time = max(last_step, step), max(last_time, t)
        for key, cell in cells:
            value = measured(cell)  # a diverged run's NaN is kept; DDP's empty staleness is none
            if value is not None:
                found.append((key, value, int((origin + t) * 1000), step))
    end = int((origin + last_time) * 1000)
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in SUMMARY_SETTINGS:
            found.append((key, float(value), end, last_step))
    return found, int(origin * 1000), end


def _sha256(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _log_run(client, experiment_id: str, variant: str, seed: int, run: Path, sha: str) -> None:
    from mlflow.entities import Metric, Param
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    metrics, start, end = _metrics(run, summary)
    versions = (summary.get("inputs") or {}).get("versions") or {}
    tags = {KIND: "run", RUN_DIR: str(run.resolve()), "psrv.variant": variant, "psrv.seed": str(seed),
            "psrv.mode": str(summary.get("mode", stored_config(run).mode)),
            "psrv.config_hash": str(summary.get("config_hash", "")), "psrv.version": str(versions.get("psrv", ""))}
    params = [Param(k, v) for k, v in _params(run).items()]
    entry = client.create_run(experiment_id, start_time=start, tags=tags, run_name=run_name(variant, seed))
    run_id = entry.info.run_id
    for i in range(0, len(params), 100):  # MLflow's limits per batch: 100 params, 1000 metrics
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=[Metric(*m) for m in metrics[i:i + 1000]])
    for name in ("summary.json", "config.json"):
        client.log_artifact(run_id, str(run / name))
    client.set_tag(run_id, SHA, sha)  # last: a run cut short while logging is replaced next time
    client.set_terminated(run_id, "FINISHED", end_time=end)


def _log_report(client, experiment_id: str, out: Path) -> bool:
    """The experiment's report and plots as the run `report` of this folder; False if logged already."""
    files = [out / name for name in REPORT_FILES if (out / name).is_file()] + sorted((out / "plots").glob("*.png"))
    if not files:
        return False
    sha, here = _sha256(*files), str(out.resolve())
    old = [r for r in _logged(client, experiment_id, "report") if r.data.tags.get(RUN_DIR) == here]
    if any(r.data.tags.get(SHA) == sha for r in old):
        return False
    run_id = client.create_run(experiment_id, tags={KIND: "report", RUN_DIR: here}, run_name="report").info.run_id
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path="plots" if path.parent.name == "plots" else None)
    client.set_tag(run_id, SHA, sha)
    client.set_terminated(run_id, "FINISHED")
    for r in old:
        client.delete_run(r.info.run_id)
    return True


def log_runs(uri: str, experiment: str, runs: list[tuple[str, int, Path]], *, report: Path | None = None,
             replace: bool = True) -> str:
    """Log each finished run (variant, seed, folder) to the MLflow experiment `experiment` at `uri`, and with
    `report` that experiment folder's report and plots; returns one line saying what was logged. `replace`:
    a folder's earlier MLflow run is deleted once its new results are logged (an experiment's rerun keeps the
    old run aside on disk, and its report shows only the new one)."""
    from mlflow.exceptions import MlflowException
    try:
        return _log_runs(_client(uri), uri, experiment, runs, report=report, replace=replace)
    except MlflowException as exc:  # after the training: what ran is kept, and the next call logs it
        raise ValueError(f"--mlflow {uri}: {' '.join(str(exc.message).split())}; the runs are kept: the same "
                         "command again logs them") from None


def _log_runs(client, uri: str, experiment: str, runs, *, report: Path | None, replace: bool) -> str:
    experiment_id = _experiment_id(client, experiment, uri)
    logged = _logged(client, experiment_id, "run")
    shas = {r.data.tags.get(SHA) for r in logged}
    counts = {"logged": 0, "replaced": 0, "already there": 0}
    for variant, seed, path in runs:
        sha = _sha256(path / "summary.json")
        if sha in shas:
            counts["already there"] += 1
            continue
        here = str(path.resolve())
        _log_run(client, experiment_id, variant, seed, path, sha)
        stale = [r for r in logged if r.data.tags.get(RUN_DIR) == here] if replace else []
        for r in stale:  # the folder ran again since: its new results replace the old ones
            client.delete_run(r.info.run_id)
        counts["replaced" if stale else "logged"] += 1
    reported = report is not None and _log_report(client, experiment_id, report)
    said = ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "no finished run"
    return f"MLflow {uri}, experiment {experiment!r}: runs {said}" + ("; report logged" if reported else "")


def log_run(cfg, out: str | Path) -> str:
    """`psrv run --mlflow URI`: the run in the MLflow experiment "psrv run", named <mode name>/seed-<seed>. An
    earlier run's MLflow run is kept: `psrv run` removes that run's files from the folder, so it is its record."""
    from psrv.experiments.harness.spec import default_name
    return log_runs(cfg.mlflow, RUN_EXPERIMENT, [(default_name(cfg), cfg.seed, Path(out))], replace=False)
