"""Every framework's console output (issue 31): each format's death reads broken at its onset, and a healthy run
in the same format reads healthy (the twin). The samples are written line for line in each tool's own shape;
the run's numbers come from one small builder per format, so a twin differs from its death only in the fault.
"""

from __future__ import annotations

import pytest

from lossguard.api import analyze

GOOD = [2.31, 2.05, 1.87, 1.74, 1.66, 1.59, 1.53, 1.49, 1.45, 1.42, 1.40, 1.38, 1.36, 1.35, 1.34, 1.33]


def _loss(index: int, nan_from: int | None, spelling: str = "nan") -> str:
    return spelling if nan_from is not None and index >= nan_from else f"{GOOD[index % len(GOOD)]:.4f}"


# -- Megatron-LM: the loss field vanishes when its interval average is NaN (bf16: no NaN check) ----------------

def megatron(nan_from: int | None, grad_norm: str = "1.234") -> str:
    lines = []
    for i in range(12):
        loss = "" if nan_from is not None and i >= nan_from else f" lm loss: {GOOD[i]:.6E} |"
        lines.append(f" [2024-05-12 10:23:{i:02d}] iteration      {10 * (i + 1):>3d}/    1000 | consumed samples:"
                     f"        {320 * (i + 1)} | elapsed time per iteration (ms): 1234.5 | learning rate: "
                     f"1.000000E-05 | global batch size:    32 |{loss} loss scale: 1.0 | grad norm: {grad_norm} | "
                     f"number of skipped iterations:   0 | number of nan iterations:   0 |")
    return "\n".join(lines) + "\n"


# -- Keras model.fit: `Epoch e/E`, then the bar; the `i/N` counter restarts each epoch, the epoch is the step ---

def keras2(nan_from: int | None, spelling: str = "nan") -> str:
    out = []
    for e in range(10):
        loss = _loss(e, nan_from, spelling)
        out += [f"Epoch {e + 1}/10", f"1875/1875 [==============================] - 5s 3ms/step - loss: {loss} - "
                f"accuracy: 0.{91 + e // 3:02d}87 - val_loss: {loss} - val_accuracy: 0.9012"]
    return "\n".join(out) + "\n"


def keras3(nan_from: int | None) -> str:
    # As a terminal prints it, colour codes kept.
    bar = "\x1b[32m" + "\u2501" * 20 + "\x1b[0m\x1b[37m\x1b[0m"
    out = []
    for e in range(10):
        out += [f"Epoch {e + 1}/10", f"\x1b[1m1875/1875\x1b[0m {bar} \x1b[1m5s\x1b[0m 3ms/step - accuracy: 0.9187 "
                f"- loss: {_loss(e, nan_from)}"]
    return "\n".join(out) + "\n"


def keras_mid_epoch(nan_from: int | None) -> str:
    # Bars caught mid-epoch, as pasted from a notebook cell that printed each redraw on a line.
    out = []
    for e in range(3):
        out.append(f"Epoch {e + 1}/3")
        for i in range(5):
            n = 60 * (i + 1)
            bar = "[" + "=" * (i * 6) + ">" + "." * (29 - i * 6) + "]"
            out.append(f"{n:>3d}/300 {bar} - ETA: {4 - i}s - loss: {_loss(5 * e + i, nan_from)}")
    return "\n".join(out) + "\n"


# -- darknet: ` N: loss, avg avg loss, lr rate, ...`; region lines read `-nan` on empty layers in healthy runs --

