"""The generic metric reader and step placement: one test per shape real tools print (short inline lines
shaped like the ones users paste)."""

import io
import math

from lossguard.core.records import EVAL, TRAIN
from lossguard.sources import discover, records
from lossguard.sources.text_log import parse_stream


def parse(text: str):
    return list(parse_stream(io.BytesIO(text.encode()), "t.log"))


def losses(recs):
    return [(r.step, r.signals.get("loss")) for r in recs if r.kind == TRAIN]


def test_torchtune_progress_description_gives_the_step_and_redraws_collapse():
    text = ("[trainer0|0]:1|25|Loss: 1.26:  26%|##5       | 26/101 [06:45<17:27, 13.96s/it]\n"
            "[trainer0|0]:1|26|Loss: 1.24:  26%|##5       | 26/101 [06:45<17:27, 13.96s/it]   [trainer0|0]:\n"
            "[trainer0|0]:1|26|Loss: 1.24:  27%|##7       | 27/101 [07:00<17:31, 14.21s/it]\n")
    assert losses(parse(text)) == [(25, 1.26), (26, 1.24)]


def test_torchtune_single_bar_takes_the_progress_counter():
    (record,) = parse("|Loss: nan:   0%|                         | 3/3073 [00:15<4:04:50,  4.79s/it]\n")
    assert record.step == 3 and math.isnan(record.signals["loss"]) and not record.step_is_ordinal


def test_lightning_postfix_redraws_in_one_line_train_named_loss_wins_and_global_step_counts():
    bar = ("Epoch 0:   3%|#  | {i}/20101 [2:12:19<76:15:08, 14.05s/it, loss=nan, v_num=, val_loss_step=11.30, "
           "reduced_train_loss={v}, gradient_norm=1.010, global_step={g}.0, throughput=19.00, ")
    line = bar.format(i=565, v="3.910", g=564) + bar.format(i=566, v="3.910", g=564) + bar.format(i=566, v="4.000", g=565)
    recs = parse(line + "\n")
    assert losses(recs) == [(564, 3.91), (565, 4.0)]
    assert recs[0].signals["grad_norm"] == 1.01 and "eval_loss" not in recs[0].signals


def test_metric_logger_epoch_and_counter_make_a_global_step():
    recs = parse("[05:19:47] Epoch: [1]  [1480/1504]  lr: 0.000012  closs: 0.9233 (0.9531)  grad_norm: 0.2695 (0.39)\n"
                 "[05:25:06] Epoch: [2]  [0/1504]  lr: 0.000012  closs: 0.9249 (0.9249)  time: 5.8674\n")
    assert losses(recs) == [(1 * 1504 + 1480, 0.9233), (2 * 1504, 0.9249)]
    assert recs[0].signals == {"epoch": 1.0, "lr": 1.2e-05, "loss": 0.9233, "grad_norm": 0.2695}


def test_fairseq_train_inner_and_valid_lines():
    recs = parse("2020-03-23 | INFO | train_inner | epoch 003:      5 / 356 loss=9.44, nll_loss=8.44, "
                 "num_updates=700, lr=0.000175, gnorm=156.036, loss_scale=0, wall=9877\n"
                 "2020-03-23 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 9.393 | nll_loss 8.3 | "
                 "num_updates 700\n")
    assert [(r.kind, r.step) for r in recs] == [(TRAIN, 700), (EVAL, 700)]
    assert recs[0].signals == {"epoch": 3.0, "loss": 9.44, "lr": 0.000175, "grad_norm": 156.036, "loss_scale": 0.0}
    assert recs[1].signals["eval_loss"] == 9.393


def test_pipe_separated_rl_line_takes_the_first_loss():
    recs = parse("epoch: 0|step: 3183|ppo_ep: 1|act_loss: 30.92|cri_loss: 30.51|unsuper_loss: 0.0\n"
                 "epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf|unsuper_loss: 0.0\n")
    assert losses(recs) == [(3183, 30.92), (3184, math.inf)]


def test_markdown_table_row_and_step_loss_words():
    recs = parse("| step | 10 | loss | 2.31 | grad_norm | 0.9 |\nEpoch 1, Step 20, Loss: 0.97\n")
    assert losses(recs) == [(10, 2.31), (20, 0.97)]
    assert recs[0].signals["grad_norm"] == 0.9


