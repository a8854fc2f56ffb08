"""The quarantine file, sample hashing and batch selection (monitor/quarantine.py), and the RNG capture a
replay restores (monitor/replay.py): real tensors, a real file."""

from __future__ import annotations

import json
import random

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor import quarantine, replay  # noqa: E402


def _batch() -> dict:
    ids = torch.arange(12).reshape(3, 4)
    return {"input_ids": ids, "labels": ids.clone(), "index": torch.tensor([7, 8, 9]), "scale": 2.0}


def test_hash_depends_on_the_tokens_only():
    a = torch.tensor([1, 2, 3])
    assert quarantine.sample_hash(a) == quarantine.sample_hash(a.to(torch.int32))  # dtype: read as int64
    column = torch.tensor([[1, 9], [2, 9], [3, 9]])[:, 0]  # a strided view: hashed by value, not by layout
    assert quarantine.sample_hash(a) == quarantine.sample_hash(column)
    assert quarantine.sample_hash(a) != quarantine.sample_hash(torch.tensor([3, 2, 1]))
    assert len(quarantine.sample_hash(a)) == 16


def test_token_ids_prefers_a_known_key_then_the_first_integer_tensor_not_labels():
    batch = _batch()
    assert quarantine.token_ids(batch) is batch["input_ids"]
    other = {"labels": torch.zeros(2, 3, dtype=torch.long), "x": torch.ones(2, 3), "tok": torch.ones(2, 3).long()}
    assert quarantine.token_ids(other) is other["tok"]
    assert quarantine.token_ids((torch.ones(2), torch.ones(2, 2).long())) is not None
    assert quarantine.token_ids("text") is None and quarantine.num_samples("text") == 0


def test_identities_name_position_hash_and_dataset_index():
    batch = _batch()
    [entry] = quarantine.identities(batch, [1], step=5, rank=1, why="test")
    assert entry == {"rank": 1, "position": 1, "hash": quarantine.sample_hash(batch["input_ids"][1]),
                     "index": 8, "step": 5, "why": "test"}
    no_index = {"input_ids": batch["input_ids"]}
    assert quarantine.identities(no_index, [0], step=1, rank=0, why="")[0]["index"] is None


def test_select_cuts_every_per_sample_tensor_and_keeps_the_rest():
    cut = quarantine.select(_batch(), [0, 2])
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert cut["index"].tolist() == [7, 9] and cut["scale"] == 2.0
    pair = quarantine.select((torch.arange(3), torch.arange(6).reshape(3, 2)), [1])
    assert isinstance(pair, tuple) and pair[0].tolist() == [1] and pair[1].tolist() == [[2, 3]]


def test_quarantine_file_round_trip_dedup_and_a_torn_line(tmp_path):
    batch = _batch()
    first = quarantine.Quarantine(tmp_path)
    assert first.kept(batch) is None  # empty: nothing dropped, nothing hashed
    named = quarantine.identities(batch, [1], step=3, rank=0, why="test")
    first.add(named, write=True)
    first.add(named, write=True)  # named again (a fully quarantined batch held again): kept once
    assert first.kept(batch) == [0, 2]
    with open(tmp_path / quarantine.FILE, "a") as fh:
        fh.write('{"hash": "cut sh')  # a crash mid-line
    again = quarantine.Quarantine(tmp_path)  # a new Guard on the same events dir (a resume)
    assert [json.loads(line)["index"] for line in (tmp_path / quarantine.FILE).read_text().splitlines()[:1]] == [8]
    assert again.kept(batch) == [0, 2]
    by_index = {"input_ids": torch.tensor([[100, 101]]), "index": torch.tensor([8])}
    assert again.kept(by_index) == []  # other tokens, the same dataset index: still out


def test_not_written_by_the_other_ranks_nor_without_an_events_dir(tmp_path):
    named = quarantine.identities(_batch(), [0], step=1, rank=1, why="")
    quarantine.Quarantine(tmp_path).add(named, write=False)
    assert not (tmp_path / quarantine.FILE).exists()
    memory = quarantine.Quarantine(None)
    memory.add(named, write=True)
    assert memory.kept(_batch()) == [1, 2]


def test_rng_capture_restores_every_stream():
    np = pytest.importorskip("numpy")
    state = replay.capture_rng()
    first = (torch.rand(3), random.random(), np.random.rand())
    replay.restore_rng(state)
    second = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], second[0]) and first[1:] == second[1:]


def test_a_batch_encoding_is_named_and_cut_and_stays_a_batch_encoding():
    transformers = pytest.importorskip("transformers")
    ids = torch.arange(12).reshape(3, 4)
    batch = transformers.BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    assert quarantine.token_ids(batch) is ids and quarantine.num_samples(batch) == 3
    held = quarantine.Quarantine(None)
    held.add(quarantine.identities(batch, [1], step=1, rank=0, why="test"), write=False)
    kept, emptied = quarantine.shed(batch, held)
    assert type(kept) is transformers.BatchEncoding and not emptied
    assert kept["input_ids"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]] and kept.to("cpu") is not None


def test_padding_does_not_change_a_samples_name():
    alone = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.tensor([[1, 1, 1]])}
    padded = {"input_ids": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])}
    held = quarantine.Quarantine(None)
    held.add(quarantine.identities(alone, [0], step=1, rank=0, why="test"), write=False)
    assert held.kept(padded) == [0]


def test_a_batch_left_empty_comes_out_whole_and_says_so():
    held = quarantine.Quarantine(None)
    pair = (torch.tensor([[1, 2]]), torch.tensor([0.5]))  # a tuple with no labels: passed through as it is
    held.add(quarantine.identities(pair, [0], step=1, rank=0, why="test"), write=False)
    out, emptied = quarantine.shed(pair, held)
    assert emptied and out is pair
    no_labels = {"input_ids": torch.tensor([[1, 2]])}
    assert quarantine.shed(no_labels, held) == (no_labels, True)
    masked, emptied = quarantine.shed({"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([[1, 2]])}, held)
    assert emptied and masked["labels"].tolist() == [[-100, -100]]
    assert quarantine.shed({"input_ids": torch.tensor([[3, 4]])}, held)[1] is False


def test_a_namedtuple_batch_is_rebuilt_as_itself():
    from collections import namedtuple

    Pair = namedtuple("Pair", "ids target")
    cut = quarantine.select(Pair(torch.arange(6).reshape(3, 2), torch.arange(3)), [2])
    assert isinstance(cut, Pair) and cut.ids.tolist() == [[4, 5]] and cut.target.tolist() == [2]


def test_a_shedder_hands_out_the_last_batch_let_through_in_place_of_an_empty_one():
    held = quarantine.Quarantine(None)
    poison, healthy = (torch.tensor([[9, 9]]), torch.tensor([[9, 9]])), (torch.tensor([[1, 2]]), torch.tensor([[1, 2]]))
    held.add(quarantine.identities(poison, [0], step=1, rank=0, why="test"), write=False)
    shed = quarantine.Shedder(held)
    assert shed(poison) == (poison, True)  # nothing let through yet: the empty batch itself
    assert shed(healthy) == (healthy, False)
    assert shed(poison) == (healthy, True)  # the poisoned sample never runs again
