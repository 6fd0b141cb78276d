"""Slash commands: one registry (name, arguments, help, which front end offers it) for the chat
and the agent, the commands both share, and the session listing and resuming that /list,
/switch and the agent's --resume all use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..conversation import Conversation
from ..engine.errors import EngineError
from ..protocol import THINK_MAX_MIN_CTX
from ..sessions import SessionInfo, SessionStore, StoreError, steering_words
from .terminal import BOLD, ID_CHARS, Out, ago, short_count


@dataclass(frozen=True)
class SlashCommand:
    name: str
    help: str
    where: tuple[str, ...] = ("chat", "agent")


COMMANDS = (
    SlashCommand("/help", "show this help"),
    SlashCommand("/think", "reason before answering (default)"),
    SlashCommand("/think-max", "maximum reasoning effort (needs a context of 384K)"),
    SlashCommand("/nothink", "answer directly"),
    SlashCommand("/ctx", "N: new context size (the conversation is kept and re-prefilled)"),
    SlashCommand("/read", "FILE: send the file's text as your next message"),
    SlashCommand("/system", "TEXT: set the system text (starts a new conversation)", ("chat",)),
    SlashCommand("/save", "save this conversation (instant resume later)"),
    SlashCommand("/list", "list saved conversations"),
    SlashCommand("/switch", "ID: resume a saved conversation (no re-prefill)"),
    SlashCommand("/new", "start a new conversation"),
    SlashCommand("/history", "[N]: show the last N turns"),
    SlashCommand("/stats", "speed and context use"),
    SlashCommand("/power", "P: cap the engine's duty cycle at P percent (1-100; 100: no cap)"),
    SlashCommand("/steer", "S | attn S | off: directional steering scale on the FFN outputs (attn: on the "
                 "attention outputs); needs --dir-steering-file"),
    SlashCommand("/compact", "summarise the conversation to free context", ("agent",)),
    SlashCommand("/approval", "ask|auto-edit|yolo: how much runs without asking (no argument: the mode and the "
                         "session's 'always' answers; 'clear' forgets them)", ("agent",)),
    SlashCommand("/sandbox", "read-only|workspace-write|full-access: what shell commands may write", ("agent",)),
    SlashCommand("/undo", "[N|list]: revert the agent's last change set (N: the last N; your own edits are kept)",
            ("agent",)),
    SlashCommand("/output", "[N]: the whole output of the last command (N: the Nth last); also Ctrl+O", ("agent",)),
    SlashCommand("/mcp", "the MCP servers and their tools", ("agent",)),
    SlashCommand("/quit", "leave (also Ctrl+D)"),
)
ALIASES = {"/exit": "/quit"}
KEYS_HELP = ("Enter sends; Alt+Enter (or Esc then Enter) adds a line; pasting keeps newlines; "
             "Ctrl+T shows or hides reasoning; Esc or Ctrl+C stops an answer; what you type meanwhile waits "
             "for the next prompt; Ctrl+D leaves.")


def commands_for(front_end: str) -> dict[str, str]:
    """Name -> help of the commands ``front_end`` ("chat" or "agent") offers, in help order."""
    return {c.name: c.help for c in COMMANDS if front_end in c.where}


# -- saved sessions, as /list, /switch and --resume show them -----------------------------------

def session_kind(reason: str) -> str:
    """What a saved session is, from its save reason: "agent" or "chat"."""
    return "agent" if reason == "agent-session" else "chat"


def save_reason(conv: Conversation) -> str:
    # A conversation that announces tools is an agent's, whichever program saves it, so its
    # kind in /list stays true after a chat resumed it.
    return "agent-session" if conv.tools else "continued"


def saved_sessions(store: SessionStore, out: Out) -> list[SessionInfo]:
    """The sessions a user can resume, newest first (the agent's cached system prompt is not
    one); files the store skipped are reported."""
    infos = [i for i in store.list() if i.reason != "agent-system"]
    for p in store.problems:
        out.note(f"skipped: {p}")
    return infos


def session_line(i: SessionInfo) -> str:
    flag = " (text only)" if i.stripped else ""
    steer = f" [steered: {i.steering_text}]" if i.steering else ""
    return (f"{i.sha[:ID_CHARS]}  {session_kind(i.reason):<5}  {ago(i.last_used):>9}  "
            f"{short_count(i.tokens):>6} tok  {i.title}{flag}{steer}")


def steering_change(saved: dict | None, now) -> str:
    """What to say when a saved session goes on under other steering than its KV was made
    under ("" when the same): ``saved`` its record, ``now`` the session's Steering or None."""
    current = now.record() if now is not None and now.active else None
    if saved == current:
        return ""
    return (f"this session was saved under {steering_words(saved) or 'no steering'}; it goes on under "
            f"{steering_words(current) or 'no steering'}")


def load_session(store: SessionStore, sha: str, conv: Conversation, out: Out) -> SessionInfo | None:
    """Load a saved session into ``conv`` (its KV restored, no prefill) and say so; on failure
    say why and leave ``conv`` as it was."""
    try:
        info = store.load(sha, conv.session)
    except StoreError as e:
        out.note(str(e), error=True)
        return None
    conv.adopt_session()
    out.note(f"resumed {sha[:ID_CHARS]}: {info.title} ({short_count(info.tokens)} tokens, no prefill needed)")
    change = steering_change(info.steering, conv.session.steering)
    if change:
        out.note(change)
    return info


