"""`ds4 chat`: the interactive terminal chat (prompt_toolkit input, rich markdown output) and
its plain pipe mode. Front-end only: the model is reached through Conversation and the
session store, never through MLX.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import IO, Callable

from .. import settings
from ..conversation import Conversation
from ..sessions import SessionStore
from .commands import KEYS_HELP, ChatCommands
from .terminal import BOLD, GREY, Out, run_events, short_count


def run_turn(conv: Conversation, text: str, out: Out, show_thinking: bool,
             on_step: Callable[[], None] | None = None) -> None:
    """One user turn, streamed. Esc / Ctrl+C set ``conv.stop`` (see run_tty) and the turn ends
    at the next token."""
    run_events(conv.turn(text), out, show_thinking, conv.interrupted, on_step)


def status_text(conv: Conversation) -> str:
    st = conv.stats
    used = len(conv.transcript.tokens)
    mode = {"chat": "no thinking", "thinking": "thinking", "max": "think max"}[conv.mode]
    pool = conv.engine.streaming()
    experts = f"experts streamed {100 * pool['hit_rate']:.0f}% hit | " if pool is not None else ""
    steer = conv.session.steering
    steering = f"steer {steer.describe()} | " if steer is not None and steer.active else ""
    power = getattr(conv.engine, "power", 100)
    steering += f"power {power}% | " if power < 100 else ""
    return (f" {conv.engine.info.name} | ctx {short_count(used)}/{short_count(conv.ctx)} | "
            f"prefill {st.prefill_tps:.1f} t/s | gen {st.gen_tps:.1f} t/s | {experts}{steering}{mode} ")


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
            runner: Runner | None = None, prompt: str = "ds4> ", status: Callable[[], str] | None = None,
            on_key: dict[str, Callable[[bool], None]] | None = None) -> int:
    """The interactive loop. ``input``/``output``/``stdout`` are injectable for tests; the agent
    passes its own commands, turn runner and status line part (approval mode and sandbox), and
    keys of its own (``on_key``: a Ctrl key such as "c-o" and what it does, called with True
    while the model works, when it must not print, and with False at the prompt)."""
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

    for name, action in (on_key or {}).items():
        def at_prompt(event, action=action) -> None:
            from prompt_toolkit.application import run_in_terminal

            run_in_terminal(lambda: action(False))

        kb.add(name)(at_prompt)

    def ask_text(question: str, keys: str | None = None) -> str:
        """A typed answer, or with ``keys`` one key pressed (ui/ask.py; "escape" for Esc)."""
        from .keys import suspended

        try:
            with suspended():
                if keys is not None:
                    from .ask import ask_key

                    return ask_key(question, keys, input=input, output=output)
                return session.prompt(question, bottom_toolbar=None, multiline=False, key_bindings=None).strip().lower()
        except (EOFError, KeyboardInterrupt):
            return "escape" if keys is not None else "n"

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
            watched = {chr(ord(name[2]) - 96): (lambda action=action: action(True))
                       for name, action in (on_key or {}).items() if name.startswith("c-") and len(name) == 3}
            with KeyWatcher(on_escape=conv.stop.set, on_key=watched) as keys:
                runner(text, out, state, ask_text)
        queued += keys.queued
        draft = keys.partial
    cmds.offer_save()
    return 0


def default_history_file() -> Path:
    return settings.chat_history_file()


def is_interactive(stdin: IO[str], stdout: IO[str]) -> bool:
    return stdin.isatty() and stdout.isatty() and os.environ.get("TERM") != "dumb"
