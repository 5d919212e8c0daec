"""digits_cnn, mnist1d_cnn and code_lm: they build offline, their shapes, code_lm's documented corpus and
split, its evaluation's consistency, its per-rank batches, and a few optimizer steps lowering its loss."""
import math

import pytest
import torch

from psrv.workers.jobs import code_lm as lm
from psrv.workers.jobs import load_job


@pytest.fixture(scope="module")
def code_job():
    return load_job("code_lm", seed=0)


@pytest.mark.parametrize(("name", "shape"), [("digits_cnn", (1, 8, 8)), ("mnist1d_cnn", (1, 40))])
def test_the_cnn_jobs_classify_their_images(name, shape):
    job = load_job(name, seed=0)
    (x, y), (xt, yt) = job.train, job.test
    assert x.shape[1:] == xt.shape[1:] == shape and x.dtype == torch.float32
    assert job.model(x[:5]).shape == (5, 10) and set(y.tolist()) == set(range(10))
    assert job.metric == "accuracy" and job.lower_is_better is False
    assert set(job.evaluate_on(job.model)) == {"loss", "accuracy"}


def test_digits_cnn_has_batchnorm_statistics_on_the_digits_mlp_split():
    cnn, mlp = load_job("digits_cnn", seed=0), load_job("digits_mlp", seed=0)
    buffers = dict(cnn.model.named_buffers())
    assert any(k.endswith("running_mean") for k in buffers) and any(k.endswith("running_var") for k in buffers)
    for ours, theirs in ((cnn.train, mlp.train), (cnn.test, mlp.test)):
        assert torch.equal(ours[0].flatten(1), theirs[0]) and torch.equal(ours[1], theirs[1])


def test_code_lm_reads_the_documented_stdlib_files_and_holds_whole_files_out():
    assert list(lm.TRAIN_FILES) == sorted(lm.TRAIN_FILES) and not set(lm.TRAIN_FILES) & set(lm.HELDOUT_FILES)
    root = lm.stdlib_dir()
    assert lm.read_corpus(lm.TRAIN_FILES) == b"".join((root / f).read_bytes() for f in lm.TRAIN_FILES)
    assert lm.read_corpus(lm.HELDOUT_FILES) == b"".join((root / f).read_bytes() for f in lm.HELDOUT_FILES)


def test_a_missing_stdlib_file_is_an_error_naming_it():
    with pytest.raises(FileNotFoundError, match="no_such_module.py is missing"):
        lm.read_corpus(("abc.py", "no_such_module.py"))


def test_code_lm_is_the_same_on_every_build(code_job):
    again = load_job("code_lm", seed=0)
    for a, b in zip(code_job.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)
    assert code_job.evaluate_on(code_job.model) == again.evaluate_on(again.model)
    one = code_job.batches_for(rank=0, world_size=2, batch_size=4, seed=3)
    two = again.batches_for(rank=0, world_size=2, batch_size=4, seed=3)
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(next(one), next(two)))


def test_code_lm_batches_are_next_byte_pairs_from_the_training_files_and_differ_by_rank(code_job):
    train = lm.read_corpus(lm.TRAIN_FILES)
    x0, y0 = next(code_job.batches_for(rank=0, world_size=2, batch_size=8, seed=0))
    x1, _ = next(code_job.batches_for(rank=1, world_size=2, batch_size=8, seed=0))
    assert x0.shape == y0.shape == (8, 64) and x0.dtype == torch.long
    assert torch.equal(x0[:, 1:], y0[:, :-1]) and not torch.equal(x0, x1)
    for row_x, row_y in zip(x0, y0):
        assert bytes(row_x.tolist()) + bytes(row_y[-1:].tolist()) in train
    assert code_job.model(x0).shape == (8, 64, 256)


def test_code_lm_evaluates_fixed_windows_of_the_held_out_files_only(monkeypatch):
    heldout = lm.read_corpus(lm.HELDOUT_FILES)
    x, y = lm.heldout_windows(64, 64)
    assert x.shape == y.shape == (64, 64) and torch.equal(x[:, 1:], y[:, :-1])
    assert all(bytes(row.tolist()) in heldout for row in x) and len({bytes(r.tolist()) for r in x}) == 64
    before = lm.code_lm(0).evaluate_on
    torch.manual_seed(0)
    model = lm.code_lm(0).model
    monkeypatch.setattr(lm, "TRAIN_FILES", ("abc.py",))     # other training bytes: the same evaluation
    assert lm.code_lm(0).evaluate_on(model) == before(model)
    monkeypatch.setattr(lm, "HELDOUT_FILES", ("abc.py",))   # other held-out bytes: another evaluation
    assert lm.code_lm(0).evaluate_on(model) != before(model)


def test_code_lm_reports_perplexity_and_bits_per_byte_of_its_loss(code_job):
    m = code_job.evaluate_on(code_job.model)
    assert set(m) == {"loss", "perplexity", "bits_per_byte"}
    assert code_job.metric == "perplexity" and code_job.lower_is_better is True
    assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-9)
    assert m["bits_per_byte"] == pytest.approx(m["loss"] / math.log(2), rel=1e-9)
    assert 4.0 < m["loss"] < 7.0  # untrained: about ln 256 = 5.5 nats a byte


def test_code_lm_parameters_are_float32_and_all_get_a_gradient(code_job):
    model = code_job.model
    batch = next(code_job.batches_for(rank=0, world_size=1, batch_size=2, seed=0))
    model.zero_grad(set_to_none=True)
    code_job.loss_of(model, batch).backward()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} got no gradient"


def test_code_lm_is_causal():
    job = lm.code_lm(0, d_model=32, layers=1, context=16)
    x = torch.randint(0, 256, (1, 16))
    changed = x.clone()
    changed[0, 10] = (x[0, 10] + 1) % 256
    with torch.no_grad():
        a, b = job.model(x), job.model(changed)
    assert torch.equal(a[0, :10], b[0, :10]) and not torch.equal(a[0, 10:], b[0, 10:])


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy 2-core machine two threads wait on each other many times longer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_few_adam_steps_lower_code_lms_training_loss(one_thread):
    job = lm.code_lm(0)
    opt = torch.optim.Adam(job.model.parameters(), lr=3e-3)
    batches = job.batches_for(rank=0, world_size=1, batch_size=16, seed=0)
    fixed = next(batches)
    before = job.loss_of(job.model, fixed).item()
    for _ in range(15):
        opt.zero_grad()
        job.loss_of(job.model, next(batches)).backward()
        opt.step()
    assert job.loss_of(job.model, fixed).item() < before - 1.0  # about 5.8 -> 2.8 nats
