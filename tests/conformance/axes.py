"""The axes of the conformance matrix: every setting a user can give psrv, the levels it is tried at,
and how a case (one level per axis) becomes psrv's own config tree (a RunConfig, which also says
which combinations psrv refuses: those are not cases).

Two kinds of axis. A *path* axis only moves bytes (transport, payload plane, chunked pushes, early
sends, replicated shards): a case must equal, bit for bit, the same case with every path axis at its
plain level. The
others change the numbers on purpose, and each case is checked against the reference's math
(tests/conformance/reference.py)."""
from __future__ import annotations

from functools import lru_cache

from psrv.config import ConfigError, RunConfig, from_dict

JOB = "tests/conformance/job.py:tiny"
STEPS, BATCH, SEED = 4, 16, 3
CHUNK_MB = 0.1  # chunks of 20k to 26k float32 (40k bfloat16) elements: over 64 KiB, so a plane carries them

AXES: dict[str, tuple] = {
    # path axes: the first level is the plain path
    "transport": ("zmq", "rpc"),
    "plane": ("inline", "shm", "bulk"),
    "chunks": ("off", "on"),
    "overlap": ("on", "off"),
    "replicas": (0, 1),  # backups per shard (cluster.replicas): each applies the primary's stream
    "in_place": ("off", "on"),  # --pull-in-place: the model computes on the shard's weights where they lie
    # numeric axes
    "shards": (1, 3),
    "wire": ("float32", "bfloat16", "float16"),
    "codec": ("none", "topk", "randomk", "sign", "int8", "sparseloco"),
    "ef": ("on", "off"),  # error feedback on both sides: the worker's push residual, the shards' pull residual
    "ef_decay": (1.0, 0.5),  # --error-feedback-decay: the push residual's factor (SparseLoCo's accumulator)
    "pull": ("none", "topk", "sign"),  # --compress-pull
    "correction": ("on", "off"),
    "warmup": (0, 2),
    "masking": ("off", "on"),
    "sign_scale": ("auto", "l2", "l1"),
    "mode": ("sync", "async", "ssp"),
    "optimizer": ("sgd", "nesterov", "adam", "adamw", "onebit_adam"),
    "rule": ("plain", "staleness-lr", "dc-asgd", "dc-asgd-a", "dn", "cgad", "heloco"),
    "local": (1, 2),
    "fragments": (1, 2),
    "outer": ("float32", "bfloat16", "int8", "fp4"),
    "nonfinite": ("none", "skip", "reject"),
    "backup": (0, 1),
    "quorum": (0, 2, 1),  # sync's merges of Q distinct workers' pushes (0: the barrier)
    "grace": (0.0, 30.0),  # --quorum-grace: never over in a case's turns, so a merge waits for every worker
    "wait": ("off", "on"),  # --quorum-wait: fresh pushes fill a merge, and their pulls wait for it
    # --quorum-max-age is no axis: in a case's turns no push is more than one merge old, and an age limit (>= 1)
    # drops nothing there; tests/integration/test_quorum.py drops real late pushes, the checker's rule 3 sees them.
    # --quorum-grace-adaptive is none either: it reads when pushes arrive, which the turns leave to the machine;
    # test_quorum_merge.py scripts the clock and checks each merge it closes by hand
    "extrapolate": (0.0, 1.0),  # --pull-extrapolate: a round of local steps starts ahead of the pulled weights
    "clip": (0.0, 1.0),
    "schedule": ("constant", "warmup_cosine"),
    "weight_decay": (0.0, 0.01),
}
_OWNERS = {str(level): sum(str(level) in map(str, levels) for levels in AXES.values())
           for levels in AXES.values() for level in levels}
PATH_AXES = ("transport", "plane", "chunks", "overlap", "replicas", "in_place")
DATA_PATH = ("plane", "chunks", "wire", "codec")  # every triple of these is covered
DEFAULT = {axis: levels[0] for axis, levels in AXES.items()}
CODEC_SPEC = {"none": "", "topk": "topk:0.1", "randomk": "randomk:0.1", "sign": "sign", "int8": "int8",
              "sparseloco": "sparseloco:0.05"}
