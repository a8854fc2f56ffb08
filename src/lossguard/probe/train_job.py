"""What each rank runs: `python -m lossguard.probe.train_job --scenario NAME --out DIR [--steps N]`.

A real `transformers.Trainer` with a DeepSpeed config (or, for `engine="raw"` scenarios, a plain
`deepspeed.initialize` loop) trains the tiny model for real; the fault is injected by `faults.install`, and the
outputs are whatever the stack really writes: stdout, `trainer_state.json`, TensorBoard events under `DIR/tb`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Must be set before deepspeed is imported anywhere: this machine has no accelerator.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from lossguard.probe import auto_values, faults  # noqa: E402
from lossguard.probe import data as data_mod  # noqa: E402
from lossguard.probe.auto_values import GRAD_ACCUM, GRAD_CLIP, LEARNING_RATE, MICRO_BATCH  # noqa: E402
from lossguard.probe.scenarios import Scenario, get  # noqa: E402


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def build_model(scenario: Scenario) -> torch.nn.Module:
    from lossguard.probe.model import TinyVLM, tiny_gpt2

    spec = dict(scenario.model)
    kind = spec.pop("kind", "gpt2")
    if kind == "vlm":
        pretrain_steps = spec.pop("pretrain_lm_steps", 0)
        model = TinyVLM(**spec)
        if pretrain_steps:
            from lossguard.probe.model import pretrain_lm

            samples = data_mod.build_dataset(log=lambda *_a, **_k: None, **_data_spec(scenario))
            generator = torch.Generator().manual_seed(11)
            batches = (data_mod.collate([samples[int(i)] for i in torch.randint(0, len(samples), (8,),
                                                                                  generator=generator)])
                       for _ in range(pretrain_steps))
            pretrain_lm(model.lm, batches, pretrain_steps)
        return model
    model = tiny_gpt2()
    if kind == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0,
                                                 fan_in_fan_out=True, bias="all"))
        if spec.get("reentrant_checkpointing"):
            # The pre-5.x path (and custom / remote-code models): checkpointing switched on with the reentrant
            # function and no `enable_input_require_grads()`. transformers 5's own `activation_checkpointing_enable`
            # adds the input hook for input_ids models, so this calls the layer switch directly.
            import functools

            from torch.utils.checkpoint import checkpoint

            base = model.get_base_model()
            base._set_gradient_checkpointing(enable=True,
                                             gradient_checkpointing_func=functools.partial(checkpoint,
                                                                                           use_reentrant=True))
    return model


def _data_spec(scenario: Scenario, split: str = "train") -> dict:
    spec = {"num_samples": 64, "max_length": 48, **scenario.data}
    if split == "eval":
        spec = {**spec, "num_samples": 16, "seed": 1000}
    return spec


def build_data(scenario: Scenario, split: str = "train") -> list[dict]:
    spec = _data_spec(scenario, split)
    # Only rank 0 prints the preprocessing warnings, like a LLaVA run launched on one node shows them once.
    log = print if _rank() == 0 else (lambda *_a, **_k: None)
    samples = data_mod.build_dataset(log=log, **spec)
    if scenario.model.get("kind") == "vlm":
        generator = torch.Generator().manual_seed(7)
        for s in samples:
            s["image_features"] = torch.randn(4, 16, generator=generator)
    return samples


def _training_arguments(scenario: Scenario, out: str, steps: int, ds: dict):
    from transformers import TrainingArguments

    # "auto" precision is the Trainer's to fill (from these flags): here it is the built-in job's own choice.
    chosen, _ = auto_values.fill({k: ds.get(k, {}) for k in ("bf16", "fp16")}, auto_values.JobSettings())
    precision = {k: bool(chosen[k].get("enabled")) for k in ("bf16", "fp16")}
    kwargs = dict(
        output_dir=out,
        per_device_train_batch_size=MICRO_BATCH,
        per_device_eval_batch_size=MICRO_BATCH,
        max_steps=steps,
        learning_rate=LEARNING_RATE,
        warmup_steps=2,
        lr_scheduler_type="linear",
        logging_steps=1,  # every step is logged: the fixtures keep the full curve
        report_to=["tensorboard"],
        save_strategy="no",
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        use_cpu=True,
        deepspeed=ds,
        **precision,
    )
    kwargs.update(scenario.trainer)
    return TrainingArguments(**kwargs)


def _guard_options(guard: dict | None) -> dict:
    """lossguard's live guard for this job: the demo and bench/zoo.py watch a scenario from inside."""
    if not guard:
        return {}
    return {"events_dir": guard["events_dir"], "halt_on": guard.get("halt_on"), "fingerprint_every": 1,
            "console": True, "recover": bool(guard.get("recover"))}


