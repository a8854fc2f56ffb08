"""The snapshot ring (monitor/snapshots.py): a restore gives back the state bit for bit on CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor.snapshots import Ring  # noqa: E402


def _train(model, optimizer, scheduler, steps):
    for _ in range(steps):
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _linear():
    """A seeded linear model with Adam and a step scheduler: what each ring test trains."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def test_restore_is_bit_equal_and_the_snapshot_survives_training():
    model, optimizer, scheduler = _linear()
    ring = Ring(every=2, keep=2)
    _train(model, optimizer, scheduler, 3)
    ring.take(4, 3, model, optimizer, scheduler)
    expected = ({k: v.clone() for k, v in model.state_dict().items()},
                {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()},
                scheduler.state_dict(), torch.rand(3))
    for _ in range(2):  # restoring twice: Adam must not have updated the snapshot's tensors in place
        _train(model, optimizer, scheduler, 3)
        Ring.restore(ring.ring[-1], model, optimizer, scheduler)
        for key, value in expected[0].items():
            assert torch.equal(model.state_dict()[key], value)
        for index, moments in expected[1].items():
            for key, value in moments.items():
                assert torch.equal(optimizer.state_dict()["state"][index][key], value)
        assert scheduler.state_dict() == expected[2]
        assert optimizer.param_groups[0]["lr"] == 1e-2 * 0.5
        assert torch.equal(torch.rand(3), expected[3])  # the RNG is where the snapshot left it
        assert all(p.grad is None for p in model.parameters())


def test_ring_keeps_the_newest_and_reports_finite_snapshots():
    model = torch.nn.Linear(2, 2)
    ring = Ring(every=3, keep=2)
    assert [s for s in range(1, 11) if ring.due(s)] == [1, 4, 7, 10]
    for step in (1, 4, 7):
        ring.take(step, step - 1, model, None, None)
    assert [s.step for s in ring.ring] == [4, 7]
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    ring.take(10, 9, model, None, None)
    report = ring.local_report(model)
    assert report["weights_ok"] is False and report["good"] == [7]
    assert ring.ring[-1].size == (4 + 2) * 4


def _state(model, optimizer):
    """Clones of the weights and the optimizer's per-parameter state, to compare a restore against."""
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()})


def _assert_restored(model, optimizer, expected):
    for key, value in expected[0].items():
        assert torch.equal(model.state_dict()[key], value), key
    assert optimizer.state_dict()["state"].keys() == expected[1].keys()
    for index, moments in expected[1].items():
        for key, value in moments.items():
            assert torch.equal(optimizer.state_dict()["state"][index][key], value), (index, key)


def _pointers(snap):
    tensors = list(snap.model.values())
    tensors += [t for s in snap.optimizer["state"].values() for t in s.values()]
    return [t.data_ptr() for t in tensors]


def test_a_full_ring_copies_into_the_oldest_slot_and_restores_from_it_bit_for_bit():
    model, optimizer, scheduler = _linear()
    ring = Ring(every=1, keep=2)
    _train(model, optimizer, scheduler, 1)  # Adam's moments exist from here on: the layout stays
    first = ring.take(2, 1, model, optimizer, scheduler)
    pointers = _pointers(first)
    _train(model, optimizer, scheduler, 1)
    ring.take(3, 2, model, optimizer, scheduler)
    _train(model, optimizer, scheduler, 1)
    expected = _state(model, optimizer)
    third = ring.take(4, 3, model, optimizer, scheduler)  # the ring is full: into the first one's buffers
    assert [s.step for s in ring.ring] == [3, 4]
    assert _pointers(third) == pointers  # no new host tensors
    assert third.complete and third.size == (8 + 2 * 8) * 4 + 2 * 4  # weights, moments, step counts
    _train(model, optimizer, scheduler, 3)
    Ring.restore(third, model, optimizer, scheduler)
    _assert_restored(model, optimizer, expected)
    assert optimizer.state_dict()["state"][0]["step"].item() == 3


def test_a_slot_whose_layout_changed_gets_new_buffers():
    model, optimizer, scheduler = _linear()
    ring = Ring(every=1, keep=1)
    before = ring.take(1, 0, model, optimizer, scheduler)  # Adam has no state before its first step
    assert before.optimizer["state"] == {} and before.size == 8 * 4
    _train(model, optimizer, scheduler, 2)
    expected = _state(model, optimizer)
    after = ring.take(3, 2, model, optimizer, scheduler)  # the same slot, now with moments and step counts
    assert [s.step for s in ring.ring] == [3]
    assert after.size == (8 + 2 * 8) * 4 + 2 * 4
    _train(model, optimizer, scheduler, 2)
    Ring.restore(after, model, optimizer, scheduler)
    _assert_restored(model, optimizer, expected)
    with torch.no_grad():  # and back: a different dtype at the same key is a new buffer, not a cast into the old
        model.double()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    again = ring.take(5, 4, model, optimizer, None)
    assert all(t.dtype == torch.float64 for t in again.model.values()) and again.optimizer["state"] == {}
    assert torch.equal(again.model["weight"], model.weight.detach())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_snapshots_go_to_pinned_buffers_and_survive_the_next_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ring = Ring(every=1, keep=2)
    model(torch.randn(8, 64, device="cuda")).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    expected = _state(model, optimizer)
    snap = ring.take(2, 1, model, optimizer, None)
    assert snap.event is not None and all(t.is_pinned() for t in snap.model.values())
    for _ in range(3):  # queued right behind the copy: it must not change what the snapshot holds
        model(torch.randn(8, 64, device="cuda")).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    snap.wait()
    assert snap.complete
    for key, value in expected[0].items():
        assert torch.equal(snap.model[key], value.cpu()), key
    Ring.restore(snap, model, optimizer, None)
    _assert_restored(model, optimizer, expected)