def test_full_width_json_with_several_dicts_on_one_line():
    line = ("{“epoch”：0.19，“grad_norm”：0.39，“loss”：2.29，“step”：1000}，"
            "{“epoch”：0.39，“grad_norm”：NaN，“loss”：5661.3，“step”：2000}\n")
    recs = parse(line)
    assert losses(recs) == [(1000, 2.29), (2000, 5661.3)]
    assert math.isnan(recs[1].signals["grad_norm"])


def test_bare_loss_tensors_from_print_loss_are_ordinal_steps():
    recs = parse("tensor(3.2207, device='cuda:0')\ntensor(nan, device='cuda:0')\n")
    assert [r.step for r in recs] == [1, 2] and all(r.step_is_ordinal for r in recs)
    assert recs[0].signals["loss"] == 3.2207 and math.isnan(recs[1].signals["loss"])


def test_a_step_block_of_name_value_lines_becomes_one_record_per_step():
    text = ("step 1 token 5m\ntrain/loss 5.5021\ntrain/grad_norm 249.48\ntrain/learning_rate 0.0000\n"
            "train/per_length_loss/loss@2 4.88\n\nstep 50 token 250m\ntrain/loss 2.2328\ntrain/grad_norm 12.6\n")
    recs = parse(text)
    assert [(r.step, r.signals) for r in recs] == [
        (1, {"loss": 5.5021, "grad_norm": 249.48, "lr": 0.0}), (50, {"loss": 2.2328, "grad_norm": 12.6})]


def test_tqdm_postfix_glued_to_the_next_print_is_two_records():
    recs = parse("10/1000 [00:32<53:42,  3.25s/it, Loss=3.4376, LR=1.00e-04]Iter 20: Train loss 3.142, "
                 "Learning Rate 1.000e-04, It/sec 0.283\n{'Step': 20, 'Loss': '3.1416', 'Learning Rate': '1.00e-04'}\n")
    assert losses(recs) == [(10, 3.4376), (20, 3.142)]
    assert recs[1].signals["lr"] == 1e-04


def test_eval_names_become_eval_records_and_rl_names_their_own_signals():
    recs = parse("{'loss': 0.0, 'grad_norm': 1.67, 'reward': 1.28, 'reward_std': 0.80, 'kl': 0.0004, "
                 "'rewards/accuracy_reward': 0.64, 'frac_reward_zero_std': 0.0, 'epoch': 0.04}\n"
                 "Validation: val_loss=2.10 epoch=0\n")
    assert recs[0].signals == {"loss": 0.0, "grad_norm": 1.67, "reward": 1.28, "reward_std": 0.8, "kl": 0.0004,
                               "frac_reward_zero_std": 0.0, "epoch": 0.04}
    assert recs[1].kind == EVAL and recs[1].signals["eval_loss"] == 2.1


def test_prose_that_names_loss_without_a_value_is_no_record():
    assert parse("the loss went down nicely\nReducing dynamic loss scale from 1024 to 512\n") == []
    # At DeepSpeed's floor the same line is an event (the scale cannot fall further), still no metric record.
    assert [(r.kind, r.event) for r in parse("Reducing dynamic loss scale from 1 to 1\n")] == \
        [("event", "scale-at-minimum")]


def test_deepspeed_step_line_gives_the_dicts_their_steps_and_merges_with_them():
    text = "".join(f"{{'loss': {2 - s / 100}, 'learning_rate': 1e-05}}\n"
                   f"[Rank 0] step={s}, skipped=0, lr=[1e-05, 1e-05], mom=[(0.9, 0.999)]\n" for s in (10, 20, 30))
    recs = parse(text)
    assert [(r.step, r.step_is_ordinal, sorted(r.signals)) for r in recs] == [
        (s, False, ["loss", "lr", "skipped_steps"]) for s in (10, 20, 30)]


