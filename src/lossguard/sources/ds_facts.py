"""Run facts from DeepSpeed's own lines: the version banner, the ZeRO optimizer line, the launcher's
world size and the config dump (`zero_config ..... stage=2 overlap_comm=True ...`)."""

from __future__ import annotations

import ast

from lossguard.core.facts import dtype_name
from lossguard.sources import patterns as P


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


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
            hosts = ast.literal_eval(match.group(1).decode())
            return {"num_nodes": len(hosts), "world_size": sum(len(v) for v in hosts.values())}
        except (ValueError, SyntaxError, AttributeError, TypeError):
            return {}
    match = P.DS_DUMP_LINE.search(line[line.find(b"]", line.rfind(b"[")) + 1 :] if b"]" in line else line)
    if not match:
        return {}
    key, value = match.group(1).decode(), match.group(2).decode()
    return _facts_from_dump(key, value)


def _facts_from_dump(key: str, value: str) -> dict:
    kv = {k.decode(): v.decode() for k, v in P.KV_ASSIGN.findall(value.encode())}
    if key == "zero_config":
        out = {}
        if (stage := _int(kv.get("stage"))) is not None:
            out["zero_stage"] = stage
        for name in ("overlap_comm", "contiguous_gradients", "use_multi_rank_bucket_allreduce"):
            if kv.get(name) in ("True", "False"):
                out[name] = kv[name] == "True"
        if (size := _int(kv.get("reduce_bucket_size"))) is not None:
            out["reduce_bucket_size"] = size
        return out
    if key == "zero_optimization_stage" and _int(value) is not None:
        return {"zero_stage": _int(value)}
    if key in ("bfloat16_enabled", "bf16_enabled") and value in ("True", "False"):
        return {"bf16": value == "True"}
    if key in ("bfloat16_config", "bf16_config"):
        out = {}
        if kv.get("enabled") in ("True", "False"):
            out["bf16"] = kv["enabled"] == "True"
        if kv.get("check_grad_overflow") in ("True", "False"):
            out["check_grad_overflow"] = kv["check_grad_overflow"] == "True"
        return out
    if key in ("fp16_enabled",) and value in ("True", "False"):
        return {"fp16": value == "True"}
    if key in ("float16_config", "fp16_config") and kv.get("enabled") in ("True", "False"):
        return {"fp16": kv["enabled"] == "True"}
    if key == "communication_data_type":
        return {"communication_data_type": dtype_name(value)} if dtype_name(value) else {}
    if key == "world_size" and _int(value) is not None:
        return {"world_size": _int(value)}
    if key == "gradient_accumulation_steps" and _int(value) is not None:
        return {"gradient_accumulation_steps": _int(value)}
    return {}
