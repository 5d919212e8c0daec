"""A run as Kubernetes manifests (`psrv run|experiment --scheduler kubernetes --dry-run`): what a local run
starts on 127.0.0.1, as two roles of pods, for `kubectl apply -f -`.

One run is, in one namespace, all named after the run (`run_name`):
- a ConfigMap with the run's config.json whole, and the two process configs derived from it
  (server.json: `RunConfig.server_config`; worker.json: `RunConfig.worker_config`), as the local launcher
  writes config-server-K.json and config-worker-R.json;
- a headless Service selecting the run's pods: the rendezvous. Each pod of an Indexed Job whose
  `subdomain` is the Service gets the stable DNS name `JOB-INDEX.SERVICE`, so shard K is at
  tcp://NAME-server-K.NAME:PORT before any pod starts, and the workers' --servers are known when the
  manifests are written (ZeroMQ resolves the name when it connects, and retries until the shard is up);
- the servers: an Indexed Job (completionMode Indexed), shard = JOB_COMPLETION_INDEX, bound on PORT;
- the workers: an Indexed Job, rank = JOB_COMPLETION_INDEX: `psrv worker` (the shipped loop), or the
  user's script with RANK, WORLD_SIZE and PSRV_SERVERS as `psrv run --script` sets them. The all-reduce
  modes have no servers: one Indexed Job of ranks with torchrun's variables, MASTER_ADDR rank 0's name.

Indexed Jobs, not a JobSet: a JobSet is a custom resource that most clusters do not have installed and
that the Kubernetes API schema does not describe; an Indexed Job is core batch/v1 (stable since 1.24)
and gives each pod its index and a stable name, which is all the two roles need.

Each container runs `sh -c`: make the run folder, then exec the very argv the local launcher builds
(experiments/launcher/launch.py, launch_ddp.py, script.py), with $(JOB_COMPLETION_INDEX) filled in by Kubernetes
and rank 0's own outputs (params.pt, model.pt) added by a test on it. The run folder is on a volume at
RUNS: a PersistentVolumeClaim named by `pvc` (ReadWriteMany, so every pod writes the one folder and its
outputs can be gathered), else an emptyDir that is lost with its pod.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from psrv.config import RunConfig, to_dict

from psrv.experiments.launcher.launch import rank0_argv, server_argv, worker_argv
from psrv.experiments.launcher.launch_ddp import allreduce_argv
from psrv.experiments.launcher.script import Script, script_env

INDEX = "$(JOB_COMPLETION_INDEX)"  # filled in by Kubernetes from the env var of that name
METRICS_PORT = 9100
RESOURCES = {"cpu": {"cpu": "2", "memory": "2Gi"}, "cuda": {"cpu": "4", "memory": "16Gi"}}  # per pod


@dataclass(frozen=True)
class KubernetesOptions:
    """Where and how the pods run: the image (psrv installed, `python` on its PATH), the namespace, the
    claim holding the run folders ("" for an emptyDir), where it and the ConfigMap are mounted, the servers' port, the
    all-reduce rendezvous port, and whether `psrv serve` and `psrv worker` serve /metrics on 0.0.0.0:9100 (as
    `psrv run --metrics`; a script's workers and the all-reduce ranks serve none)."""

    image: str = "psrv:latest"
    namespace: str = "default"
    pvc: str = ""
    runs: str = "/runs"
    configs: str = "/etc/psrv"
    port: int = 5555
    master_port: int = 29500
    metrics: bool = False


def run_name(label: str) -> str:
    """A run's object name from any label: 'psrv-' and the label in lowercase letters, digits and '-'
    (a DNS label); a long label is cut and given a hash of itself, so its pods' names (NAME-worker-K) fit
    in 63 characters and two long labels stay apart."""
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", label.lower())).strip("-") or "run"
    if len(slug) > 36:
        slug = f"{slug[:29].rstrip('-')}-{hashlib.sha1(label.encode()).hexdigest()[:6]}"
    return f"psrv-{slug}"


def server_addresses(cfg: RunConfig, name: str, port: int) -> tuple[str, ...]:
    """Each shard's address, in shard order: its pod's stable name under the run's headless Service."""
    return tuple(f"tcp://{name}-server-{i}.{name}:{port}" for i in range(cfg.cluster.servers))


def run_manifests(cfg: RunConfig, name: str, folder: str, options: KubernetesOptions = KubernetesOptions(), *,
                  script: Script | None = None) -> list[dict]:
    """The manifests of one run named `name` (`run_name`), writing into `folder` under options.runs.
    `script`: the workers are that script (`psrv run --script`), else the config's job.script if the
    config tree has that key, else the shipped loop. ValueError, in one line, for what a pod cannot run."""
    _check(cfg, options)
    script = script or _configured_script(cfg)
    if script is not None and cfg.is_allreduce:
        raise ValueError(f"job.script {script.path}: the manifests run a script's psrv.Worker against servers "
                         f"(sync, async, ssp); mode {cfg.mode!r} has none")
    out = f"{options.runs.rstrip('/')}/{folder.strip('/')}"
    configs = {"config.json": to_dict(cfg)}
    if cfg.is_allreduce:
        jobs = [_allreduce_job(cfg, name, out, options)]
    else:
        servers = server_addresses(cfg, name, options.port)
        configs["server.json"] = to_dict(cfg.server_config(0, bind=f"tcp://0.0.0.0:{options.port}"))
        if script is None:
            configs["worker.json"] = to_dict(cfg.worker_config(0, servers=servers))
        jobs = [_server_job(cfg, name, out, options), _ps_worker_job(cfg, name, out, servers, script, options)]
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name, options),
                  "data": {key: json.dumps(value, indent=1) + "\n" for key, value in configs.items()}}
    return [config_map, _service(cfg, name, options), *jobs]


