"""`ds4 agent` front ends: the interactive terminal (chat shell plus tool lines, diffs and
approval questions) and the headless one-task mode (plain transcript or JSON lines)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Callable

from ..agent import Agent, AgentEvent, event_json
from ..sessions import SessionStore, StoreError
from ..tools import MODES, SANDBOX_MODES, Request
from .chat import COMMANDS, ID_CHARS, RESET, ChatCommands, Out, Renderer, _ago, _k, run_tty, session_kind, stop_note

GREEN, RED, YELLOW, GREY = "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[90m"

AGENT_COMMANDS = {**{k: v for k, v in COMMANDS.items() if k != "/system"},
                  "/compact": "summarise the conversation to free context",
                  "/approval": "ask|auto-edit|yolo: how much runs without asking (no argument: the mode and the "
                               "session's 'always' answers; 'clear' forgets them)",
                  "/sandbox": "read-only|workspace-write|full-access: what shell commands may write"}


def color_diff(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            out.append(f"\x1b[1m{line}{RESET}")
        elif line.startswith("+"):
            out.append(f"{GREEN}{line}{RESET}")
        elif line.startswith("-"):
            out.append(f"{RED}{line}{RESET}")
        elif line.startswith("@@"):
            out.append(f"\x1b[36m{line}{RESET}")
        else:
            out.append(line)
    return "\n".join(out)


class AgentCommands(ChatCommands):
    commands = AGENT_COMMANDS

    def __init__(self, agent: Agent, store: SessionStore, out: Out, ask) -> None:
        super().__init__(agent.conv, store, out, ask)
        self.agent = agent

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


def tty_approver(out: Out, ask_text: Callable[[str], str]) -> Callable[[Request], str]:
    """y / n, or a = always for the scope the request names (a command prefix such as
    `pytest`, file edits, reads below one directory): the scope is shown and must be confirmed.
    Dangerous and unreadable commands, and running outside the sandbox, offer no "always"."""
    def approve(req: Request) -> str:
        out.line(f"⚠ {req.summary}", YELLOW)
        if req.scope:
            out.line(f"  a = always allow {req.scope} (this session)", GREY)
        choices = "[y]es / [n]o" + (" / [a]lways" if req.scope else "")
        answer = ask_text(f"  {req.reason}. Allow? {choices}: ")
        if answer in ("a", "always") and req.scope:
            sure = ask_text(f"  Always allow {req.scope}, without asking, for the rest of this session? [y]es / [n]o: ")
            if sure in ("y", "yes"):
                return "always"
            answer = ask_text("  Run it this once? [y]es / [n]o: ")
        return "yes" if answer in ("y", "yes") else "no"

    return approve


def run_agent_turn(agent: Agent, text: str, out: Out, show_thinking: bool) -> None:
    r = Renderer(out, show_thinking)
    note = None
    try:
        for ev in agent.run(text):
            if ev.kind == "interrupted":  # Esc / Ctrl+C set agent.conv.stop (run_tty)
                note = stop_note(ev.text)
            r = _show(ev, r, out, show_thinking)
        r.finish(note)
    except KeyboardInterrupt:
        outcome = agent.conv.interrupted()
        r.finish(stop_note("withdrawn" if outcome == "rolled back" else "interrupted"))


def _show(ev: AgentEvent, r: Renderer, out: Out, show_thinking: bool) -> Renderer:
    if ev.kind == "prefill":
        r.prefill(ev.done, ev.total, 0.0)
    elif ev.kind == "reasoning":
        r.reasoning(ev.text)
    elif ev.kind == "content":
        r.content(ev.text)
    elif ev.kind == "call_start":
        r.finish()
        r = Renderer(out, show_thinking)
    elif ev.kind in ("tool", "refused"):
        r.finish()
        mark, color = ("🛠️ ", GREEN if ev.ok else RED) if ev.kind == "tool" else ("✗ ", RED)
        out.line(mark + ev.text, color)
        if ev.detail:
            out.write((color_diff(ev.detail) if out.tty else ev.detail).rstrip("\n") + "\n")
        r = Renderer(out, show_thinking)
    elif ev.kind == "compact_failed":
        out.note(ev.text)
    elif ev.kind == "compacted":
        out.note(f"context compacted; summary: {ev.text}")
    elif ev.kind == "attached":
        out.note(f"attached {ev.text}")
    elif ev.kind == "note":
        out.note(ev.text)
    elif ev.kind == "error":
        out.note(ev.text, error=True)
    elif ev.kind == "done" and ev.text:  # why the run stopped, unless the model simply finished
        r.finish()
        out.note(ev.text)
        r = Renderer(out, show_thinking)
    return r


def run_agent_tty(agent: Agent, store: SessionStore, history_file: Path | None, banner: str, **io) -> int:
    def runner(text: str, out: Out, state: dict, ask_text: Callable[[str], str]) -> None:
        agent.approve = tty_approver(out, ask_text)
        run_agent_turn(agent, text, out, state["show_thinking"])

    pol = agent.policy
    return run_tty(agent.conv, store, history_file, banner=banner, prompt="ds4 agent> ",
                   make_commands=lambda out, ask: AgentCommands(agent, store, out, ask), runner=runner,
                   status=lambda: f"| {pol.mode} · sandbox {pol.describe()} ", **io)


# Exit status of `ds4 agent -p` for each stop reason (agent.STOP_REASONS; 2 is a usage error).
EXIT_CODES = {"end_turn": 0, "error": 1, "max_tokens": 3, "context": 4, "refused": 5, "interrupted": 130}


def run_headless(agent: Agent, task: str, as_json: bool, stdout: IO[str], stderr: IO[str]) -> int:
    """One task to completion without a terminal. The exit status says why it stopped
    (EXIT_CODES): 0 only when the model finished its answer. The plain transcript hides the
    reasoning and shows the answers; why a run stopped early goes to stderr."""
    out = Out(stdout, tty=False, err=stderr)
    r = Renderer(out, show_thinking=False)
    stop = "error"
    try:
        for ev in agent.run(task):
            if ev.kind == "done":
                stop = ev.stop
            if as_json:
                stdout.write(event_json(ev) + "\n")
                stdout.flush()
            else:
                r = _show(ev, r, out, show_thinking=False)
        if not as_json:
            r.finish()
    except KeyboardInterrupt:
        agent.conv.interrupted()
        if as_json:
            stdout.write(event_json(AgentEvent("done", stop="interrupted")) + "\n")
        stderr.write("ds4: interrupted\n")
        return EXIT_CODES["interrupted"]
    return EXIT_CODES.get(stop, EXIT_CODES["error"])


def pick_session(store: SessionStore, ask_text: Callable[[str], str] | None, out: Out) -> str | None:
    """The session to resume when --resume is given without an id: a numbered list of the
    most recent ones, and the user's choice."""
    infos = [i for i in store.list() if i.reason != "agent-system"][:15]
    if not infos:
        out.note(f"no saved sessions in {store.dir}", error=True)
        return None
    for n, i in enumerate(infos, 1):
        out.line(f"  {n:>2}. {i.sha[:ID_CHARS]}  {session_kind(i.reason):<5}  {_ago(i.last_used):>9}  "
                 f"{_k(i.tokens):>6} tok  {i.title}")
    if ask_text is None:
        return None
    answer = ask_text("Resume which session? [1]: ") or "1"
    if not answer.isdigit() or not 1 <= int(answer) <= len(infos):
        out.note("no session chosen", error=True)
        return None
    return infos[int(answer) - 1].sha


def resume(agent: Agent, store: SessionStore, sha_prefix: str, out: Out) -> bool:
    try:
        sha = store.resolve(sha_prefix)
        info = store.load(sha, agent.conv.session)
    except StoreError as e:
        out.note(str(e), error=True)
        return False
    out.note(f"resumed {sha[:ID_CHARS]}: {info.title} ({_k(info.tokens)} tokens, no prefill needed)")
    _take_over(agent, out)
    return True


def _take_over(agent: Agent, out: Out) -> None:
    """The loaded session becomes the agent's (adopting it again after /switch adopted it as a
    chat would is harmless: both read the same KV); a chat session is said to be one."""
    kind = agent.adopt_session()
    if kind == "chat":
        n = len(agent.conv.transcript.tokens) - len(agent.conv.session.tokens)
        out.note(f"resumed a chat session in the agent: it continues under the agent's system prompt, so tools are "
                 f"now available ({_k(n)} tokens to prefill on the next turn)")

