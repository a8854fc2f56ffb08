"""Documentation the tool can print: signature ids, detector codes, lint rules, supported formats."""

from __future__ import annotations

import inspect
import json

from lossguard.detectors import registered
from lossguard.diagnose.catalog import CAUSES
from lossguard.diagnose.signatures import SIGNATURES
from lossguard.knowledge import ISSUES, KnownIssue, get_issue

FORMATS = """\
Formats `lossguard analyze` reads (auto-detected per file; per line inside text logs, mixed allowed):
  - HF Trainer stdout: {'loss': 0.0, 'grad_norm': nan, ...} (4.x numbers) and {'loss': '4.714', ...}
    (5.x quoted strings), inside tqdm progress lines, with multi-node host prefixes (duplicates dropped),
    eval dicts and the final train_runtime dict; a dict the terminal wrapped over lines is joined; the
    `***** train metrics *****` / `***** eval metrics *****` blocks (train_loss there is the run's average,
    not a step's loss)
  - trainer_state.json (log_history, NaN literals), under any file name and when cut mid-file (the
    complete entries are read), also its `log_history` list pasted alone (pretty-printed or inside a
    ```json fence); output directories with checkpoint-*: every log of the directory is read
    and their numbers merged on the run's steps (a value one file shows NaN/Inf stays NaN/Inf); files,
    `-` (stdin), pipes and `<(cmd)` are each read once; lines longer than 64 KB are read by their first
    and last 32 KB (SRC001 says so)
  - DeepSpeed lines: OVERFLOW! ... Attempted loss scale, loss scale at minimum, step=N, skipped=M, lr=[...],
    the config dump (version, zero_config, bf16/fp16, communication_data_type, world size)
  - warnings: tokenization mismatch, lr before scheduler stepped, None of the inputs have requires_grad,
    Could not find response key, Number of trainable parameters, InternVL image-token mismatch
  - TensorBoard event files (the tensorboard package's loader)
  - MLflow runs: an mlruns/ file store, one of its run directories, or the SQLite store mlflow.db (read as
    files and tables, without mlflow; NaN / Inf restored); mlflow.db#RUN reads the run of that id or name
  - W&B runs: wandb/, an offline-run-*/ directory or its run-<id>.wandb (wandb's own reader: the wandb
    extra); HF's train/loss, train/grad_norm, train/learning_rate, eval/loss on train/global_step.
    A store of several runs: the latest started is read and named on stderr
  - LLaMA-Factory trainer_log.jsonl, ms-swift logging.jsonl (its `global_step/max_steps` step), generic
    JSONL / CSV with a step column (Lightning's CSVLogger metrics.csv, its sparse rows too), and
    TensorBoard's CSV download of one scalar (Wall time,Step,Value; the signal from the tag in its file
    name, run-<run>-tag-<tag>.csv)
  - Megatron `iteration N/ M | lm loss: ... | loss scale: ... | grad norm: ...` lines; a line without its
    `lm loss` field in a log whose lines had one is a NaN loss (Megatron prints only an average > 0; a
    NaN drops the field while `number of nan iterations` stays 0), unless its iterations were all skipped
  - mmengine `Epoch(train) [e][i/N] lr: ... loss: ... grad_norm: ...` lines and mmcv's `Epoch [e][i/N]`,
    `Iter [i/N]` (epochs from 1, the step counted across them)
  - Keras `model.fit`: the `Epoch e/E` line, then its bar (Keras 2 `[====] - 5s 3ms/step - loss: ...`,
    Keras 3 `━━━ 5s 3ms/step - ... loss: ...`, verbose=2, terminal redraws); the bar's i/N restarts each
    epoch, so the epoch is the step; a log with bars caught mid-epoch counts batches across epochs;
    val_loss is the epoch's evaluation
  - darknet `N: loss, avg avg loss, lr rate, ...` iteration lines (-nan, -nan(ind)); its per-layer region
    lines are read as nothing (their -nan IOU and total_loss 0 are normal on an empty layer)
  - timm `Train: e [i/N (p%)]  Loss: x (avg)  ...  LR: ...` (step e*N+i) and `Test: [i/N] ... Loss: x (avg)`
    (the running average, as the evaluation at the last step)
  - lossguard's own live events directory (events-rank*.jsonl)
  - any other line with a loss-like name next to a number (loss, Loss, lm loss, train/loss, train_loss,
    closs, reduced_train_loss, act_loss, ...; grad_norm / gnorm / grad norm, also under a prefix or as a
    total (optim/total_grad_norm, actor/grad_norm); lr / learning_rate / lr=[...], also a first param
    group's (actor/lr, lr-AdamW, lr-DecoupledAdamW/group0, learning_rate_group0);
    eval_loss / val_loss / valid loss as evaluation; RL reward, reward_std, kl), in the shapes tools print:
    k: v, k=v, k v, | k | v |, JSON and Python dicts (also with full-width punctuation), tqdm postfixes,
    quoted values, tensor(2.3, device=...), nan / NaN / inf. The step comes from step / iter / global_step /
    num_updates, torchtune's epoch|step|Loss, i/N progress counters (with Epoch [e] [i/N]; an epoch written
    e/N counts from 1 unless the log shows 0/N), two-word step names (MaxText's `completed step: N`;
    torchtitan's `validate step: N` as evaluation) or a line above a block of metric lines (`step N`,
    OLMo's `[step=N/M,epoch=E]`, Composer's `[batch=N/M]:`; of two counters on one line, litgpt's
    `iter 9 step 2`, the first); a bare printed loss tensor counts as one step. Torchtune, torchtitan,
    Lightning (tqdm and rich bars), NeMo, litgpt, nanotron, fairseq, DeepSpeed-Chat, nanoGPT (`val loss`
    as evaluation), MLX, OpenRLHF, verl (`step:N - actor/pg_loss:..`), OLMo, Composer, MaxText,
    Caffe (`Iteration N ..., loss = x`, `Train net output`, `lr = x`), PaddleOCR (`global_step: N, ...
    loss: x`), tf.estimator (`loss = x, step = N`), NVIDIA DLLogger (`Epoch: e Iteration: N  train.loss : x`; a counter that restarts each epoch is placed after the epochs before it),
    kohya / musubi bars (`steps: 10%|..| 100/1000 [.., avr_loss=x]`: the counter is the step; a number
    followed by % is a percentage), wandb's run summary (its values at the step it names; a value of no step, HF's train_loss, is
    a summary, not a step), peft's epoch=/train_ppl=tensor(...) prints and MetricLogger logs are read this
    way. A metric line naming no step right after a line announcing an evaluation (DeepSpeed-Chat's
    `***** Evaluating perplexity *****` then `ppl: .., loss: ..`) is an evaluation
  - a table of steps and values pasted as text: a header row naming the columns (step, loss, Training
    Loss, Validation Loss, lr, ...), then rows of numbers; markdown (| a | b |), tab, comma or space
    separated, rows split as the header is (mlx-lm's `iter train_loss tok/s tokens` table: a trend arrow
    is decoration, 1,234 and 4.4k fill the columns not read); a table with an epoch column and no step
    column (Chainer's PrintReport `epoch main/loss validation/main/loss ... elapsed_time`) is on its epochs
  - a log that holds only DeepSpeed loss-scaler overflow lines (before any step number the n-th halving is
    step n; another rank's or host's copy of it is the same step)
  - however it was captured or pasted: terminal colour codes, CRLF, trailing spaces, tabs after `key:`,
    launcher / logger prefixes on every line ([rank0]:, [default0]:, 0: , 10.0.0.1: , a timestamp and level,
    also before a bare printed tensor), GitHub fences / quotes / <details>, noise lines between metric lines,
    and each node's copy of a line (inside a `step N` block, the same value again is a copy, not a step)"""