def _check(cfg: RunConfig, options: KubernetesOptions) -> None:
    """ValueError, in one line naming the option, for a run no pod can run as asked, or a name the API refuses."""
    device = cfg.cluster.device
    if device.startswith("cuda:") and device != "cuda:0":
        raise ValueError(f"--device {device}: each pod is given one GPU, which it sees as cuda:0; use cuda")
    if cfg.cluster.transport != "zmq":
        raise ValueError(f"--transport {cfg.cluster.transport}: the Kubernetes manifests carry zmq only")
    if cfg.network.bandwidth:
        raise ValueError("network.bandwidth: emulated hosts are local; pods have the cluster's own network")
    if cfg.nemesis.schedule:
        raise ValueError("--nemesis: the local launcher does the faults to its own processes; pods run without it "
                         "(--scheduler local)")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", options.namespace) or len(options.namespace) > 63:
        raise ValueError(f"--namespace {options.namespace!r}: must be a DNS label (lowercase letters, digits, '-')")
    if options.pvc and not re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", options.pvc):
        raise ValueError(f"--pvc {options.pvc!r}: must be a PersistentVolumeClaim's name (lowercase, digits, '-', '.')")
    if not options.image.strip():
        raise ValueError("--image: name the container image that has psrv installed")


def _configured_script(cfg: RunConfig) -> Script | None:
    """The config's job.script (and job.script_args): a spec's script."""
    path = cfg.job.script
    if not path:
        return None
    return Script(Path(path), tuple(cfg.job.script_args))


def _labels(name: str, component: str | None = None) -> dict[str, str]:
    """The run's labels; the component's (server, worker) are what deploy/k8s/podmonitor.yaml relabels as role."""
    return {"app.kubernetes.io/name": "psrv", "app.kubernetes.io/instance": name,
            **({"app.kubernetes.io/component": component} if component else {})}


def _meta(name: str, options: KubernetesOptions, component: str | None = None) -> dict:
    return {"name": f"{name}-{component}" if component else name, "namespace": options.namespace,
            "labels": _labels(name, component)}


def _service(cfg: RunConfig, name: str, options: KubernetesOptions) -> dict:
    """Headless, selecting every pod of the run: it gives each a DNS name before it is ready."""
    port = ("rendezvous", options.master_port) if cfg.is_allreduce else ("psrv", options.port)
    ports = [port] + ([("metrics", METRICS_PORT)] if options.metrics and not cfg.is_allreduce else [])
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, options),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": _labels(name),
                     "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports]}}


