"""The live guard's tensor measurements on real modules: the fingerprint ranks compare bit for bit, and
the update ratio per module group."""

import copy

import pytest
import torch

from lossguard.monitor import tensors


def model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16),
                               torch.nn.Linear(16, 64)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replicas_give_bit_identical_prints_and_any_drift_moves_it(dtype):
    one, two = model(dtype), model(dtype)
    print_one = tensors.fingerprint(one)
    assert print_one.dtype == torch.float64
    assert tensors.fingerprint(two).item() == print_one.item()
    with torch.no_grad():
        two[1].weight[0, 0] += 0.01  # one value of one replica, about a twentieth of its size
    assert tensors.fingerprint(two).item() != print_one.item()


def test_swapped_tensors_of_one_shape_move_the_print():
    one = model()
    two = copy.deepcopy(one)
    with torch.no_grad():  # two 16x16 weights trade places: every tensor's norm is kept, not its place
        two[1].weight.copy_(one[2].weight)
        two[2].weight.copy_(one[1].weight)
    assert tensors.fingerprint(two).item() != tensors.fingerprint(one).item()


def test_update_ratio_per_group_is_the_sampled_relative_change():
    net = model()
    named = list(net.named_parameters())
    groups, assign = tensors.assign_groups(named, {"embed": ["0."], "head": ["3."]})
    sampler = tensors.UpdateSampler(named, groups, assign, sample_size=100)
    sampler.snapshot()
    before = {name: p.detach().reshape(-1)[:100].clone() for name, p in named}
    with torch.no_grad():
        net[3].weight.mul_(1.5)  # head: its weight moves by half of itself
        net[1].bias.add_(1.0)
    ratios = dict(zip(groups, (r.item() for r in sampler.ratios())))
    after = {name: p.detach().reshape(-1)[:100] for name, p in named}

    def expected(group):
        names = [n for n in before if assign[n] == group]
        delta = sum(float(((after[n] - before[n]) ** 2).sum()) for n in names)
        base = sum(float((before[n] ** 2).sum()) for n in names)
        return (delta / base) ** 0.5

    assert set(ratios) == {"embed", "head", "1", "2"}
    assert ratios["embed"] == ratios["2"] == 0.0
    for group in ("head", "1"):
        assert ratios[group] == pytest.approx(expected(group), rel=1e-5)
    assert sampler.ratios() is None  # one snapshot, one comparison


def test_a_kept_sample_is_the_next_snapshot():
    """Fingerprints every step: the sample `ratios` takes is the next step's snapshot (no second read)."""
    net = model()
    named = list(net.named_parameters())
    groups, assign = tensors.assign_groups(named, None)
    sampler = tensors.UpdateSampler(named, groups, assign, sample_size=100)
    assert sampler.ratios(keep=True) is None  # nothing to compare with yet: this sample starts one
    with torch.no_grad():
        net[1].weight.mul_(2.0)
        net[1].bias.mul_(2.0)  # the whole group doubles: it moved by all of itself
    first = dict(zip(groups, (r.item() for r in sampler.ratios(keep=True))))
    assert first["1"] == pytest.approx(1.0) and first["0"] == 0.0
    second = dict(zip(groups, (r.item() for r in sampler.ratios(keep=True))))
    assert second["1"] == 0.0  # measured from the kept sample, after the doubling


def test_loss_items_counts_as_the_trainer_counts_num_items_in_batch():
    """The count a Trainer divides a summed loss by: shift_labels when given, else the shifted labels where
    the Trainer knows the loss shifts them, else every label that is not -100 (GPT-2 in transformers 5.24)."""
    loss_items = tensors.loss_items
    labels = torch.tensor([[5, 6, 7, 8], [-100, -100, 7, 8]])
    assert int(loss_items({"labels": labels}, shifted=True)) == 5
    assert int(loss_items({"labels": labels}, shifted=False)) == 6
    shift = torch.tensor([[6, 7, -100], [-100, 7, 8]])
    assert int(loss_items({"labels": labels, "shift_labels": shift}, shifted=False)) == 4
    assert loss_items({"input_ids": labels}) is None
