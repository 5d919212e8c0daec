"""The shipped jobs scaled up for a GPU, by their own options: what `make gpu-check` trains (as
`--job psrv.experiments.bench.gpu_jobs:NAME`; each is factory(seed), as the job registry calls it).

    synthetic_mlp_large  synthetic_mlp, features 2048, hidden 8192: 33.6M parameters (134 MB of float32)
    code_lm_large        code_lm, d_model 512, 8 layers, 8 heads, context 256: 25.6M parameters (102 MB)
"""
from __future__ import annotations

from psrv.workers.jobs import Job
from psrv.workers.jobs.code_lm import code_lm
from psrv.workers.jobs.synthetic import synthetic_mlp

SYNTHETIC_LARGE = {"features": 2048, "hidden": 8192}
CODE_LM_LARGE = {"d_model": 512, "layers": 8, "heads": 8, "context": 256}


def synthetic_mlp_large(seed: int) -> Job:
    return synthetic_mlp(seed, **SYNTHETIC_LARGE)


def code_lm_large(seed: int) -> Job:
    return code_lm(seed, **CODE_LM_LARGE)
