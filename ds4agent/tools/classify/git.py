"""git: its global options, the rules that make a subcommand dangerous or make it write .git, and
the listing forms that may run unasked.
"""

from __future__ import annotations

import re

from ..shellparse import Word
from .model import DANGEROUS, UNKNOWN, ProgramStep
from .options import Opts, has_long, scan

# git: read-only subcommands, the options that make them write or run programs, and the
# subcommands that change .git (allowed to write it inside the sandbox when git runs alone).
GIT_SAFE: dict[str, tuple[str, ...]] = {
    "status": (), "diff": ("--output", "--ext-diff"), "log": ("--output", "--ext-diff"),
    "show": ("--output", "--ext-diff"),
    "blame": ("--contents",), "annotate": (), "rev-parse": (), "ls-files": (), "ls-tree": (), "cat-file": (),
    "describe": (), "shortlog": (), "grep": ("--open-files-in-pager", "--ext-grep"), "rev-list": (), "merge-base": (),
    "name-rev": (), "show-ref": (), "for-each-ref": (), "count-objects": (), "version": (),
    "whatchanged": ("--output",),
    "check-ignore": (), "check-attr": (), "diff-tree": ("--output", "--ext-diff"), "diff-files": ("--output",),
    "diff-index": ("--output",), "range-diff": ("--output",), "cherry": (), "var": (), "help": ("--web",),
    # listing forms only; see _git_listing (reflog's expire/delete/drop: DANGEROUS by git(), never asked)
    "branch": (), "tag": (), "remote": (), "config": (), "stash": (), "reflog": (), "worktree": (), "notes": (),
    "submodule": (), "symbolic-ref": (),
}


GIT_WRITES = {"add", "commit", "checkout", "switch", "restore", "reset", "stash", "merge", "rebase", "cherry-pick",
              "revert", "fetch", "pull", "push", "tag", "branch", "mv", "rm", "am", "apply", "notes", "init", "clone",
              "status", "diff", "log", "show", "blame", "rev-parse", "ls-files", "describe", "shortlog", "grep",
              "remote", "gc", "clean", "worktree", "sparse-checkout", "update-index", "read-tree", "write-tree",
              "commit-tree", "update-ref", "symbolic-ref", "reflog", "prune", "repack", "maintenance", "format-patch",
              "bisect", "restore", "range-diff", "rev-list", "cat-file", "show-ref", "for-each-ref", "merge-base",
              "ls-tree", "stage", "cherry", "whatchanged", "count-objects", "fsck", "lfs"}


# git -c keys that only change how output looks.
_GIT_BENIGN_CONFIG = re.compile(r"(color(\..*)?|core\.quotepath|log\.(date|decorate|abbrevcommit)|"
                                r"diff\.(noprefix|renames|mnemonicprefix|context|interhunkcontext|algorithm)|"
                                r"advice\..*|user\.(name|email)|init\.defaultbranch|safe\.directory|"
                                r"column\.ui)", re.I)


def _git_config_benign(setting: str) -> bool:
    """Whether ``git -c NAME=VALUE`` cannot make git run a program: NAME is one of the settings
    above, or pager.<command> turned on or off (any other value of it is the pager program, as
    for core.pager: `git -c pager.log='rm -rf x' log`)."""
    name, _, value = setting.partition("=")
    if name.lower().startswith("pager."):
        return value.lower() in ("", "true", "false", "yes", "no", "on", "off", "1", "0")
    return bool(_GIT_BENIGN_CONFIG.fullmatch(name))


_GIT_SHORT_VALUES = {"commit": "mFCcSt", "checkout": "bB", "switch": "cC", "push": "o", "tag": "mFu", "stash": "m",
                     "restore": "s", "merge": "msSX", "pull": "sX", "rebase": "sXx", "log": "nL", "show": "n",
                     "clone": "bbcoju", "worktree": "bB", "cherry-pick": "mXS", "revert": "mXS", "am": "pCS",
                     "clean": "e", "config": "f", "branch": "u", "grep": "efABC", "diff": "ULOSGM", "notes": "mFcC",
                     "fetch": "jo", "remote": "tm"}


_GIT_GLOBAL_ARG = {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--exec-path",
                   "--super-prefix", "--list-cmds", "--attr-source"}


