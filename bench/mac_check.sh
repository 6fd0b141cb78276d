#!/usr/bin/env bash
# The GPU path on an Apple Silicon Mac in one run, for whoever has one (needs network for pip,
# and Xcode's Metal toolchain for mlx-kquant's build; 15-30 minutes, mostly the 2-layer shape
# model and the reference path beside the fast ones). Nothing here has run yet: no Mac was at
# hand when it was written. What it does:
#   1. a scratch virtualenv with ds4agent[test,kquant] (mlx-kquant built from PyPI);
#   2. the launch tests (tests/test_gpu_launch.py: our Metal kernels through MLX against the
#      reference on the GPU, the whole model at prefill chunks of 1, 64, 256), the kernel-body
#      tests, and tests/test_kquant.py, which on a Mac also runs on Metal (mlx-kquant's
#      Metal-only operations: the fused decode experts, the segment GEMM, the KV and indexer
#      rounding) within the tolerances written there;
#   3. the self-checks at open: `ds4 inspect --kernels metal`, `--kernels kquant`, and
#      `--kernels auto` (which says which of the two it chose, and by how much);
#   4. bench/gpu_device.py on the 2-layer shape model: prefill of 2048 and 16384 tokens and
#      decode with metal, kquant and (at 2048) the reference, logits compared, memory against
#      the plan;
#   5. bench/gpu_model.py's numbers for the M-series models, to set beside what was measured.
#
#   bench/mac_check.sh [OUT]          (default OUT: /tmp/ds4-mac-check)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/ds4-mac-check}"
mkdir -p "$out"
export DS4_HOME="$out/home" PYTHONUNBUFFERED=1
venv="$out/venv"

echo "== 1. install"
python3 -m venv "$venv" && "$venv/bin/pip" install -q -e '.[test,kquant]' || exit 1
py="$venv/bin/python"
sysctl -n machdep.cpu.brand_string hw.memsize | tee "$out/device.txt"
"$py" -c "import mlx.core as mx, mlx_kquant; print('mlx', mx.__version__, 'metal', mx.metal.is_available(), \
mx.device_info(mx.gpu), 'kquant', mlx_kquant.__version__ if hasattr(mlx_kquant, '__version__') else '?')" \
    | tee -a "$out/device.txt" || exit 1

rc=0
echo "== 2. tests"
"$py" -m pytest -q -p no:cacheprovider tests/test_gpu_launch.py tests/test_gpu_kernels.py tests/test_kquant.py 2>&1 \
    | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

echo "== 3. self-checks"
demo="$DS4_HOME/demo.gguf"
"$py" -m ds4agent demo --out "$demo" >/dev/null || exit 1
for k in metal kquant auto; do
    "$py" -m ds4agent inspect "$demo" --kernels "$k" --backend metal 2>&1 | sed -n '/^kernels/,$p' \
        | tee "$out/kernel-check-$k.txt"
    grep -q "nothing refused" "$out/kernel-check-$k.txt" || rc=1
done

echo "== 4. speed, logits and memory on a 2-layer shape model"
shape="$DS4_HOME/shape2.gguf"
"$py" -m ds4agent demo --preset shape --layers 2 --out "$shape" >/dev/null || exit 1
"$py" bench/gpu_device.py "$shape" --backend metal --kernels metal,kquant,reference --prompts 2048,16384 --gen 32 \
    --only-first-beyond 2048 --json "$out/device-metal.json" 2>&1 | tee "$out/device-metal.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
"$py" bench/gpu_device.py "$shape" --backend metal --kernels kquant --prompts 16384 --gen 32 \
    --json "$out/device-kquant-16k.json" 2>&1 | tee "$out/device-kquant-16k.txt"

echo "== 5. the paper model"
"$py" bench/gpu_model.py "$shape" --device m3-max --chunk 1024 2>&1 | tee "$out/model-m3.txt"
"$py" bench/gpu_model.py "$shape" --device m5-max --chunk 1024 2>&1 | tee "$out/model-m5.txt"
echo "results in $out"
exit "$rc"
