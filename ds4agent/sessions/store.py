"""The on-disk session store: a directory of ``<sha1>.kv`` files (see kvfile.py).

The session *is* its KV cache: saving writes the engine's snapshot next to the rendered text,
loading restores it without evaluating the model. Guarantees:

* writes are atomic (temp file, fsync, rename, fsync of the directory): a crash or a full disk
  leaves the store exactly as it was; two processes saving at once never see a torn file;
* a corrupt, truncated, foreign or newer-version file is reported (``problems``) and skipped;
  it never takes the listing or the program down;
* after a save, older checkpoints of the same conversation (whose text is a strict prefix of
  the new one) are removed; saving the same text twice is idempotent;
* an optional disk budget evicts the least valuable sessions (never the one just written);
* every failure of a public method is a one-line ``StoreError``, and a failed ``load`` leaves
  the caller's session exactly as it was;
* nothing in the folder can make the store block: special files named like sessions (FIFOs,
  sockets, devices, directories, symbolic links) are reported and skipped, never opened in a
  way that waits (kvfile.open_regular);
* temporary files of writers killed mid-save are swept by later saves (``_sweep_temps``).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .. import settings
from .kvfile import (
    MAX_TOOLMAP,
    READ_CHUNK,
    REASON_NAMES,
    REASONS,
    KVFile,
    KVFileError,
    KVFileGone,
    KVHeader,
    KVReader,
    read_file,
    read_header,
    read_summary,
    text_sha,
)

if TYPE_CHECKING:
    from ..engine import Session

_NAME = re.compile(r"^[0-9a-f]{40}\.kv$")
_SHA = re.compile(r"[0-9a-f]{40}")
# _write_atomic's temporary files: ".<sha>.kv.<writer pid>.<ns>.tmp".
_TEMP = re.compile(r"^\.[0-9a-f]{40}\.kv\.([0-9]{1,10})\.[0-9]+\.tmp$")
# A dead writer's temporary file is swept once it has not been written for this long (see
# _sweep_temps for why the pid alone is not enough).
STALE_TEMP_SECONDS = 300
TITLE_CHARS = 70
# Save reasons of files meant as the common start of many sessions: a save never drops them as
# an older checkpoint of the conversation it writes (docs/protocol.md §4.3).
SHARED_PREFIXES = ("agent-system", "cold")
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
    text_bytes: int = 0  # length of the rendered text (prefix lookups compare hashes of it)
    steering: dict | None = None  # the directional steering the KV was computed under (engine/steering.py)

    @property
    def steering_text(self) -> str:
        """"verbosity ffn 1 attn 0", or "" when unsteered."""
        return steering_words(self.steering)


def steering_words(record: dict | None) -> str:
    """A steering record (engine/steering.py Steering.record) as the session list shows it:
    "verbosity ffn 1 attn 0"; "" for none."""
    if not record:
        return ""
    return f"{record.get('name', '?')} ffn {record.get('ffn', 0):g} attn {record.get('attn', 0):g}"


def default_directory() -> Path:
    return settings.sessions_dir()


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
        self._dir_error: str | None = None  # why the last listing could not read the folder

    # -- plumbing ---------------------------------------------------------------------------
    def _ensure_dir(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.dir}: cannot create the session directory: {e.strerror}") from None
        try:
            is_dir, writable = self.dir.is_dir(), os.access(self.dir, os.W_OK | os.X_OK)
        except OSError as e:
            raise StoreError(f"{self.dir}: cannot use the session directory: {e.strerror}") from None
        if not is_dir:
            raise StoreError(f"{self.dir}: is not a directory")
        if not writable:
            raise StoreError(f"{self.dir}: session directory is not writable")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise writers across processes (readers never need the lock)."""
        self._ensure_dir()
        lock = self.dir / ".lock"
        # O_NONBLOCK: a FIFO put in the lock's place must not hang the open (flock itself
        # still waits for other writers, as it should); O_NOFOLLOW: never create a file
        # wherever a link put there points.
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         0o644)
        except OSError as e:
            raise StoreError(f"{lock}: cannot open the store's lock file: {e.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                raise StoreError(f"{lock}: cannot lock the store: {e.strerror}") from None
            try:
                yield
            finally:
                # Explicitly: a process forked meanwhile shares the descriptor, and closing
                # ours alone would leave the lock held.
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def saved(self, text: bytes) -> str | None:
        """The id of the session saved with exactly this rendered text, if there is one (a
        cheap existence check; load verifies the file)."""
        sha = text_sha(text)
        return sha if self.path(sha).exists() else None

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
            except OSError:
                pass  # gone already, or left for a later save's sweep
            if e.errno == errno.ENOSPC:
                raise StoreError(f"{self.dir}: disk full while saving; the store is unchanged") from None
            raise StoreError(f"{path}: cannot write: {e.strerror}") from None
        try:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise StoreError(f"{self.dir}: saved, but the folder could not be synced to disk: {e.strerror}") from None

    def _sweep_temps(self) -> None:
        """Remove temporary files of writers that died mid-save (kill -9, a crash, power loss):
        nothing else ever would. Called by writers, with the store lock held.

        A file is removed only when (1) we hold the lock, which every writer of this code holds
        from creating its temporary file to renaming it, so none of them is mid-write; (2) its
        writer's pid is not alive here; and (3) it has not been written for STALE_TEMP_SECONDS.
        (2) and (3) cover writers that do not share our lock: one in another pid namespace (a
        container sharing the folder) or on another host (a network filesystem) has a pid that
        means nothing here and may look dead, while a live writer keeps its file's mtime fresh
        and renames right after its fsync. pid reuse only errs the safe way: a dead writer's
        pid taken by another process keeps its file until that process goes too. No start
        time is recorded in the name, so names stay as they are for readers of older builds."""
        now = time.time()
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            m = _TEMP.match(name)
            if not m:
                continue
            path = self.dir / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < STALE_TEMP_SECONDS or _alive(int(m.group(1))):
                continue
            try:
                path.unlink()
            except OSError:
                pass  # another sweeper was first, or we may not; the next save tries again

    # -- save -------------------------------------------------------------------------------
    def save(self, session: "Session", reason: str = "unknown", tool_map: dict[str, bytes] | None = None) -> str:
        """Write the session; returns the SHA-1 of its rendered text (the session's name)."""
        if reason not in REASONS:
            raise StoreError(f"unknown save reason {reason!r}")
        tools = _checked_tool_map(tool_map)
        tokens = session.tokens
        if not tokens:
            raise StoreError("nothing to save: the session holds no tokens")
        text = session.tokenizer.decode_bytes(tokens)
        sha = text_sha(text)
        now = int(time.time())
        with self._locked():
            self._sweep_temps()
            path = self.path(sha)
            created, hits = now, 0
            try:
                old, _ = read_header(path, with_text=False)
                created, hits = old.created, old.hits
            except KVFileError:
                pass  # none yet, or a damaged or special file of that name: it is replaced
            info = session.info
            header = KVHeader(info.expert_quant_bits, REASONS[reason], 0, len(tokens), hits, session.ctx,
                              info.fingerprint, created, now, 0, 0)
            steering = getattr(session, "steering", None)
            record = json.dumps(steering.record(), ensure_ascii=False).encode() \
                if steering is not None and steering.active else b""
            data = KVFile(header, text, session.snapshot(), tools, record).to_bytes()
            self._write_atomic(path, data)
            del data
            self._drop_prefixes(sha, text)
            self._enforce_budget(protect=sha)
        return sha

    def _drop_prefixes(self, sha: str, text: bytes) -> None:
        for info in _prefixes_of(text, self._infos()):
            # The agent's cached system prompt is a prefix of every agent session, and a "cold"
            # file (the server's shared system and tools prefix) of many conversations: keep them.
            if info.sha != sha and info.text_bytes < len(text) and info.reason not in SHARED_PREFIXES:
                try:
                    info.path.unlink()
                except OSError:
                    pass  # gone already, or not ours to remove: an old checkpoint may stay

    # -- read side --------------------------------------------------------------------------
    def _infos(self) -> list[SessionInfo]:
        self.problems, self._dir_error = [], None
        out: list[SessionInfo] = []
        try:
            names = sorted(os.listdir(self.dir))
        except (FileNotFoundError, NotADirectoryError):
            return out  # no store yet: nothing saved
        except OSError as e:
            self._dir_error = f"{self.dir}: cannot read the session directory: {e.strerror}"
            self.problems.append(self._dir_error)
            return out
        for name in names:
            if not _NAME.match(name):
                continue
            try:
                out.append(self._info(self.dir / name))
            except KVFileGone:
                continue  # dropped by another process since the folder was read: not damage
            except KVFileError as e:
                self.problems.append(str(e))
        return out

    @staticmethod
    def _info(p: Path) -> SessionInfo:
        h, sha, head, size, steering = read_summary(p)
        if sha != p.stem:
            raise KVFileError(f"{p}: name does not match its text (renamed or corrupt); skipped")
        return _make_info(p, h, head, size, steering)

    def list(self) -> list[SessionInfo]:
        """Readable sessions, most recently used first; unreadable files go to ``problems``
        (and so does a folder that cannot be read: a listing reports, it never fails)."""
        return sorted(self._infos(), key=lambda i: (i.last_used, i.created), reverse=True)

    def resolve(self, prefix: str) -> str:
        prefix = prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{1,40}", prefix):
            raise StoreError(f"{prefix!r} is not a session id (hex digits of its SHA-1)")
        hits = [i for i in self.list() if i.sha.startswith(prefix)]
        if not hits and self._dir_error:
            raise StoreError(self._dir_error)
        if not hits:
            raise StoreError(f"no session starts with {prefix}")
        if len(hits) > 1:
            shown = ", ".join(f"{i.sha[:12]} ({i.title})" for i in hits[:5])
            raise StoreError(f"{prefix} is ambiguous: {len(hits)} sessions match: {shown}")
        return hits[0].sha

    def _checked_path(self, sha: str) -> Path:
        """The file of a full session id; anything else (a path, a prefix) is refused before
        it can name a file outside the store."""
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise StoreError(f"{sha!r} is not a session id (the 40 hex digits of its SHA-1)")
        return self.path(sha)

    def load(self, sha: str, session: "Session") -> SessionInfo:
        """Make ``session`` hold the saved conversation. A full file restores its KV snapshot
        with no model evaluation; a stripped one re-prefills its text.

        On any failure (a StoreError, or an interrupt during a re-prefill) the session is left
        exactly as it was before the call: the user's live conversation is never lost to a
        file that turned out to be unusable."""
        from ..engine import ContextFullError, PayloadError

        path = self._checked_path(sha)
        cp = session.checkpoint()  # O(1): rolling back costs no copy and no prefill
        try:
            return self._load(path, sha, session)
        except BaseException as e:
            session.rollback(cp)
            if isinstance(e, StoreError):
                raise
            if isinstance(e, KVFileGone):
                raise StoreError(f"no session {sha}") from None
            if isinstance(e, KVFileError):
                raise StoreError(str(e)) from None
            if isinstance(e, (PayloadError, ContextFullError, UnicodeError)):
                raise StoreError(f"{path}: {e}") from None
            if isinstance(e, OSError):
                raise StoreError(f"{path}: cannot load: {e.strerror or e}") from None
            if isinstance(e, MemoryError):
                raise StoreError(f"{path}: not enough memory to load it") from None
            raise  # an interrupt, or a bug: not disguised as a damaged file

    def _load(self, path: Path, sha: str, session: "Session") -> SessionInfo:
        info, tok = session.info, session.tokenizer
        cfg = info.config
        # Everything that can be checked from the header and the model comes before anything
        # big is read: a sparse file claiming 100 GB costs a few preads.
        with KVReader(path) as r:
            h = r.header
            if h.quant_bits != info.expert_quant_bits:
                raise StoreError(f"{path}: saved with {h.quant_bits}-bit experts, this model has "
                                 f"{info.expert_quant_bits}-bit experts (another model)")
            if h.fingerprint not in (0, info.fingerprint):
                raise StoreError(f"{path}: saved with another model file; not loaded")
            if h.tokens >= session.ctx:
                raise StoreError(f"{path}: holds {h.tokens} tokens, which needs a context of {h.tokens + 1}; "
                                 f"this session has {session.ctx}")
            full = h.payload_bytes > 0
            if full:
                want = session.payload_size(h.tokens)
                if h.payload_bytes != want:
                    raise StoreError(f"{path}: payload of {h.payload_bytes} bytes, where {h.tokens} tokens of this "
                                     f"model take {want} (damaged, or saved with another model); not loaded")
                # The payload's own token ids (its header's count already equals the file
                # header's, KVReader checked): their text must be the saved text, whose length
                # is known before it is read.
                ids = r.payload_tokens()
                if any(i >= cfg.n_vocab for i in ids):
                    raise StoreError(f"{path}: payload holds a token id outside the vocabulary (damaged); not loaded")
                expect = tok.decode_bytes(ids)
                if len(expect) != h.text_bytes:
                    raise StoreError(f"{path}: payload tokens do not match the saved text (corrupt); not loaded")
            f = r.read()
            size = r.size
        if f.sha() != sha:
            raise StoreError(f"{path}: text does not match the file's name (corrupt); not loaded")
        if full:
            if f.text != expect:
                raise StoreError(f"{path}: payload tokens do not match the saved text (corrupt); not loaded")
            session.restore(f.payload)  # replaces the state whole, or raises and changes nothing
            if session.tokens != ids:
                raise StoreError(f"{path}: payload tokens do not match the saved text (corrupt); not loaded")
        else:
            ids = tok.encode_rendered(f.text.decode("utf-8", errors="replace"))
            if len(ids) >= session.ctx:
                raise StoreError(f"{path}: its text is {len(ids)} tokens, which needs a context of {len(ids) + 1}; "
                                 f"this session has {session.ctx}")
            session.sync(ids)
        text = f.text
        steering = json.loads(f.steering) if f.steering else None
        del f  # the file's buffer; the session now holds its own state
        # From here on the load has succeeded: what is returned comes from what was read (the
        # file may be gone already, dropped by another process's save), and counting the hit
        # is bookkeeping that may fail without failing the load.
        touched = self._touch(sha)
        if touched is not None:
            h = dataclasses.replace(h, hits=touched.hits, last_used=touched.last_used)
        return _make_info(path, h, text[:READ_CHUNK], size, steering)

    def _touch(self, sha: str) -> KVHeader | None:
        """Count a hit and update last-used, in place (the header is fixed-size). Returns the
        new header, or None where that could not be done (a read-only store, the file gone)."""
        path = self.path(sha)
        try:
            with self._locked():
                with KVReader(path, writable=True) as r:
                    h = r.header
                    h.hits += 1
                    h.last_used = int(time.time())
                    os.pwrite(r.fd, h.pack()[:48], 0)
                    return h
        except (StoreError, KVFileError, OSError):
            return None

    def delete(self, sha: str) -> None:
        path = self._checked_path(sha)
        with self._locked():
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    raise StoreError(f"{path}: is a directory, not a session file; not deleted")
                path.unlink()
            except FileNotFoundError:
                raise StoreError(f"no session {sha}") from None
            except OSError as e:
                raise StoreError(f"{path}: cannot delete: {e.strerror}") from None

    def strip(self, sha: str) -> None:
        """Keep header and text, drop the payload (a stripped session resumes by re-prefilling)."""
        path = self._checked_path(sha)
        with self._locked():
            self._sweep_temps()
            try:
                f = read_file(path)
            except KVFileGone:
                raise StoreError(f"no session {sha}") from None
            except KVFileError as e:
                raise StoreError(str(e)) from None
            if f.sha() != sha:
                raise StoreError(f"{path}: text does not match the file's name (corrupt); not stripped")
            f.payload = b""
            f.header.payload_bytes = 0
            self._write_atomic(path, f.to_bytes())

    def tool_maps(self) -> Iterator[tuple[dict[str, bytes], str]]:
        """(tool-id map, rendered text) of every listed session file that carries a map; a
        file that cannot be read is skipped (a listing's problems say why)."""
        for info in self._infos():
            try:
                with KVReader(info.path) as r:
                    tool_map = r.tool_map()
                    if tool_map:
                        text = r.text()
                    else:
                        continue
            except KVFileError:
                continue
            yield tool_map, text.decode("utf-8", errors="replace")

    def longest_prefix(self, rendered_text: str | bytes) -> str | None:
        """The saved session whose text is the longest prefix of ``rendered_text``."""
        try:
            text = rendered_text.encode("utf-8") if isinstance(rendered_text, str) else bytes(rendered_text)
        except UnicodeEncodeError:
            raise StoreError("the text to look up is not valid Unicode (it holds a lone surrogate)") from None
        best = None
        for info in _prefixes_of(text, self._infos()):
            best = info.sha  # in order of length: the last one is the longest
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
            try:
                i.path.unlink(missing_ok=True)
            except OSError:
                continue  # cannot be removed (permissions): it still counts against the budget
            total -= i.size


def _make_info(p: Path, h: KVHeader, head: bytes, size: int, steering: dict | None = None) -> SessionInfo:
    return SessionInfo(p.stem, title_of(head), h.created, h.last_used, h.tokens, size, h.quant_bits, h.hits,
                       REASON_NAMES.get(h.reason, "unknown"), h.payload_bytes == 0, p, h.text_bytes, steering)


def _prefixes_of(text: bytes, infos: list[SessionInfo]) -> Iterator[SessionInfo]:
    """The listed sessions whose text is a prefix of ``text``, shortest first.

    A listed file's name is the SHA-1 of its text (checked when it was listed), so its text is
    a prefix of ``text`` exactly when the SHA-1 of ``text[:its length]`` is its name: one pass
    over ``text``, and no session file is read again."""
    h, pos, view = hashlib.sha1(), 0, memoryview(text)
    for info in sorted((i for i in infos if i.text_bytes <= len(text)), key=lambda i: i.text_bytes):
        h.update(view[pos : info.text_bytes])
        pos = info.text_bytes
        if h.hexdigest() == info.sha:
            yield info


def _checked_tool_map(tool_map: dict[str, bytes] | None) -> dict[str, bytes]:
    """The tool map as the file will hold it, or a StoreError saying what is wrong with it."""
    if tool_map is None:
        return {}
    if not isinstance(tool_map, dict):
        raise StoreError("the tool map must be a dict of tool-call ids to DSML bytes")
    out, total = {}, 8
    for ident, dsml in tool_map.items():
        if not isinstance(ident, str) or not isinstance(dsml, (bytes, bytearray, memoryview)):
            raise StoreError("the tool map must map tool-call ids (str) to DSML bytes")
        try:
            raw = ident.encode("utf-8")
        except UnicodeEncodeError:
            raise StoreError(f"tool-call id {ident!r} is not valid Unicode") from None
        out[ident] = bytes(dsml)
        total += 8 + len(raw) + len(out[ident])
    if total > MAX_TOOLMAP:
        raise StoreError(f"tool map of {total} bytes exceeds the {MAX_TOOLMAP >> 20} MiB a session file may hold")
    return out


def _alive(pid: int) -> bool:
    """Whether a process of this pid exists here (one of another user counts)."""
    if pid <= 0:
        return False  # never a writer's pid, and os.kill(0, ...) would address our own group
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OverflowError:
        return False  # beyond any pid of this system
    except OSError:
        return True  # EPERM (another user's process) or unknown: keep its file
    return True
