"""Where proposed tokens come from (docs/speculation.md): a ``Drafter`` proposes what may follow
the session's tokens; the session verifies the proposal in one pass and keeps what the model
agrees with (Session.speculate), so a drafter can only make decoding faster or slower, never
different.

``NgramDrafter`` looks the conversation's last tokens up in the conversation itself (prompt,
tool results, earlier answers) and proposes what followed them there: no weights, any model
file, and strong where an agent spends its time (a file rewritten with a small change, code or
tool output quoted back). It adapts: the proposal grows while proposals are kept whole and
shrinks when they are not, and after several proposals in a row of which nothing was kept it
pauses, each pause twice the last until something is kept again, so on text that does not
repeat it costs almost nothing.

``MtpDrafter`` asks DeepSeek's MTP block (engine/mtp.py) for the next tokens, from the target's
last-layer streams that the session hands it after every step (``seen``); it adapts the same
way. Either drafter's proposals are verified, so neither can change the output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from ..settings import SPECULATE  # --speculate

if TYPE_CHECKING:
    from .mtp import MtpBlock


class Drafter(Protocol):
    name: str
    # Whether the session hands the drafter the target's last-layer streams after each step
    # (``seen``), and runs ``propose`` where its passes run (the drafter runs a model).
    needs_hidden: bool

    def propose(self, history: Sequence[int], n: int, token: int, most: int) -> list[int]:
        """Up to ``most`` tokens that may follow ``history[:n]`` (the session's tokens, a list
        that only grows while the conversation goes on) and ``token``, just sampled."""
        ...

    def feedback(self, proposed: int, kept: int) -> None:
        """How many of the last proposal the model kept."""
        ...

    def seen(self, start: int, hidden: Any) -> None:
        """The target's last-layer streams (T, hc, E) at positions start .. start+T-1, just
        committed (only called when ``needs_hidden``)."""
        ...


class _Adaptive:
    """How many tokens to propose: more while proposals are kept whole, fewer when they are
    not; after ``pause_after`` proposals in a row of which nothing was kept, a pause of
    ``pause`` steps, each pause twice the last until something is kept again."""

    needs_hidden = False

    def __init__(self, start: int, least: int, most: int, pause_after: int, pause: int, longest_pause: int) -> None:
        self.k, self.least, self.most = start, least, most
        self.pause_after, self.pause, self.longest_pause = pause_after, pause, longest_pause
        self._pause = pause  # the next pause: doubled each time one follows no kept token
        self._misses = 0  # proposals in a row of which nothing was kept
        self._rest = 0  # steps left in a pause
        self.proposed = self.kept = self.proposals = 0

    def _resting(self) -> bool:
        """Whether this step is in a pause (and counts it)."""
        if self._rest > 0:
            self._rest -= 1
            return True
        return False

    def _counted(self, out: list[int]) -> list[int]:
        if out:
            self.proposals += 1
            self.proposed += len(out)
        return out

    def feedback(self, proposed: int, kept: int) -> None:
        self.kept += kept
        if kept:
            self._pause = self.pause
        if kept == proposed:
            self.k = min(self.k + 1, self.most)
            self._misses = 0
        else:
            self.k = max(self.least, min(self.k, kept + 1))
            self._misses = self._misses + 1 if kept == 0 else 0
            if self._misses >= self.pause_after:
                # Text the drafter cannot predict: each pause twice the last, so that a rejected
                # proposal (a pass of several tokens for one) costs a vanishing share of steps.
                self._misses, self._rest = 0, self._pause
                self._pause = min(2 * self._pause, self.longest_pause)

    def seen(self, start: int, hidden: Any) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {"proposals": self.proposals, "drafted": self.proposed, "accepted": self.kept,
                "mean_accepted": round(self.kept / self.proposals, 2) if self.proposals else 0.0}


class NgramDrafter(_Adaptive):
    """The most recent earlier occurrence of the last N tokens (N = ``order`` down to 2)
    proposes the tokens that followed it. The n-gram tables grow with the conversation, a few
    dictionary writes per token: a step costs the same at 100 tokens as at 100 000."""

    name = "ngram"

    def __init__(self, order: int = 4, start: int = 4, most: int = 8, pause_after: int = 4, pause: int = 16,
                 longest_pause: int = 1024) -> None:
        super().__init__(start, 2, most, pause_after, pause, longest_pause)
        self.order = order
        self._history: Sequence[int] | None = None  # the list indexed, and how far
        self._n = 0
        self._where: list[dict[tuple[int, ...], int]] = [{} for _ in range(order + 1)]  # n-gram -> end of its last use

    def _index(self, history: Sequence[int], n: int) -> None:
        """Extend the n-gram tables to ``history[:n]``; start again for another list, or when
        the list was cut back (a rollback, another conversation)."""
        if history is not self._history or n < self._n:
            self._history, self._n = history, 0
            self._where = [{} for _ in range(self.order + 1)]
        for end in range(self._n + 1, n + 1):
            for k in range(2, min(self.order, end) + 1):
                # the k-gram ending before ``end``: what followed it starts at ``end``
                self._where[k][tuple(history[end - k : end])] = end
        self._n = max(self._n, n)

    def propose(self, history: Sequence[int], n: int, token: int, most: int) -> list[int]:
        if self._resting():
            return []
        self._index(history, n)
        k = min(self.k, most)
        if k <= 0:
            return []
        out: list[int] = []
        for order in range(self.order, 1, -1):
            if n + 1 < order:
                continue
            at = self._where[order].get((*history[n - order + 1 : n], int(token)))
            if at is not None:
                # what followed the earlier occurrence: from the history, then the token itself
                out = [int(t) for t in history[at : min(at + k, n)]]
                if len(out) < k and at + len(out) == n:
                    out.append(int(token))
                break
        return self._counted(out)


class MtpDrafter(_Adaptive):
    """Drafts from the MTP block (engine/mtp.py) of one session.

    The block's KV holds the pairs (target streams at j-1, token j) of the session's recent
    positions: each proposal first runs the pairs the session committed since the last one (in
    one pass; the last is the just-sampled token's, whose logits give the first draft), then
    chains drafts on a copy of that state (the block's own streams with its own proposal), so
    drafts never enter the block's KV. Streams older than the block's window would be out of
    its attention anyway and are not kept. When the session's tokens are not the ones the
    block has seen (a rollback, a restored session, steps run in a batch with other sessions'),
    the block starts again from the streams it has."""

    name = "mtp"
    needs_hidden = True

    def __init__(self, block: "MtpBlock", start: int = 1, most: int = 4, pause_after: int = 4, pause: int = 8,
                 longest_pause: int = 256) -> None:
        super().__init__(start, 1, most, pause_after, pause, longest_pause)
        self.block = block
        self._state = block.empty_state()
        self._last: tuple[int, int] | None = None  # (position, token) of the last pair run
        self._streams: list = []  # committed streams not yet paired, of positions _first ..
        self._first = 0
        self.restarts = 0

    def _restart(self) -> None:
        self._state = self.block.empty_state()
        self._last = None
        self.restarts += 1

    def _joined(self):
        """The held streams as one array (positions _first ..)."""
        s = self._streams
        return s[0] if len(s) == 1 else self.block.model.xp.concatenate(s, axis=0)

    def seen(self, start: int, hidden: Any) -> None:
        held = sum(len(h) for h in self._streams)
        if start != self._first + held:  # not the continuation of what the block holds
            if self._last is not None:
                self._restart()
            self._streams, self._first = [], start
        self._streams.append(hidden)
        # Pairs older than the window cannot be attended from the next position: drop them
        # (and the block's KV, all of it older still).
        held += len(hidden)
        keep = self.block.window + 1
        if held > keep:
            kept = self._joined()[held - keep :]
            self.block.model.xp.eval(kept)  # (MLX: evaluated now, or each step would lengthen one lazy graph)
            self._streams, self._first = [kept], self._first + held - keep
            if self._last is not None:
                self._restart()

    def propose(self, history: Sequence[int], n: int, token: int, most: int) -> list[int]:
        if self._resting():
            return []
        k = min(self.k, most)
        if k <= 0 or not self._streams:
            return []
        held = sum(len(h) for h in self._streams)
        if self._first + held != n:  # the streams do not reach the token before ``token``
            return []
        if self._last is not None and history[self._last[0]] != self._last[1]:
            self._restart()  # the token paired last is not the session's any more
        # Pairs: the streams of positions _first .. n-1 with the tokens of _first+1 .. n.
        ids = [int(t) for t in history[self._first + 1 : n]] + [int(token)]
        logits, X = self.block.run(np.asarray(ids), self._joined(), self._state)
        self._last, self._streams, self._first = (n, int(token)), [], n
        out = [int(np.argmax(logits))]
        state = self._state.fork() if k > 1 else None
        while len(out) < k:
            logits, X = self.block.run(np.asarray(out[-1:]), X[-1:], state)
            out.append(int(np.argmax(logits)))
        return self._counted(out)


class Pace:
    """Whether proposals pay on this machine, measured: seconds per token of plain steps and of
    verification passes (the proposal's making included), as moving averages. A drafter can
    only judge whether its proposals are kept; whether keeping them is faster depends on what a
    pass of several positions costs here (little more than a step where decode is bound by
    memory bandwidth; nearly a step per position on a CPU bound by arithmetic, where only long
    kept proposals pay). When passes have been slower per token than steps, proposals pause
    for ``hold`` steps, each pause twice the last (up to ``longest``) until passes pay again."""

    def __init__(self, hold: int = 32, longest: int = 2048, margin: float = 1.02, weight: float = 0.25,
                 warmup: int = 3) -> None:
        """``margin``: how much slower per token passes may be before proposals pause (inf:
        never); ``warmup``: plain steps timed before the first proposal."""
        self.first_hold, self.longest, self.margin, self.weight = hold, longest, margin, weight
        self.warmup = warmup
        self._hold = hold  # the next pause
        self._rest = 0  # steps left in this pause
        self.plain_s: float | None = None  # seconds per token, plain steps
        self.pass_s: float | None = None  # seconds per token, verification passes
        self._passes = 0  # passes since the last judgement
        self._timed = 0  # plain steps timed
        self.pauses = 0

    def _mix(self, avg: float | None, x: float) -> float:
        return x if avg is None else avg + self.weight * (x - avg)

    def step(self, seconds: float) -> None:
        """A plain step took ``seconds``."""
        self.plain_s = self._mix(self.plain_s, seconds)
        self._timed += 1

    def verified(self, seconds: float, tokens: int) -> None:
        """A pass (its proposal's making included) took ``seconds`` and gave ``tokens``."""
        self.pass_s = self._mix(self.pass_s, seconds / tokens)
        self._passes += 1
        if self._passes >= 4 and self.plain_s is not None:
            self._passes = 0
            if self.pass_s > self.margin * self.plain_s:
                self._rest, self._hold = self._hold, min(2 * self._hold, self.longest)
                self.pass_s = None
                self.pauses += 1
            else:
                self._hold = self.first_hold

    def allow(self) -> bool:
        """Whether to ask for a proposal this step: not before a few plain steps were timed
        (the comparison needs them), nor during a pause (which also times plain steps)."""
        if self._timed < self.warmup:
            return False
        if self._rest > 0:
            self._rest -= 1
            return False
        return True


def drafter(kind: str, mtp: "MtpBlock | None" = None) -> Drafter | None:
    """The drafter --speculate names (None for off), ``mtp`` the MTP block that "mtp" drafts
    with; ValueError for one that cannot run here."""
    if kind == "off":
        return None
    if kind == "ngram":
        return NgramDrafter()
    if kind == "mtp":
        if mtp is None:
            raise ValueError("--speculate mtp needs the MTP file: --mtp FILE (or 'mtp' in config.toml); "
                             "--speculate ngram needs none")
        return MtpDrafter(mtp)
    if kind == "dspark":
        raise ValueError("--speculate dspark needs a DSpark draft model, which this build does not run "
                         "(docs/speculation.md); --speculate mtp or ngram instead")
    raise ValueError(f"unknown --speculate {kind!r} (choose from {', '.join(SPECULATE)})")
