"""A non-finite gradient norm on a step the log itself counts as applied is a death, at once: Megatron-LM
prints the interval's `number of skipped iterations`, and a 0 beside `grad norm: nan` (bf16, loss scale 1.0:
no scaler to skip it) means the NaN update reached the weights. Its healthy twin is the fp16 run whose
interval counts the skip: the scaler dropped that step, and training goes on."""

from lossguard.api import analyze

LINE = (" iteration {it:>8d}/ 1000 | consumed samples: {s:>10d} | elapsed time per iteration (ms): 2208.9 | "
        "learning rate: 3.000E-04 | global batch size:     8 | lm loss: {loss:.6E} | loss scale: {scale} | "
        "grad norm: {grad} | number of skipped iterations: {skipped:3d} | number of nan iterations: {nans:3d} |")


def _log(tmp_path, rows):
    log = tmp_path / "train.log"
    log.write_text("".join(LINE.format(it=it, s=8 * it, **row) + "\n" for it, row in rows))
    return analyze([str(log)]).to_dict()


def _loss(i):
    return 9.0 * 0.93 ** i + 2.0


def test_a_nan_norm_on_an_applied_bf16_step_is_broken_at_that_step(tmp_path):
    rows = [(10 * i, dict(loss=_loss(i), scale="1.0", grad=f"{1.5 - 0.01 * i:.3f}", skipped=0, nans=0))
            for i in range(1, 6)]
    rows.append((60, dict(loss=_loss(6), scale="1.0", grad="nan", skipped=0, nans=0)))
    result = _log(tmp_path, rows)
    assert (result["verdict"], result["signature"], result["onset_step"]) == ("broken", "nonfinite", 60)


def test_twin_a_nan_norm_on_a_step_the_fp16_scaler_skipped_is_no_death(tmp_path):
    rows = [(10 * i, dict(loss=_loss(i), scale="65536.0", grad=f"{1.5 - 0.01 * i:.3f}", skipped=0, nans=0))
            for i in range(1, 6)]
    rows.append((60, dict(loss=_loss(6), scale="32768.0", grad="nan", skipped=1, nans=0)))
    rows += [(10 * i, dict(loss=_loss(i), scale="32768.0", grad=f"{1.5 - 0.01 * i:.3f}", skipped=0, nans=0))
             for i in range(7, 20)]
    result = _log(tmp_path, rows)
    assert result["verdict"] in ("healthy", "warning"), (result["verdict"], result["signature"])
