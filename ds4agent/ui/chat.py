"""`ds4 chat`: the interactive terminal chat (prompt_toolkit input, rich markdown output) and
its plain pipe mode. Front-end only: the model is reached through Conversation and the
session store, never through MLX.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from ..conversation import ContextError, Conversation
from ..engine.template import THINK_MAX_MIN_CTX
from ..sessions import SessionStore, StoreError
from .markdown import MarkdownStream

GREY, CYAN, RED, BOLD, RESET = "\x1b[38;5;245m", "\x1b[36m", "\x1b[31m", "\x1b[1m", "\x1b[0m"

COMMANDS = {
    "/help": "show this help",
    "/think": "reason before answering (default)",
    "/think-max": "maximum reasoning effort (needs a context of 384K)",
    "/nothink": "answer directly",
    "/ctx": "N: new context size (the conversation is kept and re-prefilled)",
    "/read": "FILE: send the file's text as your next message",
    "/system": "TEXT: set the system text (starts a new conversation)",
    "/save": "save this conversation (instant resume later)",
    "/list": "list saved conversations",
    "/switch": "ID: resume a saved conversation (no re-prefill)",
    "/new": "start a new conversation",
    "/history": "[N]: show the last N turns",
    "/stats": "speed and context use",
    "/quit": "leave (also Ctrl+D)",
}
KEYS_HELP = ("Enter sends; Alt+Enter (or Esc then Enter) adds a line; pasting keeps newlines; "
             "Ctrl+T shows or hides reasoning; Esc or Ctrl+C stops an answer; what you type meanwhile waits "
             "for the next prompt; Ctrl+D leaves.")


ID_CHARS = 12  # hex digits of a session id shown anywhere (/save, /list, /switch, the agent's picker)


def session_kind(reason: str) -> str:
    """What a saved session is, from its save reason: "agent" or "chat"."""
    return "agent" if reason == "agent-session" else "chat"


def save_reason(conv: Conversation) -> str:
    # A conversation that announces tools is an agent's, whichever program saves it, so its
    # kind in /list stays true after a chat resumed it.
    return "agent-session" if conv.tools else "continued"


def _k(n: int) -> str:
    return str(n) if n < 1000 else (f"{n // 1000}k" if n % 1000 == 0 else f"{n / 1000:.1f}k")


def _ago(t: int) -> str:
    d = max(0, int(time.time()) - t)
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= secs:
            return f"{d // secs}{unit} ago"
    return "just now"


@dataclass
class Out:
    """Where the chat writes: colours and markdown only on a terminal. In a pipe, ds4's own
    notes go to stderr so stdout carries only the answers."""

    stream: IO[str]
    tty: bool
    width: int = 80
    err: IO[str] | None = None
    errors: int = 0

    def write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def line(self, text: str = "", color: str = "") -> None:
        self.write((color + text + RESET if color and self.tty else text) + "\n")

    def note(self, text: str, error: bool = False) -> None:
        """A one-line message from ds4 itself."""
        self.errors += error
        if self.err is not None:
            self.err.write(f"ds4: {text}\n")
            self.err.flush()
        else:
            self.line(f"ds4: {text}", GREY)


class ChatCommands:
    """Slash commands; shared by the terminal and the pipe front ends (and, extended, the agent)."""

    commands = COMMANDS

    def __init__(self, conv: Conversation, store: SessionStore, out: Out, ask: Callable[[str], bool]) -> None:
        self.conv = conv
        self.store = store
        self.out = out
        self.ask = ask  # yes/no question to the user (the pipe front end never asks)
        self.pending_read: str | None = None
        self.quit = False

    def offer_save(self) -> None:
        if self.conv.dirty and self.conv.messages and self.ask("Save this conversation first? [Y/n] "):
            self.save()

    def save(self) -> None:
        if not self.conv.messages:
            self.out.note("nothing to save yet")
            return
        self.conv.sync_for_save()
        try:
            sha = self.store.save(self.conv.session, save_reason(self.conv))
        except StoreError as e:
            self.out.note(f"save failed: {e}", error=True)
            return
        self.conv.dirty = False
        self.out.note(f"saved {sha[:ID_CHARS]} ({_k(len(self.conv.session.tokens))} tokens) in {self.store.dir}")

    def run(self, line: str) -> None:
        cmd, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        handler = getattr(self, "cmd_" + cmd[1:].replace("-", "_"), None) if cmd in self.commands or cmd == "/exit" else None
        if handler is None:
            self.out.note(f"unknown command: {cmd}; type /help for commands", error=True)
            return
        handler(arg)

    def cmd_help(self, arg: str) -> None:
        for name, text in self.commands.items():
            self.out.line(f"  {name:<11} {text}")
        self.out.line("  " + KEYS_HELP)

    def _mode(self, mode: str, label: str) -> None:
        self.conv.set_mode(mode)
        self.out.note(f"thinking mode: {label}")

    def cmd_think(self, arg: str) -> None:
        self._mode("thinking", "high")

    def cmd_nothink(self, arg: str) -> None:
        self._mode("chat", "none")

    def cmd_think_max(self, arg: str) -> None:
        if self.conv.ctx < THINK_MAX_MIN_CTX:
            self.out.note(f"Think Max needs a context of at least {THINK_MAX_MIN_CTX} (/ctx {THINK_MAX_MIN_CTX}); "
                          "using normal thinking until then")
        self._mode("max", "max")

    def cmd_ctx(self, arg: str) -> None:
        if not arg.isdigit() or int(arg) < 16:
            self.out.note("/ctx needs a number of tokens (at least 16), e.g. /ctx 65536", error=True)
            return
        self.conv.set_context(int(arg))
        self.out.note(f"context is now {int(arg)} tokens; the conversation will be re-prefilled on the next turn")

    def cmd_read(self, arg: str) -> None:
        if not arg:
            self.out.note("/read needs a file path", error=True)
            return
        path = Path(arg).expanduser()
        try:
            self.pending_read = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            self.out.note(f"cannot read {path}: {getattr(e, 'strerror', None) or e}", error=True)

    def cmd_system(self, arg: str) -> None:
        if not arg:
            self.out.note(f"system text: {self.conv.system!r}" if self.conv.system else "no system text; /system TEXT sets one")
            return
        self.offer_save()
        self.conv.reset(system=arg)
        self.out.note("system text set; new conversation started")

    def cmd_save(self, arg: str) -> None:
        self.save()

    def cmd_list(self, arg: str) -> None:
        infos = [i for i in self.store.list() if i.reason != "agent-system"]  # the agent's prompt cache
        for p in self.store.problems:
            self.out.note(f"skipped: {p}")
        if not infos:
            self.out.note(f"no saved conversations in {self.store.dir}")
            return
        for i in infos[:30]:
            flag = " (text only)" if i.stripped else ""
            self.out.line(f"  {i.sha[:ID_CHARS]}  {session_kind(i.reason):<5}  {_ago(i.last_used):>9}  "
                          f"{_k(i.tokens):>6} tok  {i.title}{flag}")

    def cmd_switch(self, arg: str) -> None:
        if not arg:
            self.out.note("/switch needs a session id (see /list)", error=True)
            return
        try:
            sha = self.store.resolve(arg)
        except StoreError as e:
            self.out.note(str(e), error=True)
            return
        self.offer_save()
        try:
            info = self.store.load(sha, self.conv.session)
        except StoreError as e:
            self.out.note(str(e), error=True)
            return
        self.conv.adopt_session()
        self.out.note(f"resumed {sha[:ID_CHARS]}: {info.title} ({_k(info.tokens)} tokens, no prefill needed)")
        self.after_resume(sha)
        self.show_history(2)

    def after_resume(self, sha: str) -> None:
        """Say so when the session resumed is the other program's (the agent overrides this)."""
        if self.conv.tools:
            self.out.note(f"resumed an agent session in the chat: its tools do not run here (continue it with "
                          f"'ds4 agent --resume {sha[:ID_CHARS]}')")

    def cmd_new(self, arg: str) -> None:
        self.offer_save()
        self.conv.reset(system=self.conv.system)
        self.out.note("new conversation")

    def cmd_history(self, arg: str) -> None:
        if arg and not arg.isdigit():
            self.out.note("/history takes a number of turns, e.g. /history 5", error=True)
            return
        self.show_history(int(arg) if arg else 10)

    def show_history(self, n: int) -> None:
        turns = [m for m in self.conv.messages if m["role"] in ("user", "assistant")][-2 * n :]
        for m in turns:
            mine = m["role"] == "user"
            text = (m.get("content") or "").strip()
            self.out.line(f"{'you' if mine else 'model'} › {text}", BOLD if mine else "")

    def cmd_stats(self, arg: str) -> None:
        c, st = self.conv, self.conv.stats
        used = len(c.transcript.tokens)
        self.out.line(f"  model        {c.engine.info.name} ({c.engine.info.backend})")
        self.out.line(f"  context      {_k(used)}/{_k(c.ctx)} tokens ({100 * used / c.ctx:.1f}%)")
        self.out.line(f"  last turn    prefill {st.prefill_tokens} tok at {st.prefill_tps:.1f} t/s, "
                      f"generation {st.gen_tokens} tok at {st.gen_tps:.1f} t/s")
        self.out.line(f"  this session {st.turns} turns, {st.total_generated} tokens generated")

    def cmd_quit(self, arg: str) -> None:
        self.quit = True

    cmd_exit = cmd_quit