INCOMPLETE = """\
SRC001 analysis-incomplete (warning): part of the input was not analysed, and the verdict covers only what
was read. The reasons are in the finding and in the JSON report's `incomplete` list:
  - lines longer than 64 KB were read by their first and last 32 KB (a line that long is most often a
    dumped tensor or a progress bar without newlines; its middle is not parsed)
  - a file of the run could not be read (a trainer_state.json cut before its first entry, ...): the other
    logs of the directory were analysed without it
  - the live guard switched its analysis off mid-run after an internal error (its events say at which step)
  - under `watch`, the live analysis stopped after an internal error; the command ran on unwatched
A run that would otherwise be healthy gets the verdict `warning`. Fix: pass the missing or complete file,
or the run's stdout log."""

RECOVERED = """\
REC001 recovered (warning): the live guard (`recover=True`) recovered steps in place: the run finished, but
each listed fault happened. The JSON report's `recoveries` lists each one: step, ranks (those the fault
started on), kind, samples, steps lost, signature, code and the action taken. Kinds:
  held       the commit gate skipped the optimizer step on every rank and dropped the batch, for a
             non-finite loss or gradient (LOSS001), a micro-batch with every label masked (LABEL001), or a
             loss far above the run's own spread (LOSS006, `loss-spike`: over ten robust spreads, 3x the
             typical loss and half a nat above it, after 20 committed steps); under DeepSpeed the engine's
             step took its own overflow path, so weights, optimizer shards, scheduler and loss scale stayed
             as they were
  transient  the held batch, replayed with the RNG state it first ran with, did not fault again: the
             replay was applied; a rank where that happens twice within the window is named a suspect
             device in the action (check that GPU's health)
  sample     the replay faulted again; a forward per sample named the samples whose loss is non-finite:
             they were quarantined (listed by token-id hash and dataset index, left out for the rest of the
             run and after a resume) and the rest of the batch was applied
  rollback   weights turned non-finite after an applied step, a loss jump came back when the batch was
             replayed (the state, not the batch), or one replica's weights drifted from the others'
             (RANK001, `rank-desync`): every rank restored the newest host snapshot finite on
             every rank (`RecoverOptions(snapshot_every=S)`; by default every 10 steps when the snapshots
             fit in the host's free memory) and skipped the batches since it; `steps_lost` counts the steps undone
A run that would otherwise be healthy gets the verdict `warning`. Fix: look at the faulting steps' data and
ranks; a fault that keeps coming back needs its cause fixed, not more recoveries."""