class ChatCommands:
    """The chat's slash commands, shared by the terminal and the pipe front ends; the agent's
    extend them (ui/agent_ui.py). Each command is a ``cmd_<name>`` method; which front end
    offers it, and its help, come from COMMANDS."""

    commands = commands_for("chat")

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
        tokens = short_count(len(self.conv.session.tokens))
        self.out.note(f"saved {sha[:ID_CHARS]} ({tokens} tokens) in {self.store.dir}")

    def run(self, line: str) -> None:
        cmd, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        cmd = ALIASES.get(cmd, cmd)
        handler = getattr(self, "cmd_" + cmd[1:].replace("-", "_"), None) if cmd in self.commands else None
        if handler is None:
            self.out.note(f"unknown command: {cmd}; type /help for commands", error=True)
            return
        handler(arg)

    def cmd_power(self, arg: str) -> None:
        engine = self.conv.engine
        if not arg:
            self.out.note(f"power {engine.power}%")
            return
        try:
            engine.set_power(int(arg) if arg.strip().lstrip("-").isdigit() else arg)
        except EngineError as e:
            self.out.note(str(e), error=True)
            return
        self.out.note(f"power {engine.power}%" + (" (no cap)" if engine.power == 100 else ""))

    def cmd_steer(self, arg: str) -> None:
        """The session's directional steering: its scales changed from the next token on (the
        KV already computed keeps the steering it was computed with)."""
        session = self.conv.session
        st = session.steering or self.conv.engine.steering
        if st is None:
            self.out.note("no steering directions: start with --dir-steering-file FILE (ds4 steer build makes one)",
                          error=True)
            return
        words = arg.split()
        try:
            if not words:
                pass
            elif words == ["off"]:
                st = st.scaled(attn=0.0, ffn=0.0)
            elif len(words) == 2 and words[0] in ("attn", "ffn"):
                st = st.scaled(**{words[0]: float(words[1])})
            elif len(words) == 1:
                st = st.scaled(ffn=float(words[0]))
            else:
                raise ValueError("usage: /steer S | /steer attn S | /steer off")
            session.set_steering(st)
        except ValueError as e:
            self.out.note(str(e) if "usage" in str(e) or "must be" in str(e) else
                          "usage: /steer S | /steer attn S | /steer off", error=True)
            return
        self.out.note(f"steering: {st.describe()}" + ("" if st.active else " (off)"))

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
            self.out.note(f"system text: {self.conv.system!r}" if self.conv.system
                          else "no system text; /system TEXT sets one")
            return
        self.offer_save()
        self.conv.reset(system=arg)
        self.out.note("system text set; new conversation started")

    def cmd_save(self, arg: str) -> None:
        self.save()

    def cmd_list(self, arg: str) -> None:
        infos = saved_sessions(self.store, self.out)
        if not infos:
            self.out.note(f"no saved conversations in {self.store.dir}")
            return
        for i in infos[:30]:
            self.out.line("  " + session_line(i))

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
        if load_session(self.store, sha, self.conv, self.out):
            self.after_resume(sha)
            self.show_history(2)

    def after_resume(self, sha: str) -> None:
        """Say so when the session resumed is the other program's (the agent overrides this)."""
        if self.conv.tools:
            self.out.note(f"resumed an agent session in the chat: its tools do not run here (continue it with "
                          f"'ds4 agent --resume {sha[:ID_CHARS]}')")

    def cmd_new(self, arg: str) -> None:
        self.offer_save()
        self.conv.restart()  # from the primed system prompt (--prefix-file) when there is one
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
        self.out.line(f"  context      {short_count(used)}/{short_count(c.ctx)} tokens ({100 * used / c.ctx:.1f}%)")
        self.out.line(f"  last turn    prefill {st.prefill_tokens} tok at {st.prefill_tps:.1f} t/s, "
                      f"generation {st.gen_tokens} tok at {st.gen_tps:.1f} t/s")
        self.out.line(f"  this session {st.turns} turns, {st.total_generated} tokens generated")
        drafts = getattr(c.session.drafter, "stats", None)
        if drafts is not None:
            d = drafts()
            self.out.line(f"  speculation  {c.session.drafter.name}: {d['drafted']} tokens proposed in "
                          f"{d['proposals']} passes, {d['accepted']} kept ({d['mean_accepted']} per pass)")
        pool = c.engine.streaming()
        if pool is not None:
            self.out.line(f"  experts      {pool['slots']} of {pool['experts']} resident, the rest streamed: "
                          f"{100 * pool['hit_rate']:.1f}% found, {pool['bytes_read'] / 2**30:.2f} GiB read "
                          f"{'past' if pool['direct'] else 'through'} the page cache, "
                          f"{pool['prefetch_used']} of {pool['prefetched']} read ahead used, "
                          f"{pool['stall_s']:.1f} s waited")

    def cmd_quit(self, arg: str) -> None:
        self.quit = True
