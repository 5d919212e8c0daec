"""The optimizer's sections of the config tree: OptimConfig, what the servers (or the all-reduce baseline's
ranks) apply, names following torch.optim (the learning-rate schedule, the update rule, onebit_adam's freeze),
and GradClip, the clip by global norm that a worker holds too; with the names they choose from."""
from __future__ import annotations

from dataclasses import dataclass

from psrv.config.base import ConfigError, Section, setting

OPTIMIZERS = ("sgd", "adam", "adamw", "onebit_adam")  # onebit_adam: psrv/server/onebit_adam.py
LR_SCHEDULES = ("constant", "warmup_cosine", "step", "linear")  # psrv/schedule.py has their formulas
SGD_MOMENTUM = 0.9  # momentum's default with sgd; adam and adamw take none
UPDATE_RULES = ("plain", "staleness-lr", "dc-asgd", "dc-asgd-a", "dn", "cgad", "heloco")  # psrv/server/rules registers them
STALENESS_RULES = ("staleness-lr", "dc-asgd", "dc-asgd-a", "cgad", "heloco")  # they correct a push's staleness: none in sync
NESTEROV_RULES = ("dn", "heloco")  # they step with their own Nesterov momentum: sgd --nesterov only
VELOCITY_RULES = ("plain", "staleness-lr", "cgad")  # they only scale the step: momentum correction's velocity fits them
DC_LAMBDA = {"dc-asgd": 0.04, "dc-asgd-a": 2.0}  # dc_lambda's default with each (Zheng et al. 2017)
# cgad's alpha and cutoff with it: psrv's choice (the paper's defaults were not available to us; docs/algorithms.md)
CGAD_DEFAULTS = {"cgad_alpha": 0.1, "cgad_cutoff": 16}
# heloco's keep threshold, strengths, kappa and block: psrv's choice too (the paper's were not at hand)
HELOCO_DEFAULTS = {"heloco_keep": 0.3, "heloco_shrink": 1.0, "heloco_reorient": 0.5, "heloco_kappa": 1.0,
                   "heloco_block": 1 << 20}
RULE_KNOBS = {"cgad": CGAD_DEFAULTS, "heloco": HELOCO_DEFAULTS}  # a rule's own settings: refused under another


@dataclass(frozen=True, kw_only=True)
class GradClip(Section):
    """Gradient clipping by global norm (an optimizer setting that a worker holds too)."""

    clip_grad_norm: float | None = setting(0.0, "clip the gradient to this global norm, as torch's clip_grad_norm_ "
                                           "(0: off). sync: the server clips each clock's averaged gradient "
                                           "(one server only); async, ssp: each worker clips its own before its "
                                           "push (no early sends); ddp: the all-reduced gradient", minimum=0.0,
                                           metavar="NORM")

    def validate(self) -> None:
        super().validate()
        if self.clip_grad_norm is None:  # None and 0 both mean off; one spelling, one config hash
            object.__setattr__(self, "clip_grad_norm", 0.0)


