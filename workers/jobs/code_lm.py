"""code_lm: a small causal byte-level transformer language model on Python's own standard library.

The corpus is a fixed list of the running CPython's standard-library source files, read as bytes
from `sysconfig.get_paths()["stdlib"]`: `TRAIN_FILES` to train on and `HELDOUT_FILES` (whole files
none of which is trained on) to evaluate. Nothing is downloaded; the bytes are the same on every
machine with the same Python version (a patch release or a distribution may change a file), and a
missing file is an error naming it.

Training batches are (x, y) pairs of int64 (batch, context) tensors: windows of `context` bytes at
random offsets in the concatenated training files and the same windows shifted by one byte, drawn
per rank by a generator seeded with (seed, rank). The loss is the mean next-byte cross-entropy.
Evaluation runs on `eval_windows` fixed, evenly spaced windows of the held-out files and reports
loss (nats per byte), perplexity = exp(loss) and bits_per_byte = loss / ln 2; the primary metric is
perplexity, lower is better.

The defaults (d_model 64, 2 layers, 4 heads, context 64: about 120k float32 parameters) suit 2 CPU
cores. To scale it up, e.g. on a GPU, wrap the factory with other options in a file of your own and
name that as the job (the registry calls factory(seed)):

    # my_lm.py
    from psrv.workers.jobs.code_lm import code_lm

    def big(seed):
        return code_lm(seed, d_model=256, layers=6, heads=8, context=256)

    psrv run --job my_lm.py:big --device cuda      # or --job my_pkg.my_lm:big
"""
from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from psrv.workers.jobs.job import Job, perplexity

VOCAB = 256  # bytes
# Files every CPython 3.11 ships, relative to the stdlib folder; sorted, none in both lists.
TRAIN_FILES = (
    "abc.py", "argparse.py", "bisect.py", "collections/__init__.py", "contextlib.py", "copy.py",
    "dataclasses.py", "enum.py", "fnmatch.py", "functools.py", "json/decoder.py", "json/encoder.py",
    "operator.py", "pathlib.py", "random.py", "shlex.py", "string.py", "weakref.py",
)
HELDOUT_FILES = ("heapq.py", "queue.py", "textwrap.py")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_corpus(files: tuple[str, ...]) -> bytes:
    """The named standard-library files' bytes, concatenated in the given order."""
    root = stdlib_dir()
    parts = []
    for name in files:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"code_lm: the standard-library file {name} is missing (looked for {path})")
        parts.append(path.read_bytes())
    return b"".join(parts)


def as_tokens(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal multi-head self-attention and a 4x MLP, no dropout."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.norm2(h))


class ByteTransformer(torch.nn.Module):
    """Byte and position embeddings, `layers` blocks, a final LayerNorm and a linear head to 256 logits."""

    def __init__(self, *, d_model: int, layers: int, heads: int, context: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"code_lm: d_model {d_model} is not a multiple of heads {heads}")
        self.context = context
        self.embed = torch.nn.Embedding(VOCAB, d_model)
        self.position = torch.nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, t) byte ids, t <= context -> (batch, t, 256) next-byte logits."""
        h = self.embed(x) + self.position(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def next_byte_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy (nats) of every position's prediction of the byte after it."""
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def windows(tokens: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): `context` tokens from each start, and the same shifted by one."""
    idx = starts.unsqueeze(1) + torch.arange(context + 1)
    chunk = tokens[idx]
    return chunk[:, :-1], chunk[:, 1:]


def heldout_windows(context: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation's (x, y): `count` windows evenly spaced over the held-out files, not seeded, so
    every run is judged on the same bytes."""
    heldout = as_tokens(read_corpus(HELDOUT_FILES))
    return windows(heldout, torch.linspace(0, len(heldout) - context - 1, count).long(), context)


def code_lm(seed: int, *, d_model: int = 64, layers: int = 2, heads: int = 4, context: int = 64,
            eval_windows: int = 64) -> Job:
    train = as_tokens(read_corpus(TRAIN_FILES))
    eval_x, eval_y = heldout_windows(context, eval_windows)
    model = ByteTransformer(d_model=d_model, layers=layers, heads=heads, context=context)

    def batches(*, rank: int, world_size: int, batch_size: int, seed: int):
        rng = np.random.default_rng([seed, rank])
        while True:
            starts = torch.from_numpy(rng.integers(0, len(train) - context, size=batch_size))
            yield windows(train, starts, context)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        loss = float(next_byte_loss(model, (eval_x.to(device), eval_y.to(device))))
        return {"loss": loss, "perplexity": perplexity(loss), "bits_per_byte": loss / math.log(2)}

    return Job("code_lm", model, batches=batches, loss=next_byte_loss, evaluate=evaluate,
               metric="perplexity", lower_is_better=True)
