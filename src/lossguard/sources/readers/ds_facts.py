"""Run facts from DeepSpeed's own lines: the version banner, the ZeRO optimizer line, the launcher's
world size and the config dump (`zero_config ..... stage=2 overlap_comm=True ...`).

    >>> read(b"[Rank 0] DeepSpeed info: version=0.14.0, git-hash=unknown").data
    {'deepspeed_version': '0.14.0'}
    >>> read(b"loss 2.3") is None
    True
"""

from __future__ import annotations

import ast

from lossguard.core.dsconfig import as_bool, as_int, dtype_name
from lossguard.sources import patterns as P
from lossguard.sources.readers.fields import Fields, Form


def read(line: bytes) -> Fields | None:
    facts = facts_from_line(line)
    return Fields.event_of(Form.FACTS, "facts", facts) if facts else None


def facts_from_line(line: bytes) -> dict:
    if match := P.DS_VERSION.search(line):
        return {"deepspeed_version": match.group(1).decode()}
    if match := P.DS_ZERO_OPT.search(line):
        dtype = dtype_name(match.group(1).decode())
        facts = {"zero_stage": int(match.group(2))}
        if dtype:
            facts["bf16"] = dtype == "bf16"
        return facts
    if match := P.DS_WORLD.search(line):
        return {"world_size": int(match.group(1))}
    if match := P.DS_WORLD_INFO.search(line):
        try:
            text = match.group(1)
            hosts = ast.literal_eval(text[: text.rfind(b"}") + 1].decode("utf-8", "replace"))
            return {"num_nodes": len(hosts), "world_size": sum(len(v) for v in hosts.values())}
        except (ValueError, SyntaxError, AttributeError, TypeError, MemoryError, RecursionError):
            return {}
    match = P.DS_DUMP_LINE.search(line[line.find(b"]", line.rfind(b"[")) + 1 :] if b"]" in line else line)
    if not match:
        return {}
    key, value = match.group(1).decode(), match.group(2).rstrip().decode("utf-8", "replace")
    return _facts_from_dump(key, value)


# Dump key -> (RunFacts field, parser). The dump prints Python reprs (True, 2, torch.bfloat16); the parsers
# are the DeepSpeed-config reader's, so a value means the same here as in a config file.
_DUMP_SCALARS = {
    "zero_optimization_stage": ("zero_stage", as_int),
    "bfloat16_enabled": ("bf16", as_bool), "bf16_enabled": ("bf16", as_bool),
    "fp16_enabled": ("fp16", as_bool),
    "communication_data_type": ("communication_data_type", dtype_name),
    "world_size": ("world_size", as_int),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", as_int),
}
# Dump key (a `name=value ...` config object) -> {its field: (RunFacts field, parser)}.
_DUMP_OBJECTS = {
    "zero_config": {"stage": ("zero_stage", as_int), "overlap_comm": ("overlap_comm", as_bool),
                    "contiguous_gradients": ("contiguous_gradients", as_bool),
                    "use_multi_rank_bucket_allreduce": ("use_multi_rank_bucket_allreduce", as_bool),
                    "reduce_bucket_size": ("reduce_bucket_size", as_int)},
    "bfloat16_config": {"enabled": ("bf16", as_bool), "check_grad_overflow": ("check_grad_overflow", as_bool)},
    "float16_config": {"enabled": ("fp16", as_bool)},
}
_DUMP_OBJECTS["bf16_config"] = _DUMP_OBJECTS["bfloat16_config"]
_DUMP_OBJECTS["fp16_config"] = _DUMP_OBJECTS["float16_config"]


def _facts_from_dump(key: str, value: str) -> dict:
    if key in _DUMP_SCALARS:
        name, parse = _DUMP_SCALARS[key]
        parsed = parse(value)
        return {} if parsed is None else {name: parsed}
    fields = _DUMP_OBJECTS.get(key)
    if fields is None:
        return {}
    kv = {k.decode(): v.decode() for k, v in P.KV_ASSIGN.findall(value.encode())}
    out = {}
    for field_name, (name, parse) in fields.items():
        if (parsed := parse(kv.get(field_name))) is not None:
            out[name] = parsed
    return out
