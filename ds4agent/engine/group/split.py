"""How one model is divided among the N processes of a group (docs/distributed.md).

Pure arithmetic on the model's configuration and tensor sizes: every process computes the
same plan from the same file, so nothing about it is sent.

* ``pipeline``: contiguous layer ranges (stages), balanced by the bytes of their tensors, the
  embedding on the first stage and the output head on the last. Stage s runs on rank
  (s + 1) % N: the last stage is rank 0, where the logits are sampled, so the hidden state
  goes round the ring once per step and the logits never travel.
* ``experts``: every process runs every layer on its share: whole attention output groups
  (with their heads), a slice of the shared expert's intermediate columns, a range of routed
  experts and of the output head's rows. What every head or expert needs (norms, the KV
  projection, compressors, indexer, router, hyper-connections) is computed in full everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES

from ...modelfile.config import ModelConfig
from ..choices import SPLITS


class SplitError(ValueError):
    """A model that cannot be divided this way among this many processes; one line."""


def even(n: int, parts: int, rank: int, unit: int = 1) -> tuple[int, int]:
    """Rank's share [lo, hi) of n items cut into ``parts`` nearly equal runs of whole units."""
    units = n // unit
    return unit * (units * rank // parts), unit * (units * (rank + 1) // parts) if rank + 1 < parts else n


@dataclass(frozen=True)
class Plan:
    split: str
    size: int
    rank: int
    # pipeline: layer range of each stage (stage s runs on rank (s + 1) % size)
    stages: tuple[tuple[int, int], ...] = ()
    # experts: this rank's share
    groups: tuple[int, int] = (0, 0)
    shared: tuple[int, int] = (0, 0)
    experts: tuple[int, int] = (0, 0)
    vocab: tuple[int, int] = (0, 0)

    @property
    def stage(self) -> int:
        """This rank's pipeline stage."""
        return (self.rank - 1) % self.size

    def rank_of(self, stage: int) -> int:
        return (stage + 1) % self.size

    @property
    def layers(self) -> range:
        """The layers whose state this rank holds (all of them in an expert split)."""
        if self.split == "experts":
            return range(self.stages[0][0], self.stages[-1][1])
        lo, hi = self.stages[self.stage]
        return range(lo, hi)


def _layer_bytes(tensors: dict[str, int], cfg: ModelConfig) -> list[int]:
    sizes = [0] * cfg.n_layer
    for name, nbytes in tensors.items():
        if name.startswith("blk."):
            sizes[int(name.split(".")[1])] += nbytes
    return sizes


def pipeline_stages(layer_bytes: list[int], first: int, last: int, parts: int) -> tuple[tuple[int, int], ...]:
    """Contiguous layer ranges for ``parts`` stages minimising the largest stage's bytes, the
    first stage also holding ``first`` bytes (the embedding) and the last ``last`` (the head):
    an exact dynamic programme (layers and stages are few)."""
    L = len(layer_bytes)
    pre = [0]
    for b in layer_bytes:
        pre.append(pre[-1] + b)
    INF = float("inf")
    # best[s][j]: the smallest possible largest stage when stages 0..s-1 hold layers 0..j-1
    best = [[INF] * (L + 1) for _ in range(parts + 1)]
    cut = [[0] * (L + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for s in range(1, parts + 1):
        for j in range(s, L - (parts - s) + 1):
            for i in range(s - 1, j):
                cost = pre[j] - pre[i] + (first if s == 1 else 0) + (last if s == parts else 0)
                v = max(best[s - 1][i], cost)
                if v < best[s][j]:
                    best[s][j], cut[s][j] = v, i
    out, j = [], L
    for s in range(parts, 0, -1):
        i = cut[s][j]
        out.append((i, j))
        j = i
    return tuple(reversed(out))


def plan(cfg: ModelConfig, tensors: dict[str, int], split: str, size: int, rank: int,
         shared_block: int = 1) -> Plan:
    """This rank's plan. ``tensors`` maps tensor names to their bytes; ``shared_block`` is the
    block width (in elements) of the shared expert's down matrix, the unit its columns are
    divided in (32 for Q8_0)."""
    if split not in SPLITS:
        raise SplitError(f"unknown split {split!r} (choose from {', '.join(SPLITS)})")
    if size < 2:
        return Plan(split, 1, 0, ((0, cfg.n_layer),), (0, cfg.n_out_group), (0, cfg.expert_ff * cfg.n_shared_expert),
                    (0, cfg.n_expert), (0, cfg.n_vocab))
    if split == "pipeline":
        if cfg.n_layer < size:
            raise SplitError(f"a pipeline split of {size} processes needs at least {size} layers; "
                             f"this model has {cfg.n_layer}")
        head = sum(b for n, b in tensors.items() if n.startswith("output"))
        stages = pipeline_stages(_layer_bytes(tensors, cfg), tensors.get("token_embd.weight", 0), head, size)
        return Plan(split, size, rank, stages)
    width = cfg.expert_ff * cfg.n_shared_expert
    return Plan(split, size, rank, ((0, cfg.n_layer),), even(cfg.n_out_group, size, rank),
                even(width, size, rank, max(1, shared_block)), even(cfg.n_expert, size, rank),
                even(cfg.n_vocab, size, rank))


def block_width(qtype: int) -> int:
    return GGML_QUANT_SIZES[qtype][0]


# -- bytes of weights one decoded token reads, per rank ------------------------------------------

@dataclass(frozen=True)
class TensorSize:
    name: str
    nbytes: int
    row_bytes: int  # bytes of one row (the last GGUF dimension)
    rows: int  # elements of the first dimension (out)


def read_per_token(cfg: ModelConfig, tensors: list[TensorSize], p: Plan) -> int:
    """Bytes of weights rank ``p.rank`` reads for one decoded token: what it computes, with
    routed experts counted as their expected share (k of n experts chosen, evenly on average)."""
    k, n_exp = cfg.n_expert_used, cfg.n_expert
    total = 0.0
    layers = p.layers if p.split == "pipeline" else range(cfg.n_layer)
    first = p.split == "experts" or p.stage == 0
    last = p.split == "experts" or p.stage == p.size - 1
    G = cfg.n_out_group
    for t in tensors:
        name = t.name
        if name == "token_embd.weight":
            total += t.row_bytes if first else 0
            continue
        if name.startswith("output"):
            if last:
                sliced = p.split == "experts" and name == "output.weight"
                share = (p.vocab[1] - p.vocab[0]) / cfg.n_vocab if sliced else 1
                total += t.nbytes * share
            continue
        if not name.startswith("blk.") or int(name.split(".")[1]) not in layers:
            continue
        kind = name.split(".", 2)[2]
        if "_exps." in kind:
            mine = (p.experts[1] - p.experts[0]) / n_exp if p.split == "experts" else 1
            total += t.nbytes * k / n_exp * mine
        elif kind.endswith("tid2eid.weight"):
            total += t.row_bytes
        elif p.split != "experts":
            total += t.nbytes
        elif kind in ("attn_q_b.weight", "attn_output_a.weight", "attn_output_b.weight", "attn_sinks.weight"):
            total += t.nbytes * (p.groups[1] - p.groups[0]) / G  # heads, groups or their columns
        elif kind in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"):
            total += t.nbytes * (p.shared[1] - p.shared[0]) / (cfg.expert_ff * cfg.n_shared_expert)
        else:
            total += t.nbytes
    return int(total)
