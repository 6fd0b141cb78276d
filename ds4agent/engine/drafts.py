"""Where proposed tokens come from (docs/speculation.md): a ``Drafter`` proposes what may follow
the session's tokens; the session verifies the proposal in one pass and keeps what the model
agrees with (Session.speculate), so a drafter can only make decoding faster or slower, never
different.

``NgramDrafter`` looks the conversation's last tokens up in the conversation itself (prompt,
tool results, earlier answers) and proposes what followed them there: no weights, any model
file, and strong where an agent spends its time (a file rewritten with a small change, code or
tool output quoted back). It adapts: the proposal grows while proposals are kept whole and
shrinks when they are not, and after several proposals in a row of which nothing was kept it
pauses, then tries again, so on text that does not repeat it costs almost nothing.
"""

from __future__ import annotations

from typing import Protocol, Sequence

SPECULATE = ("off", "ngram", "mtp", "dspark")  # --speculate


class Drafter(Protocol):
    name: str

    def propose(self, tokens: Sequence[int], most: int) -> list[int]:
        """Up to ``most`` tokens that may follow ``tokens`` (every token of the session so far
        and the one just sampled)."""
        ...

    def feedback(self, proposed: int, kept: int) -> None:
        """How many of the last proposal the model kept."""
        ...


class NgramDrafter:
    """The longest recent repeat of the last N tokens (N = ``order`` down to 2) proposes the
    tokens that followed it."""

    name = "ngram"

    def __init__(self, order: int = 4, start: int = 4, most: int = 8, pause_after: int = 4, pause: int = 16) -> None:
        self.order, self.most, self.pause_after, self.pause = order, most, pause_after, pause
        self.k = start  # tokens proposed next time (adapted)
        self._seen: list[int] = []  # the tokens indexed so far
        self._where: list[dict[tuple[int, ...], int]] = [{} for _ in range(order + 1)]  # n-gram -> end of its last use
        self._misses = 0  # proposals in a row of which nothing was kept
        self._rest = 0  # steps left in a pause
        self.proposed = self.kept = self.proposals = 0

    def _index(self, tokens: Sequence[int]) -> None:
        """Extend the n-gram tables to ``tokens`` (rebuilt when they are not an extension)."""
        seen = self._seen
        if len(tokens) < len(seen) or list(tokens[: len(seen)]) != seen:  # another conversation
            self._seen, self._where = [], [{} for _ in range(self.order + 1)]
            seen = self._seen
        for end in range(len(seen) + 1, len(tokens) + 1):
            seen.append(int(tokens[end - 1]))
            for n in range(2, self.order + 1):
                if end >= n:
                    # the n-gram ending before ``end``: what followed it starts at ``end``
                    self._where[n][tuple(seen[end - n : end])] = end

    def propose(self, tokens: Sequence[int], most: int) -> list[int]:
        if self._rest > 0:
            self._rest -= 1
            return []
        tokens = list(tokens)
        # Index everything but the last occurrence, so a lookup finds an earlier one.
        self._index(tokens[:-1])
        k = min(self.k, most)
        if k <= 0:
            self._index(tokens)
            return []
        out: list[int] = []
        for n in range(self.order, 1, -1):
            if len(tokens) < n:
                continue
            at = self._where[n].get(tuple(tokens[-n:]))
            if at is not None:
                out = tokens[at : at + k]
                break
        self._index(tokens)
        if out:
            self.proposals += 1
            self.proposed += len(out)
        return out

    def feedback(self, proposed: int, kept: int) -> None:
        self.kept += kept
        if kept == proposed:
            self.k = min(self.k + 1, self.most)
            self._misses = 0
        else:
            self.k = max(2, min(self.k, kept + 1))
            self._misses = self._misses + 1 if kept == 0 else 0
            if self._misses >= self.pause_after:
                self._misses, self._rest = 0, self.pause

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