def darknet(nan_from: int | None, spelling: str = "-nan") -> str:
    out = []
    for i in range(14):
        loss = _loss(i, nan_from, spelling)
        avg = spelling if loss == spelling else f"{GOOD[i] + 0.1:.6f}"
        out += ["v3 (mse loss, Normalizer: (iou: 0.75, cls: 1.00) Region 82 Avg (IOU: 0.512345, GIOU: 0.498765), "
                "Class: 0.623451, Obj: 0.412345, No Obj: 0.004512, .5R: 0.500000, .75R: 0.125000, count: 8, "
                "class_loss = 1.234567, iou_loss = 0.765432, total_loss = 2.000000",
                "v3 (mse loss, Normalizer: (iou: 0.75, cls: 1.00) Region 106 Avg (IOU: -nan, GIOU: -nan), "
                "Class: -nan, Obj: -nan, No Obj: 0.000123, .5R: -nan, .75R: -nan, count: 0, "
                "class_loss = 0.000000, iou_loss = 0.000000, total_loss = 0.000000",
                f" {100 * (i + 1)}: {loss}, {avg} avg loss, 0.001000 rate, 3.215000 seconds, {6400 * (i + 1)} images, "
                f"{12.3 - i / 10:.1f} hours left"]
    return "\n".join(out) + "\n"


# -- Chainer's PrintReport: a whitespace table read by its header, one row per epoch (the epoch is the step) -----

def chainer(nan_from: int | None) -> str:
    out = ["epoch       main/loss   validation/main/loss  main/accuracy  validation/main/accuracy  elapsed_time"]
    for e in range(10):
        loss = _loss(e, nan_from)
        val = loss if loss == "nan" else f"{GOOD[e] + 0.05:.4f}"
        out.append(f"{e + 1:<12d}{loss:<12s}{val:<22s}{0.8 + e / 100:<15.4f}{0.79 + e / 100:<26.4f}{5.1 * (e + 1):.4f}")
    return "\n".join(out) + "\n"


# -- Lines whose step is an epoch's counter placed after the epochs before it -----------------------------------

def mmcv(nan_from: int | None) -> str:
    return "".join(
        f"2023-05-12 10:23:45,123 - mmdet - INFO - Epoch [{e + 1}][{50 * (i + 1)}/400]\tlr: 1.000e-02, eta: 1:23:45, "
        f"time: 0.345, data_time: 0.012, memory: 3456, loss_cls: 0.5012, loss_bbox: 0.3123, "
        f"loss: {_loss(8 * e + i, nan_from)}, grad_norm: 12.3456\n" for e in range(2) for i in range(8))


def timm(nan_from: int | None) -> str:
    lines = []
    for e in range(2):
        for i in range(6):
            loss = _loss(6 * e + i, nan_from)
            lines.append(f"Train: {e} [{250 * i:>4d}/1251 ({20 * i:>3d}%)]  Loss: {loss} ({loss})  Time: 0.312s,  "
                         f"820.51/s  (0.320s,  800.12/s)  LR: 1.000e-05  Data: 0.012 (0.015)")
        lines.append(f"Test: [  48/48]  Time: 0.105 (0.210)  Loss:  0.8214 ({_loss(6 * e + 5, nan_from)})  "
                     f"Acc@1: 81.2500 (75.1230)  Acc@5: 93.7500 (92.4560)")
    return "\n".join(lines) + "\n"


# -- Lines that name their step (already read by the generic reader and the JSON / CSV sources) ----------------

def caffe(nan_from: int | None, spelling: str = "-nan") -> str:
    lines = []
    for i in range(12):
        loss, t = _loss(i, nan_from, spelling), f"10:23:{i:02d}"
        lines += [f"I0512 {t}.123456 12345 solver.cpp:218] Iteration {100 * i} (2.3 iter/s, 43.4783s/100 iters), "
                  f"loss = {loss}",
                  f"I0512 {t}.123470 12345 solver.cpp:237]     Train net output #0: loss = {loss} (* 1 = {loss} loss)",
                  f"I0512 {t}.123480 12345 sgd_solver.cpp:105] Iteration {100 * i}, lr = 0.01"]
    return "\n".join(lines) + "\n"


