"""`ds4 -p`: one prompt, one answer, streamed (a front end: terminal output through ui/terminal.py);
plus the --dump-tokens / --dump-logprobs diagnostics."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from ..conversation.reply import Reply
from ..engine import SamplingParams
from ..modelfile import BOS
from ..protocol import THINK_MAX_MIN_CTX, one_shot_prompt
from .terminal import CYAN, GREY, RESET, Out

if TYPE_CHECKING:
    from ..engine import Engine
    from ..modelfile import Tokenizer


@dataclass
class OneShot:
    prompt: str
    mode: str  # "chat" | "thinking" | "max"
    system: str | None
    sampling: SamplingParams
    max_tokens: int
    ctx: int


def effective_mode(mode: str, ctx: int, err: IO[str]) -> str:
    if mode == "max" and ctx < THINK_MAX_MIN_CTX:
        print(f"ds4: warning: --think-max needs --ctx >= {THINK_MAX_MIN_CTX}; ctx={ctx} uses normal thinking instead",
              file=err)
        return "thinking"
    return mode


def prompt_ids(tok: "Tokenizer", job: OneShot) -> list[int]:
    # A prompt that already starts with BOS is taken as fully rendered text.
    text = job.prompt if job.prompt.startswith(BOS) else one_shot_prompt(job.prompt, job.system, job.mode)
    return tok.encode_rendered(text)


def dump_tokens(tok: "Tokenizer", text: str, out: IO[str]) -> None:
    """Special-aware tokenisation of ``text`` exactly as given (no template)."""
    ids = tok.encode_rendered(text)
    out.write("[" + ", ".join(str(i) for i in ids) + "]\n")
    for i in ids:
        out.write(f"{i:6d}  {tok.token_text(i)}\n")


def run(engine: "Engine", job: OneShot, out: IO[str], err: IO[str]) -> int:
    tok = engine.tokenizer
    ids = prompt_ids(tok, job)
    tty = err.isatty()
    notes = Out(err, tty=tty)
    session = engine.session()

    def progress(done: int, total: int) -> None:
        text = f"processing {total} input tokens: {done}/{total}"
        if tty:
            notes.progress(f"{text} ({100 * done // total}%)")
            if done == total:
                notes.write("\n")
        else:
            notes.write(text + "\n")

    session.sync(ids, progress=progress if len(ids) > session.prefill_chunk else None)
    prefill = session.last_prefill
    color = out.isatty()
    # A prompt given fully rendered (starting with BOS) is continued as plain text.
    mode = "raw" if job.prompt.startswith(BOS) else ("chat" if job.mode == "chat" else "thinking")
    reply = Reply(session, tok, job.sampling, mode, job.max_tokens, malformed="text")
    thinking = mode == "thinking"  # reasoning streams dim, then a line break before the answer
    if thinking and color:
        out.write(GREY)
    ended_with_newline = True

    def write(text: str) -> None:
        nonlocal ended_with_newline
        if text:
            out.write(text)
            ended_with_newline = text.endswith("\n")
            out.flush()

    def end_thinking() -> None:
        nonlocal thinking, ended_with_newline
        thinking = False
        out.write((RESET if color else "") + "\n")
        ended_with_newline = True
        out.flush()

    gen_tps = 0.0
    for ev in reply:
        if ev.kind == "done":
            gen_tps = ev.tokens / ev.seconds if ev.seconds > 0 else 0.0
        elif ev.kind == "reasoning":
            write(ev.text)
        elif ev.kind in ("content", "tool_block"):
            if thinking:
                end_thinking()
            write(ev.text if ev.kind == "content" else "\n\n" + ev.text)  # a tool block, as the model wrote it
    if thinking and reply.parser.phase != "reasoning":  # </think> came, and nothing after it
        end_thinking()
    if color and thinking:
        out.write(RESET)
    if not ended_with_newline:
        out.write("\n")
    out.flush()
    notes.line(f"ds4: prefill: {prefill.tps:.2f} t/s, generation: {gen_tps:.2f} t/s", CYAN)
    return 0


def _token_json(tok: "Tokenizer", token: int) -> str:
    raw = tok.token_bytes(token)
    try:
        text = json.dumps(raw.decode("utf-8"), ensure_ascii=False)
    except UnicodeDecodeError:
        # Not valid UTF-8 on its own (a piece of a character): bytes >= 0x80 as \u00XX.
        text = json.dumps(raw.decode("latin-1"), ensure_ascii=False)
        text = "".join(f"\\u{ord(c):04x}" if ord(c) >= 0x80 else c for c in text)
    return f'{{"id":{token},"text":{text},"bytes":[{",".join(str(b) for b in raw)}]}}'


def dump_logprobs(engine: "Engine", job: OneShot, path: str, top_k: int) -> int:
    """Greedy continuation of the templated prompt, writing each step's top log-probabilities."""
    tok = engine.tokenizer
    ids = prompt_ids(tok, job)
    session = engine.session()
    session.sync(ids)
    steps = []
    for step in session.generate(SamplingParams(temperature=0), max_tokens=job.max_tokens):
        # generate() samples from session.logits before evaluating the token: read them first.
        entries = ",".join(
            f'{{"token":{_token_json(tok, t)},"logit":{logit:.9g},"logprob":{logprob:.9g}}}'
            for t, logit, logprob in session.top_logprobs(top_k)
        )
        selected = _token_json(tok, step.token)
        steps.append(f'    {{"step":{step.index},"selected":{selected},"top_logprobs":[{entries}]}}')
        if step.finish:
            break
    body = (
        f'{{\n  "source":"ds4agent",\n  "prompt_tokens":{len(ids)},\n  "ctx":{engine.ctx},\n  "top_k":{top_k},\n'
        f'  "steps":[\n' + ",\n".join(steps) + "\n  ]\n}\n"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return 0
