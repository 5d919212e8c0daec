"""`--scheduler kubernetes --dry-run`: every manifest passes the Kubernetes API schema (offline, from the
schemas kubernetes-validate ships), and each pod, with Kubernetes' own $(VAR) expansion played here and its
`sh -c` run by the real shell, starts the process a local run starts: the same resolved config per shard
and per rank, the workers' server addresses being the server pods' stable names and port."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from psrv.config import RunConfig, ServerConfig, WorkerConfig
from psrv.config.cli_args import config_from_args
from psrv.experiments.launcher.kubernetes import KubernetesOptions, run_manifests, run_name
from psrv.experiments.launcher.script import Script

pytestmark = pytest.mark.timeout(60)

K8S_VERSION = "1.30.0"  # any cluster from 1.24 (Indexed Jobs stable) validates the same; a supported one
FAKE_PYTHON = "#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$RECORD_TO\"\nenv -0 > \"$RECORD_TO.env\"\n"


def _run(mode: str, *, servers: int = 2, workers: int = 2, device: str = "cpu", **keys) -> RunConfig:
    cfg = RunConfig(mode=mode, **keys)
    return cfg.replace(cluster=cfg.cluster.replace(servers=servers, workers=workers, device=device))


def _validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def _job(docs: list[dict], component: str) -> dict:
    [job] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return job


def _container(job: dict) -> dict:
    [container] = job["spec"]["template"]["spec"]["containers"]
    return container


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of $(VAR) in env values, command and args ($$ is a literal $; an unknown
    variable stays as written)."""
    return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


def _pod_env(container: dict, index: int) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']", path
            env[item["name"]] = str(index)
        else:
            env[item["name"]] = _expand(item["value"], env)
    return env