@dataclass(frozen=True)
class OptimConfig(GradClip):
    """The optimizer the servers (or the all-reduce baseline's ranks) apply; names follow torch.optim."""

    name: str = setting("sgd", "server-side optimizer", choices=OPTIMIZERS, flag="optimizer")
    lr: float = setting(0.05, "learning rate", minimum=0.0, above=True)
    momentum: float | None = setting(None, f"SGD momentum (default: {SGD_MOMENTUM} with sgd; adam and adamw "
                                     "take none)", minimum=0.0, maximum=1.0)
    nesterov: bool = setting(False, "SGD with Nesterov momentum")
    weight_decay: float = setting(0.0, "weight decay", minimum=0.0)
    betas: tuple[float, float] = setting((0.9, 0.999), "Adam's betas", flag="")
    eps: float = setting(1e-8, "Adam's eps", minimum=0.0, above=True, flag="")
    freeze_step: int = setting(0, "onebit_adam: the warm-up steps of full-gradient Adam, after which the variance "
                               "is frozen and workers push 1-bit momentum (required by it)", minimum=0, metavar="K")
    lr_schedule: str = setting("constant", "learning rate by update count (a server's: its shard's "
                               "updates; ddp's: its steps); formulas in psrv/schedule.py", choices=LR_SCHEDULES)
    warmup_steps: int = setting(0, "first updates of a linear warm-up: update k < N takes lr*(k+1)/(N+1)",
                                minimum=0)
    lr_decay_steps: int = setting(0, "warmup_cosine and linear: updates after the warm-up over which lr "
                                  "falls to lr*lr_end_factor (required by them)", minimum=0)
    lr_end_factor: float = setting(0.0, "warmup_cosine and linear: the lr they end at, as a fraction of lr",
                                   minimum=0.0, maximum=1.0)
    lr_step_size: int = setting(0, "step: lr is multiplied by lr_gamma every N updates after the warm-up "
                                "(required by it)", minimum=0)
    lr_gamma: float = setting(0.1, "step: the factor", minimum=0.0, maximum=1.0, above=True)
    update_rule: str = setting("plain", "how a shard treats a push's gradient before the step: plain, "
                               "staleness-lr (g/max(1,staleness)), dc-asgd, dc-asgd-a (delay compensation), "
                               "dn (delayed Nesterov, sgd --nesterov only), cgad (g*sigma(staleness), cosine-gated "
                               "decay), heloco (a push turned toward the outer momentum, sgd --nesterov only); "
                               "docs/algorithms.md. sync steps on "
                               "each clock's mean, which has no staleness: it takes plain or dn (there "
                               "SGD-Nesterov) and refuses the others", choices=UPDATE_RULES)
    dc_lambda: float | None = setting(None, "dc-asgd's lambda (default 0.04), dc-asgd-a's lambda0 (default 2.0)",
                                      minimum=0.0)
    dn_period: int = setting(0, "dn: pushes N per momentum update (0: the number of workers; mode sync: 1)",
                             minimum=0, metavar="N")
    cgad_alpha: float | None = setting(None, "cgad: the decay rate alpha of sigma(tau) = gate(tau) exp(-alpha "
                                       f"tau) (default {CGAD_DEFAULTS['cgad_alpha']})", minimum=0.0,
                                       metavar="ALPHA")
    cgad_cutoff: int | None = setting(None, "cgad: the staleness at and past which the cosine gate is 0; 0: no gate "
                                      f"(default {CGAD_DEFAULTS['cgad_cutoff']})", minimum=0, metavar="TAU")
    heloco_keep: float | None = setting(None, "heloco: the cosine c_ok with the outer momentum at and above which a "
                                        f"block of a push is kept as it is (default {HELOCO_DEFAULTS['heloco_keep']})",
                                        minimum=-1.0, maximum=1.0, metavar="C")
    heloco_shrink: float | None = setting(None, "heloco: k_s, how strongly a block against the momentum loses that "
                                          f"component (default {HELOCO_DEFAULTS['heloco_shrink']}; 0: never)",
                                          minimum=0.0, metavar="K")
    heloco_reorient: float | None = setting(None, "heloco: k_d, how strongly a block below the keep threshold is "
                                            "turned toward the momentum (default "
                                            f"{HELOCO_DEFAULTS['heloco_reorient']}; 0: never)", minimum=0.0,
                                            metavar="K")
    heloco_kappa: float | None = setting(None, "heloco: kappa in the confidence |d| / (|d| + kappa |m|) that scales "
                                         f"each correction (default {HELOCO_DEFAULTS['heloco_kappa']})",
                                         minimum=0.0, metavar="KAPPA")
    heloco_block: int | None = setting(None, "heloco: elements per block of a shard's slice, each corrected on "
                                       f"its own (default {HELOCO_DEFAULTS['heloco_block']}; 0: the whole slice)",
                                       minimum=0, metavar="N")

    def validate(self) -> None:
        super().validate()
        needs = {"warmup_cosine": "lr_decay_steps", "linear": "lr_decay_steps", "step": "lr_step_size"}
        if self.lr_schedule in needs and not getattr(self, needs[self.lr_schedule]):
            raise ConfigError(needs[self.lr_schedule], f"lr_schedule {self.lr_schedule!r} needs it (> 0)")
        for key, users in (("lr_decay_steps", ("warmup_cosine", "linear")),
                           ("lr_end_factor", ("warmup_cosine", "linear")),
                           ("lr_step_size", ("step",)), ("lr_gamma", ("step",))):
            if getattr(self, key) != self.__dataclass_fields__[key].default and self.lr_schedule not in users:
                raise ConfigError(key, f"only used by lr_schedule {' or '.join(users)} "
                                  f"(it is {self.lr_schedule!r}); remove it")
        if self.dc_lambda is None:
            object.__setattr__(self, "dc_lambda", DC_LAMBDA.get(self.update_rule, 0.0))
        elif self.update_rule not in DC_LAMBDA and self.dc_lambda:
            raise ConfigError("dc_lambda", f"only used by update_rule dc-asgd or dc-asgd-a (it is "
                              f"{self.update_rule!r}); remove it")
        for rule, knobs in RULE_KNOBS.items():
            for key, default in knobs.items():
                if getattr(self, key) is None:
                    object.__setattr__(self, key, default if self.update_rule == rule else type(default)(0))
                elif self.update_rule != rule and getattr(self, key):  # 0: what a stored config of another rule holds
                    raise ConfigError(key, f"only used by update_rule {rule} (it is {self.update_rule!r}); remove it")
        if self.momentum is None:
            object.__setattr__(self, "momentum", SGD_MOMENTUM if self.name == "sgd" else 0.0)
        elif self.momentum and self.name != "sgd":
            raise ConfigError("momentum", f"only used by optimizer 'sgd' ({self.name!r} takes none); remove it")
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ConfigError("nesterov", "needs optimizer 'sgd' with momentum > 0")
        if self.update_rule in NESTEROV_RULES and not self.nesterov:
            raise ConfigError("update_rule", {"dn": "dn is delayed Nesterov", "heloco": "heloco steps with its own "
                              "outer Nesterov momentum"}[self.update_rule] + ": needs optimizer 'sgd' with nesterov")
        if self.dn_period and self.update_rule != "dn":
            raise ConfigError("dn_period", f"only used by update_rule dn (it is {self.update_rule!r}); remove it")
        if self.name == "onebit_adam":
            if not self.freeze_step:
                raise ConfigError("freeze_step", "onebit_adam needs it (>= 1): the Adam warm-up that sets the variance")
            if self.update_rule != "plain" or self.clip_grad_norm:
                raise ConfigError("update_rule" if self.update_rule != "plain" else "clip_grad_norm",
                                  "onebit_adam's pushes after the freeze are momenta: no update rule or clip")
        elif self.freeze_step:
            raise ConfigError("freeze_step", f"only used by optimizer onebit_adam (it is {self.name!r}); remove it")