def _git_listing(sub: str, o: Opts, rest: list[Word]) -> str | None:
    """branch/tag/remote/config/stash/... are read-only only in their listing forms."""
    ops = [w.value for w in o.operands]
    if sub == "branch":
        if any(c in o.shorts for c in "dDmMcCfu") or any(has_long(o, x) for x in (
                "--delete", "--move", "--copy", "--force", "--set-upstream-to", "--unset-upstream",
                "--edit-description", "--track", "--no-track", "--create-reflog", "--recurse-submodules")):
            return "git branch that changes branches"
        if ops and not ("l" in o.shorts or has_long(o, "--list") or any(has_long(o, x) for x in (
                "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"))):
            return "git branch NAME creates a branch"
        return None
    if sub == "tag":
        if any(c in o.shorts for c in "dfasume") or any(has_long(o, x) for x in (
                "--delete", "--force", "--annotate", "--sign", "--message", "--file", "--edit")):
            return "git tag that changes tags"
        if ops and not ("l" in o.shorts or has_long(o, "--list") or any(has_long(o, x) for x in (
                "--contains", "--no-contains", "--merged", "--no-merged", "--points-at"))):
            return "git tag NAME creates a tag"
        return None
    if sub == "remote":
        # (-v is an option, never the first operand)
        return None if not ops or ops[0] == "get-url" else f"git remote {ops[0]}"
    if sub == "config":
        reading = any(has_long(o, x) for x in ("--get", "--get-all", "--get-regexp", "--list", "--get-urlmatch",
                                               "--show-origin", "--show-scope", "--name-only")) or "l" in o.shorts
        if ops and ops[0] in ("get", "list"):
            reading = True
        writing = any(has_long(o, x) for x in ("--add", "--unset", "--unset-all", "--replace-all", "--rename-section",
                                               "--remove-section", "--edit")) or "e" in o.shorts or (ops and ops[0] in (
                                                   "set", "unset", "rename-section", "remove-section", "edit"))
        return None if reading and not writing else "git config that sets values"
    if sub == "stash":
        return None if ops and ops[0] in ("list", "show") else "git stash that changes stashes"
    if sub == "worktree":
        return None if ops and ops[0] == "list" else "git worktree that changes worktrees"
    if sub == "notes":
        return None if not ops or ops[0] in ("list", "show") else "git notes that changes notes"
    if sub == "submodule":
        return None if not ops or ops[0] in ("status", "summary") else "git submodule that changes submodules"
    if sub == "symbolic-ref":
        sets = len(ops) > 1 or "d" in o.shorts or has_long(o, "--delete")
        return "git symbolic-ref that sets a ref" if sets else None
    return None


