#!/usr/bin/env bash
# For whoever has an Ascend NPU (nothing here has run on one): the Ascend module's tests, then
# the module on the card itself, then `ds4 bench` on it. Usage:
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh
#   pip install -e '.[test,npu]'
#   bash bench/npu_check.sh [MODEL.gguf] [DEVICES]      (DEVICES default 0; 0,1 on a 300I Duo)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-}
DEVICES=${2:-0}
PY=${PYTHON:-python}

echo "== torch_npu and the devices"
"$PY" - <<'PY'
import torch, torch_npu  # noqa: F401
print("torch", torch.__version__, "torch_npu", torch_npu.__version__, "devices", torch.npu.device_count())
for i in range(torch.npu.device_count()):
    free, total = torch.npu.mem_get_info(i)
    print(f"  npu:{i} {torch.npu.get_device_name(i)}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f}")
PY

echo "== the suite's Ascend tests (CPU torch, stand-in torch_npu)"
"$PY" -m pytest tests/test_ascend.py -q

echo "== the demo model on the card: fused ops' open-time check, and logits against CPU torch"
DEMO=$(mktemp -d)/demo.gguf
"$PY" -m ds4agent demo --out "$DEMO"
"$PY" -m ds4agent inspect "$DEMO" --backend npu --kernels
DS4_NPU_DEVICES=$DEVICES DS4_DEMO=$DEMO "$PY" - <<'PY'
import os
import numpy as np
from ds4agent.engine import Engine
ids = np.random.default_rng(0).integers(0, 128000, 300).tolist()
out = {}
for name, devices, kernels in (("host", "cpu", "reference"), ("npu plain", os.environ["DS4_NPU_DEVICES"], "reference"),
                               ("npu fused", os.environ["DS4_NPU_DEVICES"], "auto")):
    with Engine.open(os.environ["DS4_DEMO"], backend="npu", devices=devices, ctx=4096, qat_sim=False,
                     kernels=kernels) as e:
        print(name, e.info.kernels, e.info.kernel_note or "", *e.info.devices, sep="\n  ")
        s = e.session()
        s.sync(ids)
        out[name] = s.logits.copy()
ref = out["host"]
for name in ("npu plain", "npu fused"):
    err = float(np.abs(out[name] - ref).max() / np.abs(ref).max())
    print(f"{name}: max rel diff {err:.2e} against host torch, argmax {'same' if out[name].argmax() == ref.argmax() else 'DIFFERS'}")
PY

if [ -n "$MODEL" ]; then
  echo "== ds4 bench on $MODEL (devices $DEVICES)"
  "$PY" -m ds4agent bench -m "$MODEL" --backend npu --devices "$DEVICES" --ctx-start 512 --ctx-max 4096 \
    --step-incr 1536 --gen-tokens 16
fi