ATOL, RTOL = 1e-5, 1e-4  # a case's weights against the reference's (torch.allclose): its sums may run in another order
PULL_RESYNC = 3  # of a case's pulls (the first, one per step, rank 0's final), the fourth is a resync
LR = {"sgd": 0.05, "nesterov": 0.05, "adam": 0.003, "adamw": 0.003, "onebit_adam": 0.003}
# dc_lambda (SGD on gradients, else: Adam's normalised steps, or pseudo-gradients): under the papers' 0.04 and 2 the
# compensation moved the tiny job's weights by less than the tolerance (plain SGD in dc-asgd's place passed every
# case); under these, by 28 to 2500 times it in every case of two workers (one has no delay to compensate)
DC_LAMBDA = {"dc-asgd": (100.0, 1e7), "dc-asgd-a": (10.0, 3000.0)}
# cgad's alpha and cutoff: a case's pushes are at most a few updates stale, so the cutoff is 3 (the gate at 0.75 and
# 0.25 for staleness 1 and 2, 0 from 3) and alpha 0.5, where both show; psrv's defaults (0.1, 16) barely would
CGAD = {"cgad_alpha": 0.5, "cgad_cutoff": 3}
# heloco's knobs: a case's pushes mostly agree with the momentum (cosine 0.3 to 0.9 per block), so the keep threshold
# is 0.95 and the blocks 4096 elements (a shard's slice holds 15 to 30), where both corrections show: blocks are
# turned, and some (against the momentum) shrunk (test_rule_edges.py counts them in the plan's cases)
HELOCO = {"heloco_keep": 0.95, "heloco_shrink": 2.0, "heloco_reorient": 1.0, "heloco_kappa": 0.5, "heloco_block": 4096}
HELOCO_OFF = {key: 0 for key in HELOCO}


def case_id(case: dict) -> str:
    """The case's levels away from the defaults, each named by its axis where another axis has that level
    too ("codec=sign-pull=topk-ef=off-async"): one id per case (the matrix's runs are cached by it)."""
    return "-".join(f"{case[k]}" if _OWNERS[str(case[k])] == 1 else f"{k}={case[k]}"
                    for k in AXES if case[k] != DEFAULT[k]) or "plain"


def workers_of(case: dict) -> int:
    """Two workers; one where a run's order cannot be fixed (torch RPC under async, ssp or a quorum: psrv run's
    workers free-run there, and two of them interleave as they may)."""
    return 1 if case["transport"] == "rpc" and (case["mode"] != "sync" or case["quorum"]) else 2


