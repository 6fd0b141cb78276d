"""`ds4 pull`: the published model files from the Hugging Face hub, resumed after an
interruption, each checked against the hub's own SHA-256 before ds4 would open it.

The files are the GGUFs published for antirez/ds4 (`antirez/deepseek-v4-gguf`). The hub's client
(`huggingface_hub`) does the talking: the file's metadata (size, the LFS object's SHA-256, the
commit) from one HEAD, the token from `HF_TOKEN` or its cache, `HF_ENDPOINT` for another hub, and
the transfer (its `http_get`, resumed from the bytes already here with a Range request). The
client's own download would restart an interrupted transfer from zero (it writes to a temporary
file named per process), which for an 81 GiB file is not an option.

Bytes go to ``<final>.part`` and become the file only once their SHA-256 equals the hub's, so a
damaged or partial file is never where ds4 would open it: in the hub's cache layout (blobs named
by their hash, a snapshot link per commit; the default) or in a folder the user names.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = "antirez/deepseek-v4-gguf"
GIB = 1 << 30
CHUNK = 16 << 20  # bytes hashed per read
SPARE = 1 << 30  # free space left beside a finished download


@dataclass(frozen=True)
class Variant:
    name: str
    file: str
    gib: float  # as published (approximate); the hub's size is what is checked
    what: str
    kind: str = "model"  # "model", "mtp" (--mtp), "dspark" (--dspark)
    repo: str = REPO

    @property
    def memory(self) -> str:
        """What the machine needs to run it."""
        if self.kind != "model":
            return "beside its model"
        return (f"{self.gib + 8:.0f} GiB of memory to hold it whole; less streams experts "
                "(--memory-budget, docs/streaming.md)")


_Q2 = "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2"
_Q4 = "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2"
_MIXED = ("DeepSeek-V4-Flash-Layers37-42Q4KExperts-OtherExpertLayersIQ2XXSGateUp-Q2KDown-AProjQ8-SExpQ8-OutQ8"
          "-chat-v2-imatrix-fixed")

# The published files (antirez/ds4's download list), the recommended first.
VARIANTS = (
    Variant("q2", f"{_Q2}-imatrix.gguf", 80.8,
            "2-bit experts (IQ2_XXS gate/up, Q2_K down), imatrix; the one to start with"),
    Variant("q4", f"{_Q4}-imatrix.gguf", 153.3, "Q4_K experts, F16 hyper-connections, compressor and indexer, imatrix"),
    Variant("q2-q4", f"{_MIXED}.gguf", 91.3, "Q4_K experts in layers 37-42, 2-bit elsewhere"),
    Variant("q2-plain", f"{_Q2}.gguf", 80.8, "q2 without the imatrix (the first release)"),
    Variant("q4-plain", f"{_Q4}.gguf", 153.3, "q4 without the imatrix (the first release)"),
    Variant("mtp", "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf", 3.5,
            "DeepSeek's MTP draft block for the checkpoints before 0731 (--mtp)", kind="mtp"),
    Variant("q2-0731", f"{_Q2}-imatrix-0731.gguf", 80.8, "the 0731 checkpoint, q2"),
    Variant("q2-q4-0731", f"{_MIXED}-0731.gguf", 91.3, "the 0731 checkpoint, Q4_K experts in layers 37-42"),
    Variant("q4-0731", f"{_Q4}-imatrix-0731.gguf", 153.3, "the 0731 checkpoint, q4"),
    Variant("mxfp4-0731", "DeepSeek-V4-Flash-MXFP4Experts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2"
            "-mxfp4-0731.gguf", 145.3, "the 0731 checkpoint with DeepSeek's own MXFP4 experts, not requantised"),
    Variant("dspark-0731", "DeepSeek-V4-Flash-DSpark-support-0731.gguf", 5.6,
            "the 0731 checkpoint's DSpark drafter (not run by this build)", kind="dspark"),
)


class PullError(Exception):
    """What failed, in one line, with how to go on."""


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise PullError(f"no variant {name!r} (ds4 pull --list shows them: {', '.join(v.name for v in VARIANTS)})")


@dataclass(frozen=True)
class Remote:
    """The file on the hub: its size, its LFS SHA-256, the commit it is at, where to get it."""

    size: int
    sha256: str
    commit: str
    url: str


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None  # read now, not when the client was imported


def remote(v: Variant, revision: str = "main") -> Remote:
    """One HEAD request: the hub's size, SHA-256 and commit of ``v``'s file."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(v.repo, v.file, revision=revision, endpoint=_endpoint())
    meta = get_hf_file_metadata(url)
    sha = (meta.etag or "").lower()
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise PullError(f"the hub gives no SHA-256 for {v.file} (its ETag is {meta.etag!r}): cannot check the "
                        "download, so it is not made")
    if not meta.size or not meta.commit_hash:
        raise PullError(f"the hub did not say the size and commit of {v.file}")
    return Remote(meta.size, sha, meta.commit_hash, meta.location)