class Renderer:
    """Streams one answer: reasoning dim (or hidden), the answer as markdown on a terminal."""

    def __init__(self, out: Out, show_thinking: bool) -> None:
        self.out = out
        self.show_thinking = show_thinking
        self.md = MarkdownStream(out.write, out.width) if out.tty else None
        self.in_reasoning = False
        self.started_answer = False
        self.progress_shown = False
        self.reasoning_chars = 0

    def prefill(self, done: int, total: int, started: float) -> None:
        if not self.out.tty:
            return
        frac = done / total if total else 1.0
        cells = 24
        filled = max(1, int(frac * cells))
        elapsed = time.perf_counter() - started
        eta = f" ETA {elapsed / frac - elapsed:.0f}s" if 0 < frac < 1 and elapsed > 0.5 else ""
        self.out.write(f"\r{CYAN}prefill [{'█' * filled}{'░' * (cells - filled)}] {done}/{total} "
                       f"{100 * frac:.0f}%{eta}{RESET}\x1b[K")
        self.progress_shown = True

    def _end_progress(self) -> None:
        if self.progress_shown:
            self.out.write("\r\x1b[K")
            self.progress_shown = False

    def reasoning(self, text: str) -> None:
        self._end_progress()
        if not self.show_thinking:
            self.reasoning_chars += len(text)
            if self.out.tty:
                self.out.write(f"\r{GREY}thinking… {self.reasoning_chars} chars{RESET}\x1b[K")
            return
        if not self.in_reasoning:
            self.in_reasoning = True
            if self.out.tty:
                self.out.write(GREY)
        self.out.write(text)

    def content(self, text: str) -> None:
        self._end_progress()
        if self.in_reasoning or (not self.show_thinking and self.reasoning_chars):
            if self.out.tty:
                self.out.write(RESET + ("\r\x1b[K" if not self.show_thinking else "\n\n"))
            elif self.show_thinking:
                self.out.write("\n\n")
            self.in_reasoning = False
            self.reasoning_chars = 0
        if not self.started_answer:
            text = text.lstrip()  # the answer's leading blank lines add nothing
            if not text:
                return
            self.started_answer = True
        if self.md:
            self.md.feed(text)
        else:
            self.out.write(text)

    def finish(self, note: str | None = None) -> None:
        self._end_progress()
        if self.in_reasoning:
            self.out.write((RESET if self.out.tty else "") + "\n")  # ended while still reasoning
        if self.md:
            self.md.finish()
        elif self.started_answer:
            self.out.write("\n")
        if note:
            self.out.note(note)
        if self.out.tty:
            self.out.write("\n")  # a blank line before the next prompt


