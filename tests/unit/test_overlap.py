"""ShardReadiness: each shard is called back once per backward, last layers first, and only when its
slice of the flat gradient is final."""
import torch

from psrv.partition import PartitionPlan
from psrv.client.flat import FlatModel
from psrv.client.overlap import ShardReadiness


def model_and_flat():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    return model, FlatModel(model)


def test_each_shard_is_ready_once_last_layers_first_with_its_final_gradient():
    model, flat = model_and_flat()
    plan = PartitionPlan.from_module(model, 3)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    flat.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    final = flat.grads.clone()

    readiness = ShardReadiness(model, plan.ranges)
    seen: list[tuple[int, torch.Tensor]] = []
    readiness.arm(lambda s: seen.append((s, flat.grads[slice(*plan.ranges[s])].clone())))
    flat.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    readiness.disarm()

    order = [s for s, _ in seen]
    assert sorted(order) == [0, 1, 2] and order[-1] == 0  # the input layer's shard is final last
    for s, grad_then in seen:
        torch.testing.assert_close(grad_then, final[slice(*plan.ranges[s])], rtol=0, atol=0)


def test_a_disarmed_backward_calls_nothing_and_the_next_armed_one_counts_afresh():
    model, flat = model_and_flat()
    readiness = ShardReadiness(model, PartitionPlan.from_module(model, 2).ranges)
    seen: list[int] = []
    x, y = torch.randn(3, 8), torch.randint(0, 4, (3,))
    torch.nn.functional.cross_entropy(model(x), y).backward()   # not armed
    assert seen == []
    for _ in range(2):
        readiness.arm(seen.append)
        flat.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        readiness.disarm()
    assert sorted(seen) == [0, 0, 1, 1] and seen[:2] == seen[2:]


def test_a_shard_with_a_parameter_left_without_gradient_is_never_called():
    model, flat = model_and_flat()
    plan = PartitionPlan.from_module(model, 3)
    readiness = ShardReadiness(model, plan.ranges)
    seen: list[int] = []
    readiness.arm(seen.append)
    flat.zero_grad()
    model[4](torch.randn(2, 16)).sum().backward()  # only the last layer gets a gradient
    assert seen == []  # every shard also holds part of an earlier layer: PushPull.finish() sends them
