#!/usr/bin/env bash
# GPU overhead bench of the live guard (bench/gpu_overhead.py) on the device machine.
# Run from the repo root there, with `.whl` carried:   bash bench/gpu/run_on_gpu_machine.sh
# `.whl` (git-ignored) holds what the GPU image lacks, built here: the DeepSpeed wheel
# (`DS_ACCELERATOR=cuda DS_BUILD_OPS=0 pip wheel --no-deps --no-cache-dir deepspeed==0.19.8 -w .whl`) and binary
# cp312 manylinux wheels of pydantic, pydantic-core, annotated-types, typing-inspection and hjson
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 ...`),
# with typing_extensions>=4.16 under .whl/if_older/. bench/gpu/h100-2026-11-27.log is one run's output.
# Knobs (env): BENCH_STEPS (default 40), BENCH_ROUNDS (3), BENCH_LIMIT_S (330: the bench is killed after
# that many seconds, so that the log still comes back well inside the tool's timeout), WHEEL_DIR (.whl).
# Everything goes to $OUT/gpu_bench.log too; the raw bench.json is copied to $OUT.
set -euo pipefail

OUT=${OUT:-/tmp/gpu_bench_out}
mkdir -p "$OUT"
LOG=$OUT/gpu_bench.log
STEPS=${BENCH_STEPS:-40}
ROUNDS=${BENCH_ROUNDS:-3}
LIMIT=${BENCH_LIMIT_S:-330}
WHEEL_DIR=${WHEEL_DIR:-.whl}

main() {
    echo "== $(date -u +%FT%TZ) $(uname -n) in $PWD; steps=$STEPS rounds=$ROUNDS limit=${LIMIT}s"
    [ -f bench/gpu_overhead.py ] || { echo "FATAL: run me from the lossguard repo root"; exit 2; }

    # deepspeed 0.19.8 (no ops, cuda) and its missing dependencies; typing_extensions only if the one
    # there is older than pydantic 2.14.4 needs (>= 4.16.0)
    local wheels=("$WHEEL_DIR"/*.whl)
    if ! python3 -c 'import sys, importlib.metadata as m; from packaging.version import Version as V; sys.exit(V(m.version("typing_extensions")) < V("4.16.0"))'; then
        echo "typing_extensions there is older than 4.16.0: installing the carried one"
        wheels+=("$WHEEL_DIR"/if_older/typing_extensions-*.whl)
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
    export PYTHONPATH=/tmp/site:$PWD/src
    export PYTHONUNBUFFERED=1 DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
    mkdir -p "$TORCH_EXTENSIONS_DIR"

    nvidia-smi -L || echo "WARNING: nvidia-smi -L failed"
    # fails loudly (non-zero) unless torch sees a GPU and deepspeed imports from /tmp/site on cuda
    python3 - <<'EOF'
import sys, importlib.metadata as md
print("python", sys.version.split()[0], sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device", torch.cuda.get_device_name(0))
import deepspeed
from deepspeed.accelerator import get_accelerator
print("deepspeed", deepspeed.__version__, deepspeed.__file__, "accelerator", get_accelerator()._name)
assert get_accelerator()._name == "cuda", "deepspeed did not pick the cuda accelerator"
import transformers, accelerate, pydantic
print("transformers", transformers.__version__, "accelerate", accelerate.__version__, "pydantic",
      pydantic.VERSION, "typing_extensions", md.version("typing_extensions"))
from transformers.integrations import is_deepspeed_available
assert is_deepspeed_available(), "transformers does not see deepspeed"
from lossguard import LossguardCallback
print("lossguard", LossguardCallback.__module__)
EOF

    echo "== bench: python3 bench/gpu_overhead.py --steps $STEPS --rounds $ROUNDS"
    local t0=$SECONDS rc=0
    timeout --kill-after=15 "$LIMIT" python3 bench/gpu_overhead.py --steps "$STEPS" --rounds "$ROUNDS" || rc=$?
    echo "== bench exit $rc after $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo " (TIMED OUT at ${LIMIT}s)")"
    local newest
    newest=$(ls -td /tmp/lossguard-gpu-bench-*/ 2>/dev/null | head -1 || true)
    if [ -n "$newest" ] && [ -f "$newest/bench.json" ]; then cp "$newest/bench.json" "$OUT/bench.json"; fi
    return "$rc"
}

main 2>&1 | tee "$LOG"
