"""FP8/FP4 KV simulation against ds4's CPU functions (golden vectors) and ml_dtypes, run on
MLX arrays (reference and GPU path) and on numpy arrays (CPU kernels path): both must be
bit-exact."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ds4agent.engine import qat

# ds4's own functions evaluated on chosen inputs (tests/data/README.md says where they come
# from). Part of the repository: a missing file fails the tests, it never skips them.
GOLDEN = Path(__file__).resolve().parent / "data" / "qat_vectors.npz"


@pytest.fixture(params=["mlx", "numpy"])
def arr(request):
    """The array constructor of one of the two namespaces the model runs in (engine/xp.py)."""
    return mx.array if request.param == "mlx" else (lambda a: np.asarray(a, dtype=np.float32))


@pytest.fixture(scope="module")
def z():
    return np.load(GOLDEN)


def _bits_equal(ours, ref: np.ndarray) -> None:
    got = np.array(ours).astype(np.float32)
    bad = np.flatnonzero(got.view(np.uint32) != ref.astype(np.float32).view(np.uint32))
    assert bad.size == 0, f"{bad.size} of {ref.size} differ; first at {bad[:5]}: {got.reshape(-1)[bad[:3]]} vs {ref.reshape(-1)[bad[:3]]}"


def test_e4m3_elementwise(z, arr) -> None:
    _bits_equal(qat.e4m3_round(arr(z["e4m3_in"])), z["e4m3_out"])


def test_e2m1_elementwise(z, arr) -> None:
    _bits_equal(qat.e2m1_round(arr(z["e2m1_in"])), z["e2m1_out"])


def test_f16_round(z, arr) -> None:
    _bits_equal(qat.f16_round(arr(z["f16_in"])), z["f16_out"])


@pytest.mark.parametrize("width", [512, 192, 256])
def test_fp8_kv_rows(z, arr, width: int) -> None:
    _bits_equal(qat.fp8_kv_round(arr(z[f"fp8_{width}_in"]), 64), z[f"fp8_{width}_out"])


def test_hadamard(z, arr) -> None:
    _bits_equal(qat.hadamard(arr(z["had_normal_in"])), z["had_normal_out"])
    _bits_equal(qat.hadamard(arr(z["idx_in"])), z["idx_had_out"])


def test_fp4_blocks(z, arr) -> None:
    _bits_equal(qat.fp4_round(arr(z["fp4_in"])), z["fp4_out"])


def test_indexer_chain(z, arr) -> None:
    _bits_equal(qat.indexer_round(arr(z["idx_in"])), z["idx_qat_out"])


@pytest.mark.parametrize("width", [512, 128])
def test_compressed_row_chain_tail(z, arr, width: int) -> None:
    """Stages 2 -> 3 -> 4 of the compressed-row chains (RoPE output -> FP8 or Hadamard+FP4 -> f16)."""
    st = z[f"chain{width}_stages"]
    third = qat.fp8_kv_round(arr(st[:, 2]), 64) if width == 512 else qat.indexer_round(arr(st[:, 2]))
    _bits_equal(third, st[:, 3])
    _bits_equal(qat.f16_round(arr(st[:, 3])), st[:, 4])


def test_ml_dtypes_agree_after_clamp(arr) -> None:
    """Element rounding equals ml_dtypes' float8_e4m3fn / float4_e2m1fn once clamped."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, s, 20000) for s in (1e-3, 0.1, 1, 10, 100, 1000)]).astype(np.float32)
    x = np.concatenate([x, np.float32(2.0) ** np.arange(-12, 10, dtype=np.float32) * 1.0625]).astype(np.float32)
    e4 = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.array(qat.e4m3_round(arr(x))), e4)
    e2 = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(np.array(qat.e2m1_round(arr(x))), e2)


def test_ceil_log2_exhaustive_near_powers_of_two(arr) -> None:
    """2^ceil(log2f(r)) against float64 log2 rounded to float32, around every power of two."""
    exps = np.arange(-126, 127)
    base = (2.0 ** exps).astype(np.float32)
    r = np.concatenate([np.nextafter(base, np.float32(np.inf)) * 0 + base.view(np.uint32).astype(np.uint32) + k
                        for k in range(0, 200)]).astype(np.uint32).view(np.float32)
    ref = np.float32(2.0) ** np.ceil(np.log2(r.astype(np.float64)).astype(np.float32))
    got = np.array(qat.pow2_ceil_log2(arr(r)))
    assert np.array_equal(got, ref.astype(np.float32))


def test_numpy_stays_numpy() -> None:
    """The CPU path never round-trips through MLX: numpy in, numpy out, at every stage."""
    x = np.random.default_rng(1).normal(0, 3, (4, 512)).astype(np.float32)
    for out in (qat.fp8_kv_round(x, 64), qat.indexer_round(x[:, :128]), qat.f16_round(x), qat.pow2_ceil_log2(np.abs(x) + 1)):
        assert type(out) is np.ndarray and out.dtype == np.float32


@pytest.fixture(scope="module")
def native():
    """cpu.c's versions, used by the CPU kernels (skipped where no C compiler is found)."""
    from ds4agent.engine.kernels import cpu, cpu_build

    try:
        cpu.library()
    except cpu_build.BuildError as e:
        pytest.skip(str(e))
    return cpu


@pytest.mark.parametrize("width", [512, 192, 256])
def test_native_kv_round(z, native, width: int) -> None:
    """cpu.c's FP8 + f16 KV rounding: ds4's golden rows, f16-rounded, bit for bit; and the same
    bits as qat.kv_round on wide-ranging random rows (64 rotated dims pass through FP8)."""
    _bits_equal(native.kv_round(z[f"fp8_{width}_in"], 64), qat.f16_round(z[f"fp8_{width}_out"]))
    rng = np.random.default_rng(width)
    x = (rng.normal(size=(300, width)) * np.exp(rng.uniform(-12, 12, size=(300, 1)))).astype(np.float32)
    x[0] = 0.0
    _bits_equal(native.kv_round(x, 64), qat.kv_round(x, 64))
    with pytest.raises(ValueError, match="FP8 blocks"):
        native.kv_round(x[:, :100], 64)


def test_native_indexer_round(z, native) -> None:
    """cpu.c's Hadamard + FP4: ds4's golden chain bit for bit, and qat.indexer_round on random
    rows of several widths and magnitudes (the query batch is (T, heads, 128))."""
    _bits_equal(native.indexer_round(z["idx_in"]), z["idx_qat_out"])
    rng = np.random.default_rng(3)
    for shape in ((7, 16, 128), (50, 64), (3, 256)):
        x = (rng.normal(size=shape) * np.exp(rng.uniform(-20, 20, size=shape[:-1] + (1,)))).astype(np.float32)
        _bits_equal(native.indexer_round(x), qat.indexer_round(x))
    with pytest.raises(ValueError, match="power of two"):
        native.indexer_round(np.zeros((2, 96), np.float32))
