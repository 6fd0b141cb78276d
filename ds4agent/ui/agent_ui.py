"""`ds4 agent` front ends: the interactive terminal (chat shell plus tool lines, diffs and
approval questions) and the headless one-task mode (plain transcript, JSON lines, or Claude
Code's stream-json and json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import IO, Callable, Iterator

from ..conversation import Agent, Event, event_json
from ..conversation.agent_setup import AgentSetup
from ..sessions import SessionStore, StoreError
from ..tools import MODES, SANDBOX_MODES, Request
from .chat import run_tty
from .commands import ChatCommands, commands_for, load_session, saved_sessions, session_line
from .terminal import GREY, RESET, YELLOW, Out, TurnView, color_diff, run_events, short_count

OUTPUTS_KEPT = 50  # commands whose whole output /output can show again


@dataclasses.dataclass
class Shown:
    """What the terminal showed that the agent's other parts need: the outputs of the commands
    run (for Ctrl+O and /output), whether Ctrl+O was pressed while the model worked, and whether
    the call about to be reported had its change shown in the approval question."""

    outputs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    expand: bool = False
    previewed: bool = False

    def expand_last(self, out: Out, n: int = 1) -> bool:
        if not 1 <= n <= len(self.outputs):
            return False
        summary, text = self.outputs[-n]
        out.line(f"── output of {summary}", GREY)
        out.write(text if text.endswith("\n") else text + "\n")
        out.line("── end of output", GREY)
        return True


class AgentCommands(ChatCommands):
    commands = commands_for("agent")

    def __init__(self, agent: Agent, store: SessionStore, out: Out, ask, shown: Shown | None = None,
                 mcp_status: list | None = None) -> None:
        super().__init__(agent.conv, store, out, ask)
        self.agent = agent
        self.shown = shown if shown is not None else Shown()
        self.mcp_status = mcp_status or []

    def cmd_mcp(self, arg: str) -> None:
        if not self.mcp_status:
            self.out.note("no MCP servers configured ([mcp_servers.NAME] in ~/.ds4agent/config.toml or .ds4agent.toml)")
            return
        for st in self.mcp_status:
            self.out.line(f"  {st.line()}")
            for name in st.tools:
                self.out.line(f"      {name}", GREY)

    def cmd_undo(self, arg: str) -> None:
        journal = getattr(self.agent.ws, "journal", None)
        if journal is None:
            self.out.note("changes are not recorded in this session", error=True)
            return
        if arg == "list":
            list_steps(journal, self.out)
            return
        if arg and (not arg.isdigit() or int(arg) < 1):
            self.out.note("/undo takes a number of steps (/undo 2), or 'list'", error=True)
            return
        undo_steps(journal, int(arg) if arg else 1, self.out)

    def cmd_output(self, arg: str) -> None:
        n = int(arg) if arg.isdigit() else 1
        if arg and not arg.isdigit():
            self.out.note("/output takes a number: 1 is the last command, 2 the one before", error=True)
        elif not self.shown.expand_last(self.out, n):
            n = len(self.shown.outputs)
            self.out.note(f"only {n} command output{'s' if n > 1 else ''} kept" if n else "no command output to show",
                          error=bool(arg))

    def cmd_new(self, arg: str) -> None:
        self.offer_save()
        self.agent.new_conversation()
        self.out.note("new conversation (the system prompt is cached: no prefill)")

    def after_resume(self, sha: str) -> None:
        _take_over(self.agent, self.out)

    def cmd_compact(self, arg: str) -> None:
        from .keys import stop_on_sigint

        conv = self.agent.conv
        conv.stop.clear()
        with stop_on_sigint(conv.stop):  # Ctrl+C ends the summary at a token; nothing changes then
            for ev in self.agent.compact():
                if ev.kind == "compacted":
                    self.out.note(f"compacted; summary: {ev.text}")
                    return
                if ev.kind == "compact_failed":
                    self.out.note(ev.text, error=True)
                    return
        self.out.note("nothing to compact yet")

    def cmd_approval(self, arg: str) -> None:
        pol = self.agent.policy
        if arg == "clear":
            pol.always.clear()
            self.out.note("forgot this session's 'always' answers")
            return
        if arg not in MODES:
            rules = pol.rules()
            self.out.note(f"approval mode is {pol.mode}, sandbox {pol.describe()}; choose one of {', '.join(MODES)}"
                          + (f"; 'always' answers: {'; '.join(rules)}" if rules else "; no 'always' answers yet"),
                          error=bool(arg))
            return
        pol.mode = arg
        pol.always.clear()
        self.out.note(f"approval mode: {arg} (sandbox: {pol.describe()})")

    def cmd_sandbox(self, arg: str) -> None:
        pol = self.agent.policy
        if arg not in SANDBOX_MODES:
            self.out.note(f"sandbox is {pol.describe()}; choose one of {', '.join(SANDBOX_MODES)}", error=bool(arg))
            return
        pol.sandbox = arg
        self.out.note(f"sandbox: {pol.describe()}")
        note = pol.startup_note()
        if note:
            self.out.note(note, error=True)


PREVIEW_LINES = 200  # lines of a diff shown in an approval question before 'v' is needed


def _preview_lines(req: Request, tty: bool) -> list[str]:
    text = req.preview.rstrip("\n")
    if not text:
        return []
    if req.kind in ("edit", "escape") and not text.startswith("new file "):
        text = color_diff(text) if tty else text
        return text.splitlines()
    return [(GREY + "  " + ln + RESET) if tty else "  " + ln for ln in text.splitlines()]


def tty_approver(out: Out, ask_key: Callable[[str, str], str], shown: Shown | None = None) -> Callable[[Request], str]:
    """One key, no Enter: y yes, n or Esc no, a = always for the scope the request names (a
    command prefix such as `pytest`, file edits, reads below one directory), shown in the
    question before the key is pressed. Before the question: what the call would do (the diff
    of an edit, a new file's head and size, an MCP call's arguments), where a command runs and
    its sandbox, where a path resolves. Dangerous and unreadable commands, and running outside
    the sandbox, offer no "always"."""
    def approve(req: Request) -> str:
        out.line(f"⚠ {req.summary}", YELLOW)
        for d in req.details:
            out.line(f"  {d}", GREY)
        lines = _preview_lines(req, out.tty)
        for ln in lines[:PREVIEW_LINES]:
            out.line(ln)
        rest = lines[PREVIEW_LINES:]
        if rest:
            out.line(f"  … {len(rest)} more lines (v shows them)", GREY)
        if req.scope:
            out.line(f"  a = always allow {req.scope} (this session)", GREY)
        while True:
            choices = ("y yes · n no" + (" · a always" if req.scope else "") + " · Esc no"
                       + (" · v view all" if rest else ""))
            question = f"  {req.reason}. Allow? {choices} "
            key = ask_key((YELLOW + question + RESET) if out.tty else question, "yn" + ("a" if req.scope else "")
                          + ("v" if rest else ""))
            if key == "v":
                for ln in rest:
                    out.line(ln)
                rest = []
                continue
            break
        # Only an offered key counts: "always" never comes from a question that did not offer it.
        answer = {"y": "yes", "a": "always" if req.scope else "no"}.get(key, "no")
        out.line(question + "→ " + {"yes": "yes", "always": f"always ({req.scope})", "no": "no"}[answer],
                 GREY if answer == "no" else "")
        if shown is not None and answer != "no" and req.preview:
            shown.previewed = True  # the change was seen: the tool line need not repeat it
        return answer

    return approve


def _watched(events: Iterator[Event], out: Out, shown: Shown) -> Iterator[Event]:
    """The run's events, noting commands' outputs (for Ctrl+O and /output) and dropping the
    diff of a change the approval question already showed; a Ctrl+O pressed while the model
    worked shows the last output at the next tool line, where nothing is streaming."""
    for ev in events:
        if ev.kind in ("tool", "refused"):
            output = (ev.data or {}).get("output")
            if output:
                shown.outputs.append((ev.text, output))
                del shown.outputs[:-OUTPUTS_KEPT]
            if shown.previewed:
                ev = dataclasses.replace(ev, detail="")
            shown.previewed = False
        yield ev
        if shown.expand and ev.kind in ("tool", "refused"):
            shown.expand = False
            shown.expand_last(out)


def run_agent_turn(agent: Agent, text: str, out: Out, show_thinking: bool, shown: Shown | None = None) -> None:
    """One user request, streamed, until the model answers without tool calls."""
    shown = shown if shown is not None else Shown()
    run_events(_watched(agent.run(text), out, shown), out, show_thinking, agent.conv.interrupted)
    if shown.expand:
        shown.expand = False
        if not shown.expand_last(out):
            out.note("no command output to show")


def after_step(agent: Agent, out: Out, git_commit: str, ask_key: Callable[[str, str], str] | None,
               undo_hint: str = "/undo reverts this step") -> None:
    """After a request that changed files: say which (and that /undo reverts them); with the
    git_commit setting, commit them (asking first with "ask"; headless, "ask" commits nothing)."""
    from ..tools.undo import UndoError

    step, journal = agent.last_step, agent.ws.journal
    if step is None or journal is None:
        return
    names = [journal.rel(p) for p in step.paths()]
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    out.note(f"changed {shown} ({undo_hint})")
    if git_commit == "off" or journal._git_root() is None:
        return
    if git_commit == "ask":
        if ask_key is None:
            return
        question = f"  Commit these changes ({shown})? y yes · n no "
        key = ask_key(question, "yn")
        out.line(question + ("→ yes" if key == "y" else "→ no"), GREY)
        if key != "y":
            return
    message = f"ds4 agent: {step.task[:64]}" + ("…" if len(step.task) > 64 else "")
    message += f"\n\nChanged by ds4 agent for the request:\n\n{step.task}\n"
    try:
        sha = journal.commit(step, message)
    except UndoError as e:
        out.note(f"not committed: {e}", error=True)
        return
    out.note(f"committed {sha[:10]}: {message.splitlines()[0]}" if sha
             else "nothing to commit: the files are as committed")


def list_steps(journal, out: Out) -> None:
    import time

    steps = journal.steps()
    if not steps:
        out.note("no change of the agent's file tools recorded for this workspace")
        return
    for n, st in enumerate(reversed(steps[-20:]), 1):
        names = ", ".join(journal.rel(p) for p in st.paths()[:4]) + (" …" if len(st.files) > 4 else "")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.time))
        commit = f"  [commit {st.commit[:10]}]" if st.commit else ""
        out.line(f"  {n:>2}. {when}  {st.task[:60]}  — {names}{commit}")


def undo_steps(journal, n: int, out: Out) -> bool:
    """/undo N and `ds4 agent --undo N`: says what each undone step changed back."""
    from ..tools.undo import UndoError

    try:
        reports = journal.undo(n)
    except UndoError as e:
        for r in getattr(e, "reports", []):
            _say_undo(r, out)
        out.note(str(e), error=True)
        return False
    for r in reports:
        _say_undo(r, out)
    return True


def run_undo(ws, n: int, out: Out) -> int:
    """`ds4 agent --undo [N]` (0 lists the steps): the exit status is 1 when the undo failed."""
    from .. import settings
    from ..tools.undo import Journal

    journal = Journal.for_workspace(ws.root, settings.undo_dir())
    if n < 0:
        out.note("--undo takes a number of steps (0 lists them)", error=True)
        return 2
    if n == 0:
        list_steps(journal, out)
        return 0
    return 0 if undo_steps(journal, n, out) else 1


def _say_undo(r, out: Out) -> None:
    parts = []
    if r.reverted:
        parts.append("reverted " + ", ".join(r.reverted))
    if r.removed:
        parts.append("removed " + ", ".join(r.removed) + " (created by the step)")
    if r.merged:
        parts.append("took the step's change out of " + ", ".join(r.merged) + " (your later edits kept)")
    done = "; ".join(parts) or "nothing to change: the files are as they were"
    what = "completed the interrupted undo of" if r.resumed else "undid"
    out.note(f"{what} step {r.step.seq} ({r.step.task[:50]}): {done}" + (f"; {r.git}" if r.git else ""))
    for k in r.kept:
        out.note(f"  kept {k}")


def run_agent_tty(agent: Agent, store: SessionStore, history_file: Path | None, banner: str,
                  git_commit: str = "off", mcp_status: list | None = None, **io) -> int:
    shown = Shown()

    def runner(text: str, out: Out, state: dict, ask_text: Callable[..., str]) -> None:
        ask_key = lambda q, keys: ask_text(q, keys=keys)  # noqa: E731
        agent.approve = tty_approver(out, ask_key, shown)
        run_agent_turn(agent, text, out, state["show_thinking"], shown)
        after_step(agent, out, git_commit, ask_key)

    out_ref: list[Out] = []

    def make_commands(out: Out, ask) -> AgentCommands:
        out_ref.append(out)
        return AgentCommands(agent, store, out, ask, shown, mcp_status)

    def ctrl_o(busy: bool) -> None:
        if busy:  # the model is working: shown at the next tool line or when it stops
            shown.expand = True
        elif out_ref and not shown.expand_last(out_ref[0]):
            out_ref[0].note("no command output to show")

    pol = agent.policy
    return run_tty(agent.conv, store, history_file, banner=banner, prompt="ds4 agent> ",
                   make_commands=make_commands, runner=runner,
                   status=lambda: f"| {pol.mode} · sandbox {pol.describe()} ", on_key={"c-o": ctrl_o}, **io)


# Exit status of `ds4 agent -p` for each stop reason (agent.STOP_REASONS; 2 is a usage error).
EXIT_CODES = {"end_turn": 0, "error": 1, "max_tokens": 3, "context": 4, "refused": 5, "interrupted": 130}


OUTPUT_FORMATS = ("text", "json", "stream-json", "events")
# Kinds the events format (--json, ds4's own) has always written; later kinds are left out of it.
_EVENT_KINDS = {"prefill", "reasoning", "content", "call_start", "tool", "refused", "attached", "note", "compacted",
                "compact_failed", "interrupted", "error", "done"}


def run_headless(agent: Agent, task: str, output_format: str | bool, stdout: IO[str], stderr: IO[str],
                 mcp_servers: list[tuple[str, bool]] = (), git_commit: str = "off") -> int:
    """One task to completion without a terminal. The exit status says why it stopped
    (EXIT_CODES): 0 only when the model finished its answer.

    ``output_format``: "text" (the answers and tool lines, reasoning hidden; why a run stopped
    early goes to stderr), "events" (ds4's JSON line per event, ``--json``), "stream-json" and
    "json" (Claude Code's lines, ui/stream_json.py; ds4's notes go to stderr). True and False
    mean "events" and "text"."""
    from .. import __version__
    from .stream_json import ClaudeStream

    fmt = {True: "events", False: "text"}.get(output_format, output_format)  # type: ignore[call-overload]
    note_out = Out(stderr, tty=False, err=stderr)
    out = Out(stdout, tty=False, err=stderr)
    view = TurnView(out, show_thinking=False)
    claude = None
    if fmt in ("json", "stream-json"):
        info = agent.conv.engine.info
        claude = ClaudeStream(info.name, str(agent.ws.root), list(agent.tools), agent.policy.mode, mcp_servers,
                              __version__)

    def emit(d: dict) -> None:
        stdout.write(json.dumps(d, ensure_ascii=False) + "\n")
        stdout.flush()

    if claude is not None and fmt == "stream-json":
        emit(claude.init())
    stop, stop_text = "error", ""
    try:
        for ev in agent.run(task):
            if ev.kind == "done":
                stop, stop_text = ev.stop, ev.text
            if fmt == "events":
                if ev.kind in _EVENT_KINDS:
                    stdout.write(event_json(ev) + "\n")
                    stdout.flush()
            elif claude is not None:
                for line in claude.event(ev):
                    if fmt == "stream-json":
                        emit(line)
                if ev.kind in ("note", "error", "compact_failed") or (ev.kind == "done" and ev.text):
                    note_out.note(ev.text, error=ev.kind == "error")
            else:
                view.event(ev)
        if fmt == "text":
            view.finish()
    except KeyboardInterrupt:
        agent.conv.interrupted()
        stop, stop_text = "interrupted", "interrupted"
        if fmt == "events":
            stdout.write(event_json(Event("done", stop="interrupted")) + "\n")
        stderr.write("ds4: interrupted\n")
    if claude is not None:
        emit(claude.result(stop, agent.usage, agent.conv.ctx, stop_text if stop != "end_turn" else ""))
    after_step(agent, note_out, git_commit, None, "'ds4 agent --undo' reverts it")
    return EXIT_CODES.get(stop, EXIT_CODES["error"])


def pick_session(store: SessionStore, ask_text: Callable[[str], str] | None, out: Out) -> str | None:
    """The session to resume when --resume is given without an id: a numbered list of the
    most recent ones (the same lines as /list), and the user's choice."""
    infos = saved_sessions(store, out)[:15]
    if not infos:
        out.note(f"no saved sessions in {store.dir}", error=True)
        return None
    for n, i in enumerate(infos, 1):
        out.line(f"  {n:>2}. {session_line(i)}")
    if ask_text is None:
        return None
    answer = ask_text("Resume which session? [1]: ") or "1"
    if not answer.isdigit() or not 1 <= int(answer) <= len(infos):
        out.note("no session chosen", error=True)
        return None
    return infos[int(answer) - 1].sha


def resume(agent: Agent, store: SessionStore, sha_prefix: str, out: Out) -> bool:
    """`ds4 agent --resume ID`: the same load as /switch, then the agent takes the session over."""
    try:
        sha = store.resolve(sha_prefix)
    except StoreError as e:
        out.note(str(e), error=True)
        return False
    if load_session(store, sha, agent.conv, out) is None:
        return False
    _take_over(agent, out)
    return True


def _take_over(agent: Agent, out: Out) -> None:
    """The loaded session becomes the agent's (adopting it again after /switch adopted it as a
    chat would is harmless: both read the same KV); a chat session is said to be one."""
    kind = agent.adopt_session()
    if kind == "chat":
        n = len(agent.conv.transcript.tokens) - len(agent.conv.session.tokens)
        out.note(f"resumed a chat session in the agent: it continues under the agent's system prompt, so tools are "
                 f"now available ({short_count(n)} tokens to prefill on the next turn)")


def banner_lines(setup: AgentSetup) -> list[str]:
    """What the banner says beyond the first line: instruction files loaded, MCP servers."""
    lines = []
    files = setup.instructions.files if setup.instructions is not None else []
    lines.append("instructions: " + (", ".join(f.shown() for f in files) if files else
                                     "none (AGENTS.md or CLAUDE.md in the workspace, or ~/.ds4agent/AGENTS.md)"))
    if setup.status or setup.skipped:
        parts = [s.line() for s in setup.status] + setup.skipped
        lines.append("MCP: " + "; ".join(parts))
    if setup.git_commit != "off":
        lines.append(f"git: each step's changes are committed ({setup.git_commit})")
    return lines
