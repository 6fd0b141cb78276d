"""Cost of streaming a long markdown answer to the terminal vs generating it on the demo model.

Renders a 2 000-line markdown answer fed token by token through the chat's MarkdownStream (the
real throttle: at most 20 redraws a second, against the generation rate), and compares with the
time the demo model takes to generate the same number of tokens, measured in the same run.
"""

from __future__ import annotations

import io
import time


def answer(lines: int = 2000) -> str:
    out, i = [], 0
    while len(out) < lines:
        out += [f"## Section {i}", "", f"Paragraph {i} with *emphasis*, `code` and **bold** text that runs on.", ""]
        out += ["```python", f"def f{i}(x):", "    return x * 2", "```", "", f"- item {i}", f"- item {i + 1}", ""]
        i += 1
    return "\n".join(out[:lines]) + "\n"


def main() -> None:
    import numpy as np

    from ds4agent.engine import Engine, SamplingParams
    from ds4agent.modelfile.demo import ensure_demo
    from ds4agent.ui.markdown import MarkdownStream

    engine = Engine.open(ensure_demo(), backend="auto", ctx=4096)
    tok = engine.tokenizer
    text = answer()
    ids = tok.encode(text)
    s = engine.session()
    s.sync(np.arange(1000, 1064).tolist())
    n_gen = 64
    t = time.perf_counter()
    for _ in s.generate(SamplingParams(temperature=0), max_tokens=n_gen, stop_at_eos=False):
        pass
    tps = n_gen / (time.perf_counter() - t)
    gen_seconds = len(ids) / tps

    sink = io.StringIO()
    # Tokens arrive slower than the 20 fps throttle on real hardware, so every token redraws the
    # live block: emulate that by disabling the throttle (one redraw per token, the worst case).
    md = MarkdownStream(sink.write, width=100, fps=1e9)
    stream = tok.stream()
    t = time.perf_counter()
    for i in ids:
        piece = stream.feed(i)
        if piece:
            md.feed(piece)
    md.finish()
    render_seconds = time.perf_counter() - t
    print(f"{len(text.splitlines())} lines, {len(ids)} tokens: rendering {render_seconds:.2f} s; "
          f"generating them on the demo model at {tps:.1f} t/s would take {gen_seconds:.0f} s; "
          f"rendering costs {100 * render_seconds / gen_seconds:.2f}% of generation")


if __name__ == "__main__":
    main()
