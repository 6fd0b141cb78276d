"""What the agent's file tools changed, one change set per user request (a "step"), and /undo.

Every write of the file tools (write, edit) goes through the workspace's Journal: before the
first write of a file in a step, its content (or its absence, and the directories the write will
create) is stored; after each write, the new content. Contents live in a content-addressed
folder under the home folder (settings.undo_dir), and each step is a small JSON file written
atomically, so a step is known even if ds4 stops in the middle of it, and `ds4 agent --undo`
works in a later process.

Undoing a step never overwrites what the user changed by hand since: a file that still holds
what the agent wrote gets its old content back (a file it created is removed); a file changed
since gets the agent's change taken out of it by a three-way merge (`git merge-file`), which
keeps the user's own changes, or is left alone, and said so, when the changes overlap. Before
anything is written, the current content of every file the undo touches is stored and the
plan is recorded in the step; a failure halfway puts back what was already written, and an
undo interrupted by a crash is completed by the next one. Shell commands' changes are not
recorded (a command's effects cannot be known): only the file tools'.

Steps can also be committed to git (the agent setting git_commit, aider's habit); undoing a
committed step removes its commit when it is still the last one and on no remote branch.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .base import ToolError

STEPS_KEPT = 100  # change sets kept per workspace; older ones (and contents only they use) go
MAX_TASK = 200  # characters of the request kept as a step's title


class UndoError(Exception):
    """An undo (or a step's commit) that could not be done; one line, nothing changed."""


@dataclass
class FileChange:
    path: str  # absolute
    before: str | None  # content hash before the step; None: the file did not exist
    after: str | None = None  # after the agent's last write in the step; None: not recorded
    mode: int | None = None  # permission bits before the step
    dirs: list[str] = field(default_factory=list)  # directories created for it, outermost first


@dataclass
class JournalStep:
    seq: int
    time: float
    task: str
    files: list[FileChange] = field(default_factory=list)
    state: str = "open"  # open | done | undone
    commit: str | None = None  # the git commit made of this step
    undo: list[dict] | None = None  # while an undo is applied: [{path, current, target}]

    def paths(self) -> list[str]:
        return [f.path for f in self.files]


@dataclass
class UndoReport:
    step: JournalStep
    reverted: list[str] = field(default_factory=list)  # files given back their old content
    removed: list[str] = field(default_factory=list)  # files the step created, deleted
    merged: list[str] = field(default_factory=list)  # changed by hand since: the step's change taken out
    kept: list[str] = field(default_factory=list)  # "path: why" left as they are
    git: str = ""  # what became of the step's commit
    resumed: bool = False  # an interrupted undo was completed


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(p: Path) -> bytes | None:
    """A file's bytes; None when there is no file (a directory or other non-file is an error)."""
    try:
        if not p.is_file() and not p.exists() and not p.is_symlink():
            return None
        if not p.is_file():
            raise UndoError(f"{p}: not a regular file")
        return p.read_bytes()
    except OSError as e:
        raise UndoError(f"{p}: {e.strerror or e}") from None


def _write_atomic(p: Path, data: bytes, mode: int | None = None) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".ds4undo", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is None and p.exists():
            mode = p.stat().st_mode & 0o7777
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _git(root: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=60, input=input)


def merge3(current: bytes, base: bytes, other: bytes) -> bytes | None:
    """``current`` with the change from ``base`` to ``other`` applied (git merge-file); None when
    the two changes overlap, or git is not there to merge."""
    with tempfile.TemporaryDirectory(prefix="ds4-merge-") as d:
        names = []
        for name, data in (("current", current), ("base", base), ("other", other)):
            path = Path(d) / name
            path.write_bytes(data)
            names.append(str(path))
        try:
            r = subprocess.run(["git", "merge-file", "-p", "-q", *names], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return r.stdout if r.returncode == 0 else None


class Journal:
    """The change sets of one workspace (see the module's docstring)."""

    def __init__(self, root: Path, folder: Path) -> None:
        self.root = Path(root)
        self.dir = Path(folder)
        self._open: JournalStep | None = None
        self._task = ""

    @classmethod
    def for_workspace(cls, root: Path, home: Path) -> "Journal":
        """The journal of ``root``, kept under ``home`` (settings.undo_dir()) by the path's hash."""
        real = os.path.realpath(root)
        return cls(Path(root), Path(home) / hashlib.sha1(real.encode("utf-8", "surrogateescape")).hexdigest()[:16])

    # -- storage ---------------------------------------------------------------------------------
    def _ensure(self) -> None:
        (self.dir / "steps").mkdir(parents=True, exist_ok=True)
        (self.dir / "blobs").mkdir(exist_ok=True)
        where = self.dir / "workspace"
        if not where.exists():
            where.write_text(str(self.root) + "\n", encoding="utf-8")

    def _blob(self, data: bytes) -> str:
        sha = _sha(data)
        path = self.dir / "blobs" / sha
        if not path.exists():
            _write_atomic(path, data, 0o600)
        return sha

    def _content(self, sha: str) -> bytes:
        try:
            data = (self.dir / "blobs" / sha).read_bytes()
        except OSError as e:
            raise UndoError(f"the saved content {sha[:12]} is missing from {self.dir}: {e.strerror or e}") from None
        if _sha(data) != sha:
            raise UndoError(f"the saved content {sha[:12]} in {self.dir} is damaged")
        return data

    def _save(self, step: JournalStep) -> None:
        self._ensure()
        data = json.dumps(asdict(step), ensure_ascii=False, indent=1).encode("utf-8")
        _write_atomic(self.dir / "steps" / f"{step.seq:08d}.json", data, 0o600)

    def _load_all(self) -> list[JournalStep]:
        out = []
        folder = self.dir / "steps"
        if not folder.is_dir():
            return out
        for p in sorted(folder.glob("*.json")):
            try:
                d = json.loads(p.read_text(encoding="utf-8"))
                d["files"] = [FileChange(**f) for f in d.get("files", [])]
                out.append(JournalStep(**d))
            except (OSError, ValueError, TypeError):
                continue  # a damaged record: that step cannot be undone; the others can
        return out

    # -- recording (called by the file tools) ----------------------------------------------------
    def begin(self, task: str) -> None:
        """A new user request: the writes that follow form its step (made at the first write)."""
        self.end()
        self._task = " ".join(task.split())[:MAX_TASK]

    def before_write(self, p: Path) -> None:
        """Called before a tool writes ``p``: keep what it holds (once per step). Raises
        ToolError when that cannot be kept, so that no change is made that undo could not revert."""
        path = os.path.abspath(p)
        try:
            step = self._open
            if step is None:
                seqs = [s.seq for s in self._load_all()]
                step = self._open = JournalStep(max(seqs, default=0) + 1, time.time(), self._task or "(no request)")
            if any(f.path == path for f in step.files):
                return
            data = _read(Path(path))
            mode = os.stat(path).st_mode & 0o7777 if data is not None else None
            dirs = []
            parent = Path(path).parent
            while not parent.exists():
                dirs.insert(0, str(parent))
                parent = parent.parent
            step.files.append(FileChange(path, self._blob(data) if data is not None else None, None, mode, dirs))
            self._save(step)
        except (OSError, UndoError) as e:
            raise ToolError(f"cannot keep the file's content for /undo ({getattr(e, 'strerror', None) or e}); "
                            "not written") from None

    def after_write(self, p: Path) -> None:
        path = os.path.abspath(p)
        step = self._open
        if step is None:
            return
        for f in step.files:
            if f.path == path:
                try:
                    data = _read(Path(path))
                    f.after = self._blob(data) if data is not None else None
                    self._save(step)
                except (OSError, UndoError):
                    f.after = None  # unknown: undo then only reverts it if it is as it was before
                return

    def end(self) -> JournalStep | None:
        """Close the current step; returns it when it changed anything."""
        step, self._open = self._open, None
        if step is None:
            return None
        step.state = "done"
        try:
            self._save(step)
            self._prune()
        except OSError:
            pass  # the step's record as last saved stays usable
        return step

    def _prune(self) -> None:
        steps = self._load_all()
        if len(steps) <= STEPS_KEPT:
            return
        for s in steps[: len(steps) - STEPS_KEPT]:
            (self.dir / "steps" / f"{s.seq:08d}.json").unlink(missing_ok=True)
        used = {h for s in steps[-STEPS_KEPT:] for f in s.files for h in (f.before, f.after)}
        used |= {h for s in steps[-STEPS_KEPT:] for u in (s.undo or []) for h in (u.get("current"), u.get("target"))}
        for blob in (self.dir / "blobs").iterdir():
            if blob.name not in used:
                blob.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------------------
    def steps(self) -> list[JournalStep]:
        """The steps that can still be undone, oldest first."""
        return [s for s in self._load_all() if s.state in ("done", "open") and s.files]

    def rel(self, path: str) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return path

    # -- undo ------------------------------------------------------------------------------------
    def undo(self, n: int = 1) -> list[UndoReport]:
        """Undo the last ``n`` steps, newest first. An undo interrupted earlier is completed
        first (and counts as one). Raises UndoError, naming the file, when a step cannot be
        undone; what that step's undo had already written is then put back, and the steps
        undone before it stay undone (their reports are in the error's ``reports``)."""
        if self._open is not None:
            self.end()
        reports: list[UndoReport] = []
        pending = [s for s in self._load_all() if s.undo]
        for step in pending:
            reports.append(self._finish(step))
        todo = self.steps()[::-1][: max(0, n - len(reports))]
        if not todo and not reports:
            raise UndoError("nothing to undo: no change of the agent's file tools is recorded for this workspace")
        for step in todo:
            try:
                reports.append(self._undo(step))
            except UndoError as e:
                e.reports = reports  # type: ignore[attr-defined]
                raise
        return reports

    def _plan(self, step: JournalStep, report: UndoReport) -> list[dict]:
        plan = []
        for f in step.files:
            rel = self.rel(f.path)
            current = _read(Path(f.path))
            before = self._content(f.before) if f.before is not None else None
            after = self._content(f.after) if f.after is not None else None
            if current == before:
                continue  # already as it was
            if f.after is not None and current == after:
                target = before
                (report.reverted if before is not None else report.removed).append(rel)
            elif current is None:
                report.kept.append(f"{rel}: deleted since; left deleted")
                continue
            elif before is None:
                report.kept.append(f"{rel}: created by the agent, then changed since; kept")
                continue
            elif after is None:
                report.kept.append(f"{rel}: the agent's change was not recorded completely; left as it is")
                continue
            else:
                target = merge3(current, after, before)
                if target is None:
                    report.kept.append(f"{rel}: changed since, where the agent changed it; left as it is")
                    continue
                report.merged.append(rel)
            plan.append({"path": f.path, "current": self._blob(current) if current is not None else None,
                         "target": self._blob(target) if target is not None else None, "mode": f.mode})
        return plan

    def _undo(self, step: JournalStep) -> UndoReport:
        report = UndoReport(step)
        plan = self._plan(step, report)
        step.undo = plan  # recorded before anything is written: a crash leaves a plan to complete
        self._save(step)
        done: list[dict] = []
        try:
            for item in plan:
                self._apply(item, item["target"])
                done.append(item)
        except (OSError, UndoError) as e:
            failed = self.rel(plan[len(done)]["path"])
            problems = []
            for item in reversed(done):
                try:
                    self._apply(item, item["current"])
                except (OSError, UndoError) as again:
                    problems.append(f"{self.rel(item['path'])} ({getattr(again, 'strerror', None) or again})")
            step.undo = None
            self._save(step)
            why = getattr(e, "strerror", None) or e
            if problems:
                raise UndoError(f"undo of step {step.seq} failed at {failed} ({why}), and putting back failed for "
                                f"{', '.join(problems)}: their contents are kept in {self.dir / 'blobs'}") from None
            raise UndoError(f"undo of step {step.seq} failed at {failed} ({why}); nothing was changed") from None
        self._remove_dirs(step)
        report.git = self._uncommit(step)
        step.undo, step.state = None, "undone"
        self._save(step)
        return report

    def _finish(self, step: JournalStep) -> UndoReport:
        """Complete an undo that was interrupted: each file of its plan that still holds what it
        held then gets its target; one already at the target is done; any other is left."""
        report = UndoReport(step, resumed=True)
        for item in step.undo or []:
            rel = self.rel(item["path"])
            current = _read(Path(item["path"]))
            have = _sha(current) if current is not None else None
            if have == item["target"]:
                report.reverted.append(rel)
            elif have == item["current"]:
                self._apply(item, item["target"])
                report.reverted.append(rel)
            else:
                report.kept.append(f"{rel}: changed since the interrupted undo; left as it is")
        self._remove_dirs(step)
        report.git = self._uncommit(step)
        step.undo, step.state = None, "undone"
        self._save(step)
        return report

    def _apply(self, item: dict, sha: str | None) -> None:
        p = Path(item["path"])
        if sha is None:
            p.unlink(missing_ok=True)
        else:
            _write_atomic(p, self._content(sha), item.get("mode"))

    def _remove_dirs(self, step: JournalStep) -> None:
        """Directories the step created, if they are empty again (innermost first)."""
        for d in sorted({d for f in step.files for d in f.dirs}, key=len, reverse=True):
            try:
                os.rmdir(d)
            except OSError:
                pass  # not empty (something else lives there now), or already gone

    # -- git -------------------------------------------------------------------------------------
    def _git_root(self) -> Path | None:
        try:
            r = _git(self.root, "rev-parse", "--show-toplevel")
        except (OSError, subprocess.TimeoutExpired):
            return None
        return Path(r.stdout.decode().strip()) if r.returncode == 0 else None

    def commit(self, step: JournalStep, message: str) -> str | None:
        """Commit the files of ``step`` (only those; other changes, staged or not, stay as they
        are). Returns the commit, or None when there was nothing to commit. The repository's
        hooks run; a failure raises UndoError with git's words and leaves the files uncommitted."""
        root = self._git_root()
        if root is None:
            raise UndoError("not a git repository")
        paths = []
        for f in step.files:
            try:
                rel = str(Path(os.path.realpath(f.path)).relative_to(os.path.realpath(root)))
            except ValueError:
                continue  # outside the repository
            if _git(root, "check-ignore", "-q", "--", rel).returncode == 0:
                continue  # ignored by git: never committed
            paths.append(rel)
        if not paths:
            return None
        try:
            existing = [p for p in paths if (root / p).exists()]
            if existing:
                add = _git(root, "add", "--", *existing)
                if add.returncode != 0:
                    raise UndoError(f"git add failed: {add.stderr.decode(errors='replace').strip()[-300:]}")
            if _git(root, "diff", "--cached", "--quiet", "HEAD", "--", *paths).returncode == 0:
                return None  # the agent's writes left these files as committed
            r = _git(root, "commit", "-q", "-m", message, "--only", "--", *paths)
            if r.returncode != 0:
                why = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
                raise UndoError(f"git commit failed: {why[-1] if why else 'exit status ' + str(r.returncode)}")
            sha = _git(root, "rev-parse", "HEAD").stdout.decode().strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UndoError(f"git failed: {e}") from None
        step.commit = sha
        self._save(step)
        return sha

    def _uncommit(self, step: JournalStep) -> str:
        """After a committed step's files were reverted: drop its commit if that is safe."""
        if not step.commit:
            return ""
        root = self._git_root()
        short = step.commit[:10]
        if root is None:
            return f"its commit {short} stays (no git repository here now)"
        try:
            head = _git(root, "rev-parse", "HEAD").stdout.decode().strip()
            if head != step.commit:
                return f"its commit {short} stays (commits were made after it); the revert is in the working tree"
            if _git(root, "branch", "-r", "--contains", head).stdout.strip():
                return f"its commit {short} stays (it is on a remote branch); the revert is in the working tree"
            if _git(root, "reset", "-q", "--soft", "HEAD~1").returncode != 0:
                return f"its commit {short} stays (git could not move back from it)"
            rels = []
            for p in step.paths():
                try:
                    rels.append(str(Path(os.path.realpath(p)).relative_to(os.path.realpath(root))))
                except ValueError:
                    continue
            if rels:
                _git(root, "reset", "-q", "--", *rels)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"its commit {short} stays ({e})"
        return f"its commit {short} was removed"