def ppocr(nan_from: int | None) -> str:
    return "".join(
        f"[2023/05/12 10:23:45] ppocr INFO: epoch: [{1 + i // 6}/500], global_step: {10 * (i + 1)}, lr: 0.001000, "
        f"loss: {_loss(i, nan_from)}, loss_shrink_maps: 1.234567, avg_reader_cost: 0.01234 s, avg_batch_cost: "
        f"0.34567 s, avg_samples: 8.0, ips: 23.14348 samples/s, eta: 1 day, 2:03:04\n" for i in range(12))


def tf_estimator(nan_from: int | None, spelling: str = "nan") -> str:
    lines = []
    for i in range(12):
        lines += [f"INFO:tensorflow:loss = {_loss(i, nan_from, spelling)}, step = {100 * i} (12.345 sec)",
                  "INFO:tensorflow:global_step/sec: 8.10047"]
    return "\n".join(lines) + "\n"


def lightning_csv(nan_from: int | None, spelling: str = "nan") -> str:
    # CSVLogger's metrics.csv: sparse rows, the validation's on rows of their own.
    rows = ["epoch,step,train_loss,val_loss,lr-AdamW"]
    for i in range(12):
        rows.append(f"{i // 4},{50 * i + 49},{_loss(i, nan_from, spelling)},,1e-05")
        if i % 4 == 3:
            rows.append(f"{i // 4},{50 * i + 49},,{_loss(i, nan_from, spelling)},")
    return "\n".join(rows) + "\n"


def swift_jsonl(nan_from: int | None, spelling: str = "NaN") -> str:
    return "".join(
        f'{{"loss": {_loss(i, nan_from, spelling)}, "grad_norm": 0.51234, "learning_rate": 1e-05, "memory(GiB)": 20.1, '
        f'"train_speed(iter/s)": 0.312, "epoch": {(i + 1) / 12:.2f}, "global_step/max_steps": "{i + 1}/12", '
        f'"percentage": "{100 * (i + 1) // 12}%", "elapsed_time": "{i}m", "remaining_time": "{12 - i}m"}}\n'
        for i in range(12))


def kohya(nan_from: int | None) -> str:
    # A file the bar wrote to: its redraws joined by carriage returns; the tqdm counter is the step.
    def avr_loss(i: int) -> str:  # a moving average: it moves a little every step
        return "nan" if nan_from is not None and i >= nan_from else f"{0.1 + 0.05 * 0.99 ** i + 0.002 * (i % 3):.4g}"

    return "\r".join(f"steps:  {i * 100 // 600:>2d}%|{'█' * (i // 60):<10s}| {i}/600 [00:{i // 10:02d}<01:23,  "
                      f"1.20it/s, avr_loss={avr_loss(i)}]" for i in range(1, 241)) + "\n"


def dllogger(nan_from: int | None) -> str:
    # NVIDIA DLLogger's stdout backend: the iteration counter restarts each epoch (10 logs of 100 iterations).
    return "".join(f"DLL 2023-05-12 10:23:{i % 60:02d}.123456 - Epoch: {i // 10} Iteration: {100 * (i % 10 + 1)}  "
                   f"train.loss : {'nan' if nan_from is not None and i >= nan_from else f'{2.3 * 0.97 ** i:.4f}'}  "
                   f"train.lr : 0.001\n" for i in range(30))


