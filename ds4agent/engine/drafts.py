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
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ..settings import SPECULATE  # --speculate


class Drafter(Protocol):
    name: str

    def propose(self, history: Sequence[int], n: int, token: int, most: int) -> list[int]:
        """Up to ``most`` tokens that may follow ``history[:n]`` (the session's tokens, a list
        that only grows while the conversation goes on) and ``token``, just sampled."""
        ...

    def feedback(self, proposed: int, kept: int) -> None:
        """How many of the last proposal the model kept."""
        ...


class NgramDrafter:
    """The most recent earlier occurrence of the last N tokens (N = ``order`` down to 2)
    proposes the tokens that followed it. The n-gram tables grow with the conversation, a few
    dictionary writes per token: a step costs the same at 100 tokens as at 100 000."""

    name = "ngram"

    def __init__(self, order: int = 4, start: int = 4, most: int = 8, pause_after: int = 4, pause: int = 16,
                 longest_pause: int = 1024) -> None:
        self.order, self.most, self.pause_after, self.pause = order, most, pause_after, pause
        self.longest_pause = longest_pause
        self._pause = pause  # the next pause: doubled each time one follows no kept token
        self.k = start  # tokens proposed next time (adapted)
        self._history: Sequence[int] | None = None  # the list indexed, and how far
        self._n = 0
        self._where: list[dict[tuple[int, ...], int]] = [{} for _ in range(order + 1)]  # n-gram -> end of its last use
        self._misses = 0  # proposals in a row of which nothing was kept
        self._rest = 0  # steps left in a pause
        self.proposed = self.kept = self.proposals = 0

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
        if self._rest > 0:
            self._rest -= 1
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
            self.k = max(2, min(self.k, kept + 1))
            self._misses = self._misses + 1 if kept == 0 else 0
            if self._misses >= self.pause_after:
                # Text that does not repeat: each pause twice the last, so that a rejected
                # proposal (a pass of several tokens for one) costs a vanishing share of steps.
                self._misses, self._rest = 0, self._pause
                self._pause = min(2 * self._pause, self.longest_pause)

    def stats(self) -> dict[str, float]:
        return {"proposals": self.proposals, "drafted": self.proposed, "accepted": self.kept,
                "mean_accepted": round(self.kept / self.proposals, 2) if self.proposals else 0.0}


def drafter(kind: str) -> Drafter | None:
    """The drafter --speculate names (None for off); ValueError for one that cannot run here."""
    if kind == "off":
        return None
    if kind == "ngram":
        return NgramDrafter()
    if kind in ("mtp", "dspark"):
        raise ValueError(f"--speculate {kind} needs its draft model, which this build does not run yet "
                         "(docs/speculation.md); --speculate ngram needs none")
    raise ValueError(f"unknown --speculate {kind!r} (choose from {', '.join(SPECULATE)})")