MADE_UP = """\
REC002 made-up-loss (warning): a logged training loss is exactly 0.0, or half, of the steady loss on both
sides of it, and the run trained on at its level. That is the value the Trainer's NaN filter
(`logging_nan_inf_filter`, on by default) logs, at `logging_steps=1`, for a step whose loss was NaN/Inf on
some rank: that rank counts 0, so one rank of one gives 0.0, one of two gives half. Had the step been
applied, the later losses would be NaN too: it was not (lossguard's `recover=True` held it, or an
overflow check skipped it). Said only when nothing else is (a healthy verdict becomes a warning) and no
record of recoveries was read. Fix: analyze the log with the guard's events dir (`events-rank*.jsonl`)
beside it, or the job's stderr with its `lossguard: recovered at step N` lines, for what was done."""


FSDP = """\
fsdp: the live guard on PyTorch FSDP (FSDP1 `FullyShardedDataParallel`, flat parameters, `use_orig_params` true
or false; FSDP2 `fully_shard`, DTensor parameters). Each rank reads its own shard, with no collective of its
own: the gradient norm is FSDP's (each rank sends its shard's squared norm in the one per-step exchange it
already makes, and every rank takes the square root of their sum), the update ratio is the shard's, and no
weight fingerprint is compared (shards are no replicas, as under ZeRO-3); parameters no rank got a gradient
for at the first step are one `no-grad` event of the run (GRAD004). The run facts name the engine
(`sharding_engine` fsdp1 / fsdp2; FSDP1's `fsdp_sharding_strategy`; its version is torch's): the diagnosis
then ranks the causes that need DeepSpeed ZeRO `unlikely` (fact `fsdp-shown`, which they predict never).
With `recover=True` a faulty step is held on every rank before it is applied; on FSDP2 host snapshots hold
each rank's own shards (weights and optimizer state, `to_local()`, no collective) and a rollback restores them
in place on every rank at the same step; on FSDP1's flat shards snapshots (and so rollbacks) are off, said at
the first step.
unreadable-tensors: an event in a rank's events file (and one console line on rank 0), once per parameter: a
parameter the guard cannot read (one left on the meta device, a tensor type it cannot view) is left out of
the update ratios; training and every other signal go on. Fix: nothing, unless that parameter should train."""


def topics() -> list[tuple[str, str]]:
    rows = [(sig, meaning) for sig, (_, meaning) in SIGNATURES.items()]
    for factory in registered():
        detector = factory()
        rows.append((detector.code, f"{detector.name} -> {detector.signature or '-'}"))
    for rule in _lint_rules():
        rows.append((rule.code, rule.name))
    rows += [(issue.id, issue.title) for issue in ISSUES.values()]
    rows.append(("SRC001", "analysis-incomplete: part of the input was not analysed"))
    rows.append(("REC001", "recovered: the live guard recovered steps in place"))
    rows.append(("REC002", "made-up-loss: a logged loss the Trainer's NaN filter made up, the run trained on"))
    rows.append(("fsdp", "the live guard on FSDP1 / FSDP2: shards, the folded norm, fsdp-shown, unreadable-tensors"))
    rows.append(("formats", "log formats analyze reads"))
    return rows


