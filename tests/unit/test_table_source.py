"""Tables of steps and values pasted as text: the names are in the header only."""

from __future__ import annotations

from lossguard.api import analyze


def _run(tmp_path, text: str):
    log = tmp_path / "pasted.txt"
    log.write_text(text)
    return analyze([log])


def test_a_markdown_table_going_to_zero_loss_and_zero_grad_norm_is_masked_labels(tmp_path):
    d = _run(tmp_path, "| step | loss   | lr      | grad_norm |\n|------|--------|---------|-----------|\n"
                       "| 10   | 2.412  | 1.0e-05 | 1.21      |\n| 20   | 2.301  | 1.0e-05 | 1.10      |\n"
                       "| 30   | 0.000  | 1.0e-05 | 0.00      |\n| 40   | 0.000  | 1.0e-05 | 0.00      |\n")
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "masked-labels", 30)


def test_the_trainers_notebook_table_reads_train_and_validation_loss(tmp_path):
    d = _run(tmp_path, "Step\tTraining Loss\tValidation Loss\n100\t2.4100\t2.5100\n200\t2.1000\t2.6000\n"
                       "300\t1.9000\tnan\n")
    assert d.verdict == "broken" and d.onset_step == 300
    assert d.result.stats.num_train == 3 and d.result.stats.num_eval == 3


def test_a_whitespace_table_of_a_healthy_run_is_healthy_at_its_steps(tmp_path):
    d = _run(tmp_path, "step loss lr\n10 2.41 1e-5\n20 2.30 1e-5\n30 2.20 1e-5\n")
    assert d.verdict == "healthy" and d.result.stats.num_train == 3
    assert (d.result.stats.first_step, d.result.stats.last_step) == (10, 30)


def test_a_log_whose_loss_lines_are_not_a_table_stays_a_text_log(tmp_path):
    d = _run(tmp_path, "loss went down\n{'loss': 2.3, 'learning_rate': 1e-5, 'epoch': 0.1}\n"
                       "{'loss': 0.0, 'learning_rate': 0.0, 'epoch': 0.2}\n")
    assert d.verdict == "broken"