def run_config(case: dict, *, workers: int | None = None) -> RunConfig:
    """The case as psrv's config tree (`workers`: another count than the case's own); ConfigError where
    psrv refuses the combination."""
    c = case
    codec = CODEC_SPEC[c["codec"]]
    sgd, cosine = c["optimizer"] in ("sgd", "nesterov"), c["schedule"] != "constant"
    dc_lambda = DC_LAMBDA.get(c["rule"], (0.0, 0.0))[0 if sgd and c["local"] == 1 else 1]
    # every setting the reference reads from the config (ref_optim.STATED), stated in every case; the others it
    # takes from torch's and the papers' documents. A clip: 1.0 clips a gradient (norm 3.5 to 4.5), 0.1 a
    # pseudo-gradient of 2 inner steps at lr 0.05 (norm 0.19 to 0.29), which 1.0 never clipped
    optimizer = {"name": "sgd" if sgd else c["optimizer"], "lr": LR[c["optimizer"]],
                 "weight_decay": c["weight_decay"], "update_rule": c["rule"],
                 "clip_grad_norm": c["clip"] / 10 if c["local"] > 1 else c["clip"],
                 "momentum": 0.9 if sgd else 0.0, "nesterov": c["optimizer"] == "nesterov",
                 "freeze_step": 2 if c["optimizer"] == "onebit_adam" else 0, "dc_lambda": dc_lambda,
                 "lr_schedule": c["schedule"], "warmup_steps": 1 if cosine else 0,
                 "lr_decay_steps": STEPS if cosine else 0,
                 **(CGAD if c["rule"] == "cgad" else {"cgad_alpha": 0.0, "cgad_cutoff": 0}),
                 **(HELOCO if c["rule"] == "heloco" else HELOCO_OFF)}
    ef_off = c["ef"] == "off"  # each side's error feedback is turned off where that side has a lossy codec
    worker = {"wire_dtype": c["wire"], "compress": codec,
              "error_feedback": not (ef_off and (c["codec"] != "none" or c["optimizer"] == "onebit_adam")),
              "error_feedback_decay": c["ef_decay"],
              "momentum_correction": c["correction"] == "on" or not corrects(c), "compress_warmup": c["warmup"],
              "momentum_masking": c["masking"] == "on", "sign_scale": c["sign_scale"],
              "push_chunk_mb": CHUNK_MB if c["chunks"] == "on" else 0.0, "overlap": c["overlap"] == "on",
              "local_steps": c["local"], "fragments": c["fragments"], "outer_dtype": c["outer"],
              "request_timeout": 30.0, "compress_pull": CODEC_SPEC[c["pull"]],
              "pull_error_feedback": not (ef_off and c["pull"] != "none"), "pull_resync": PULL_RESYNC,
              "pull_extrapolate": c["extrapolate"], "pull_in_place": c["in_place"] == "on"}
    if c["local"] > 1:
        worker.update(inner_optimizer="sgd", inner_lr=0.05)
    tree = {"mode": c["mode"], "staleness": 1, "backup_workers": c["backup"], "quorum": c["quorum"],
            "quorum_grace": c["grace"], "quorum_wait": c["wait"] == "on", "seed": SEED,
            "cluster": {"servers": c["shards"], "workers": workers or workers_of(c), "transport": c["transport"],
                        "shared_memory": "auto" if c["plane"] == "shm" else "off",
                        "bulk": "auto" if c["plane"] == "bulk" else "off", "replicas": c["replicas"]},
            "job": {"name": JOB + ("_nan" if c["nonfinite"] != "none" else ""), "steps": STEPS, "batch_size": BATCH},
            "optimizer": optimizer, "worker": worker,
            # failure_bound: no case means a failover (check_backups asserts none). A primary starved of the GIL by
            # the test process's other threads was fenced once on a quiet machine at F = 1 s, and once under load
            # at F = 5 s (silent 3.5 s, with three pytest processes on two cores)
            "server": {"nonfinite": "reject" if c["nonfinite"] == "none" else c["nonfinite"], "worker_timeout": 30.0,
                       "failure_bound": 10.0}}
    return from_dict(RunConfig, tree)


def corrects(case: dict) -> bool:
    """Does momentum correction run (DGC, Lin et al. 2018): a lossy push codec with its error feedback, SGD
    momentum on the servers? Elsewhere the case's correction=off is not given to psrv, which refuses it."""
    return case["codec"] != "none" and case["ef"] == "on" and case["optimizer"] in ("sgd", "nesterov")


MATRIX_LIMITS = {  # combinations psrv runs that the matrix cannot hold to one order: not cases
    "backup": "psrv run's workers free-run over torch RPC: which push a backup worker's clock leaves out is not fixed",
    "nonfinite": "under psrv run (torch RPC) a worker refused for a NaN ends its run",
}


def refusal(case: dict) -> str | None:
    """Why this combination is not a case: psrv refuses it (its own one-line error), or one of the matrix's
    MATRIX_LIMITS; None for a case."""
    c = case
    if c["transport"] == "rpc" and c["backup"]:
        return MATRIX_LIMITS["backup"]
    if c["transport"] == "rpc" and c["nonfinite"] == "reject":
        return MATRIX_LIMITS["nonfinite"]
    return refused_by_psrv(c)


def refused_by_psrv(case: dict) -> str | None:
    """psrv's own answer to the case's config: its ConfigError's line, or None."""
    return _refused_by_psrv(tuple(sorted(case.items())))


@lru_cache(maxsize=None)
def _refused_by_psrv(items: tuple) -> str | None:
    try:
        run_config(dict(items))
    except (ConfigError, ValueError) as exc:
        return str(exc)
    return None


def plain_path(case: dict) -> dict:
    """The same case with every path axis at its plain level: zmq, inline, whole pushes, early sends, no
    backups."""
    return {**case, **{axis: AXES[axis][0] for axis in PATH_AXES}}


__all__ = ["ATOL", "RTOL", "AXES", "DATA_PATH", "DEFAULT", "MATRIX_LIMITS", "PATH_AXES", "case_id", "corrects", "plain_path",
           "refusal", "refused_by_psrv", "run_config", "workers_of"]