def _shell(out: str, argv: list[str], *, rank0_args: list[str] = (),
           keep_config: str = "") -> list[str]:
    """A container's command: make the run folder, then exec argv. On index 0 only: copy the run's
    config.json from `keep_config` (the ConfigMap's folder) into the run folder, as a local run has it;
    export `rank0_env`; put `rank0_args` after argv (what rank 0 alone writes)."""
    first = [f"cp {shlex.quote(keep_config + '/config.json')} {shlex.quote(out + '/config.json')}"] if keep_config else []
    first += [f"set -- {shlex.join(rank0_args)}"] if rank0_args else []
    test = f"if [ '{INDEX}' = 0 ]; then {'; '.join(first)}; fi\n" if first else ""
    tail = ' "$@"' if rank0_args else ""
    return ["sh", "-c", f"set -e\nmkdir -p {shlex.quote(out)}\n{test}exec {shlex.join(argv)}{tail}\n"]


def _metrics_argv(options: KubernetesOptions) -> list[str]:
    return ["--metrics-port", str(METRICS_PORT), "--metrics-host", "0.0.0.0"] if options.metrics else []


def _server_job(cfg: RunConfig, name: str, out: str, options: KubernetesOptions) -> dict:
    argv = server_argv(f"{options.configs}/server.json", out, INDEX, ["--shard", INDEX, *_metrics_argv(options)],
                       python="python")
    container = _container("server", options, _shell(out, argv), cfg, ports=[("psrv", options.port)],
                           metrics=options.metrics)
    return _indexed_job(name, "server", cfg.cluster.servers, container, options, metrics=options.metrics)


def _ps_worker_job(cfg: RunConfig, name: str, out: str, servers: tuple[str, ...], script: Script | None,
                   options: KubernetesOptions) -> dict:
    if script is None:  # the shipped loop: worker.json is rank 0's config, --rank makes it this pod's
        argv = worker_argv(f"{options.configs}/worker.json", out, INDEX, cfg.mode, ["--rank", INDEX, *_metrics_argv(options)],
                           python="python")
        command, env = _shell(out, argv, rank0_args=rank0_argv(out), keep_config=options.configs), {}
    else:  # the user's loop, found in the image's working folder, told who it is as psrv run --script tells it
        command = _shell(out, ["python", *script.argv], keep_config=options.configs)
        # PSRV_CONFIG: the ConfigMap's copy, in every pod from its start (index 0 copies it into the run folder)
        env = {**script_env(cfg, out, script, ",".join(servers)), "RANK": INDEX,
               "PSRV_CONFIG": f"{options.configs}/config.json"}
    metrics = options.metrics and script is None  # a script's /metrics would listen on 127.0.0.1 only
    container = _container("worker", options, command, cfg, env=env, metrics=metrics)
    return _indexed_job(name, "worker", cfg.cluster.workers, container, options, metrics=metrics)


def _allreduce_job(cfg: RunConfig, name: str, out: str, options: KubernetesOptions) -> dict:
    """The all-reduce ranks, one per pod, with the variables torchrun sets; rank 0 hosts the rendezvous."""
    env = {"MASTER_ADDR": f"{name}-worker-0.{name}", "MASTER_PORT": str(options.master_port),
           "WORLD_SIZE": str(cfg.cluster.workers), "RANK": INDEX, "GROUP_RANK": INDEX, "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1"}
    command = _shell(out, allreduce_argv(f"{options.configs}/config.json", out, python="python"),
                     keep_config=options.configs)
    container = _container("worker", options, command, cfg, env=env, ports=[("rendezvous", options.master_port)])
    return _indexed_job(name, "worker", cfg.cluster.workers, container, options)  # ranks serve no /metrics