def stop_note(finish: str) -> str | None:
    """The note shown when a turn ended early (TurnEvent.finish)."""
    return {"interrupted": "interrupted", "withdrawn": "interrupted; your message was withdrawn",
            "length": "stopped at the token limit (-n)", "context": "stopped: the context is full"}.get(finish)


def run_turn(conv: Conversation, text: str, out: Out, show_thinking: bool,
             on_step: Callable[[], None] | None = None) -> None:
    """One user turn, streamed. Esc / Ctrl+C set ``conv.stop`` (see run_tty) and the turn ends
    at the next token; a KeyboardInterrupt that lands anyway (pipe mode) is settled the same way."""
    r = Renderer(out, show_thinking)
    started = time.perf_counter()
    try:
        note = None
        for ev in conv.turn(text):
            if ev.kind == "prefill":
                r.prefill(ev.done, ev.total, started)
            elif ev.kind == "reasoning":
                r.reasoning(ev.text)
            elif ev.kind == "content":
                r.content(ev.text)
            elif ev.kind == "done":
                note = stop_note(ev.finish)
            if on_step:
                on_step()
        r.finish(note)
    except KeyboardInterrupt:
        outcome = conv.interrupted()
        r.finish(stop_note("withdrawn" if outcome == "rolled back" else "interrupted"))
    except ContextError as e:
        r.finish()
        out.note(str(e), error=True)