class GitRules:
    """The git rules of Analyzer (mixed in): its global options, the subcommands that change work
    or reach other repositories, and the forms on the read-only list."""

    def git(self, s: ProgramStep, args: list[Word]) -> None:
        i = 0
        vals = [w.value for w in args]
        while i < len(args):
            v = vals[i]
            if v is None:
                s.raise_to(UNKNOWN, "git with a computed argument before the subcommand")
                return
            if not v.startswith("-"):
                break
            name = v.split("=", 1)[0]
            if name == "--config-env" or v.startswith("-c"):  # -c NAME=VALUE, or attached: -cNAME=VALUE
                if v.startswith("-c") and len(v) > 2:
                    value = v[2:]
                elif "=" in v:
                    value = v.split("=", 1)[1]
                else:
                    value = vals[i + 1] if i + 1 < len(args) else ""
                if value is None:
                    s.raise_to(UNKNOWN, "git -c with a computed setting")
                elif name == "--config-env" or not _git_config_benign(value):
                    s.raise_to(UNKNOWN, f"git -c {value.split('=', 1)[0]} can make git run programs")
                    s.coverable = False
            elif name in ("--exec-path", "--git-dir", "--work-tree") and ("=" in v or name != "--exec-path"):
                s.not_coverable(f"git {name} points git somewhere else")
                if name == "--exec-path":
                    s.raise_to(UNKNOWN, "git --exec-path runs git programs from elsewhere")
                # Its path (attached or the next word) is judged with git's other words, by
                # operand_places in program_rules.
            elif name == "-C":
                if i + 1 < len(args):
                    s.cwd = args[i + 1]
            if name in _GIT_GLOBAL_ARG and "=" not in v:  # its value is the next word
                i += 2
            else:
                i += 1
        if i >= len(args):
            s.inert = True  # bare `git` prints help
            return
        sub = vals[i]
        rest = args[i + 1:]
        if s.cwd is not None:
            d = s.cwd.value
            if d is None:
                s.raise_to(UNKNOWN, "git -C a computed directory")
        # Which short options take a value differs per subcommand; where it is not listed, none
        # do, so every letter of a cluster counts as an option (``git push -uf``).
        short_values = _GIT_SHORT_VALUES.get(sub or "", "")
        # Long options whose value may be the next word. Not those whose value is optional and
        # so only ever attached with `=` (git's parse-options): taking the next word for the
        # value of --recurse-submodules hid `--hard` in `git reset --recurse-submodules --hard`;
        # a --pretty with no `=` is followed by a revision.
        o = scan(rest, short_values, {"--message", "--file", "--author", "--date", "--template", "--format",
                                      "--output", "--upload-pack", "--receive-pack", "--exec", "--strategy",
                                      "--strategy-option", "--onto", "--source", "--pathspec-from-file",
                                      "--push-option", "--orphan", "--reuse-message", "--reedit-message", "--fixup",
                                      "--squash", "--cleanup", "--trailer", "--repo", "--conflict"})
        danger = None
        if o.computed and sub in ("push", "reset", "clean", "checkout", "restore", "switch", "branch", "stash", "rm",
                                  "gc", "reflog", "update-ref", "worktree", "submodule", "filter-branch", "prune"):
            s.raise_to(UNKNOWN, f"git {sub} with computed arguments ({o.computed[0].source[:40]})")
        if sub == "push":
            if "f" in o.shorts or "d" in o.shorts or any(has_long(o, x) for x in (
                    "--force", "--force-with-lease", "--mirror", "--delete", "--prune", "--force-if-includes")):
                danger = "force-push or remote delete"
            elif any(w.value and (w.value.startswith("+") or w.value.startswith(":")) for w in o.operands):
                danger = "force-push or remote delete (+refspec or :ref)"
        elif sub == "reset":
            if has_long(o, "--hard") or has_long(o, "--merge") or has_long(o, "--keep"):
                danger = "discards uncommitted work (git reset --hard)"
        elif sub == "clean":
            if "f" in o.shorts or has_long(o, "--force"):
                danger = "deletes untracked files (git clean -f)"
        elif sub == "checkout":
            if "f" in o.shorts or has_long(o, "--force") or has_long(o, "--discard-changes") or o.ended \
                    or any(w.value in (".", "*", ":/") for w in o.operands) \
                    or has_long(o, "--ours") or has_long(o, "--theirs") \
                    or "p" in o.shorts or has_long(o, "--patch") or has_long(o, "--pathspec-from-file"):
                danger = "discards uncommitted changes (git checkout of paths)"
            elif len(o.operands) >= 2:
                danger = "discards uncommitted changes (git checkout of paths)"
        elif sub == "restore":
            staged_only = (("S" in o.shorts or has_long(o, "--staged"))
                           and not ("W" in o.shorts or has_long(o, "--worktree")))
            if not staged_only:
                danger = "discards uncommitted changes (git restore)"
        elif sub == "switch":
            if "f" in o.shorts or "C" in o.shorts or any(has_long(o, x) for x in (
                    "--force", "--discard-changes", "--force-create")):
                danger = "discards changes or resets a branch (git switch --force / -C)"
        elif sub == "branch":
            if any(c in o.shorts for c in "DMCf") or has_long(o, "--force"):  # -d --force too
                danger = "deletes or overwrites a branch (git branch -D/-M/-C/-f)"
        elif sub == "stash":
            if o.operands and o.operands[0].value in ("drop", "clear"):
                danger = f"git stash {o.operands[0].value} loses stashed work"
        elif sub in ("filter-branch", "filter-repo"):
            danger = "rewrites the whole history"
        elif sub == "reflog":
            # drop: git 2.50's whole-reflog delete
            if o.operands and o.operands[0].value in ("expire", "delete", "drop"):
                danger = "deletes reflog entries (loses the way back)"
        elif sub == "gc":
            if any(n.startswith("--prune") for n in o.longs) or has_long(o, "--aggressive"):
                danger = "prunes unreachable objects"
        elif sub == "prune":
            danger = "prunes unreachable objects"
        elif sub == "update-ref":
            if "d" in o.shorts or has_long(o, "--stdin"):
                danger = "deletes or rewrites refs"
        elif sub == "rm":
            if "f" in o.shorts or has_long(o, "--force"):
                danger = "git rm -f discards uncommitted changes"
        elif sub == "worktree":
            # remove -f drops a dirty or locked worktree (prune has no -f: it only forgets missing ones)
            if o.operands and o.operands[0].value == "remove" and ("f" in o.shorts or has_long(o, "--force")):
                danger = "removes a worktree with its changes"
        elif sub == "submodule":
            deinit = o.operands and o.operands[0].value == "deinit"
            if deinit and ("f" in o.shorts or has_long(o, "--force") or has_long(o, "--all")):
                danger = "removes submodule work trees"
            if o.operands and o.operands[0].value == "foreach":
                s.raise_to(UNKNOWN, "git submodule foreach runs a command in every submodule")
                s.coverable = False
        elif sub in ("rebase",):
            if "x" in o.shorts or has_long(o, "--exec"):
                s.raise_to(UNKNOWN, "git rebase --exec runs commands")
                s.coverable = False
        elif sub == "bisect":
            if o.operands and o.operands[0].value == "run":
                s.raise_to(UNKNOWN, "git bisect run runs a command")
                s.coverable = False
        elif sub in ("difftool", "mergetool", "daemon", "instaweb", "web--browse", "credential", "hook"):
            s.not_coverable(f"git {sub} runs other programs")
        elif sub == "config":
            reading = any(has_long(o, x) for x in ("--get", "--get-all", "--get-regexp", "--list", "--get-urlmatch",
                                                   "--get-color", "--get-colorbool", "--show-origin")) \
                or "l" in o.shorts \
                or (o.operands and o.operands[0].value in ("get", "list"))
            if not reading:
                key = next((w.value for w in o.operands if w.value not in ("set", "unset", "add")), None)
                if key is None and o.operands:
                    s.raise_to(UNKNOWN, "git config of a computed key")
                elif key and not _GIT_BENIGN_CONFIG.fullmatch(key):
                    s.not_coverable(f"git config {key} may make git run programs")
                if any(has_long(o, x) for x in ("--global", "--system")):
                    s.raise_to(DANGEROUS, "git config --global/--system writes outside the workspace")
                if has_long(o, "--file") or "f" in o.shorts:
                    self.writes(s, [w for n, w in o.values if n in ("-f", "--file", "--fi", "--fil")], "writes")
        if danger:
            s.raise_to(DANGEROUS, danger)
        if sub in ("clone", "init"):
            targets = o.operands[1:] if sub == "clone" else o.operands[:1]
            self.writes(s, targets, "creates a repository in")
        if sub == "worktree" and o.operands and o.operands[0].value == "add":
            self.writes(s, o.operands[1:2], "creates a worktree in")
        s.git_write = sub in GIT_WRITES and s.coverable and s.level < UNKNOWN and s.cwd is None

    def git_safe(self, s: ProgramStep, args: list[Word]) -> str | None:
        vals = [w.value for w in args]
        i = 0
        while i < len(vals) and vals[i] and vals[i].startswith("-"):
            v = vals[i]
            if v in ("--no-pager", "-P", "--no-optional-locks", "--literal-pathspecs", "--no-replace-objects",
                     "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--paginate", "-p"):
                i += 1
            elif v == "-C" and i + 1 < len(vals):
                i += 2
            elif v == "-c" and i + 1 < len(vals) and vals[i + 1] and _git_config_benign(vals[i + 1]):
                i += 2
            else:
                return f"git {v}"
        if i >= len(vals):
            return None
        sub = vals[i]
        if sub not in GIT_SAFE:
            return f"git {sub} is not read-only"
        rest = args[i + 1:]
        o = scan(rest, "", set())
        for full in GIT_SAFE[sub]:
            if has_long(o, full):
                return f"git {sub} {full}"
        if sub in ("grep",) and "O" in o.shorts:
            return "git grep -O runs a pager"
        if sub == "help" and "w" in o.shorts:
            return "git help -w starts a web browser"  # the browser runs outside any sandbox
        listing = _git_listing(sub, o, rest)
        if listing:
            return listing
        return self.reads_inside(s, [w for w in rest])