def _container(role: str, options: KubernetesOptions, command: list[str], cfg: RunConfig, *,
               env: dict[str, str] | None = None, ports: list[tuple[str, int]] = (), metrics: bool = False) -> dict:
    """One pod's container: its resources by the run's device (a cuda run's pods each take one GPU), torch
    threads = its cpus (as the local launcher gives each process its share of the cores)."""
    gpu = cfg.cluster.device.startswith("cuda")
    requests = RESOURCES["cuda" if gpu else "cpu"]
    limits = {"memory": requests["memory"], **({"nvidia.com/gpu": "1"} if gpu else {})}
    # named first, so the $(JOB_COMPLETION_INDEX) in the variables after it and in the command resolve (the Job
    # controller appends its own, after the others, only to a container that names none)
    index = {"name": "JOB_COMPLETION_INDEX",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    plain = {"OMP_NUM_THREADS": requests["cpu"], "PYTHONUNBUFFERED": "1", **(env or {})}
    all_ports = list(ports) + ([("metrics", METRICS_PORT)] if metrics else [])
    return {"name": role, "image": options.image, "imagePullPolicy": "IfNotPresent", "command": command,
            "env": [index, *({"name": k, "value": v} for k, v in plain.items())],
            **({"ports": [{"name": n, "containerPort": p} for n, p in all_ports]} if all_ports else {}),
            "resources": {"requests": dict(requests), "limits": limits},
            "volumeMounts": [{"name": "config", "mountPath": options.configs, "readOnly": True},
                             {"name": "runs", "mountPath": options.runs}]}


def _indexed_job(name: str, component: str, count: int, container: dict, options: KubernetesOptions, *,
                 metrics: bool = False) -> dict:
    """`count` pods at once, index 0..count-1, named NAME-COMPONENT-INDEX under the run's Service. A pod
    that fails fails the run (backoffLimit 0), as a failed process fails a local run."""
    runs = {"persistentVolumeClaim": {"claimName": options.pvc}} if options.pvc else {"emptyDir": {}}
    pod = {"subdomain": name, "restartPolicy": "Never", "containers": [container],
           "volumes": [{"name": "config", "configMap": {"name": name}}, {"name": "runs", **runs}]}
    if metrics:
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                       "prometheus.io/path": "/metrics"}
    template = {"metadata": {"labels": _labels(name, component), **({"annotations": annotations} if metrics else {})},
                "spec": pod}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, options, component),
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 0,
                     "template": template}}


def experiment_manifests(spec, folder: str, options: KubernetesOptions = KubernetesOptions()) -> list[tuple[str, list[dict]]]:
    """(run name, its manifests) of every variant and repeat of an ExperimentSpec (experiments/harness/spec.py),
    each writing FOLDER/VARIANT/rep-K under options.runs: the folders `psrv experiment --out runs/FOLDER`
    writes locally (FOLDER is the spec file's name without .toml unless --out says)."""
    runs = []
    for variant, seed, repeat in spec.runs():
        name = run_name(f"{folder}-{variant.name}-rep-{repeat}")
        cfg = spec.run_config(variant, seed)
        script = Script.of(cfg, steps_given=spec.steps_given(variant)) if cfg.job.script else None
        try:
            documents = run_manifests(cfg, name, f"{folder}/{variant.name}/rep-{repeat}", options, script=script)
        except ValueError as exc:
            raise ValueError(f"{spec.name}: variant {variant.name}: {exc}") from None
        runs.append((name, documents))
    names = [name for name, _ in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"{spec.name}: two runs would share a name ({', '.join(names)}); rename the variants")
    return runs


def to_yaml(runs: list[tuple[str, list[dict]]], options: KubernetesOptions) -> str:
    """Multi-document YAML for `kubectl apply -f -`: each run's documents after a comment naming it, its
    folder and what keeps that folder (multi-line text as YAML blocks, so the configs and commands read)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)
    Dumper.add_representer(str, text)
    keeper = (f"the PersistentVolumeClaim {options.pvc!r}" if options.pvc else
              "an emptyDir, lost with each pod: give --pvc CLAIM (ReadWriteMany) to keep the outputs")
    parts = []
    for name, documents in runs:
        parts.append(f"# run {name}: the run folder is under {options.runs} on {keeper}\n")
        parts += ["---\n" + yaml.dump(d, Dumper=Dumper, sort_keys=False, width=120) for d in documents]
    return "".join(parts)
