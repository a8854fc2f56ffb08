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


def test_restore_is_bit_equal_and_the_snapshot_survives_training():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
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