CASES = {
    "dllogger_nan_in_epoch_1": (dllogger(15), "dllogger.log", "broken", 1000 + 600),
    "dllogger_healthy": (dllogger(None), "dllogger.log", "healthy", None),
    # name: (log text, file name, verdict, onset step or None)
    "megatron_loss_vanishes": (megatron(6), "train.log", "broken", 70),
    "megatron_healthy": (megatron(None), "train.log", "healthy", None),
    "keras2_nan_from_epoch_4": (keras2(3), "fit.log", "broken", 4),
    "keras2_inf_from_epoch_6": (keras2(5, "inf"), "fit.log", "broken", 6),
    "keras2_healthy": (keras2(None), "fit.log", "healthy", None),
    "keras3_nan_from_epoch_4": (keras3(3), "fit.log", "broken", 4),
    "keras3_healthy": (keras3(None), "fit.log", "healthy", None),
    "keras_mid_epoch_nan_in_epoch_2": (keras_mid_epoch(7), "fit.log", "broken", 300 + 180),
    "keras_mid_epoch_healthy": (keras_mid_epoch(None), "fit.log", "healthy", None),
    "darknet_nan_from_800": (darknet(7), "train.log", "broken", 800),
    "darknet_windows_nan_ind": (darknet(9, "-nan(ind)"), "train.log", "broken", 1000),
    "darknet_healthy_with_empty_layers": (darknet(None), "train.log", "healthy", None),
    "chainer_nan_from_epoch_5": (chainer(4), "log.txt", "broken", 5),
    "chainer_healthy": (chainer(None), "log.txt", "healthy", None),
    "mmcv_nan_in_epoch_2": (mmcv(11), "20230512_102345.log", "broken", 400 + 200),
    "mmcv_healthy": (mmcv(None), "20230512_102345.log", "healthy", None),
    "timm_nan_in_epoch_1": (timm(8), "output.log", "broken", 1251 + 500),
    "timm_healthy": (timm(None), "output.log", "healthy", None),
    "caffe_minus_nan_from_700": (caffe(7), "caffe.INFO", "broken", 700),
    "caffe_inf": (caffe(7, "inf"), "caffe.INFO", "broken", 700),
    "caffe_healthy": (caffe(None), "caffe.INFO", "healthy", None),
    "ppocr_nan_from_step_80": (ppocr(7), "train.log", "broken", 80),
    "ppocr_healthy": (ppocr(None), "train.log", "healthy", None),
    "tf_estimator_nan_from_700": (tf_estimator(7), "train.log", "broken", 700),
    "tf_estimator_inf": (tf_estimator(7, "inf"), "train.log", "broken", 700),
    "tf_estimator_healthy": (tf_estimator(None), "train.log", "healthy", None),
    "lightning_metrics_csv_nan": (lightning_csv(6), "metrics.csv", "broken", 349),
    "lightning_metrics_csv_minus_inf": (lightning_csv(6, "-inf"), "metrics.csv", "broken", 349),
    "lightning_metrics_csv_healthy": (lightning_csv(None), "metrics.csv", "healthy", None),
    "swift_logging_jsonl_nan": (swift_jsonl(6), "logging.jsonl", "broken", 7),
    "swift_logging_jsonl_infinity": (swift_jsonl(6, "Infinity"), "logging.jsonl", "broken", 7),
    "swift_logging_jsonl_healthy": (swift_jsonl(None), "logging.jsonl", "healthy", None),
    "kohya_tqdm_avr_loss_nan": (kohya(120), "train.log", "broken", 120),
    "kohya_tqdm_healthy": (kohya(None), "train.log", "healthy", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_framework_console_verdict_and_onset(name, tmp_path):
    text, file_name, verdict, onset = CASES[name]
    path = tmp_path / file_name
    path.write_text(text, encoding="utf-8")
    d = analyze([path])
    assert d.verdict == verdict, (d.verdict, d.signature, d.onset_step)
    if verdict == "broken":
        assert (d.signature, d.onset_step) == ("nonfinite", onset)


def test_a_megatron_interval_whose_iterations_were_all_skipped_is_no_nan(tmp_path):
    # fp16: every iteration of the interval skipped also drops the loss field; the skip count explains it.
    text = megatron(None).splitlines()
    skipped = text[6].replace(f" lm loss: {GOOD[6]:.6E} |", "").replace("iterations:   0 | number of nan",
                                                                          "iterations:  10 | number of nan")
    path = tmp_path / "train.log"
    path.write_text("\n".join(text[:6] + [skipped] + text[7:]) + "\n", encoding="utf-8")
    assert analyze([path]).signature != "nonfinite"
