"""The worker's section of the config tree, WorkerSettings: how a worker pushes and waits, its push and pull
codecs, local steps (local SGD / DiLoCo) and streaming DiLoCo's fragments and outer dtype, with the checks that
tie them together. Its own module because it is the tree's largest section; psrv/config/sections.py
re-exports every name here, so `from psrv.config.sections import WorkerSettings` keeps working."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.codec_names import CASTS, FORMS, LOSSY_NAMES
from psrv.config.base import ConfigError, Section, setting
from psrv.config.codec_knobs import WARMUP_DEFAULT, worker_knobs
from psrv.local_period import AUTO_DEFAULT, base_steps, is_dynamic, parse_local_steps

WIRE_DTYPES = ("float32", "bfloat16", "float16")  # what a worker may send its gradient as
INNER_OPTIMIZERS = ("sgd", "adamw")  # a worker's own, for local steps (torch.optim.SGD, AdamW)
INNER_LR = {"sgd": 0.05, "adamw": 0.001}  # inner_lr's default with each
OUTER_DTYPES = ("float32", "bfloat16", "int8", "fp4")  # local steps: the pseudo-gradient on the wire


def _compress(spec: str) -> None:
    if spec:
        from psrv.codec_names import parse  # the codecs' names, without torch
        parse(spec)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings(Section):
    """How a worker pushes and waits."""

    wire_dtype: str = setting("float32", "send gradients as this dtype (bfloat16/float16 halve the push; the "
                              "servers apply them in float32)", choices=WIRE_DTYPES)
    overlap: bool = setting(True, "with several shards, push only after backward ends (default: each "
                            "shard's slice goes out as soon as backward finishes it)", flag="no-overlap")
    request_timeout: float = setting(60.0, "seconds without any reply before a worker gives up",
                                     minimum=0.1)
    compress: str = setting("", f"push codec (psrv/codecs, docs/compression.md): {FORMS}; the casts as --wire-dtype; "
                            "none: dense float32 (under --optimizer onebit_adam: the momentum's codec after the freeze, "
                            "none: sign)", check=_compress, metavar="CODEC")
    error_feedback: bool = setting(True, "turn off the error feedback of a lossy --compress (default: each "
                                   "worker adds what its last pushes left out to the next)", flag="no-error-feedback")
    error_feedback_decay: float = setting(1.0, "multiply the error-feedback residual by BETA before it joins the next "
                                          "push: e <- BETA e + g, send C(e), e <- e - C(e). Under local steps with a "
                                          "sparse codec and an outer SGD without momentum this accumulator stands in "
                                          "for the outer momentum: SparseLoCo (Sarfi et al. 2025; docs/compression.md). "
                                          "1: plain error feedback", minimum=0.0, maximum=1.0, metavar="BETA")
    momentum_correction: bool = setting(True, "turn off momentum correction (default: with a lossy --compress, "
                                        "its error feedback and SGD momentum on the servers, each worker keeps the "
                                        "velocity, pushes it compressed with error feedback and the servers step it "
                                        "without momentum of their own: Lin et al. 2018, DGC; docs/compression.md)",
                                        flag="no-momentum-correction")
    compress_warmup: int = setting(WARMUP_DEFAULT, "the warm-up training of Deep Gradient Compression (Lin et al. 2018, ICLR): "
                                   "over the first N pushes top-k's and random-k's ratio rises to RATIO in four stages "
                                   "of N/4 pushes, stage s sending RATIO^((s+1)/5) (as DGC's code computes its warm-up "
                                   "epochs' ratios: 75%, 93.75%, 98.4%, 99.6% sparsity before 99.9%); 0: RATIO from the "
                                   "first push; docs/compression.md", minimum=0, metavar="N")
    momentum_masking: bool = setting(False, "with momentum correction and top-k or random-k, zero the velocity where "
                                     "a push sent (DGC's momentum factor masking, Lin et al. 2018; off by default: "
                                     "with the warm-up it left digits_mlp further from dense, docs/compression.md)")
    sign_scale: str = setting("auto", "the scale of each chunk of --compress sign: l2, its root mean square (1-bit "
                              "Adam's, Tang et al. 2021, as DeepSpeed computes it), or l1, its mean |x| "
                              "(EF-SignSGD's, Karimireddy et al. 2019). auto: l2, but l1 for onebit_adam's momenta "
                              "(its step divides by the frozen variance, and l2's larger steps on weights of small "
                              "variance diverged a digits_mlp run). l2 because with l1 a chunk's few large elements "
                              "kept most of their value waiting in the residual for tens of pushes and a digits_mlp "
                              "run came apart late (docs/compression.md)", choices=("auto", "l2", "l1"))
    compress_min_numel: int = setting(1024, "with --compress, tensors of fewer elements (biases, norms) are "
                                      "pushed dense", minimum=0, metavar="N")
    compress_pull: str = setting("", "pull codec (the same names as --compress; docs/compression.md): each shard sends "
                                 "the compressed change of its weights since this worker's copy (with --fragments, of the "
                                 "fragment's weights), keeping the residual per worker (one float32 copy of the shard "
                                 "each), so the copy drifts from the weights by that residual only; tensors under "
                                 "--compress-min-numel travel exactly. '' : dense pulls", check=_compress, metavar="CODEC")
    pull_error_feedback: bool = setting(True, "turn off the shards' error feedback of --compress-pull (default: "
                                        "what a pull left out rides with the next; off: it is lost until a resync)",
                                        flag="no-pull-error-feedback")
    pull_resync: int = setting(100, "with --compress-pull, one pull in N is dense and resets the copy to the "
                               "shard's weights (0: only on a reconnect, a re-HELLO or a restarted shard, which "
                               "always resync; the final pull is dense too)", minimum=0, metavar="N")
    push_chunk_mb: float = setting(8.0, "a dense push bigger than this many MB goes in chunks that an async or ssp "
                                   "shard applies as they arrive, so it holds one chunk, not the push, in memory "
                                   "(0: pushes go whole; sync and some update rules take them whole anyway; "
                                   "docs/architecture.md)", minimum=0.0, metavar="MB")
    local_steps: int | str = setting(1, "local SGD / DiLoCo: inner steps per push; each push is the "
                                     "pseudo-gradient w_pulled - w_now and the servers' optimizer is the outer one "
                                     "(1: push every step). auto[:H]: dynamic local updates, the fastest worker "
                                     f"takes H (default {AUTO_DEFAULT}) and each other fewer, by its measured "
                                     "speed, so all push at about the same rate; docs/algorithms.md",
                                     check=parse_local_steps, metavar="H|auto[:H]")
    inner_optimizer: str | None = setting(None, "the worker's own optimizer for its inner steps (default: adamw "
                                          "when local_steps > 1, none at 1: push the gradient); given at "
                                          "local_steps 1, every step pushes its update", choices=INNER_OPTIMIZERS)
    inner_lr: float | None = setting(None, f"the inner optimizer's learning rate (default: {INNER_LR['adamw']} "
                                     f"with adamw, {INNER_LR['sgd']} with sgd)", minimum=0.0, above=True)
    fragments: int = setting(1, "streaming DiLoCo (Douillard et al. 2025): with --local-steps H, the parameter "
                             "tensors split into F strided fragments (fragment f: tensors f, f+F, f+2F, ... in the "
                             "model's order) and one fragment is pushed every H/F inner steps, in turn, so each is "
                             "synced once per H steps; its answer is merged one inner step later, mixed half and "
                             "half with the local weights, while the worker computes; --compress-pull compresses "
                             "each fragment's answer (1: plain DiLoCo, the whole model every H steps; "
                             "docs/compression.md, \"Streaming DiLoCo\")", minimum=1,
                             metavar="F")
    outer_dtype: str = setting("float32", "the pushed pseudo-gradients (outer gradients) on the wire: bfloat16, or "
                               "int8 / fp4 (a 4-bit integer, two per byte) with a float32 scale per 1024 elements "
                               "and no error feedback; the servers dequantise and average them in float32; needs "
                               "--local-steps > 1", choices=OUTER_DTYPES)

    pull_extrapolate: float = setting(0.0, "with --local-steps: start each round from the pulled weights plus K times "
                                      "their change since this worker's previous pull, a prediction of the weights "
                                      "its push will meet (under --quorum every push is a merge old: docs/"
                                      "algorithms.md, \"Pulls extrapolated\"); the push is still the worker's own "
                                      "progress from that start (0: start from the pulled weights)", minimum=0.0,
                                      metavar="K")

    pull_in_place: bool = setting(False, "the model computes on its shard's weights where they lie, in the shard's "
                                  "shared memory, mapped read-only, instead of a copy of them pulled each step (no "
                                  "copy of the model per step). Needs a shard that never writes them while a worker "
                                  "computes: mode sync without backup workers or a quorum (it writes once every worker "
                                  "has pushed), or one worker in async or ssp; and one server, transport zmq with "
                                  "shared memory, dense pulls, no local steps. A shard on another host: pulls copy as "
                                  "before (docs/benchmarks.md, \"Co-located\")")

    @property
    def local_updates(self) -> bool:
        """True when this worker steps its own inner optimizer and pushes pseudo-gradients."""
        return self.inner_optimizer is not None

    @property
    def local_steps_base(self) -> int:
        """H: the inner steps per push, or the fastest worker's under 'auto:H'."""
        return base_steps(self.local_steps)

    def validate(self) -> None:
        super().validate()
        if self.compress.partition(":")[0] in LOSSY_NAMES and self.wire_dtype != "float32":
            raise ConfigError("wire_dtype", f"is another push codec; compress {self.compress!r} sends float32 values")
        if self.compress in CASTS and self.wire_dtype not in ("float32", CASTS[self.compress]):
            raise ConfigError("wire_dtype", f"is {self.wire_dtype!r}, and compress {self.compress!r} casts to "
                              f"{CASTS[self.compress]}: give one of them")
        if self.inner_optimizer is None and (self.local_steps_base > 1 or is_dynamic(self.local_steps)):
            object.__setattr__(self, "inner_optimizer", "adamw")
        if self.inner_optimizer is None:
            if self.inner_lr is not None:
                raise ConfigError("inner_lr", "needs local_steps > 1 or an inner_optimizer; remove it")
        elif self.inner_lr is None:
            object.__setattr__(self, "inner_lr", INNER_LR[self.inner_optimizer])
        self._check_streaming()
        self._check_extrapolate()
        if self.pull_in_place and (self.local_updates or self.compress_pull):
            raise ConfigError("pull_in_place", "computes on the shard's own weights, which local steps would "
                              "change and a compressed pull does not send: remove one")
        worker_knobs(self)

    def _check_extrapolate(self) -> None:
        """pull_extrapolate: local steps > 1, whole pushes, dense pulls."""
        if not self.pull_extrapolate:
            return
        if not (self.local_steps_base > 1 and self.inner_optimizer is not None):
            raise ConfigError("pull_extrapolate", "moves where a round of local steps starts; needs local_steps > 1")
        if self.fragments > 1:
            raise ConfigError("pull_extrapolate", "starts a round from a whole pull; fragments are merged into the "
                              "local weights one at a time: remove one")
        if self.compress_pull:
            raise ConfigError("pull_extrapolate", "moves the weights a compressed pull keeps equal to the shards' "
                              "mirror of them: remove one")

    def _check_streaming(self) -> None:
        """fragments and outer_dtype: local steps > 1 (fixed H, which F divides), and no other push codec."""
        local = self.local_steps_base > 1 and self.inner_optimizer is not None
        if self.outer_dtype != "float32":
            if not local:
                raise ConfigError("outer_dtype", "quantises the pseudo-gradients of local steps; needs local_steps > 1")
            if self.compress or self.wire_dtype != "float32":
                raise ConfigError("outer_dtype", "is the push codec of local steps; remove compress and wire_dtype")
        if self.fragments == 1:
            return
        if not local:
            raise ConfigError("fragments", "splits the pushes of local steps; needs local_steps > 1")
        if is_dynamic(self.local_steps):
            raise ConfigError("fragments", f"needs a fixed local_steps H, not {self.local_steps!r}")
        if self.local_steps_base % self.fragments:
            raise ConfigError("fragments", f"{self.fragments} must divide local_steps {self.local_steps_base} "
                              "(one fragment every H/F inner steps)")
        if self.compress or self.wire_dtype != "float32":
            raise ConfigError("fragments", "pushes with outer_dtype; remove compress and wire_dtype")


def extrapolate_in_run(run) -> None:
    """pull_extrapolate against the rest of a run (RunConfig.validate; the worker's own checks are
    WorkerSettings._check_extrapolate): the all-reduce modes have no pulls, DC-ASGD compensates from the weights
    the shard sent."""
    if not run.worker.pull_extrapolate:
        return
    if run.is_allreduce:
        raise ConfigError("worker.pull_extrapolate", f"extrapolates the parameter server's pulls; mode "
                          f"{run.mode!r} has none (every rank steps the all-reduced weights)")
    if run.optimizer.update_rule in ("dc-asgd", "dc-asgd-a"):
        raise ConfigError("worker.pull_extrapolate", f"{run.optimizer.update_rule} compensates a push from the "
                          "weights the shard sent, and an extrapolated round starts from others: remove one")