def status_text(conv: Conversation) -> str:
    st = conv.stats
    used = len(conv.transcript.tokens)
    mode = {"chat": "no thinking", "thinking": "thinking", "max": "think max"}[conv.mode]
    return (f" {conv.engine.info.name} | ctx {_k(used)}/{_k(conv.ctx)} | prefill {st.prefill_tps:.1f} t/s | "
            f"gen {st.gen_tps:.1f} t/s | {mode} ")


# -- front ends ---------------------------------------------------------------------------------

def run_pipe(conv: Conversation, store: SessionStore, stdin: IO[str], stdout: IO[str], stderr: IO[str] | None = None,
             show_thinking: bool = True) -> int:
    """Not a terminal: each input line is a prompt (or a command); plain text out. The exit
    status is 1 when any command or turn failed."""
    out = Out(stdout, tty=False, err=stderr or sys.stderr)
    cmds = ChatCommands(conv, store, out, ask=lambda q: False)
    for raw in stdin:
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            cmds.run(line)
            if cmds.quit:
                break
            if cmds.pending_read is None:
                continue
            line, cmds.pending_read = cmds.pending_read, None
        from .keys import stop_on_sigint

        with stop_on_sigint(conv.stop):  # Ctrl+C ends this answer at a token; the next line runs
            run_turn(conv, line, out, show_thinking)
    return 1 if out.errors else 0


Runner = Callable[[str, Out, dict, Callable[[str], str]], None]


