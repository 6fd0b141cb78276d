"""What the CLI shows of the engine's and the model file's reports: `ds4 inspect`'s summary of a
model file, `ds4 bench`'s progress line. Formatting only; the numbers come from below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .terminal import Out

if TYPE_CHECKING:
    from ..modelfile.info import ModelReport

GiB = 1024**3


def fmt_gib(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB / 100 else f"{n / 2**20:.1f} MiB"


def inspect_lines(r: "ModelReport", tensors: bool) -> list[str]:
    """`ds4 inspect`'s summary of a model file (``tensors``: every tensor too)."""
    c = r.config
    ratios = c.compress_ratios
    n0, n4, n128 = ratios.count(0), ratios.count(4), ratios.count(128)
    if r.is_flash:
        layout = "the published DeepSeek V4 Flash layout (every value and tensor checked)"
    elif r.claims_flash:
        layout = "claims the DeepSeek V4 Flash shape but differs from it:"
    elif r.problems:
        layout = "deepseek4 model with an inconsistent tensor layout:"
    else:
        layout = "a deepseek4 model of another shape (not the published Flash), layout consistent"
    lines = [
        f"file          {r.path}  ({fmt_gib(r.file_size)})",
        f"model         {c.name or '(unnamed)'}  [architecture deepseek4]",
        f"layout        {layout}",
        f"variant       {r.variant}",
    ]
    lines += [f"                - {p}" for p in r.problems[:20]]
    if len(r.problems) > 20:
        lines.append(f"                ... and {len(r.problems) - 20} more")
    lines += [
        f"layers        {c.n_layer}: {n0} window-only, {n4} ratio-4 + indexer, {n128} ratio-128; "
        f"hash-routed {c.n_hash_layer}",
        f"attention     hidden {c.n_embd}, {c.n_head} heads x {c.head_dim} (rope tail {c.n_rot}), "
        f"q rank {c.q_lora_rank}, out {c.n_out_group} groups x {c.o_lora_rank}, window {c.sliding_window}",
        f"indexer       {c.indexer_n_head} heads x {c.indexer_head_dim}, top-k {c.indexer_top_k}",
        f"moe           {c.n_expert} experts, {c.n_expert_used} active, width {c.expert_ff}, "
        f"{c.n_shared_expert} shared, scale {c.expert_weights_scale:g}",
        f"rope          base {c.rope_base:g} (window layers), "
        f"{c.compress_rope_base:g} + YaRN x{c.rope_scaling_factor:g} "
        f"(compressed layers, original ctx {c.rope_orig_ctx})",
        f"hyper-conn.   {c.hc_count} streams, {c.hc_sinkhorn_iters} Sinkhorn iterations",
        f"vocabulary    {r.vocab_size} tokens, {r.n_merges} merges, {r.n_added} added tokens",
        "special ids   " + ", ".join(f"{k} {v}" for k, v in r.special_ids.items()),
        "quant mix     type       tensors        size",
    ]
    for q in r.quant_mix:
        lines.append(f"              {q.type_name:<9}{q.tensors:>8}  {q.nbytes / GiB:>10.3f} GiB")
    total = sum(q.nbytes for q in r.quant_mix)
    lines.append(f"              {'total':<9}{len(r.tensors):>8}  {total / GiB:>10.3f} GiB")
    if tensors:
        lines.append("tensors       name                                         type      GGUF dims")
        for t in r.tensors:
            dims = "x".join(str(d) for d in t.dims)
            lines.append(f"              {t.name:<44} {t.type_name:<9} {dims:<22} {fmt_gib(t.nbytes):>12}")
    return lines


class BenchProgress:
    """`ds4 bench`'s progress: one line per frontier, redrawn in place on a terminal."""

    def __init__(self, out: Out, share) -> None:
        self.out, self.share = out, share  # share(gen_tps): " (NN% of the read bandwidth)" or ""

    def __call__(self, done: int, total: int, row) -> None:
        line = (f"bench {done}/{total} [{'#' * (20 * done // total):<20}] ctx {row.ctx}: "
                f"prefill {row.prefill_tps:.1f} t/s, generation {row.gen_tps:.1f} t/s{self.share(row.gen_tps)}")
        if self.out.tty:
            self.out.write(f"\r{line}\x1b[K" + ("" if done < total else "\n"))
        else:
            self.out.line(line)


class PullProgress:
    """`ds4 pull`'s progress: rich's bars on a terminal (bytes, speed, time left; then the
    hash check), elsewhere a line at every tenth. Called from the transfer's watcher thread."""

    def __init__(self, out: Out, name: str) -> None:
        self.out, self.name = out, name
        self._bar = None
        self._tasks: dict[str, object] = {}
        self._said: dict[str, int] = {}

    def __enter__(self) -> "PullProgress":
        if self.out.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                                 TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=Console(file=self.out.stream))
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, stage: str, done: int, total: int) -> None:
        words = {"download": "downloading", "verify": "checking SHA-256"}[stage]
        if self._bar is not None:
            task = self._tasks.get(stage)
            if task is None:
                task = self._tasks[stage] = self._bar.add_task(f"{self.name}: {words}", total=total)
            self._bar.update(task, completed=done)
            return
        tenth = 10 * done // max(total, 1)
        if self._said.get(stage, -1) < tenth:
            self._said[stage] = tenth
            self.out.line(f"{self.name}: {words} {fmt_gib(done)} of {fmt_gib(total)} ({10 * tenth}%)")
