import io
import random
import shutil

import pytest

from lossguard.core.records import EVAL, EVENT, TRAIN
from lossguard.sources.scan import iter_lines
from lossguard.sources.text_log import parse_lines, parse_stream


def parse(text: str):
    return list(parse_stream(io.BytesIO(text.encode()), "t.log"))


def test_hf5_quoted_strings_inside_tqdm_line_take_the_tqdm_step():
    line = " 10%|#  | 10/100 [00:01<00:09,  9.5it/s]{'loss': '4.714', 'grad_norm': '0.9681', " \
           "'learning_rate': '0.0008', 'epoch': '0.1562'}\n"
    (record,) = parse(line)
    assert record.kind == TRAIN and record.step == 10 and not record.step_is_ordinal
    assert record.signals == {"loss": 4.714, "grad_norm": 0.9681, "lr": 0.0008, "epoch": 0.1562}


def test_carriage_return_progress_segments_before_the_dict():
    line = "  1/4 [00:00<?]\r  2/4 [00:01<00:01]\r  3/4 [00:02<00:00]{'loss': '0', 'grad_norm': '0'}\n"
    (record,) = parse(line)
    assert record.step == 3 and record.signals["loss"] == 0.0


def test_hf4_numeric_nan_and_tensor_repr():
    (a, b) = parse("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.02}\n"
                   "{'loss': 1.5, 'grad_norm': tensor(1.4142, device='cuda:0'), 'learning_rate': 1e-05}\n")
    assert a.signals["grad_norm"] != a.signals["grad_norm"]  # nan
    assert b.signals["grad_norm"] == 1.4142
    assert a.step_is_ordinal and (a.step, b.step) == (1, 2)


def test_multinode_duplicates_are_dropped_and_host_prefix_ignored():
    text = ("10.0.0.4: {'loss': 1.9, 'epoch': 0.1}\n10.0.0.5: {'loss': 1.9, 'epoch': 0.1}\n"
            "10.0.0.4: {'loss': 1.7, 'epoch': 0.2}\n10.0.0.5: {'loss': 1.7, 'epoch': 0.2}\n")
    records = parse(text)
    assert [r.signals["loss"] for r in records] == [1.9, 1.7]


def test_eval_and_summary_dicts():
    records = parse("{'loss': 2.0, 'epoch': 1.0}\n{'eval_loss': nan, 'eval_runtime': 1.0, 'epoch': 1.0}\n"
                    "{'train_runtime': 10.0, 'train_loss': 1.2, 'epoch': 1.0}\n")
    assert [r.kind for r in records] == [TRAIN, EVAL, EVENT]
    assert records[1].step == records[0].step
    assert records[2].event == "train-summary"