def _start_pod(container: dict, index: int, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Run the pod's command as its container would (the real sh, after Kubernetes' expansion), with a
    `python` that records the argv and environment it is given instead of starting: (argv, env)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    env = _pod_env(container, index)
    command = [_expand(word, env) for word in container["command"]]
    record = tmp / f"{container['name']}-{index}.argv"
    done = subprocess.run(command, env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD_TO": str(record)},
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    argv = record.read_text().split("\0")[:-1]
    seen = dict(line.split("=", 1) for line in (tmp / f"{record.name}.env").read_text().split("\0") if "=" in line)
    return argv, seen


def _config_files(docs: list[dict], tmp: Path) -> Path:
    [config_map] = _by_kind(docs)["ConfigMap"]
    folder = tmp / "etc"
    folder.mkdir(exist_ok=True)
    for key, text in config_map["data"].items():
        (folder / key).write_text(text)
    return folder


def _options(tmp: Path, **keys) -> KubernetesOptions:
    """Options whose volume and ConfigMap mount are folders under `tmp`, so the pods' commands can run here."""
    return KubernetesOptions(runs=str(tmp / "runs"), configs=str(tmp / "etc"), **keys)


def _resolved(command: str, argv: list[str], configs: Path, cls: type):
    """The config the psrv process would train with: psrv's own parser over its argv, its --config read
    from the ConfigMap's files."""
    from psrv.cli import build_parser
    from psrv.config.cli_args import read_config_file
    assert argv[:4] == ["-P", "-m", "psrv.cli", command], argv
    args = build_parser().parse_args(argv[3:])
    assert args.config.parent == configs, args.config
    return args, config_from_args(cls, args, base=read_config_file(args.config))


@pytest.mark.parametrize("cfg", [_run("sync"), _run("ssp", staleness=3, servers=3, workers=4), _run("ddp", workers=3),
                                 _run("async", device="cuda")], ids=["sync", "ssp", "ddp", "async-cuda"])
def test_every_manifest_passes_the_kubernetes_schema(cfg):
    docs = run_manifests(cfg, run_name("t"), "t", KubernetesOptions(pvc="psrv-runs", metrics=True))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"] + ([] if cfg.is_allreduce else ["Job"])
    for doc in docs:
        _validate(doc)


def test_the_schema_rejects_a_broken_manifest():
    docs = run_manifests(_run("sync"), run_name("t"), "t")
    job = _job(docs, "worker")
    misspelled = copy.deepcopy(job)
    misspelled["spec"]["completionMod"] = misspelled["spec"].pop("completionMode")
    wrong_type = copy.deepcopy(job)
    _container(wrong_type)["ports"] = [{"containerPort": "five"}]
    for broken in (misspelled, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate(broken)
    # the schema leaves a container's image optional (the API server's own checks require it): so here
    no_image = copy.deepcopy(job)
    del _container(no_image)["image"]
    _validate(no_image)
    assert "image" not in _container(no_image) and all(_container(_job(docs, r))["image"] for r in ("server", "worker"))


def test_ps_run_roles_resources_and_rendezvous(tmp_path):
    cfg, name, port = _run("sync", optimizer=RunConfig().optimizer.replace(lr=0.1)), run_name("sync run"), 6000
    options = _options(tmp_path, image="registry.example/psrv:1", namespace="lab", port=port)
    docs = run_manifests(cfg, name, "sync", options)
    kinds = _by_kind(docs)
    [service] = kinds["Service"]
    servers, workers = _job(docs, "server"), _job(docs, "worker")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    for job, count in ((servers, cfg.cluster.servers), (workers, cfg.cluster.workers)):
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", count, count)
        assert pod["subdomain"] == service["metadata"]["name"]  # pods named JOB-INDEX.SERVICE
        assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
        assert job["metadata"]["namespace"] == "lab" and _container(job)["image"] == "registry.example/psrv:1"
        resources = _container(job)["resources"]
        assert resources["requests"] == {"cpu": "2", "memory": "2Gi"} and "nvidia.com/gpu" not in resources["limits"]
    assert [p["containerPort"] for p in _container(servers)["ports"]] == [port]

    configs = _config_files(docs, tmp_path)
    dns = [f"tcp://{servers['metadata']['name']}-{i}.{service['metadata']['name']}:{port}" for i in range(2)]
    assert dns == [f"tcp://{name}-server-{i}.{name}:{port}" for i in range(2)]
    out = f"{tmp_path}/runs/sync"
    for shard in range(cfg.cluster.servers):
        argv, _ = _start_pod(_container(servers), shard, tmp_path)
        args, resolved = _resolved("serve", argv, configs, ServerConfig)
        assert resolved == cfg.server_config(shard, bind=f"tcp://0.0.0.0:{port}")
        assert args.out == Path(f"{out}/server-{shard}.json")
    for rank in range(cfg.cluster.workers):
        argv, _ = _start_pod(_container(workers), rank, tmp_path)
        args, resolved = _resolved("worker", argv, configs, WorkerConfig)
        assert resolved == cfg.worker_config(rank, servers=tuple(dns))  # the rendezvous: the server pods' names
        assert (args.out, args.progress_file) == (Path(f"{out}/worker-{rank}.json"), Path(f"{out}/worker-{rank}.progress"))
        assert (args.params_out, args.state_out) == ((Path(f"{out}/params.pt"), Path(f"{out}/model.pt")) if rank == 0
                                                     else (None, None))
    assert (tmp_path / "runs/sync/config.json").read_text() == (configs / "config.json").read_text()  # rank 0's copy


def test_ssp_run_on_gpus_carries_its_bound_and_a_gpu_each(tmp_path):
    cfg = _run("ssp", staleness=4, servers=1, workers=3, device="cuda")
    docs = run_manifests(cfg, run_name("ssp"), "ssp", _options(tmp_path))
    configs = _config_files(docs, tmp_path)
    for role in ("server", "worker"):
        limits = _container(_job(docs, role))["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
    argv, _ = _start_pod(_container(_job(docs, "server")), 0, tmp_path)
    _, shard = _resolved("serve", argv, configs, ServerConfig)
    assert (shard.mode, shard.staleness, shard.workers, shard.device) == ("ssp", 4, 3, "cuda")
    argv, _ = _start_pod(_container(_job(docs, "worker")), 2, tmp_path)
    _, worker = _resolved("worker", argv, configs, WorkerConfig)
    assert (worker.rank, worker.world_size, worker.servers) == (2, 3, (f"tcp://{run_name('ssp')}-server-0.{run_name('ssp')}:5555",))


def test_ddp_run_is_one_indexed_job_of_ranks_with_torchruns_variables(tmp_path):
    cfg, name = _run("ddp", workers=3), run_name("ddp")
    docs = run_manifests(cfg, name, "ddp", _options(tmp_path, master_port=29511))
    configs = _config_files(docs, tmp_path)
    kinds = _by_kind(docs)
    assert len(kinds["Job"]) == 1 and json.loads(kinds["ConfigMap"][0]["data"]["config.json"])["mode"] == "ddp"
    [service], job = kinds["Service"], _job(docs, "worker")
    assert job["spec"]["completions"] == 3 and [p["port"] for p in service["spec"]["ports"]] == [29511]
    from psrv.workers.allreduce.main import build_parser
    for rank in range(3):
        argv, env = _start_pod(_container(job), rank, tmp_path)
        assert argv[:3] == ["-P", "-m", "psrv.workers.allreduce"]
        args = build_parser().parse_args(argv[3:])
        assert args.config == configs / "config.json" and args.out == f"{tmp_path}/runs/ddp/worker-{{rank}}.json"
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == (str(rank), "3", "0", "29511")
        assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"  # rank 0's pod


def test_script_workers_get_what_psrv_run_script_gives_them(tmp_path):
    cfg, name = _run("async"), run_name("mine")
    script = Script(Path("train.py"), ("--epochs", "3"), steps=None)
    docs = run_manifests(cfg, name, "mine", _options(tmp_path), script=script)
    configs = _config_files(docs, tmp_path)
    assert "worker.json" not in _by_kind(docs)["ConfigMap"][0]["data"]
    out = f"{tmp_path}/runs/mine"
    for rank in range(2):
        argv, env = _start_pod(_container(_job(docs, "worker")), rank, tmp_path)
        assert argv == ["train.py", "--epochs", "3"]
        record = env["PSRV_RECORD"].replace("{rank}", env["RANK"])  # psrv.Worker fills in its rank
        assert (env["RANK"], env["WORLD_SIZE"], record) == (str(rank), "2", f"{out}/worker-{rank}.json")
        assert env["PSRV_SERVERS"] == ",".join(f"tcp://{name}-server-{i}.{name}:5555" for i in range(2))
        assert (env["PSRV_PARAMS_OUT"], env["PSRV_SEED"]) == (f"{out}/params.pt", "0")  # rank 0 alone writes it
        assert env["PSRV_CONFIG"] == str(configs / "config.json")  # the run's worker settings, in every pod
    with pytest.raises(ValueError, match="mode 'ddp' has none"):
        run_manifests(_run("ddp"), name, "mine", script=script)


def test_names_are_dns_labels_that_fit_and_stay_apart():
    long_a, long_b = "x" * 80 + "-sync", "x" * 80 + "-ssp"
    for label in ("My Spec_v2/sync", long_a, long_b):
        name = run_name(label)
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(f"{name}-worker-9999") <= 63, name
    assert run_name(long_a) != run_name(long_b)


@pytest.mark.parametrize("argv, message", [
    (["run", "--scheduler", "kubernetes"], "add --dry-run"),
    (["run", "--dry-run"], "--dry-run: only with --scheduler kubernetes"),
    (["run", "--pvc", "c"], "--pvc: only with --scheduler kubernetes"),
    (["run", "--scheduler", "kubernetes", "--dry-run", "--device", "cuda:1"], "each pod is given one GPU"),
    (["run", "--scheduler", "kubernetes", "--dry-run", "--transport", "rpc"], "zmq only"),
    (["run", "--scheduler", "kubernetes", "--dry-run", "--nemesis", "pause worker:1 at 1s for 1s"],
     "--nemesis: the local launcher does the faults"),
    (["run", "--scheduler", "kubernetes", "--dry-run", "--namespace", "Lab_1"], "--namespace 'Lab_1'"),
])
def test_bad_scheduler_options_are_one_line_errors(argv, message):
    code, out, err = _cli(argv)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1, err


SPEC = """
name = "k8s-check"
seeds = [0, 7]
[target]
eval_accuracy = 0.8
[job]
steps = 20
[cluster]
servers = 2
workers = 2
[[variants]]
mode = "sync"
[[variants]]
mode = "ssp"
staleness = 2
[[variants]]
mode = "ddp"
"""


def test_experiment_dry_run_prints_one_set_per_run(tmp_path):
    spec = tmp_path / "k8s-check.toml"
    spec.write_text(SPEC)
    code, out, err = _cli(["experiment", str(spec), "--scheduler", "kubernetes", "--dry-run", "--pvc", "runs"])
    assert code == 0, err
    again = _cli(["experiment", str(spec), "--out", "runs/elsewhere", "--scheduler", "kubernetes", "--dry-run"])[1]
    assert again.count("mkdir -p /runs/elsewhere/ssp-2/rep-1\n") == 2 and "psrv-elsewhere-ddp-rep-0" in again
    docs = [d for d in yaml.safe_load_all(out) if d]
    for doc in docs:
        _validate(doc)
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    runs = {(json.loads(m["data"]["config.json"])["mode"], json.loads(m["data"]["config.json"])["seed"]) for m in maps}
    assert len(maps) == 6 and runs == {(mode, seed) for mode in ("sync", "ssp", "ddp") for seed in (0, 7)}
    names = {m["metadata"]["name"] for m in maps}
    assert names == {run_name(f"k8s-check-{v}-rep-{k}") for v in ("sync", "ssp-2", "ddp") for k in (0, 1)}
    assert len([d for d in docs if d["kind"] == "Service"]) == 6
    assert len([d for d in docs if d["kind"] == "Job"]) == 2 * 4 + 2  # servers and workers; ddp: ranks only
    folders = {re.search(r"mkdir -p (\S+)", _container(d)["command"][2])[1] for d in docs if d["kind"] == "Job"}
    assert folders == {f"/runs/k8s-check/{v}/rep-{k}" for v in ("sync", "ssp-2", "ddp") for k in (0, 1)}
    assert all(d["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"] == {"claimName": "runs"}
               for d in docs if d["kind"] == "Job")


def test_run_dry_run_prints_the_script_run(tmp_path):
    (tmp_path / "train.py").write_text("print('a psrv.Worker loop')\n")
    code, out, err = _cli(["run", "--mode", "sync", "--workers", "2", "--out", "runs/mine", "--scheduler", "kubernetes",
                           "--dry-run", "--script", str(tmp_path / "train.py"), "--epochs", "2"])
    assert code == 0, err
    assert out.startswith("# run psrv-mine: the run folder is under /runs on an emptyDir")
    docs = [d for d in yaml.safe_load_all(out) if d]
    command = _container(_job(docs, "worker"))["command"][2]
    assert shlex.split(command.splitlines()[-1]) == ["exec", "python", str(tmp_path / "train.py"), "--epochs", "2"]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from psrv.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_deploy_podmonitor_scrapes_the_generated_pods():
    """deploy/k8s/podmonitor.yaml (Prometheus Operator) selects every pod of a --metrics run by its labels,
    finds the port it names on servers and workers, and reads the role from the component label."""
    monitor = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy/k8s/podmonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    role = next(r for r in endpoint["relabelings"] if r.get("targetLabel") == "role")
    label = role["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
    for cfg in (_run("ssp", staleness=1), _run("ddp")):
        docs = run_manifests(cfg, run_name("m"), "m", KubernetesOptions(metrics=True))
        for job in (d for d in docs if d["kind"] == "Job"):
            labels = job["spec"]["template"]["metadata"]["labels"]
            assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
            assert {re.sub(r"[./-]", "_", k): v for k, v in labels.items()}[label] in ("server", "worker")
            ports = [p["name"] for p in _container(job).get("ports", [])]
            assert (endpoint["port"] in ports) != cfg.is_allreduce  # all-reduce ranks serve no /metrics
            if not cfg.is_allreduce:
                argv = shlex.split(_container(job)["command"][2].splitlines()[-1])
                assert argv[argv.index("--metrics-port") + 1] == str(job["spec"]["template"]["metadata"]
                                                                     ["annotations"]["prometheus.io/port"])


def test_experiment_names_the_variant_a_pod_cannot_run(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text(SPEC.replace('mode = "ddp"', 'mode = "async"\n[variants.cluster]\ndevice = "cuda:1"'))
    code, out, err = _cli(["experiment", str(spec), "--scheduler", "kubernetes", "--dry-run"])
    assert (code, out) == (2, "") and "variant async: --device cuda:1: each pod is given one GPU" in err, err
