"""Two-rank Trainer + DeepSpeed ZeRO-2 (bf16) job whose rank 1 loss is inf at step 4, guarded with
`exit_code_on_halt=3`: the Trainer checkpoints and stops on both ranks, then both exit with status 3.

    torchrun --nproc_per_node 2 hf_exit_job.py OUT_DIR

Each rank writes OUT_DIR/rank{r}.json in a `finally`: the SystemExit code it saw and where the Trainer stopped.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import hf_job  # noqa: E402
import tiny  # noqa: E402


def main(out_dir: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from lossguard import LossguardCallback

    model, kw, args_kw, faults, _ = hf_job.build("nan-bf16")
    hf_job.install_faults(model, faults)

    class StepCounter(TrainerCallback):
        def on_step_end(self, args, state, control, **k):
            faults.step = state.global_step

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "out"), per_device_train_batch_size=4, max_steps=8, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, deepspeed=tiny.hf_ds_config(**kw),
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, **args_kw,
    )
    guard = LossguardCallback(events_dir=os.path.join(out_dir, "events"), halt_on="error", exit_code_on_halt=3)
    trainer = Trainer(model=model, args=args, train_dataset=tiny.Tokens(), callbacks=[StepCounter(), guard])
    exit_code = None
    try:
        trainer.train()
        print(f"rank {tiny.rank()}: after train()")  # must not run after a halt with exit_code_on_halt
    except SystemExit as exc:
        exit_code = exc.code
        raise
    finally:
        summary = {"exit_code": exit_code, "global_step": trainer.state.global_step,
                   "halted_at": guard.monitor.halted_at if guard.monitor else None}
        with open(os.path.join(out_dir, f"rank{tiny.rank()}.json"), "w") as fh:
            json.dump(summary, fh)


if __name__ == "__main__":
    main(sys.argv[1])
