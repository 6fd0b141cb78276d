"""`ds4 chat` driven end to end on the demo model: pipe mode, prompt_toolkit input, a real pty."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest

from ds4agent.conversation.turns import Conversation
from ds4agent.engine import Engine, SamplingParams
from ds4agent.sessions import SessionStore
from ds4agent.ui.chat import run_pipe, run_tty

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(demo_path):
    with Engine.open(demo_path, backend="cpu", ctx=2048) as e:
        yield e


def _conv(engine, mode="chat", n=6):
    return Conversation(engine, mode=mode, sampling=GREEDY, max_tokens=n)


def _consistent(conv) -> None:
    tok = conv.tok
    assert tok.decode(conv.transcript.tokens) == conv.transcript.text
    live = conv.session.tokens
    assert conv.transcript.tokens[: len(live)] == live  # the KV is a prefix of the transcript


def test_pipe_three_turns_and_commands(engine, tmp_path) -> None:
    conv = _conv(engine, "thinking")
    store = SessionStore(tmp_path / "s")
    note = tmp_path / "note.txt"
    note.write_text("Summarise this note.", encoding="utf-8")
    script = f"Hello\n/nothink\nSecond question\n/read {note}\n/stats\n/bogus\n"
    out, err = io.StringIO(), io.StringIO()
    rc = run_pipe(conv, store, io.StringIO(script), out, err)
    assert rc == 1  # /bogus
    assert "unknown command: /bogus; type /help for commands" in err.getvalue()
    assert "\x1b[" not in out.getvalue()
    users = [m["content"] for m in conv.messages if m["role"] == "user"]
    assert users == ["Hello", "Second question", "Summarise this note."]
    assert sum(m["role"] == "assistant" for m in conv.messages) == 3
    assert "context" in out.getvalue() and "tokens" in out.getvalue()
    _consistent(conv)


def test_each_turn_prefills_only_its_suffix(engine) -> None:
    conv = _conv(engine)
    sizes = []
    for text in ("one", "two", "three"):
        before = len(conv.transcript.tokens)
        list(conv.turn(text))
        sizes.append(conv.stats.prefill_tokens)
        added_user = len(conv.tok.encode_rendered(f"<｜User｜>{text}<｜Assistant｜></think>"))
        # The new user turn plus the previous answer's unevaluated tail (last token + EOS).
        assert conv.stats.prefill_tokens <= added_user + 2 + (0 if before else 1)
    _consistent(conv)


def test_save_new_switch_restores_with_zero_prefill(engine, tmp_path, monkeypatch) -> None:
    conv = _conv(engine)
    store = SessionStore(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    run_pipe(conv, store, io.StringIO("First topic\nMore on it\n/save\n/new\nOther topic\n/save\n"), out, err)
    infos = store.list()
    assert len(infos) == 2
    first = next(i for i in infos if i.title == "First topic")
    text_before = conv.transcript.text
    calls = []
    real = engine.model.forward
    monkeypatch.setattr(engine.model, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_pipe(conv, store, io.StringIO(f"/switch {first.sha[:10]}\n"), out, err)
    assert calls == []  # switching evaluated nothing
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["First topic", "More on it"]
    assert conv.transcript.text != text_before and "resumed" in err.getvalue()
    _consistent(conv)
    list(conv.turn("And a third"))  # the resumed conversation continues, prefilling only the new turn
    assert 0 < conv.stats.prefill_tokens < 20
    _consistent(conv)


def test_ctx_command_keeps_the_conversation(engine, tmp_path) -> None:
    conv = _conv(engine)
    out, err = io.StringIO(), io.StringIO()
    run_pipe(conv, SessionStore(tmp_path), io.StringIO("hi\n/ctx 1024\nagain\n/ctx x\n"), out, err)
    assert conv.ctx == 1024 and "/ctx needs a number" in err.getvalue()
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["hi", "again"]
    _consistent(conv)


def test_interrupt_mid_generation_keeps_partial_answer(engine, tmp_path) -> None:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    conv = _conv(engine, "thinking", n=30)
    steps = {"n": 0}

    def on_step() -> None:
        steps["n"] += 1
        if steps["n"] == 4:
            raise KeyboardInterrupt

    out = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text("Tell me a story\r")
        inp.send_text("Another one\r")
        inp.send_text("/quit\r")
        inp.send_text("n\r")  # do not save
        rc = run_tty(conv, SessionStore(tmp_path), None, input=inp, output=DummyOutput(), stdout=out, on_step=on_step)
    assert rc == 0
    assert "interrupted" in out.getvalue()
    msgs = conv.messages
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert conv.transcript.text.count("<｜end▁of▁sentence｜>") == 2  # the cut answer was closed
    _consistent(conv)


def test_interrupt_before_first_token_withdraws_the_message(engine) -> None:
    conv = _conv(engine)
    list(conv.turn("keep"))
    before = list(conv.transcript.tokens)
    gen = conv.turn("withdrawn")
    next(gen, None)  # prefill done, nothing sampled yet
    assert conv.interrupted() == "rolled back"
    assert conv.transcript.tokens == before and conv.messages[-1]["role"] == "assistant"
    list(conv.turn("next"))
    _consistent(conv)


def test_markdown_on_a_terminal(engine, tmp_path) -> None:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    conv = _conv(engine, "thinking", n=8)
    out = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text("/help\r/unknown\rhello\r")
        inp.send_text("\x04")  # Ctrl+D
        inp.send_text("n\r")
        run_tty(conv, SessionStore(tmp_path), tmp_path / "hist", input=inp, output=DummyOutput(), stdout=out)
    text = out.getvalue()
    assert "/switch" in text and "unknown command: /unknown" in text
    assert "\x1b[38;5;245m" in text  # reasoning drawn dim on a terminal
    assert (tmp_path / "hist").exists()


def test_real_terminal(demo_path, tmp_path) -> None:
    """ds4 chat in a pseudo-terminal: prompt, answer, status, /stats, Ctrl+D with the save offer."""
    import pexpect  # the test extra: missing means a broken install, not a skip
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path), "TERM": "xterm-256color",
           "DS4_SESSIONS": str(tmp_path / "sessions")}
    child = pexpect.spawn(sys.executable, ["-m", "ds4agent", "chat", "--ctx", "1024", "-n", "6", "--temp", "0"],
                          env=env, encoding="utf-8", timeout=120, dimensions=(40, 120))
    try:
        child.expect("ds4>")
        screen = child.before
        assert "tiny, random weights" in screen and "/help" in screen
        child.send("Hello there\r")
        child.expect("ds4>")
        child.send("/stats\r")
        child.expect("context")
        child.expect("ds4>")
        child.sendcontrol("d")
        child.expect(re.escape("Save this conversation first? [Y/n]"))
        child.send("y\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    saved = list((tmp_path / "sessions").glob("*.kv"))
    assert len(saved) == 1


def test_pipe_mode_via_cli(engine, demo_path, tmp_path) -> None:
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "ds4agent", "--ctx", "1024", "-n", "5", "--temp", "0", "--nothink"],
                       input="Hello\nAgain\n", capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout
    # Exactly the two greedy answers of the same conversation run here, one after the other,
    # each ending its line; the token-limit notes go to stderr, once per turn.
    conv = _conv(engine, "chat", n=5)
    answers = ["".join(e.text for e in conv.turn(line) if e.kind == "content") for line in ("Hello", "Again")]
    assert all(answers) and r.stdout == "".join(a + "\n" for a in answers)
    assert r.stderr.count("stopped at the token limit (-n)") == 2


def test_terminal_session_commands_through_prompt_toolkit(engine, tmp_path, monkeypatch) -> None:
    """Three turns, /save, /new, /switch (zero prefill), /ctx, /read and an unknown command,
    all typed into the prompt_toolkit app."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    conv = _conv(engine, "chat", n=5)
    store = SessionStore(tmp_path / "s")
    note = tmp_path / "n.txt"
    note.write_text("From a file.", encoding="utf-8")
    out = io.StringIO()
    with create_pipe_input() as inp:
        for line in ("Turn one", "Turn two", "/save", "/new", "Other", f"/read {note}", "/frob", "/ctx 1500", "/quit"):
            inp.send_text(line + "\r")
        inp.send_text("n\r")
        run_tty(conv, store, None, input=inp, output=DummyOutput(), stdout=out)
    text = out.getvalue()
    assert "saved " in text and "new conversation" in text and "unknown command: /frob" in text
    assert "context is now 1500 tokens" in text and conv.ctx == 1500
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["Other", "From a file."]
    first = store.list()[0]
    assert first.title == "Turn one"

    calls = []
    real = engine.model.forward
    monkeypatch.setattr(engine.model, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    conv2 = _conv(engine, "chat", n=5)
    out2 = io.StringIO()
    with create_pipe_input() as inp:
        inp.send_text(f"/switch {first.sha[:8]}\r")
        inp.send_text("/quit\r")
        run_tty(conv2, store, None, input=inp, output=DummyOutput(), stdout=out2)
    assert calls == []
    assert "resumed" in out2.getvalue() and "you › Turn two" in out2.getvalue()
    assert [m["content"] for m in conv2.messages if m["role"] == "user"] == ["Turn one", "Turn two"]
    _consistent(conv2)


def test_escape_interrupts_and_typing_is_queued(demo_path, tmp_path) -> None:
    """In a real terminal: Esc stops a long answer; a line typed meanwhile runs next. (Answers
    may run to 3000 tokens, so neither can finish before its Esc arrives, however fast decode is.)"""
    import pexpect  # the test extra: missing means a broken install, not a skip
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path), "TERM": "xterm-256color"}
    child = pexpect.spawn(sys.executable, ["-m", "ds4agent", "--ctx", "4096", "-n", "3000", "--temp", "0"],
                          env=env, encoding="utf-8", timeout=120, dimensions=(40, 120))
    try:
        child.expect("ds4>")
        child.send("First question\r")
        child.expect("\x1b\\[38;5;245m")  # the answer (reasoning) has started streaming
        child.send("queued question\r")
        child.send("\x1b")
        child.expect("interrupted")
        child.expect("queued question")  # taken from the queue as the next prompt
        child.expect("\x1b\\[38;5;245m")
        child.send("\x1b")
        child.expect("interrupted")
        child.expect("ds4>")
        child.send("/history 5\r")
        child.expect("you › queued question")
        child.expect("ds4>")
        child.sendcontrol("d")
        child.expect(re.escape("[Y/n]"))
        child.send("n\r")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_ctrl_c_mid_answer_then_save_in_a_real_terminal(demo_path, tmp_path) -> None:
    """Ctrl+C while an answer streams ends it at a token (a flag, not an exception inside a
    model step); the conversation then saves, and /stats counts what was generated."""
    import pexpect  # the test extra: missing means a broken install, not a skip
    env = {**os.environ, "DS4_MODEL": str(demo_path), "DS4_HOME": str(tmp_path), "TERM": "xterm-256color"}
    child = pexpect.spawn(sys.executable, ["-m", "ds4agent", "--ctx", "4096", "-n", "3000", "--temp", "0"],
                          env=env, encoding="utf-8", timeout=120, dimensions=(40, 120))
    try:
        for _ in range(3):
            child.expect("ds4>")
            child.send("Write a long story\r")
            child.expect("\x1b\\[38;5;245m")  # streaming
            child.sendintr()
            child.expect("interrupted")
        child.expect("ds4>")
        child.send("/save\r")
        child.expect(r"saved ([0-9a-f]{12})")
        child.expect("ds4>")
        child.send("/stats\r")
        child.expect(r"generation (\d+) tok at ([0-9.]+) t/s")
        assert int(child.match.group(1)) > 0 and float(child.match.group(2)) > 0
        child.expect("ds4>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)  # saved and unchanged since: no question
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")
    assert len(list((tmp_path / "sessions").glob("*.kv"))) == 1