def run_trainer(scenario: Scenario, out: str, steps: int, ds: dict, guard: dict | None = None) -> None:
    from transformers import Trainer, TrainerCallback

    os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(out, "tb")
    counter = faults.StepCounter()

    class _Step(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            faults.after_optimizer(model, scenario.fault)  # the engine and its optimizer exist by now

        def on_step_begin(self, args, state, control, **kwargs):
            counter.step = state.global_step + 1

    model = build_model(scenario)
    faults.install(model, scenario.fault, counter, _rank())
    args = _training_arguments(scenario, out, steps, ds)
    callbacks = [_Step()]
    if guard:
        from lossguard import LossguardCallback

        callbacks.append(LossguardCallback(**_guard_options(guard)))
    trainer = Trainer(model=model, args=args, train_dataset=build_data(scenario),
                      eval_dataset=build_data(scenario, "eval"), data_collator=data_mod.collate, callbacks=callbacks)
    try:
        trainer.train()
        trainer.evaluate()  # eval_loss is not NaN-filtered: the tell that separates a hidden NaN from a real 0
    finally:
        if trainer.is_world_process_zero():
            trainer.state.save_to_json(os.path.join(out, "trainer_state.json"))


def run_raw(scenario: Scenario, out: str, steps: int, ds: dict, guard: dict | None = None) -> None:
    """No Trainer: `deepspeed.initialize` and a loop that prints what a hand-written script prints."""
    import deepspeed
    from torch.utils.data import DataLoader, DistributedSampler
    from torch.utils.tensorboard import SummaryWriter

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = _rank(), int(os.environ.get("WORLD_SIZE", "1"))
    model = build_model(scenario)
    ds = _filled(ds, world, steps, model)
    ds.update(train_micro_batch_size_per_gpu=MICRO_BATCH, gradient_accumulation_steps=GRAD_ACCUM,
              gradient_clipping=GRAD_CLIP)
    ds.pop("train_batch_size", None)
    ds.setdefault("optimizer", {"type": "AdamW", "params": {"lr": LEARNING_RATE, "torch_adam": True}})
    counter = faults.StepCounter()
    faults.install(model, scenario.fault, counter, rank)
    engine, _, _, _ = deepspeed.initialize(model=model, config=ds,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    if scenario.fault:
        faults.perturb_replica(engine.module, scenario.fault, rank)
    attachment = None
    if guard:
        import lossguard

        attachment = lossguard.attach(engine, halt_checkpoint_dir=os.path.join(out, "halt-checkpoint"),
                                      **_guard_options(guard))
    dataset = build_data(scenario)
    loader = DataLoader(dataset, batch_size=MICRO_BATCH, collate_fn=data_mod.collate,
                        sampler=DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0))
    writer = SummaryWriter(os.path.join(out, "tb")) if rank == 0 else None
    history, step = [], 0
    while step < steps:
        loader.sampler.set_epoch(step)
        for batch in loader:
            step += 1
            counter.step = step
            loss = engine(**batch).loss
            engine.backward(loss)
            try:
                engine.step()
            except Exception as exc:  # LossguardHalt: the guard stopped the run on every rank
                if attachment is None or type(exc).__name__ != "LossguardHalt":
                    raise
                _say(f"[rank{rank}] lossguard halted the run at step {step}")
                steps = step
                break
            # ZeRO-0 fp32 keeps no global norm: the engine returns None, and a hand-written script prints that.
            grad_norm = engine.get_global_grad_norm()
            grad_norm = None if grad_norm is None else float(grad_norm)
            # A weight checksum per rank: with data parallelism every replica must print the same number.
            param_sum = sum(float(p.detach().float().sum()) for p in engine.module.parameters())
            # Every rank prints its own line: rank-local values are what the rank-desync scenario shows.
            norm_text = "None" if grad_norm is None else f"{grad_norm:.6g}"
            _say(f"[rank{rank}] step {step} loss {loss.item():.6g} grad_norm {norm_text} param_sum {param_sum:.9g}")
            if writer is not None:
                writer.add_scalar("train/loss", loss.item(), step)
                if grad_norm is not None:
                    writer.add_scalar("train/grad_norm", grad_norm, step)
                history.append({"step": step, "loss": loss.item(), "grad_norm": grad_norm, "param_sum": param_sum})
            if step >= steps:
                break
    if writer is not None:
        writer.close()
        with open(os.path.join(out, "raw_log.json"), "w") as f:
            json.dump(history, f, indent=1)


def _filled(ds: dict, world: int, steps: int, model: torch.nn.Module) -> dict:
    """The config with its "auto" values filled as the HF Trainer fills them, for this job and model."""
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    settings = auto_values.JobSettings(world_size=world, steps=steps, **({"hidden_size": hidden} if hidden else {}))
    ds, filled = auto_values.fill(ds, settings)
    if filled and _rank() == 0:
        _say(f"probe: filled \"auto\" as the HF Trainer does: {auto_values.describe_filled(filled)}")
    return ds


def _say(line: str) -> None:
    """One write per line: `print` writes the text and the newline separately, so two ranks sharing
    stdout could splice their lines together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--config-json", default=None, help="DeepSpeed config file replacing the scenario's")
    parser.add_argument("--guard-events", default=None, help="attach lossguard's live guard, JSONL events here")
    parser.add_argument("--halt-on", default=None, help="with --guard-events: halt on this verdict/severity")
    parser.add_argument("--recover", action="store_true", help="with --guard-events: recover=True (hold faulty steps)")
    args = parser.parse_args(argv)
    guard = {"events_dir": args.guard_events, "halt_on": args.halt_on, "recover": args.recover} \
        if args.guard_events else None
    scenario = get(args.scenario)
    ds = scenario.ds_config
    if args.config_json:
        with open(args.config_json) as f:
            ds = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    steps = args.steps or scenario.steps
    if scenario.engine == "raw":
        run_raw(scenario, args.out, steps, ds, guard)
    else:
        run_trainer(scenario, args.out, steps, ds, guard)
    _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """Wait for every rank, then close the process group, like a well-behaved training script.

    Left open, a rank that exits first closes its gloo sockets under a peer that is still writing its
    results, and the peer can abort at interpreter exit. Only called after a normal finish: a rank that
    raised never reaches it, so nobody waits at a barrier for a dead peer."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
