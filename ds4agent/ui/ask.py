"""One-key questions on the terminal: y / n / a / Esc, answered without Enter.

prompt_toolkit draws the question and reads one key; keys that are not answers do nothing
(Enter included: no answer is given by accident). Esc, Ctrl+C and Ctrl+D answer "escape", which
callers read as no. The question is erased when answered; the caller prints it with the answer,
so the scrollback shows what was asked and what was said.
"""

from __future__ import annotations

from typing import Any


def ask_key(question: str, keys: str, input: Any = None, output: Any = None) -> str:
    """Show ``question`` (may hold ANSI colours) and return the key pressed, one of ``keys``
    (lower case; the upper case letter counts too), or "escape"."""
    from prompt_toolkit.application import Application
    from prompt_toolkit.formatted_text import ANSI
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.layout import Layout
    from prompt_toolkit.layout.containers import Window
    from prompt_toolkit.layout.controls import FormattedTextControl

    kb = KeyBindings()

    def answer(key: str):
        def handler(event) -> None:
            event.app.exit(result=key)

        return handler

    for k in keys:
        kb.add(k)(answer(k))
        if k.isalpha():
            kb.add(k.upper())(answer(k))
    for k in ("escape", "c-c", "c-d"):
        kb.add(k, eager=True)(answer("escape"))

    @kb.add("<any>")
    def _ignore(event) -> None:
        pass

    app: Application[str] = Application(
        layout=Layout(Window(FormattedTextControl(ANSI(question), show_cursor=False), dont_extend_height=True)),
        key_bindings=kb, full_screen=False, erase_when_done=True, input=input, output=output)
    # A lone Esc is an answer: do not wait half a second to see whether an escape sequence follows.
    app.ttimeoutlen = 0.05
    app.timeoutlen = 0.05
    return app.run()