def run_tty(conv: Conversation, store: SessionStore, history_file: Path | None, *, input=None, output=None,
            stdout: IO[str] | None = None, banner: str | None = None, on_step: Callable[[], None] | None = None,
            make_commands: Callable[[Out, Callable[[str], bool]], ChatCommands] | None = None,
            runner: Runner | None = None, prompt: str = "ds4> ", status: Callable[[], str] | None = None) -> int:
    """The interactive loop. ``input``/``output``/``stdout`` are injectable for tests; the agent
    passes its own commands, turn runner and status line part (approval mode and sandbox)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer, Completion, PathCompleter
    from prompt_toolkit.document import Document
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    stream = stdout or sys.stdout
    width = shutil.get_terminal_size((100, 24)).columns
    out = Out(stream, tty=True, width=width)
    state = {"show_thinking": True}
    names: dict[str, str] = {}

    class Commands(Completer):
        paths = PathCompleter(expanduser=True)

        def get_completions(self, document: Document, complete_event):
            text = document.text_before_cursor
            if not text.startswith("/"):
                return
            if " " not in text:
                for name, meta in names.items():
                    if name.startswith(text):
                        yield Completion(name, start_position=-len(text), display_meta=meta)
            elif text.startswith("/read "):
                sub = Document(text[len("/read "):], len(text) - len("/read "))
                yield from self.paths.get_completions(sub, complete_event)

    kb = KeyBindings()

    @kb.add("enter")
    def _submit(event) -> None:
        event.current_buffer.validate_and_handle()

    @kb.add("escape", "enter")
    def _newline(event) -> None:
        event.current_buffer.insert_text("\n")

    @kb.add("c-t")
    def _toggle(event) -> None:
        state["show_thinking"] = not state["show_thinking"]

    def ask_text(question: str) -> str:
        from .keys import suspended

        try:
            with suspended():
                return session.prompt(question, bottom_toolbar=None, multiline=False, key_bindings=None).strip().lower()
        except (EOFError, KeyboardInterrupt):
            return "n"

    def ask(question: str) -> bool:
        return ask_text(question) in ("", "y", "yes")

    history = InMemoryHistory()
    if history_file is not None:
        try:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(history_file))
        except OSError:
            pass
    session = PromptSession(history=history, completer=Commands(), key_bindings=kb, multiline=True,
                            complete_while_typing=True, enable_history_search=False, input=input, output=output,
                            bottom_toolbar=lambda: status_text(conv) + (status() if status else "")
                            + ("" if state["show_thinking"] else "| reasoning hidden "),
                            prompt_continuation=lambda width, line, soft: "." * (width - 1) + " ")
    cmds = make_commands(out, ask) if make_commands else ChatCommands(conv, store, out, ask)
    names.update(cmds.commands)
    if runner is None:
        def runner(text: str, out: Out, state: dict, ask_text: Callable[[str], str]) -> None:
            run_turn(conv, text, out, state["show_thinking"], on_step)
    if banner:
        out.line(banner, GREY)
    out.line("Type /help for commands. " + KEYS_HELP, GREY)
    # Keys typed while a turn runs: Esc interrupts, lines wait here (only on a real terminal).
    watch = input is None and sys.stdin.isatty()
    queued: list[str] = []
    draft = ""
    while not cmds.quit:
        if queued:
            text = queued.pop(0)
            out.line(prompt + text, BOLD)
        else:
            try:
                text = session.prompt(prompt, default=draft)
            except KeyboardInterrupt:
                draft = ""
                continue  # Ctrl+C at the prompt clears the line, never exits
            except EOFError:
                break
            draft = ""
        if not text.strip():
            continue
        if text.startswith("/"):
            cmds.run(text)
            if cmds.pending_read is None:
                continue
            text, cmds.pending_read = cmds.pending_read, None
        from .keys import KeyWatcher, stop_on_sigint

        with stop_on_sigint(conv.stop):
            if not watch:
                runner(text, out, state, ask_text)
                continue
            with KeyWatcher(on_escape=conv.stop.set) as keys:
                runner(text, out, state, ask_text)
        queued += keys.queued
        draft = keys.partial
    cmds.offer_save()
    return 0


def default_history_file() -> Path:
    from ..engine.demo import ds4_home

    return ds4_home() / "chat_history"


def is_interactive(stdin: IO[str], stdout: IO[str]) -> bool:
    return stdin.isatty() and stdout.isatty() and os.environ.get("TERM") != "dumb"
