"""`ds4 agent` front ends: the interactive terminal (chat shell plus tool lines, diffs and
approval questions) and the headless one-task mode (plain transcript or JSON lines)."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Callable

from ..conversation import Agent, Event, event_json
from ..sessions import SessionStore, StoreError
from ..tools import MODES, SANDBOX_MODES, Request
from .chat import run_tty
from .commands import ChatCommands, commands_for, load_session, saved_sessions, session_line
from .terminal import GREY, YELLOW, Out, TurnView, run_events, short_count


class AgentCommands(ChatCommands):
    commands = commands_for("agent")

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
    """One user request, streamed, until the model answers without tool calls."""
    run_events(agent.run(text), out, show_thinking, agent.conv.interrupted)


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
    view = TurnView(out, show_thinking=False)
    stop = "error"
    try:
        for ev in agent.run(task):
            if ev.kind == "done":
                stop = ev.stop
            if as_json:
                stdout.write(event_json(ev) + "\n")
                stdout.flush()
            else:
                view.event(ev)
        if not as_json:
            view.finish()
    except KeyboardInterrupt:
        agent.conv.interrupted()
        if as_json:
            stdout.write(event_json(Event("done", stop="interrupted")) + "\n")
        stderr.write("ds4: interrupted\n")
        return EXIT_CODES["interrupted"]
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