@dataclass(frozen=True)
class Place:
    """Where a file goes: ``final`` (what ds4 opens), ``partial`` (bytes on their way),
    ``verified`` (the note that final's hash was checked), and in the hub's cache the snapshot
    link to make (None in a folder of the user's)."""

    final: Path
    partial: Path
    verified: Path
    link: Path | None = None
    ref: Path | None = None


def place(v: Variant, r: Remote, folder: str | os.PathLike[str] | None, revision: str) -> Place:
    if folder is not None:
        final = Path(folder).expanduser() / v.file
        return Place(final, final.with_name(final.name + ".part"), final.with_name(final.name + ".sha256"))
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=v.repo, repo_type="model")
    blob = repo / "blobs" / r.sha256  # the hub's cache names an LFS blob by its SHA-256
    return Place(blob, blob.with_name(blob.name + ".part"), blob.with_name(blob.name + ".ds4-verified"),
                 repo / "snapshots" / r.commit / v.file, repo / "refs" / revision)


def sha256_of(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    h = hashlib.sha256()
    total, done = path.stat().st_size, 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return h.hexdigest()


@dataclass
class Result:
    path: Path  # what ds4 opens (the snapshot link in the hub's cache)
    size: int
    downloaded: int  # bytes transferred this time
    resumed_from: int  # bytes that were already here
    already: bool  # the verified file was here already


Report = Callable[[str, int, int], None]  # (stage "download"/"verify", done, total)


def pull(v: Variant, folder: str | os.PathLike[str] | None = None, revision: str = "main",
         report: Report | None = None) -> Result:
    """Download ``v`` (resuming what an earlier run left), check its SHA-256 against the hub's,
    and put it where ds4 opens it. PullError, one line, for anything that fails."""
    try:
        return _pull(v, folder, revision, report)
    except PullError:
        raise
    except Exception as e:  # the client's and the network's errors, a full disk: one line each
        raise PullError(_said(e, v)) from None


def _said(e: Exception, v: Variant) -> str:
    from huggingface_hub import errors

    again = f"; run ds4 pull {v.name} again to resume (what arrived is kept)"
    if isinstance(e, errors.OfflineModeIsEnabled):
        return f"offline mode is on (HF_HUB_OFFLINE){again}"
    if isinstance(e, errors.GatedRepoError):
        return f"{v.repo} needs you to accept its terms on the hub, and a token (HF_TOKEN or `hf auth login`)"
    if isinstance(e, errors.RepositoryNotFoundError):
        return f"the hub has no repository {v.repo} (or it needs a token: HF_TOKEN)"
    if isinstance(e, (errors.EntryNotFoundError, errors.RemoteEntryNotFoundError)):
        return f"{v.repo} has no file {v.file}"
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        return (f"the hub answered {status}" if status else f"the hub failed: {str(e).splitlines()[0]}") + again
    if isinstance(e, OSError) and e.errno == 28:
        return f"the disk is full ({e.filename or 'writing the download'}){again}"
    if isinstance(e, OSError) and e.errno is not None:
        return f"{e.filename + ': ' if e.filename else ''}{e.strerror}{again}"
    detail = str(e).splitlines()[0] if str(e) else "no detail"
    return f"{type(e).__name__}: {detail}{again}"  # the network's errors (httpx): no connection, a timeout


def _pull(v: Variant, folder, revision: str, report: Report | None) -> Result:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    r = remote(v, revision)
    p = place(v, r, folder, revision)
    p.final.parent.mkdir(parents=True, exist_ok=True)
    if p.final.exists():
        if _verified(p, r):
            return Result(_link(p), r.size, 0, 0, True)
        # A file of that name that was not checked here: checked now, never trusted.
        if p.final.stat().st_size == r.size and sha256_of(p.final, _stage(report, "verify")) == r.sha256:
            p.verified.write_text(r.sha256 + "\n")
            return Result(_link(p), r.size, 0, 0, True)
        damaged = p.final.with_name(p.final.name + ".damaged")
        os.replace(p.final, damaged)
        raise PullError(f"{p.final} is not the hub's file (size or SHA-256 differ); moved to {damaged.name}; "
                        f"run ds4 pull {v.name} again to download it")
    have = p.partial.stat().st_size if p.partial.exists() else 0
    if have > r.size:  # not a prefix of this file (the hub's file changed): start again
        p.partial.unlink()
        have = 0
    free = shutil.disk_usage(p.partial.parent).free
    if free < r.size - have + SPARE:
        raise PullError(f"not enough disk: {v.file} needs {(r.size - have) / GIB:.1f} GiB more on "
                        f"{p.partial.parent} and {free / GIB:.1f} GiB are free (1 GiB is kept spare)")
    if have < r.size:
        with _watching(p.partial, r.size, _stage(report, "download")), open(p.partial, "ab") as f:
            # expected_size None: the client refuses plain HTTP above 50 GB from byte 0 (it would
            # rather use Xet); the size and the hash are checked below either way.
            http_get(r.url, f, resume_size=have, headers=build_hf_headers(), expected_size=None)
    got = p.partial.stat().st_size
    if got != r.size:
        raise PullError(f"the transfer ended at {got} of {r.size} bytes; run ds4 pull {v.name} again to resume")
    digest = sha256_of(p.partial, _stage(report, "verify"))
    if digest != r.sha256:
        p.partial.unlink()
        raise PullError(f"{v.file}: its SHA-256 is {digest}, the hub says {r.sha256}; the download was deleted "
                        f"(nothing was put where ds4 opens models); run ds4 pull {v.name} again")
    os.replace(p.partial, p.final)
    p.verified.write_text(r.sha256 + "\n")
    return Result(_link(p), r.size, r.size - have, have, False)


def _verified(p: Place, r: Remote) -> bool:
    """Whether ``p.final`` is the file this module checked against ``r``'s hash (the note is
    written only after a check; the size guards against a file replaced since)."""
    try:
        return p.verified.read_text().strip() == r.sha256 and p.final.stat().st_size == r.size
    except OSError:
        return False


def _link(p: Place) -> Path:
    """In the hub's cache: the snapshot's name for the blob (a relative link, as the client
    makes them) and the revision's ref. In a folder: the file itself."""
    if p.link is None:
        return p.final
    p.link.parent.mkdir(parents=True, exist_ok=True)
    if not p.link.is_symlink() or p.link.resolve() != p.final.resolve():
        tmp = p.link.with_name(p.link.name + ".link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(p.final, p.link.parent))
        os.replace(tmp, p.link)
    if p.ref is not None:
        p.ref.parent.mkdir(parents=True, exist_ok=True)
        p.ref.write_text(p.link.parent.name)
    return p.link


def _stage(report: Report | None, stage: str) -> Callable[[int, int], None] | None:
    return None if report is None else (lambda done, total: report(stage, done, total))


class _watching:
    """Reports the size of a growing file every few tenths of a second while a transfer runs
    (the client's own progress bars are tqdm's; ours are the terminal's)."""

    def __init__(self, path: Path, total: int, progress: Callable[[int, int], None] | None) -> None:
        self.path, self.total, self.progress = path, total, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self._tell()

    def _tell(self) -> None:
        try:
            done = self.path.stat().st_size
        except OSError:
            return
        self.progress(done, self.total)  # type: ignore[misc]

    def __enter__(self) -> "_watching":
        if self.progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self._stop.set()
            self._thread.join()
            self._tell()


def table() -> list[str]:
    """``ds4 pull --list``: the variants, offline."""
    rows = [f"{'variant':12} {'size':>10}  what (file in {REPO})"]
    for v in VARIANTS:
        rows.append(f"{v.name:12} {v.gib:>6.1f} GiB  {v.what}")
        rows.append(f"{'':12} {'':>10}  {v.file}")
        rows.append(f"{'':12} {'':>10}  needs: {v.gib:.1f} GiB of disk; {v.memory}")
    return rows
