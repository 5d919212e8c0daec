"""The settings that act only through a codec (error feedback, momentum correction and its masking, DGC's
warm-up, sign's scale): each is refused, in one line, where no codec it acts on runs, rather than accepted
and ignored. `worker_knobs` checks what a worker's own settings show; `run_knobs` what the optimizer adds
(onebit_adam's momenta codec, the servers' SGD momentum that momentum correction needs)."""
from __future__ import annotations

from psrv.codec_names import LOSSY_NAMES, parse
from psrv.config.base import ConfigError

SPARSE = ("topk", "randomk")
WARMUP_DEFAULT = 50  # WorkerSettings.compress_warmup's default (set there from here): not the user's setting


def _name(spec: str) -> str:
    return spec.partition(":")[0]


def worker_knobs(w) -> None:
    """What WorkerSettings alone shows (`w`: a WorkerSettings, before the keys are prefixed)."""
    push = _name(w.compress)
    if not w.pull_error_feedback and not w.compress_pull:
        raise ConfigError("pull_error_feedback", "turns off the error feedback of --compress-pull, and pulls are "
                          "dense here: remove it")
    if w.compress_warmup not in (0, WARMUP_DEFAULT) and push not in SPARSE:
        raise ConfigError("compress_warmup", f"warms up top-k's and random-k's ratio; compress is {w.compress!r}: "
                          "remove it")
    if w.sign_scale != "auto" and push not in ("sign", ""):
        raise ConfigError("sign_scale", f"is the scale of --compress sign (or of onebit_adam's momenta); compress "
                          f"is {w.compress!r}: remove it")
    if w.error_feedback_decay != 1.0 and not (push in LOSSY_NAMES and w.error_feedback):
        raise ConfigError("error_feedback_decay", "decays the error feedback of a lossy --compress, and none runs here "
                          f"(compress {w.compress!r}, error feedback {'on' if w.error_feedback else 'off'}): remove it")
    if w.momentum_masking and not (push in SPARSE and w.error_feedback and w.momentum_correction):
        raise ConfigError("momentum_masking", "masks momentum correction's velocity where top-k or random-k sent; "
                          "it needs --compress topk/randomk with error feedback and momentum correction: remove it")


def corrects(run) -> bool:
    """Whether momentum correction runs (psrv/client/momentum_correction.py): a lossy push codec with its
    error feedback, under a parameter server whose optimizer is SGD with momentum."""
    o, w = run.optimizer, run.worker
    return bool(_name(w.compress) in LOSSY_NAMES and w.error_feedback and o.name == "sgd" and o.momentum)


def run_knobs(run) -> None:
    """What the whole run shows (`run`: a RunConfig of a parameter-server mode)."""
    w, onebit = run.worker, run.optimizer.name == "onebit_adam"
    if not w.error_feedback and not (_name(w.compress) in LOSSY_NAMES or onebit):
        raise ConfigError("worker.error_feedback", f"turns off the error feedback of a lossy --compress, and none "
                          f"runs here (compress {w.compress!r}, optimizer {run.optimizer.name!r}): remove it")
    if w.sign_scale != "auto" and not (_name(w.compress) == "sign" or onebit):
        raise ConfigError("worker.sign_scale", "is the scale of --compress sign or of onebit_adam's momenta; "
                          f"neither runs here (compress {w.compress!r}): remove it")
    if not w.momentum_correction and not corrects(run):
        raise ConfigError("worker.momentum_correction", "turns off momentum correction, which would not run here "
                          "(it needs a lossy --compress with error feedback and SGD momentum on the servers): remove it")
    if w.momentum_masking and not corrects(run):
        raise ConfigError("worker.momentum_masking", "masks momentum correction's velocity, which needs SGD "
                          f"momentum on the servers (the optimizer is {run.optimizer.name!r}): remove it")


MEASURED_TOPK = (0.001, 0.005, 0.02)  # top-k ratios the quality grids measured (experiments/specs/ef_ratios.toml,
# ef_quality.toml): a ratio takes the line of the smallest measured one at or above it; above 2%, none was measured
GRID_TEXT = "(sync, 4 workers, 200 steps; docs/compression.md, Error feedback's quality grid)"


def _topk_caveat(compress: str, ratio: float, momentum: float) -> str | None:
    """What the grids measured for top-k with error feedback at the nearest ratio at or above `ratio`."""
    if ratio <= MEASURED_TOPK[0]:
        return (f"--compress {compress}: top-k at 0.1% (the grids' smallest ratio) with error feedback ended "
                f"1.35-3.97x dense pushes' held-out loss in 12 of 24 cells on digits_cnn and digits_mlp3 {GRID_TEXT}")
    if ratio <= MEASURED_TOPK[1]:
        return (f"--compress {compress}: top-k at 0.5% with error feedback ended 1.37-1.80x dense pushes' held-out "
                "loss on digits_mlp3 (3 hidden layers), within 1.3x on digits_mlp, mnist1d_mlp and digits_cnn; at "
                f"0.1%, 1.35-3.97x on both held-out jobs {GRID_TEXT}")
    if ratio <= MEASURED_TOPK[2] and momentum >= 0.9 - 1e-9:
        return (f"--compress {compress} with --momentum {momentum:g}: top-k at 2% with error feedback and momentum "
                "0.9 ended 1.56-2.44x dense pushes' held-out loss in 3 of 12 cells (one seed each: digits_mlp3 at "
                f"lr 0.05 and 0.1, digits_cnn at lr 0.1); within 1.3x in every cell without momentum {GRID_TEXT}")
    return None


def codec_caveats(run) -> list[str]:
    """Where the error-feedback quality grids (docs/compression.md, "Error feedback's quality grid") measured
    a lossy push with error feedback over 1.3x dense pushes' held-out loss, on jobs nobody tuned its
    defaults on: one line per such setting this run has, for the commands to print as a warning (the run
    goes ahead; these are measurements, not refusals). The all-reduce modes refuse a codec already."""
    w, o = run.worker, run.optimizer
    if _name(w.compress) not in LOSSY_NAMES or not w.error_feedback:
        return []
    out = []
    name, ratio = parse(w.compress)
    if name == "topk" and (line := _topk_caveat(w.compress, ratio, o.momentum)) is not None:
        out.append(line)
    step = o.lr / (1.0 - o.momentum) if o.momentum < 1 else float("inf")  # SGD's step with its momentum's sum
    if corrects(run) and w.momentum_correction and step >= 1.0 - 1e-9:
        out.append(f"--lr {o.lr:g} with --momentum {o.momentum:g} (lr/(1-momentum) = {step:.3g}) and --compress "
                   f"{w.compress}: at lr 0.1, momentum 0.9 error feedback with momentum correction ended 1.4-4.0x "
                   "dense pushes' held-out loss on digits_cnn and digits_mlp3 (top-k 0.1%, 0.5% and 2%, and sign; "
                   "docs/compression.md, Error feedback's quality grid)")
    return out
