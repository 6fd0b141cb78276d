"""The on-disk session store: a directory of ``<sha1>.kv`` files (see kvfile.py).

The session *is* its KV cache: saving writes the engine's snapshot next to the rendered text,
loading restores it without evaluating the model. Guarantees:

* writes are atomic (temp file, fsync, rename, fsync of the directory): a crash or a full disk
  leaves the store exactly as it was; two processes saving at once never see a torn file;
* a corrupt, truncated, foreign or newer-version file is reported (``problems``) and skipped;
  it never takes the listing or the program down;
* after a save, older checkpoints of the same conversation (whose text is a strict prefix of
  the new one) are removed; saving the same text twice is idempotent;
* an optional disk budget evicts the least valuable sessions (never the one just written).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .kvfile import REASON_NAMES, REASONS, KVFile, KVFileError, KVHeader, read_file, read_header, text_sha

if TYPE_CHECKING:
    from ..engine.session import Session

_NAME = re.compile(r"^[0-9a-f]{40}\.kv$")
TITLE_CHARS = 70
_USER = "<｜User｜>".encode()
# Any special token ends the first user message (a turn marker, </think>, <tool_result>...).
_TITLE_END = re.compile("<｜[^｜]*｜>|</?think>|<tool_result>")


class StoreError(ValueError):
    """A store operation that cannot be done; one line."""


@dataclass(frozen=True)
class SessionInfo:
    sha: str
    title: str
    created: int
    last_used: int
    tokens: int
    size: int
    quant_bits: int
    hits: int
    reason: str
    stripped: bool
    path: Path


def default_directory() -> Path:
    env = os.environ.get("DS4_SESSIONS")
    if env:
        return Path(env).expanduser()
    from ..engine.demo import ds4_home

    return ds4_home() / "sessions"


def title_of(text: bytes) -> str:
    """The first user message, whitespace collapsed, cut to 70 characters."""
    i = text.find(_USER)
    if i < 0:
        return "(no user message)"
    body = text[i + len(_USER) :].decode("utf-8", errors="replace")
    m = _TITLE_END.search(body)
    body = " ".join((body[: m.start()] if m else body).split())
    return body if len(body) <= TITLE_CHARS else body[: TITLE_CHARS - 1] + "…"


class SessionStore:
    def __init__(self, directory: str | os.PathLike[str] | None = None, budget_bytes: int | None = None) -> None:
        self.dir = Path(directory) if directory is not None else default_directory()
        self.budget_bytes = budget_bytes
        self.problems: list[str] = []  # files skipped by the last listing, one line each

    # -- plumbing ---------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.dir}: cannot create the session directory: {e.strerror}") from None
        if not self.dir.is_dir():
            raise StoreError(f"{self.dir}: is not a directory")
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise StoreError(f"{self.dir}: session directory is not writable")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise writers across processes (readers never need the lock)."""
        self._ensure_dir()
        fd = os.open(self.dir / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def path(self, sha: str) -> Path:
        return self.dir / f"{sha}.kv"

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            if e.errno == errno.ENOSPC:
                raise StoreError(f"{self.dir}: disk full while saving; the store is unchanged") from None
            raise StoreError(f"{path}: cannot write: {e.strerror}") from None
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- save -------------------------------------------------------------------------------
    def save(self, session: "Session", reason: str = "unknown", tool_map: dict[str, bytes] | None = None) -> str:
        """Write the session; returns the SHA-1 of its rendered text (the session's name)."""
        if reason not in REASONS:
            raise StoreError(f"unknown save reason {reason!r}")
        tokens = session.tokens
        if not tokens:
            raise StoreError("nothing to save: the session holds no tokens")
        engine = session.engine
        text = engine.tokenizer.decode_bytes(tokens)
        sha = text_sha(text)
        now = int(time.time())
        with self._locked():
            path = self.path(sha)
            created, hits = now, 0
            if path.exists():
                try:
                    old, _ = read_header(path, with_text=False)
                    created, hits = old.created, old.hits
                except KVFileError:
                    pass  # a damaged file of the same name is simply replaced
            info = engine.info
            header = KVHeader(info.expert_quant_bits, REASONS[reason], 0, len(tokens), hits, session.ctx,
                              info.fingerprint, created, now, 0, 0)
            data = KVFile(header, text, session.snapshot(), dict(tool_map or {})).to_bytes()
            self._write_atomic(path, data)
            self._drop_prefixes(sha, text)
            self._enforce_budget(protect=sha)
        return sha

    def _drop_prefixes(self, sha: str, text: bytes) -> None:
        for p in self.dir.glob("*.kv"):
            if p.name == f"{sha}.kv" or not _NAME.match(p.name):
                continue
            try:
                h, other = read_header(p)
            except KVFileError:
                continue
            # The agent's cached system prompt is a prefix of every agent session: keep it.
            if len(other) < len(text) and text.startswith(other) and h.reason != REASONS["agent-system"]:
                p.unlink(missing_ok=True)

    # -- read side --------------------------------------------------------------------------
    def _infos(self) -> list[SessionInfo]:
        self.problems = []
        out = []
        if not self.dir.is_dir():
            return out
        for p in sorted(self.dir.glob("*.kv")):
            if not _NAME.match(p.name):
                continue
            try:
                out.append(self._info(p))
            except KVFileError as e:
                self.problems.append(str(e))
        return out

    @staticmethod
    def _info(p: Path) -> SessionInfo:
        h, text = read_header(p)
        if text_sha(text) != p.stem:
            raise KVFileError(f"{p}: name does not match its text (renamed or corrupt); skipped")
        return SessionInfo(p.stem, title_of(text), h.created, h.last_used, h.tokens, p.stat().st_size, h.quant_bits,
                           h.hits, REASON_NAMES.get(h.reason, "unknown"), h.payload_bytes == 0, p)

    def list(self) -> list[SessionInfo]:
        """Readable sessions, most recently used first; unreadable files go to ``problems``."""
        return sorted(self._infos(), key=lambda i: (i.last_used, i.created), reverse=True)

    def resolve(self, prefix: str) -> str:
        prefix = prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{1,40}", prefix):
            raise StoreError(f"{prefix!r} is not a session id (hex digits of its SHA-1)")
        hits = [i for i in self.list() if i.sha.startswith(prefix)]
        if not hits:
            raise StoreError(f"no session starts with {prefix}")
        if len(hits) > 1:
            shown = ", ".join(f"{i.sha[:12]} ({i.title})" for i in hits[:5])
            raise StoreError(f"{prefix} is ambiguous: {len(hits)} sessions match: {shown}")
        return hits[0].sha

    def load(self, sha: str, session: "Session") -> SessionInfo:
        """Make ``session`` hold the saved conversation. A full file restores its KV snapshot
        with no model evaluation; a stripped one re-prefills its text."""
        from ..engine.state import PayloadError

        path = self.path(sha)
        try:
            f = read_file(path)
        except KVFileError as e:
            raise StoreError(str(e)) from None
        if f.sha() != sha:
            raise StoreError(f"{path}: text does not match the file's name (corrupt); not loaded")
        info = session.engine.info
        if f.header.quant_bits != info.expert_quant_bits:
            raise StoreError(f"{path}: saved with {f.header.quant_bits}-bit experts, this model has "
                             f"{info.expert_quant_bits}-bit experts (another model)")
        if f.header.fingerprint not in (0, info.fingerprint):
            raise StoreError(f"{path}: saved with another model file; not loaded")
        if f.payload:
            try:
                session.restore(f.payload)
            except PayloadError as e:
                raise StoreError(f"{path}: {e}") from None
            if session.engine.tokenizer.decode_bytes(session.tokens) != f.text:
                session.reset()
                raise StoreError(f"{path}: payload tokens do not match the saved text (corrupt); not loaded")
        else:
            ids = session.engine.tokenizer.encode_rendered(f.text.decode("utf-8", errors="replace"))
            session.sync(ids)
        self._touch(sha)
        return self._info(path)

    def _touch(self, sha: str) -> None:
        """Count a hit and update last-used, in place (the header is fixed-size)."""
        path = self.path(sha)
        with self._locked():
            try:
                h, _ = read_header(path, with_text=False)
                h.hits += 1
                h.last_used = int(time.time())
                with open(path, "r+b") as fh:
                    fh.write(h.pack()[:48])
            except (KVFileError, OSError):
                pass

    def delete(self, sha: str) -> None:
        with self._locked():
            try:
                self.path(sha).unlink()
            except FileNotFoundError:
                raise StoreError(f"no session {sha}") from None

    def strip(self, sha: str) -> None:
        """Keep header and text, drop the payload (a stripped session resumes by re-prefilling)."""
        path = self.path(sha)
        with self._locked():
            try:
                f = read_file(path)
            except KVFileError as e:
                raise StoreError(str(e)) from None
            f.payload = b""
            f.header.payload_bytes = 0
            self._write_atomic(path, f.to_bytes())

    def longest_prefix(self, rendered_text: str | bytes) -> str | None:
        """The saved session whose text is the longest prefix of ``rendered_text``."""
        text = rendered_text.encode("utf-8") if isinstance(rendered_text, str) else rendered_text
        best, best_len = None, -1
        for info in self._infos():
            try:
                _, saved = read_header(info.path)
            except KVFileError:
                continue
            if len(saved) > best_len and text.startswith(saved):
                best, best_len = info.sha, len(saved)
        return best

    # -- budget -----------------------------------------------------------------------------
    @staticmethod
    def _value(i: SessionInfo, now: int) -> float:
        """Worth keeping: reused, long (costly to rebuild), recent; per byte of disk."""
        age_days = max(0, now - i.last_used) / 86400
        return (1 + i.hits) * (1 + i.tokens) / max(1, i.size) / (1 + age_days)

    def _enforce_budget(self, protect: str) -> None:
        if not self.budget_bytes:
            return
        infos = self._infos()
        total = sum(i.size for i in infos)
        now = int(time.time())
        for i in sorted(infos, key=lambda i: self._value(i, now)):
            if total <= self.budget_bytes:
                break
            if i.sha == protect:
                continue
            i.path.unlink(missing_ok=True)
            total -= i.size
