"""The real `ds4` command with the model's answers dictated: for driving the interactive agent in a
pty or tmux, and headless runs in a subprocess.

    python tests/agent_script.py ANSWERS.json agent [ds4 agent options]

ANSWERS.json is a list of completions, one per model turn, in the text the model would sample
(reasoning, `</think>`, content, DSML tool blocks, the end-of-sentence token). Everything else is
the product's own code: the template, the streaming parser, tools, policy, terminal. When the
list runs out, each turn answers "(no more scripted answers)".
"""

from __future__ import annotations

import json
import sys

EOS = "<｜end▁of▁sentence｜>"


def install(answers: list[str]) -> None:
    # helpers.py sits next to this file, whose folder is on sys.path when it runs as a script.
    from helpers import scripted_steps

    from ds4agent.engine import session as session_mod

    def generate(self, params=None, max_tokens=50000, stop_at_eos=True):
        text = answers.pop(0) if answers else "done</think>(no more scripted answers)" + EOS
        yield from scripted_steps(self.tokenizer, text, max_tokens)

    session_mod.Session.generate = generate


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        install(json.load(f))
    from ds4agent.cli import main

    sys.exit(main(sys.argv[2:]))