def explain(topic: str) -> str | None:
    key = topic.strip()
    if key in SIGNATURES:
        return _signature(key)
    if key.lower() == "formats":
        return FORMATS
    if key.lower() in ("fsdp", "fsdp1", "fsdp2", "fsdp-shown", "unreadable-tensors", "sharding_engine"):
        return FSDP
    if key.upper() == "SRC001" or key == "analysis-incomplete":
        return INCOMPLETE
    if key.upper() == "REC001" or key == "recovered":
        return RECOVERED
    if key.upper() == "REC002" or key == "made-up-loss":
        return MADE_UP
    if issue := get_issue(key):
        return known_issue(issue)
    for factory in registered():
        detector = factory()
        if key.upper() == detector.code or key == detector.name:
            return _detector(detector)
    for rule in _lint_rules():
        if key.upper() == rule.code or key == rule.name:
            return _rule(rule)
    return None


def _signature(sig: str) -> str:
    verdict, meaning = SIGNATURES[sig]
    if verdict == "broken":  # see diagnose(): only an error or worse kills a run
        verdict += " (warning when only warning-level findings show it)"
    lines = [f"{sig}: {meaning}", f"verdict when it is the primary signature: {verdict}", ""]
    detectors = [f() for f in registered()]
    reporters = [f"{d.code} ({d.name})" for d in detectors if d.signature == sig]
    if reporters:
        lines.append("reported by: " + ", ".join(reporters))
    causes = sorted((c for c in CAUSES if sig in c.priors), key=lambda c: -c.priors[sig])
    if causes:
        lines.append("causes considered (prior before the run's facts; `lossguard explain ID` for one):")
        for cause in causes:
            lines.append(f"  - {cause.id} ({cause.priors[sig]:.2f}): {cause.issue.title}")
            lines.append(f"      fix: {cause.issue.fix}")
    return "\n".join(lines)


def known_issue(issue: KnownIssue) -> str:
    """One known issue as `lossguard explain ID` and docs/causes.md show it."""
    lines = [f"{issue.id}: {issue.title}", "", f"mechanism: {issue.mechanism}"]
    if issue.windows:
        lines.append("affected versions: " + "; ".join(str(w) for w in issue.windows))
    for label, text in (("needs", issue.config), ("looks like", issue.symptoms)):
        if text:
            lines.append(f"{label}: {text}")
    lines += [f"how to confirm: {issue.confirm}", f"fix: {issue.fix}"]
    rule = next((c for c in CAUSES if c.id == issue.id), None)
    if rule is not None:
        lines.append("ranked for: " + ", ".join(f"{sig} (prior {p:.2f})" for sig, p in rule.priors.items()))
        lines.append("what its mechanism predicts (how often a run with this cause shows each fact; a cause "
                     "that says nothing shows it as runs in general do):")
        lines += [f"  {level.word:6s}  {clue.describe()}" for clue, level in rule.predicts]
        lines.append("  a known fact it predicts while its rivals rarely do can make it likely; a fact against "
                     "an 'always' or for a 'never' makes it unlikely")
        lines += [f"  what would decide: {ask.text}" for ask in rule.asks]
    rules = [r.code for r in _lint_rules() if issue.id in getattr(r, "issues", ())]
    if rules:
        lines.append("lint rules: " + ", ".join(rules))
    if issue.sources:
        lines += ["sources:", *(f"  {link}" for link in issue.sources)]
    return "\n".join(lines)


def _detector(detector) -> str:
    doc = inspect.getdoc(type(detector)) or ""
    text = f"{detector.code} {detector.name} (signature: {detector.signature or '-'})\n\n{doc}"
    if detector.predicts:  # what the rule checks its finding against: a column that contradicts it lowers it
        width = max(len(column) for column in detector.predicts)
        rows = [f"  {column:{width}s}  {what}" for column, what in detector.predicts.items()]
        text += "\n\nwhat its mechanism predicts in each column (one the log contradicts lowers the finding):\n"
        text += "\n".join(rows)
    return text


def _lint_rules() -> list:
    try:
        from lossguard.lint.rules import all_rules
    except ImportError:
        return []
    return list(all_rules())


def _rule(rule) -> str:
    lines = [f"{rule.code} {rule.name} ({rule.severity})", "", rule.doc() or rule.summary]
    if rule.evidence:
        lines += ["", "evidence:", *(f"  {link}" for link in rule.evidence)]
    if rule.examples:
        lines += ["", "examples (the rule's own tests):"]
        lines += [_example(example) for example in rule.examples]
    return "\n".join(lines)


def _example(example) -> str:
    """One example as a line: flagged or not, the config, and what else it was linted with."""
    verdict = "valid  " if example.valid else "flagged"
    extra = [f"{k}={v}" for k, v in {"versions": example.env, "args": example.args, "options": example.options}.items()
             if v]
    if example.fixed is not None:
        extra.append(f"--fix gives {json.dumps(example.fixed)}")
    if example.note:
        extra.append(example.note)
    return f"  {verdict} {json.dumps(example.config)}" + (f"  ({'; '.join(extra)})" if extra else "")
