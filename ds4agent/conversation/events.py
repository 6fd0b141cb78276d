"""The one event type the conversation layer hands up to every front end (terminal chat,
agent, headless runs, and the server to come), for a chat turn and an agent run alike."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class Event:
    """One thing that happened while the model worked.

    kind:
      prefill (done/total tokens) | reasoning | content (text as it streams) |
      call_start (a tool call's name, as soon as it is known) | call ("name arguments", parsed) |
      dsml_error (a malformed tool block) | done (the end of a turn or of an agent run);
      agent runs add: tool (a call ran: text is its one-line summary, detail a diff or output,
      ok its outcome) | refused (a call not run) | attached (an @file) | note (a line to show) |
      compacted (text: the summary) | compact_failed | interrupted (text: the turn's finish) |
      turn (one model turn ended: see ``data``) | error.
    """

    kind: str
    text: str = ""
    detail: str = ""
    ok: bool = True
    done: int = 0
    total: int = 0
    # On a turn's "done": why the answer ended: "eos" (the model finished), "length" (the
    # token limit), "context" (the context is full), "interrupted" (stopped after some output
    # was kept), "withdrawn" (stopped before any output: the user message was taken back).
    finish: str = ""
    # On an agent run's "done": one of agent.STOP_REASONS (text explains any but end_turn).
    stop: str = ""
    # Structured extras for front ends that need more than the text (headless stream-json):
    # on "tool"/"refused": name, input (the arguments), result (what the model was given),
    # index (the call's place in its turn), output (a command's whole output); on "turn" (the
    # end of one model turn): message (the assistant message), finish, usage.
    data: dict | None = None


def event_json(ev: Event) -> str:
    """One JSON line for headless output (`ds4 agent -p --json`)."""
    d = {"type": ev.kind}
    if ev.text:
        d["text"] = ev.text
    if ev.detail:
        d["detail"] = ev.detail
    if not ev.ok:
        d["ok"] = False
    if ev.kind == "prefill":
        d.update(done=ev.done, total=ev.total)
    if ev.kind == "done":
        d["stop_reason"] = ev.stop
    return json.dumps(d, ensure_ascii=False)