def test_deepspeed_overflow_old_and_new_prefix_and_minimum():
    records = parse(
        "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        "[INFO] [deepspeed] OVERFLOW! Rank 1 Skipping step.\n"
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n")
    assert [r.event for r in records] == ["overflow", "overflow", "scale-at-minimum"]
    assert records[0].data == {"rank": 0, "attempted_scale": 65536.0, "new_scale": 32768.0}
    assert records[1].data["attempted_scale"] is None


def test_deepspeed_step_line_and_config_dump_facts():
    records = parse(
        "[Rank 0] DeepSpeed info: version=0.12.6, git-hash=unknown, git-branch=unknown\n"
        "[INFO] [config.py:988:print]   zero_config .................. stage=2 overlap_comm=True "
        "reduce_bucket_size=200000000 use_multi_rank_bucket_allreduce=True\n"
        "[INFO] [config.py:988:print]   communication_data_type ...... torch.float32\n"
        "[INFO] [config.py:988:print]   bfloat16_config .............. enabled=True check_grad_overflow=False\n"
        "[INFO] [logging.py:107:log_dist] [Rank 0] step=20, skipped=3, lr=[1e-05, 1e-05], mom=[(0.9, 0.95)]\n")
    facts = {}
    for record in records[:-1]:
        facts.update(record.data)
    assert facts == {"deepspeed_version": "0.12.6", "zero_stage": 2, "overlap_comm": True,
                     "reduce_bucket_size": 200000000, "use_multi_rank_bucket_allreduce": True,
                     "communication_data_type": "fp32", "bf16": True, "check_grad_overflow": False}
    assert records[-1].step == 20 and records[-1].signals == {"skipped_steps": 3.0, "lr": 1e-05}


def test_warnings_become_events():
    text = ("WARNING: tokenization mismatch: 654 vs. 643. #turn = 25. (ignored)\n"
            "UserWarning: None of the inputs have requires_grad=True. Gradients will be None\n"
            "tried to get lr value before scheduler/optimizer started stepping, returning lr=0\n"
            "Could not find response key `### Response:` in the following instance: ...\n"
            "***** Number of trainable parameters = 0\n")
    events = [(r.event, r.data) for r in parse(text)]
    assert events == [("tokenization-mismatch", {"got": 654, "expected": 643}), ("no-input-grad", {}),
                      ("lr-before-step", {}), ("response-key-missing", {}), ("trainable-params", {"count": 0})]


def test_megatron_and_mmengine_lines():
    megatron = (" iteration      100/    1000 | learning rate: 1.000E-04 | lm loss: 2.345E+00 | "
                "loss scale: 65536.0 | grad norm: 1.234 | number of skipped iterations:   2 |\n")
    (m,) = parse(megatron)
    assert m.step == 100 and m.signals == {"lr": 1e-4, "loss": 2.345, "loss_scale": 65536.0,
                                           "grad_norm": 1.234, "skipped_steps": 2.0}
    (mm,) = parse("mmengine - INFO - Epoch(train)  [2][ 10/500]  lr: 1.0000e-04  grad_norm: 1.23  loss: 2.3456\n")
    assert mm.step == 510 and mm.signals == {"lr": 1e-4, "grad_norm": 1.23, "loss": 2.3456}


def test_unrelated_dicts_and_junk_are_ignored():
    assert parse("{'localhost': [0, 1]}\n\x00\x01binary junk\n{'loss': \n") == []


def test_chunk_boundaries_do_not_lose_or_split_lines(monkeypatch):
    import lossguard.sources.scan as scan

    monkeypatch.setattr(scan, "CHUNK_BYTES", 7)
    body = "".join(f"noise line {i}\n{{'loss': {i + 1}.5, 'epoch': {i}}}\n" for i in range(50))
    lines = list(iter_lines(io.BytesIO(body.encode())))
    assert [n for n, _ in lines] == list(range(2, 101, 2))
    assert [r.signals["loss"] for r in parse_lines(line for _, line in lines)] == [i + 1.5 for i in range(50)]


def test_last_line_without_newline_is_read():
    (record,) = parse("{'loss': 1.0, 'epoch': 0.1}")
    assert record.signals["loss"] == 1.0


def test_plain_script_lines_with_rank_prefix_and_nanogpt_iters():
    records = parse("[rank1]: step 3 loss 4.12806 grad_norm None param_sum 160.657959\n"
                    "step 6 loss 3.21 grad_norm 1.70\n"
                    "iter 100: loss 2.3456, time 12.3ms, mfu 4.10%\n"
                    "Skipping step 5 because of something\n")
    assert [(r.rank, r.step, r.signals) for r in records] == [
        (1, 3, {"loss": 4.12806, "param_fingerprint": 160.657959}),
        (None, 6, {"loss": 3.21, "grad_norm": 1.70}),
        (None, 100, {"loss": 2.3456}),
    ]


def test_tqdm_counter_that_lags_behind_the_log_is_corrected():
    text = ("  1/20 [00:00<00:02]\r{'loss': '4.19', 'epoch': '0.125'}\n"
            "  1/20 [00:00<00:02]\r{'loss': '4.18', 'epoch': '0.25'}\n"
            "  2/20 [00:00<00:02]\r  3/20 [00:00<00:01]\r{'loss': '4.13', 'epoch': '0.375'}\n")
    assert [r.step for r in parse(text)] == [1, 2, 3]


def _dict_lines():
    """Log-dict lines from every committed text fixture, and made-up ones in every shape the key
    regex has to get right: spacing, quoting, NaN/Inf, tensor reprs, stray quotes, missing keys."""
    from tests.conftest import FIXTURES

    lines = [line for path in sorted(FIXTURES.rglob("*.log"))
             for line in path.read_bytes().splitlines() if b"{'" in line or b'{"' in line]
    rng = random.Random(3)
    values = [b"1.5", b"'1.5'", b'"2.5"', b"nan", b"'nan'", b"inf", b"-inf", b"1e-05", b" 0.0 ", b"'1.5'7",
              b"tensor(1.4142, device='cuda:0')", b"'abc'", b"", b"'", b"12", b"0.5'", b"''", b'""', b"'2}'", b"'{1'"]
    keys = [b"loss", b"grad_norm", b"learning_rate", b"epoch", b"eval_loss", b"step", b"note", b"train_runtime"]
    for _ in range(3000):
        chosen = rng.sample(keys[:4], rng.randrange(1, 5)) if rng.random() < 0.8 else rng.sample(keys, 3)
        quote = rng.choice((b"'", b'"'))
        sep, colon = rng.choice((b", ", b",", b" , ")), rng.choice((b": ", b":", b" :  "))
        body = sep.join(quote + k + quote + colon + rng.choice(values) for k in chosen)
        lines.append(rng.choice((b"", b" 10%|#  | 10/100 [00:01<00:09]", b"10.0.0.4: ")) + b"{" + body + b"}")
    return lines


def test_an_empty_quoted_value_in_a_learned_layout_is_no_value():
    # transformers 5 prints values as strings; an empty one, read through a learned shape, once raised
    # IndexError out of analyze.
    records = parse("{'loss': '', 'grad_norm': '1.0'}\n{'loss': '', 'grad_norm': '2.0'}\n"
                    "{'loss': '2.5', 'grad_norm': ''}\n")
    assert [r.signals for r in records] == [{"grad_norm": 1.0}, {"grad_norm": 2.0}, {"loss": 2.5}]


def test_a_brace_inside_a_quoted_value_is_read_as_the_dict_search_reads_it(monkeypatch):
    """A line that is one dict in a learned shape is read without searching for the dict, unless a brace
    inside a value would make the search stop earlier (or start later): then it reads what the search reads."""
    from lossguard.sources.readers import log_dict

    lines = ["{'loss': '2.5', 'epoch': '0.1'}", "{'loss': '2.4', 'epoch': '0.2'}",
             "{'loss': '2}', 'epoch': '0.3'}", "{'loss': '{'2.2', 'epoch': '0.4'}",
             "{'loss': '2.1', 'epoch': '{0.5}'}", "{'loss': '2.0', 'epoch': '0.6'}",
             "{'loss': '1.9', 'epoch': \"0.7\"}", "{'loss': '1.8', 'epoch': \"{'0.8\"}"]
    learned = parse("\n".join(lines) + "\n")
    monkeypatch.setattr(log_dict, "_learn", lambda pairs, text: None)  # no dict read by a learned shape
    log_dict.forget_shapes()
    searched = parse("\n".join(lines) + "\n")
    assert [repr(r) for r in learned] == [repr(r) for r in searched]


def test_a_learned_key_layout_reads_every_dict_as_the_generic_parser_does(monkeypatch):
    from lossguard.sources.readers import log_dict

    lines = _dict_lines()
    log_dict.forget_shapes()  # the memo is the process's: start from what this log teaches it
    read_by_pairs = []
    pair_values = log_dict.pair_values
    monkeypatch.setattr(log_dict, "pair_values", lambda *args: read_by_pairs.append(1) or pair_values(*args))
    fast = list(parse_lines(lines))
    assert len(lines) - len(read_by_pairs) > 1000  # the learned shapes did read
    monkeypatch.setattr(log_dict, "pair_values", pair_values)
    monkeypatch.setattr(log_dict, "_learn", lambda pairs, text: None)  # never a learned shape: findall on every line
    log_dict.forget_shapes()
    generic = list(parse_lines(lines))
    assert len(fast) == len(generic) > 2500
    for a, b in zip(fast, generic):
        assert repr(a) == repr(b)  # repr: NaN == NaN


def _anchor_sample() -> tuple[list[bytes], list[bool]]:
    """Every fixture log's lines and 5,000 random ones, a third with an anchor (or its head) in them; and
    whether each holds an anchor string."""
    from lossguard.sources import patterns as P
    from tests.conftest import FIXTURES

    rng = random.Random(5)
    anchors = [a.encode() for a in P.ANCHOR_STRINGS]
    lines = [line for path in sorted(FIXTURES.rglob("*.log")) for line in path.read_bytes().splitlines()]
    alphabet = b"abcdeilnorstvw{}'\"_ .=(OVERFLWZ"
    for _ in range(5000):
        noise = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        if rng.random() < 0.3:  # an anchor, or an anchor cut short, somewhere in the line
            anchor = rng.choice(anchors)
            cut = anchor[: rng.randrange(1, len(anchor) + 1)]
            at = rng.randrange(0, len(noise) + 1)
            noise = noise[:at] + cut + noise[at:]
        lines.append(noise)
    held = [any(a in line for a in anchors) for line in lines]
    assert sum(held) > 1000
    return lines, held


def test_the_anchor_trie_finds_exactly_the_lines_that_hold_an_anchor_string():
    from lossguard.sources import patterns as P

    lines, held = _anchor_sample()
    assert [P.ANCHORS.search(line) is not None for line in lines] == held


@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep on this machine: the Python scan serves")
def test_grep_passes_exactly_the_lines_that_hold_an_anchor_string(tmp_path):
    """grep runs the anchors as one extended regex of escaped literals (`\\{'|...|\\[step=|...`): a missed
    escape would drop or add lines without any error."""
    from lossguard.sources.scan import iter_grep_lines

    lines, held = _anchor_sample()
    log = tmp_path / "mixed.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    passed = [number for number, _ in iter_grep_lines(log)]
    assert passed == [number for number, hit in enumerate(held, 1) if hit]


def test_colour_codes_around_names_and_numbers_are_read_through():
    # rich / loguru consoles: a code can split an anchor (`step `) and a name from its number.
    esc = "\x1b"
    records = parse(f"{esc}[1mstep{esc}[0m {esc}[32m5{esc}[0m {esc}[1mloss{esc}[0m {esc}[32m2.31{esc}[0m\n"
                    f"{{'{esc}[1mloss{esc}[0m': {esc}[31mnan{esc}[0m, 'epoch': 0.2}}\n")
    assert records[0].step == 5 and records[0].signals == {"loss": 2.31}
    assert records[1].signals["loss"] != records[1].signals["loss"]  # nan


def test_mmengine_fields_separated_by_a_tab():
    (record,) = parse(" - mmengine - INFO - Iter(train) [   10/23076]  lr:\t1.3e-07  time:\t11.78  loss:\tnan\n")
    assert record.step == 10 and record.signals["lr"] == 1.3e-07 and record.signals["loss"] != record.signals["loss"]




def test_a_bar_postfix_and_an_event_on_one_line_are_both_read(tmp_path):
    """A tqdm bar left open by `\\r` and a DeepSpeed OVERFLOW line printed after it share one line: the bar's
    postfix metrics are read as well as the event (a NaN loss there is the run's death, not calibration)."""
    from lossguard.api import analyze

    bar = "[Epoch 0 / Train]:   0%|          | {i}/8614 [00:00<1:03:35,  2.26it/s, loss={loss}, lr=2.5e-05]"
    event = ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {a}, reducing to {b}")
    lines = [bar.format(i=i, loss="265.25" if i == 1 else "nan") + event.format(a=2 ** (33 - i), b=2 ** (32 - i))
             for i in range(1, 6)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    result = analyze([str(log)])
    losses = [p[1] for (signal, _), line in result.result.series.series.items() if signal == "loss"
              for p in line.points]
    assert losses[0] == 265.25 and all(v != v for v in losses[1:]), losses
    assert result.verdict == "broken" and result.result.stats.events["overflow"] == 5
    # The twin: the scaler calibrates (three overflows with finite losses at start-up), then trains.
    calibrating = [line.replace("loss=nan", "loss=2.31").replace("loss=265.25", "loss=2.35") for line in lines[:3]]
    training = [bar.format(i=i, loss=f"{2.3 - 0.02 * i:.2f}") for i in range(4, 20)]
    healthy = tmp_path / "healthy.log"
    healthy.write_text("\n".join(calibrating + training) + "\n")
    assert analyze([str(healthy)]).verdict in ("healthy", "warning")