def test_step_line_before_node_duplicated_quoted_dicts_is_one_record_per_step():
    text = "".join(f"[Rank 0] step={s}, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]\n"
                   f"10.0.0.1: {{'loss': '{s / 10}', 'grad_norm': '0.9', 'learning_rate': '1e-05', 'epoch': '0.1'}}\n"
                   f"10.0.0.2: {{'loss': '{s / 10}', 'grad_norm': '0.9', 'learning_rate': '1e-05', 'epoch': '0.1'}}\n"
                   for s in (1, 2, 3))
    assert losses(parse(text)) == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_trainer_state_cut_mid_file_under_any_name(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text('{\n  "global_step": 30,\n  "log_history": [\n    {"loss": 1.5, "step": 10},\n'
                   '    {"eval_loss": 1.2, "step": 10},\n    {"loss": 1.4, "step": 20},\n    {"loss": 1.')
    recs = list(records(discover([str(log)])))
    assert [(r.kind, r.step) for r in recs] == [(TRAIN, 10), (EVAL, 10), (TRAIN, 20)]


def test_a_printed_loss_tensor_behind_a_launcher_logger_or_paste_prefix_is_the_loss():
    prefixes = ("", "[rank0]:", "[default0]:", "0: ", "10.0.0.1: ", "node-3: ", "> ",
                "2024-05-01 10:00:00,123 - INFO - ")
    for prefix in prefixes:
        recs = parse(f"{prefix}tensor(3.2207, device='cuda:0')\n{prefix}tensor(nan, device='cuda:0')\n")
        assert [r.signals["loss"] for r in recs][0] == 3.2207 and math.isnan(recs[1].signals["loss"]), prefix


def test_a_tensor_after_a_name_that_is_no_loss_stays_no_loss():
    # `reward: tensor(...)` is a reward, `advantages tensor(...)` nothing the reader knows: neither is a loss.
    assert all("loss" not in r.signals for r in parse("reward: tensor(0.5)\nadvantages tensor(0.3)\n"))


def test_a_copy_of_a_line_in_a_step_block_is_no_later_step():
    # Every metric line printed twice (each node's copy, with or without its host prefix): still one step.
    block = "step 1 token 5m\ntrain/loss 5.5\ntrain/learning_rate 0.0000\nstep 50 token 250m\ntrain/loss 2.2\n"
    for first, second in (("", ""), ("10.0.0.1: ", "10.0.0.2: ")):
        doubled = "".join(f"{first}{line}\n{second}{line}\n" for line in block.splitlines())
        assert losses(parse(doubled)) == [(1, 5.5), (50, 2.2)]


def test_a_new_value_of_a_name_in_a_step_block_is_still_the_next_step():
    # The copy rule takes only repeats of the same value: a second, different loss is a later step.
    assert losses(parse("step 1 token 5m\ntrain/loss 5.5\ntrain/loss 5.1\n")) == [(1, 5.5), (2, 5.1)]


def test_lightning_prints_a_nan_metric_as_nan_dot_0_and_it_is_read_as_nan():
    import math

    from lossguard.sources.readers.generic import read_line

    (segment,) = read_line(b"Epoch 0:  28%|##  | 11/40 [00:00<00:01, 17.97it/s, train_loss=nan.0, v_num=0]")
    assert math.isnan(segment.signals["loss"])
    (segment,) = read_line(b"step 3 loss=-inf.0 lr=0.1")
    assert segment.signals["loss"] == -math.inf


def test_of_a_bars_redraws_at_one_count_the_last_holds_that_batchs_values():
    from lossguard.sources.readers.generic import read_line

    line = (b"\rEpoch 0:  25%|#  | 10/40 [00:00<00:01, 18.03it/s, train_loss=5.930]"
            b"\rEpoch 0:  25%|#  | 10/40 [00:00<00:01, 18.02it/s, train_loss=3.990]"
            b"\rEpoch 0:  28%|#  | 11/40 [00:00<00:01, 17.97it/s, train_loss=3.990]"
            b"\rEpoch 0:  28%|#  | 11/40 [00:00<00:01, 17.97it/s, train_loss=nan.0]")
    assert [(s.counter[0], s.signals["loss"]) for s in read_line(line)][:1] == [(10, 3.99)]
    assert len(read_line(line)) == 2


def test_a_last_epoch_cut_short_by_a_step_limit_keeps_its_steps():
    """Lightning with max_steps 20 and 16 batches an epoch: epoch 1's bar counts to 4, and its batch 2 is
    step 18, not 1 * 4 + 2."""
    from lossguard.sources.text_log import parse_lines

    lines = [b"Epoch 0: 100%%|###| %d/16 [00:01<00:00, 10it/s, train_loss=%.3f]" % (i, 4 - i / 10)
             for i in range(1, 17)]
    lines += [b"Epoch 1: 50%%|###| %d/4 [00:01<00:00, 10it/s, train_loss=%s]" % (i, b"nan.0" if i == 2 else b"2.0")
              for i in range(1, 5)]
    steps = [(r.step, r.signals["loss"]) for r in parse_lines(lines) if r.kind == "train"]
    assert [s for s, _ in steps][-4:] == [17, 18, 19, 20]
    assert next(s for s, v in steps if v != v) == 18
