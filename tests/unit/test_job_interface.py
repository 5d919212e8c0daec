"""workers/jobs/job.py: the two forms of a job behind one interface, and the mistakes it names."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from psrv.workers.jobs import Job, batch_size_of, to_device


def _tensor_job(y_float: bool = False) -> Job:
    x, xt = torch.randn(40, 3), torch.randn(10, 3)
    if y_float:
        return Job("reg", torch.nn.Linear(3, 1), (x, x[:, :1]), (xt, xt[:, :1]),
                   loss_fn=torch.nn.functional.mse_loss)
    return Job("cls", torch.nn.Linear(3, 2), (x, (x[:, 0] > 0).long()), (xt, (xt[:, 0] > 0).long()))


def test_a_classifier_tensor_job_reports_loss_and_accuracy_and_aims_at_accuracy():
    job = _tensor_job()
    metrics = job.evaluate_on(job.model)
    assert set(metrics) == {"loss", "accuracy"} and 0 <= metrics["accuracy"] <= 1
    assert (job.metric, job.lower_is_better) == ("accuracy", False)


def test_a_regression_tensor_job_reports_no_accuracy_and_aims_at_its_loss():
    job = _tensor_job(y_float=True)
    metrics = job.evaluate_on(job.model)
    assert set(metrics) == {"loss"}
    assert (job.metric, job.lower_is_better) == ("loss", True)


def test_tensor_batches_are_the_distributed_sampler_shards_of_train():
    job = _tensor_job()
    seen = [next(b) for b in [job.batches_for(rank=r, world_size=2, batch_size=5, seed=0) for r in (0, 1)]]
    x = job.train[0]
    rows = {tuple(v.tolist()) for xb, _ in seen for v in xb}
    assert len(rows) == 10 and rows <= {tuple(v.tolist()) for v in x}  # two disjoint shards of train


def test_a_dataloader_job_goes_round_epochs_with_set_epoch_and_dict_batches():
    data = TensorDataset(torch.arange(12.0).reshape(12, 1))
    made = []

    def batches(*, rank, world_size, batch_size, seed):
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        made.append(sampler)
        return DataLoader(data, batch_size=batch_size, sampler=sampler,
                          collate_fn=lambda items: {"x": torch.stack([i[0] for i in items])})

    job = Job("dl", torch.nn.Linear(1, 1), batches=batches, loss=lambda m, b: m(b["x"]).mean(),
              evaluate=lambda m: {"loss": 0.0})
    stream = job.batches_for(rank=0, world_size=2, batch_size=3, seed=0)
    epochs = [[float(v) for _ in range(2) for v in next(stream)["x"].flatten()] for _ in range(3)]
    assert len(made) == 1 and made[0].epoch == 2  # one loader, gone round three times
    assert all(len(set(e)) == 6 for e in epochs)             # each epoch: this rank's half, once each
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # reshuffled by set_epoch


def test_a_generator_that_runs_out_is_a_clear_error():
    job = Job("gen", torch.nn.Linear(1, 1), batches=lambda **kw: (torch.ones(2, 1) for _ in range(2)),
              loss=lambda m, b: m(b).mean(), evaluate=lambda m: {"loss": 0.0})
    stream = job.batches_for(rank=0, world_size=1, batch_size=2, seed=0)
    next(stream), next(stream)
    with pytest.raises(ValueError, match="ran out after one pass"):
        next(stream)
    empty = Job("empty", torch.nn.Linear(1, 1), batches=lambda **kw: [], loss=lambda m, b: m(b).mean(),
                evaluate=lambda m: {"loss": 0.0})
    with pytest.raises(ValueError, match="gave no batch for rank 0 of 1"):
        next(empty.batches_for(rank=0, world_size=1, batch_size=2, seed=0))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"evaluate": lambda m: {"loss": 0.0}}, "give train tensors or a batches"),
    ({"batches": lambda **kw: [], "loss": lambda m, b: 0}, "give test tensors or an evaluate"),
    ({"batches": lambda **kw: [], "evaluate": lambda m: {"loss": 0.0}, "loss_fn": None}, "needs loss"),
])
def test_a_job_missing_a_piece_says_which(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Job("bad", torch.nn.Linear(1, 1), **kwargs)


def test_an_evaluation_without_loss_or_without_the_primary_metric_is_a_clear_error():
    job = Job("e", torch.nn.Linear(1, 1), batches=lambda **kw: [torch.ones(1, 1)], loss=lambda m, b: m(b).sum(),
              evaluate=lambda m: {"mse": 1.0})
    with pytest.raises(ValueError, match="must report 'loss'"):
        job.evaluate_on(job.model)
    job = Job("f", torch.nn.Linear(1, 1), batches=lambda **kw: [torch.ones(1, 1)], loss=lambda m, b: m(b).sum(),
              evaluate=lambda m: {"loss": 1.0}, metric="f1")
    assert job.lower_is_better is False
    with pytest.raises(ValueError, match="metric 'f1' is not among"):
        job.evaluate_on(job.model)


def test_evaluation_runs_in_eval_mode_and_restores_training_mode():
    modes = []
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    job = Job("m", model, batches=lambda **kw: [torch.ones(1, 2)], loss=lambda m, b: m(b).sum(),
              evaluate=lambda m: modes.append(m.training) or {"loss": math.pi})
    model.train()
    assert job.evaluate_on(model) == {"loss": pytest.approx(math.pi)} and modes == [False] and model.training


def test_batch_size_and_to_device_walk_nested_batches():
    batch = {"a": (torch.zeros(7, 2), [torch.ones(7)]), "n": 3}
    assert batch_size_of(batch) == 7 and batch_size_of((torch.zeros(4, 1), torch.zeros(4))) == 4
    moved = to_device(batch, "cpu")
    assert moved["n"] == 3 and isinstance(moved["a"], tuple) and isinstance(moved["a"][1], list)
