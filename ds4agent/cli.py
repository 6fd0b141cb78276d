"""`ds4` entry point: subcommands and user-facing errors (one line, non-zero exit, no traceback)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from . import __version__, settings
from .engine.choices import BACKENDS, KERNELS, SPLITS
from .settings import SPECULATE


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _open_engine(path, args: argparse.Namespace, ctx: int, flag: str = "--ctx"):
    """Engine.open with the command's backend and kernels; says once on stderr when the fast
    kernels could not be used. A context beyond the one the model was trained for is refused
    (``flag`` names what set it): positions past it are extrapolation, the answers degrade
    without any sign, and the KV memory grows for nothing."""
    from .engine import Engine, EngineError
    from .engine.group.launch import launched

    if getattr(args, "split", None) or getattr(args, "hosts", None) or getattr(args, "hostfile", None) or launched():
        engine = _open_group(path, args, ctx)
    else:
        engine = Engine.open(path, backend=args.backend, ctx=ctx, kernels=args.kernels,
                             devices=getattr(args, "devices", None), w8a8=getattr(args, "w8a8", False),
                             memory_budget=getattr(args, "memory_budget", None),
                             expert_profile=getattr(args, "expert_profile", None))
    try:
        if getattr(args, "dspark", None):
            raise EngineError("--dspark: this build does not run DSpark draft models (docs/speculation.md says what "
                              "is missing); --speculate mtp with --mtp FILE, or ngram, instead")
        mtp = getattr(args, "mtp", None) or settings.mtp_choice()
        engine.set_speculation(getattr(args, "speculate", None) or settings.speculate_choice(mtp=mtp is not None),
                               mtp=mtp)
        _steering(engine, args)
        if getattr(args, "power", None) is not None:
            engine.set_power(args.power)
    except (EngineError, settings.SettingsError) as e:
        engine.close()
        raise UsageError(str(e)) from None
    trained = engine.info.config.context_length
    if trained and ctx > trained:
        engine.close()
        raise UsageError(f"{flag} {ctx} is more than this model was trained for ({trained} tokens, "
                         f"deepseek4.context_length); use at most {trained}")
    if engine.info.kernel_note:
        _say(f"note: {engine.info.kernel_note}")
    for line in engine.info.devices:  # what each device holds (npu, GPU kernels); what streams
        _say(line)
    return engine


def _steering(engine, args: argparse.Namespace) -> None:
    """--dir-steering-file and its scales, for the sessions the engine makes."""
    from .engine import EngineError

    path = getattr(args, "dir_steering_file", None)
    ffn, attn = getattr(args, "dir_steering_ffn", None), getattr(args, "dir_steering_attn", None)
    if path is None:
        if ffn is not None or attn is not None:
            raise EngineError("--dir-steering-ffn and --dir-steering-attn scale a --dir-steering-file")
        return
    for name, v in (("--dir-steering-ffn", ffn), ("--dir-steering-attn", attn)):
        if v is not None and not (-100 <= v <= 100):
            raise EngineError(f"{name} must be in -100..100, got {v}")
    engine.set_steering(path, attn=0.0 if attn is None else attn, ffn=1.0 if ffn is None else ffn)


def _open_group(path, args: argparse.Namespace, ctx: int):
    """Several machines (docs/distributed.md): with --hosts/--hostfile this process becomes rank
    0 and starts the others; under mlx.launch it joins the group it was started in. A follower
    (rank > 0) never gets here: main() hands it to _follow."""
    from .engine.group.distributed import open_engine
    from .engine.group.launch import LaunchError, alive, launched, parse_hosts, read_hostfile, start

    if args.backend == "npu":
        raise UsageError("--split/--hosts run on MLX backends; --backend npu uses --devices on one machine")
    check = lambda: None  # noqa: E731
    if getattr(args, "hosts", None) or getattr(args, "hostfile", None):
        if launched():
            raise UsageError("--hosts/--hostfile start a group themselves; under mlx.launch leave them out")
        try:
            hosts = parse_hosts(args.hosts) if args.hosts else read_hostfile(args.hostfile)
            check = alive(start(hosts, getattr(args, "argv", sys.argv[1:])), hosts)
        except LaunchError as e:
            raise UsageError(str(e)) from None
    elif not launched():
        raise UsageError("--split needs a group: give --hosts/--hostfile, or start ds4 under mlx.launch "
                         "(see docs/distributed.md)")
    return open_engine(path, args.split or "pipeline", backend=args.backend, ctx=ctx, kernels=args.kernels,
                       alive=check)


def _follow(args: argparse.Namespace) -> int:
    """A rank other than 0: open its share of the model and follow rank 0 until it closes."""
    from .engine import EngineError
    from .engine.group.distributed import follow, open_engine
    from .modelfile import resolve_model

    path = resolve_model(args.model).path if getattr(args, "model", None) is None else Path(args.model)
    try:
        engine = open_engine(path, getattr(args, "split", None) or "pipeline", backend=getattr(args, "backend", "auto"),
                             kernels=getattr(args, "kernels", None))
    except EngineError:
        return 1  # rank 0 says why (this rank's own failure to open was told to the group already)
    return follow(engine)


MODEL_CHOICE = ("Model choice: -m PATH, else $DS4_MODEL, else 'model' in ~/.ds4agent/config.toml, else the built-in "
                "demo model (tiny, random weights).")


def _add_model(parser: argparse.ArgumentParser) -> argparse.Action:
    return parser.add_argument("-m", "--model", metavar="PATH",
                               help="GGUF model file (default: $DS4_MODEL, else 'model' in config.toml, "
                                    "else the demo model)")


def _add_engine(group: argparse._ActionsContainer) -> None:
    group.add_argument("--backend", choices=BACKENDS, default="auto", help="compute backend (default auto)")
    group.add_argument("--kernels", choices=KERNELS, default=None,
                       help="implementation of the heavy products (default $DS4_KERNELS or auto; see README)")
    group.add_argument("--memory-budget", metavar="BYTES|auto", default=None,
                       help="memory for routed experts (8G, 512M, auto); past it they stream from the model file "
                            "(default $DS4_MEMORY_BUDGET, 'memory_budget' in config.toml, else auto: what the machine "
                            "has left; see docs/streaming.md)")
    group.add_argument("--expert-profile", metavar="FILE", default=None,
                       help="with experts streaming: start by reading the most used experts of this popularity "
                            "profile (written by ds4 bench --save-profile)")
    group.add_argument("--speculate", choices=SPECULATE, default=None,
                       help="propose tokens and verify several per pass, with the same output: ngram = from the "
                            "conversation's own repeats, mtp = DeepSeek's MTP block (default $DS4_SPECULATE, "
                            "'speculate' in config.toml, else mtp when an MTP file is named, else ngram; "
                            "docs/speculation.md)")
    group.add_argument("--mtp", metavar="FILE", default=None,
                       help="DeepSeek's MTP block (DeepSeek-V4-Flash-MTP-*.gguf) to draft with: --speculate mtp "
                            "(default $DS4_MTP, else 'mtp' in config.toml)")
    group.add_argument("--dir-steering-file", metavar="FILE", default=None,
                       help="directional steering: one direction per layer, raw float32 [layers x hidden] (ds4's "
                            "files load as they are; ds4 steer build makes them)")
    group.add_argument("--dir-steering-ffn", type=float, default=None, metavar="S",
                       help="steering scale on the FFN outputs (default 1 with a file; negative amplifies)")
    group.add_argument("--dir-steering-attn", type=float, default=None, metavar="S",
                       help="steering scale on the attention outputs (default 0)")
    group.add_argument("--power", type=int, default=None, metavar="P",
                       help="cap the engine's duty cycle at P percent (1-100; on battery): a pause after each pass, "
                            "and P%% of the CPU kernels' threads (default 100: no cap; /power changes it)")
    group.add_argument("--dspark", metavar="FILE", default=None,
                       help="a DSpark draft model for the 0731 checkpoint (not run by this build; "
                            "docs/speculation.md)")
    group.add_argument("--devices", metavar="LIST", default=None,
                       help="--backend npu: devices to split the layers over, e.g. 0,1 (default 0; cpu runs it on "
                            "host torch)")
    group.add_argument("--w8a8", action="store_true",
                       help="--backend npu: int8 weights and activations for the Q8_0 matrices (see docs/ascend.md)")
    group.add_argument("--split", choices=SPLITS, default=None,
                       help="several machines: pipeline = layers divided (fits a model no one host holds), experts "
                            "= experts and heads divided (faster decode); default pipeline (docs/distributed.md)")
    group.add_argument("--hosts", metavar="A,B,...", default=None,
                       help="several machines: run on these hosts over ssh (this one is rank 0), the ring backend")
    group.add_argument("--hostfile", metavar="FILE", default=None,
                       help="several machines: mlx.launch's hostfile ([{\"ssh\": NAME, \"ips\": [IP]}, ...])")


def _add_thinking(parser: argparse.ArgumentParser, think_max: bool) -> list[argparse.Action]:
    mode = parser.add_mutually_exclusive_group()
    actions = [mode.add_argument("--think", dest="mode", action="store_const", const="thinking",
                                 help="reason before answering (default)"),
               mode.add_argument("--nothink", dest="mode", action="store_const", const="chat", help="answer directly")]
    if think_max:
        actions.append(mode.add_argument("--think-max", dest="mode", action="store_const", const="max",
                                         help="maximum reasoning effort (needs --ctx >= 393216)"))
    parser.set_defaults(mode="thinking")
    return actions


def _add_generation(parser: argparse.ArgumentParser, tokens: int, tokens_help: str, ctx: int) -> list[argparse.Action]:
    """The sampling, length, context and engine flags, the same for the chat and the agent
    (only the defaults differ). Returns the most used ones, for the top-level help."""
    gen = parser.add_argument_group("generation")
    common = [gen.add_argument("--temp", type=float, default=1.0, metavar="T",
                               help="temperature, 0 = greedy (default 1)")]
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1)")
    gen.add_argument("--min-p", type=float, default=0.05, metavar="P",
                     help="drop tokens below P x the top token's probability (default 0.05)")
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K most likely tokens (0 = off)")
    common.append(gen.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)"))
    common.append(gen.add_argument("-n", "--tokens", type=int, default=tokens, metavar="N",
                                   help=f"{tokens_help} (default {tokens})"))
    common.append(gen.add_argument("-c", "--ctx", type=int, default=ctx, metavar="N",
                                   help=f"context size in tokens (default {ctx}; at most the model's trained context)"))
    _add_engine(gen)
    return common


def _common_options(sections: list[tuple[str, list[argparse.Action]]]) -> str:
    """The top-level help's summary of the subcommands' most used flags, formatted by argparse
    from the flags themselves (so the texts are written once)."""
    fmt = argparse.HelpFormatter("ds4")
    for title, actions in sections:
        fmt.start_section(title)
        fmt.add_arguments(actions)
        fmt.end_section()
    return fmt.format_help()


def build_parser() -> argparse.ArgumentParser:
    import textwrap

    p = _Parser(
        prog="ds4",
        description="DeepSeek V4 Flash, local and in-process: terminal chat and coding agent.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog is formatted below
    )
    p.add_argument("--version", action="version", version=f"ds4agent {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    chat = sub.add_parser("chat", help="interactive chat (what plain 'ds4' runs); -p for one prompt")
    chat_common = [chat.add_argument("-p", "--prompt", metavar="TEXT",
                                     help="answer one prompt and exit ('-' reads stdin)"),
                   _add_model(chat)]
    chat.add_argument("--prompt-file", metavar="FILE", help="read the one-shot prompt from FILE")
    chat.add_argument("--system", metavar="TEXT", help="system text placed before the first user turn")
    chat.add_argument("--prefix-file", metavar="FILE",
                      help="system text from FILE, evaluated once and kept in the session store: later starts "
                           "with it (and /new) never prefill it again")
    chat.add_argument("--sessions", metavar="DIR",
                      help="where saved conversations live (default ~/.ds4agent/sessions, or $DS4_SESSIONS)")
    chat_common += _add_thinking(chat, think_max=True)[1:]
    chat_common += _add_generation(chat, 50000, "generate at most N tokens", 32768)
    diag = chat.add_argument_group("diagnostics")
    diag.add_argument("--dump-tokens", action="store_true",
                      help="print the special-aware tokenisation of the prompt as given, then exit")
    diag.add_argument("--dump-logprobs", metavar="FILE", help="write greedy top log-probabilities as JSON")
    diag.add_argument("--dump-activations", metavar="FILE.npz",
                      help="write every layer's attention and FFN outputs and hidden streams for the prompt (no "
                           "answer is generated)")
    diag.add_argument("--logprobs-top-k", type=int, default=20, metavar="K", help="entries per step (1..128)")

    ag = sub.add_parser("agent", help="coding agent working in the current repository")
    _add_model(ag)
    ag.add_argument("--prefix-file", metavar="FILE",
                    help="more system text from FILE, after the agent's own; evaluated once with it and kept in the "
                         "session store")
    agent_common = [
        ag.add_argument("-p", "--prompt", metavar="TASK", help="run one task headless and exit ('-' reads stdin); "
                        "the exit status says why it stopped (see README)"),
        ag.add_argument("--json", action="store_true", help="with -p: ds4's own JSON line per event on stdout "
                        "(the same as --output-format events)"),
        ag.add_argument("--output-format", choices=("text", "json", "stream-json", "events"), default=None,
                        help="with -p: text (default), stream-json (Claude Code's event lines), json (Claude Code's "
                             "one final object), events (ds4's JSON lines, = --json)"),
        ag.add_argument("--approval", choices=("ask", "auto-edit", "yolo"), default="ask",
                        help="ask (default): edits and commands need a yes; auto-edit: edits and read-only commands "
                             "run; yolo: all runs (dangerous commands always ask; headless, anything needing a yes is "
                             "refused)"),
        ag.add_argument("--sandbox", choices=("read-only", "workspace-write", "full-access"), default=None,
                        help="what shell commands may write: workspace-write (default outside yolo: the "
                             "workspace and the temporary directory, .git read-only), read-only, or full-access "
                             "(yolo's default)"),
        ag.add_argument("--resume", nargs="?", const="", metavar="SHA",
                        help="resume a saved session (a picker without SHA)")]
    ag.add_argument("--undo", nargs="?", const=1, type=int, metavar="N",
                    help="revert the agent's last N change sets in this workspace (default 1; your own edits are "
                         "kept) and exit; --undo 0 lists them")
    ag.add_argument("--no-network", action="store_true", help="sandboxed shell commands get no network")
    ag.add_argument("--allow-write", action="append", default=[], metavar="DIR",
                    help="another directory sandboxed commands may write (a cache, say); repeatable")
    ag.add_argument("--sessions", metavar="DIR", help="where saved sessions live")
    _add_thinking(ag, think_max=False)
    _add_generation(ag, 16384, "most tokens per model turn", 65536)

    sv = sub.add_parser("serve", help="OpenAI- and Anthropic-compatible HTTP server (docs/server.md)")
    _add_model(sv)
    _add_thinking(sv, think_max=True)
    sv.add_argument("--prefix-file", metavar="FILE",
                    help="system text for requests that bring none, its KV kept in the disk cache (prefilled once)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    sv.add_argument("--api-key", metavar="KEY", default=os.environ.get("DS4_API_KEY"),
                    help="require this key (Authorization: Bearer KEY or x-api-key; default $DS4_API_KEY)")
    sv.add_argument("--cors", metavar="ORIGIN", help="allow browser requests from ORIGIN ('*' for any)")
    sv.add_argument("--parallel", default="auto", metavar="N",
                    help="requests generating at once, each in its own slot with a context's KV; their decode "
                         "steps run as one batch (default auto: as many as the memory left holds, at most 8)")
    sv.add_argument("--queue", type=int, default=16, metavar="N",
                    help="requests that may wait for a free slot (default 16)")
    sv.add_argument("--sessions", metavar="DIR", help="on-disk KV cache folder (default: the session store)")
    sv.add_argument("--no-disk-cache", action="store_true", help="keep the KV cache in memory only")
    sv.add_argument("--cache-min-tokens", type=int, default=512, metavar="N",
                    help="smallest prefix worth saving to disk (default 512)")
    _add_generation(sv, 32768, "default most tokens per answer when the client gives none", 32768)

    b = sub.add_parser("bench", help="prefill/generation speed at context frontiers (ds4-bench CSV)")
    b.add_argument("-m", "--model", metavar="PATH", help="GGUF model file")
    b.add_argument("--prompt-file", metavar="FILE", help="text to prefill (default: a built-in text, repeated)")
    b.add_argument("--parallel", type=int, metavar="N",
                   help="instead: decode 1, 2, 4 .. N sessions together (as many server slots) after a --ctx-start "
                        "prompt each, and report aggregate and per-stream t/s")
    b.add_argument("--repeat", type=int, default=1, metavar="R", help="--parallel: runs of each width (medians)")
    b.add_argument("--ctx-start", type=int, default=2048, metavar="N")
    b.add_argument("--ctx-max", type=int, default=32768, metavar="N")
    step = b.add_mutually_exclusive_group()
    step.add_argument("--step-incr", type=int, default=2048, metavar="N")
    step.add_argument("--step-mul", type=float, default=None, metavar="F")
    b.add_argument("--gen-tokens", type=int, default=128, metavar="N")
    b.add_argument("--csv", metavar="FILE", help="write the CSV here instead of stdout")
    b.add_argument("--plot", metavar="FILE.png", help="draw prefill and generation t/s (needs matplotlib)")
    b.add_argument("--save-profile", metavar="FILE",
                   help="with experts streaming: write how often each expert was used, for --expert-profile")
    _add_engine(b)  # --kernels reference measures the MLX path

    pl = sub.add_parser("pull", help="download a published model file from the Hugging Face hub, resumable, "
                                     "checked against the hub's SHA-256")
    pl.add_argument("variant", nargs="?", default="q2", metavar="VARIANT", help="which file (default q2; see --list)")
    pl.add_argument("--list", action="store_true", help="the variants with their sizes and needs (no network)")
    pl.add_argument("--dir", metavar="DIR", help="put the file in DIR (default: the Hugging Face cache, HF_HOME)")
    pl.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit on the hub (default main)")
    pl.add_argument("--yes", action="store_true",
                    help="afterwards set it in config.toml ('model', or 'mtp') without asking")

    ck = sub.add_parser("check", help="the model on this machine against DeepSeek's official outputs (five prompts, "
                                      "greedy, token by token)")
    _add_model(ck)
    ck.add_argument("--case", action="append", metavar="ID", help="run only this case (repeatable; see --list)")
    ck.add_argument("--list", action="store_true", help="list the cases and exit (needs no model)")
    _add_engine(ck)

    sr = sub.add_parser("steer", help="directional steering: build a direction file from two prompt sets")
    srs = sr.add_subparsers(dest="steer_command", metavar="build")
    sb = srs.add_parser("build", help="directions from two prompt sets (the mean difference of a sublayer's output "
                                      "per layer)")
    _add_model(sb)
    sb.add_argument("--good", required=True, metavar="FILE", help="prompts showing what you want, one per line")
    sb.add_argument("--bad", required=True, metavar="FILE", help="prompts showing what to steer away from")
    sb.add_argument("--control", metavar="FILE", help="prompts whose mean direction the result is made orthogonal to")
    sb.add_argument("--component", choices=("ffn", "attn"), default="ffn", help="which output (default ffn)")
    sb.add_argument("--out", required=True, metavar="FILE", help="the direction file to write (and FILE.json)")
    sb.add_argument("-c", "--ctx", type=int, default=8192, metavar="N", help="context size (default 8192)")
    _add_engine(sb)

    ev = sub.add_parser("eval", help="our evaluation suites (reasoning, code, tools, recall) on this model and "
                                     "machine, graded")
    _add_model(ev)
    ev.add_argument("--suite", action="append", metavar="NAME",
                    help="run this suite (repeatable: reasoning, code, tools, recall; default all)")
    ev.add_argument("--case", action="append", metavar="ID", help="run this case (repeatable)")
    ev.add_argument("--list-cases", action="store_true", help="list the cases and exit (needs no model)")
    ev.add_argument("--trace", metavar="FILE", help="write every prompt and completion here (JSON lines)")
    ev.add_argument("--regrade", metavar="FILE", help="grade a trace again, without the model")
    ev.add_argument("--json", metavar="FILE", help="write the report (every grade, the counts per suite) as JSON")
    ev.add_argument("--nothink", action="store_true", help="answer without reasoning (default: thinking)")
    ev.add_argument("--self-test", action="store_true", help="run the answer extractors' self-tests and exit")
    _add_generation(ev, 0, "at most N tokens per case (0: each case's own budget; a slow machine may want less)",
                    32768)
    ev.set_defaults(temp=0.0)

    ins = sub.add_parser("inspect", help="describe a model file without loading its weights")
    ins.add_argument("model", nargs="?", metavar="MODEL", help="GGUF file (default: the model ds4 would run)")
    ins.add_argument("--tensors", action="store_true", help="also list every tensor")
    ins.add_argument("--kernels", nargs="?", const="auto", choices=KERNELS, metavar="K",
                     help="also load the model with kernels K (default auto) and print their self-check against the "
                          "reference (each case, its error, its time)")
    ins.add_argument("--backend", choices=BACKENDS, default="auto", help="backend for --kernels (default auto)")
    ins.add_argument("--memory-budget", metavar="BYTES|auto", default=None,
                     help="say what would stream under this budget (default as when running: auto)")

    demo = sub.add_parser("demo", help="generate a tiny random-weight DeepSeek V4 GGUF in the real layout")
    demo.add_argument("--out", metavar="PATH", help="where to write it (default: the cached demo model)")
    demo.add_argument("--preset", choices=("tiny", "q4", "mxfp4", "shape", "mtp"), default="tiny",
                      help="tiny: IQ2_XXS/Q2_K experts like the q2 release; q4: Q4_K experts; mxfp4: MXFP4 experts "
                           "like the 0731 MXFP4 file; shape: the real "
                           "Flash dimensions with --layers layers (GBs: for benchmarks); mtp: an MTP block file "
                           "(for --mtp) fitting the model -m names, else the demo model")
    _add_model(demo)
    demo.add_argument("--layers", type=int, default=2, metavar="N", help="shape preset: layers (default 2)")
    demo.add_argument("--experts", type=int, default=256, metavar="E",
                      help="shape preset: routed experts (default 256)")
    demo.add_argument("--skew", type=float, default=0.0, metavar="S",
                      help="shape preset: uneven expert popularity, Zipf-like with exponent S (0..8, default 0: "
                           "uniform); see docs/streaming.md")
    demo.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    demo.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    # `ds4 --help` is where people look first: it shows the flags they use most, not only the
    # subcommands (plain `ds4 -p ...` runs the chat).
    p.epilog = (_common_options([
        ("chat: ds4 [chat] [options], most used (all: ds4 chat --help)", chat_common),
        ("agent: ds4 agent [options], -m and the options above, and (all: ds4 agent --help)", agent_common)])
        + "\n" + textwrap.fill(MODEL_CHOICE, 80))
    return p


# -- commands ---------------------------------------------------------------------------------

def _say(text: str) -> None:
    """One line from ds4 itself on standard error ("ds4: ..."), through the terminal owner."""
    from .ui.terminal import Out

    Out(sys.stderr, tty=False, err=sys.stderr).note(text)


def _stdout():
    from .ui.terminal import Out

    return Out(sys.stdout, tty=False)


def _stderr():
    from .ui.terminal import Out

    return Out(sys.stderr, tty=False)


def cmd_inspect(args: argparse.Namespace) -> int:
    from .modelfile import describe, resolve_model
    from .ui.reports import inspect_lines

    path = resolve_model(args.model).path if args.model is None else Path(args.model)
    mtp = _mtp_summary(path)
    if mtp is not None:
        _stdout().line("\n".join(mtp))
        return 0
    r = describe(path)
    lines = inspect_lines(r, args.tensors)
    if r.usable:
        from .engine import EngineError, streaming_plan

        try:
            plan = streaming_plan(path, memory_budget=args.memory_budget)
        except EngineError as e:
            plan = str(e)
        lines.append(f"memory (CPU kernels, this machine): {plan}")
    if args.kernels is not None and r.usable:
        from .engine import kernel_report

        lines += kernel_report(path, args.backend, args.kernels)
    _stdout().line("\n".join(lines))
    return 0 if r.usable else 1


def _mtp_summary(path: Path) -> list[str] | None:
    """``ds4 inspect``'s lines for an MTP support file, None for anything else (a model)."""
    from .modelfile import GGUFError, GGUFFile
    from .modelfile.mtpfile import mtp_summary

    try:
        with GGUFFile(path) as f:
            return mtp_summary(f)
    except (GGUFError, OSError):
        return None  # describe() says what is wrong with it


def cmd_demo(args: argparse.Namespace) -> int:
    from .modelfile import default_demo_path, shape_config, write_demo, write_model

    if args.preset == "shape" and not args.out:
        raise UsageError("the shape preset needs --out PATH (it is several GB)")
    if args.model is not None and args.preset != "mtp":
        raise UsageError("-m is an option of the mtp preset (the model its block is for)")
    if args.model is not None and not args.out:
        raise UsageError("an MTP file for the model -m names needs --out PATH")
    out = Path(args.out) if args.out else default_demo_path(args.preset, args.seed)
    if out.exists() and out.is_dir():
        raise UsageError(f"{out}: is a directory; give a file path to --out")
    if out.exists() and args.out and not args.force:
        raise UsageError(f"{out}: already exists (pass --force to overwrite it)")
    if not out.parent.exists():
        if args.out:
            raise UsageError(f"{out.parent}: no such directory")
        out.parent.mkdir(parents=True)
    t0 = time.perf_counter()
    if args.preset == "shape":
        try:
            write_model(out, shape_config(args.layers, args.experts), "tiny", args.seed, skew=args.skew)
        except ValueError as e:
            raise UsageError(str(e)) from None
    elif args.skew:
        raise UsageError("--skew is an option of the shape preset")
    elif args.preset == "mtp":
        _write_mtp(out, args)
    else:
        write_demo(out, args.preset, args.seed)
    from .ui.reports import fmt_gib

    _stdout().line(f"wrote {out} ({fmt_gib(out.stat().st_size)}, preset {args.preset}, seed {args.seed}) "
                   f"in {time.perf_counter() - t0:.1f} s")
    return 0


def _write_mtp(out: Path, args: argparse.Namespace) -> None:
    """The mtp preset: an MTP file with random weights for the model -m names (its shapes)."""
    from .modelfile import GGUFError, GGUFFile, resolve_model
    from .modelfile.config import ConfigError, config_from_gguf
    from .modelfile.demo import write_mtp

    target = resolve_model(args.model).path if args.model is None else Path(args.model)
    try:
        with GGUFFile(target) as f:
            cfg = config_from_gguf(f)
    except (GGUFError, ConfigError, OSError) as e:
        raise UsageError(f"{target}: {e}") from None
    write_mtp(out, cfg, args.seed)


def _read_prompt(args: argparse.Namespace) -> str | None:
    if args.prompt is not None and args.prompt_file is not None:
        raise UsageError("give either -p or --prompt-file, not both")
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{args.prompt_file}: cannot read prompt: {getattr(e, 'strerror', None) or e}") from None
    if args.prompt == "-":
        return sys.stdin.read()
    return args.prompt


def _sampling(args: argparse.Namespace):
    from .engine import SamplingParams

    if args.tokens < 1:
        raise UsageError(f"-n must be at least 1, got {args.tokens}")
    if args.ctx < 16:
        raise UsageError(f"--ctx must be at least 16, got {args.ctx}")
    try:
        return SamplingParams(args.temp, args.top_p, args.min_p, args.top_k, args.seed).validate()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _prefix_text(path: str) -> str:
    """--prefix-file's system text."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--prefix-file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not text.strip():
        raise UsageError(f"--prefix-file {path}: the file is empty")
    return text


def _interactive(args: argparse.Namespace, choice, sampling) -> int:
    from .conversation import Conversation
    from .sessions import SessionStore
    from .ui.chat import default_history_file, is_interactive, run_pipe, run_tty

    engine = _open_engine(choice.path, args, args.ctx)
    from .ui.oneshot import effective_mode

    effective_mode(args.mode, args.ctx, sys.stderr)  # warns; the chat keeps "max" for a later /ctx
    conv = Conversation(engine, mode=args.mode, system=args.system, sampling=sampling, max_tokens=args.tokens)
    store = SessionStore(args.sessions) if args.sessions else SessionStore()
    if args.prefix_file:
        conv.reset(system=_prefix_text(args.prefix_file))
        n = conv.prime(store)
        _say(f"prefix {args.prefix_file}: " + (f"{n} tokens prefilled and kept in {store.dir}" if n else
                                                "its KV read from the session store (no prefill)"))
    if is_interactive(sys.stdin, sys.stdout):
        banner = (f"ds4agent {__version__} | {engine.info.name} | context {args.ctx} tokens | "
                  f"{engine.info.backend} ({engine.info.kernels} kernels)")
        return run_tty(conv, store, default_history_file(), banner=banner)
    return run_pipe(conv, store, sys.stdin, sys.stdout)


def cmd_chat(args: argparse.Namespace) -> int:
    from .modelfile import DEMO_BANNER, resolve_model

    prompt = _read_prompt(args)
    if args.dump_tokens or args.dump_logprobs or args.dump_activations:
        if prompt is None:
            raise UsageError("--dump-tokens, --dump-logprobs and --dump-activations need a prompt "
                             "(-p or --prompt-file)")
    if not 1 <= args.logprobs_top_k <= 128:
        raise UsageError(f"--logprobs-top-k must be in 1..128, got {args.logprobs_top_k}")
    if args.prefix_file and args.system:
        raise UsageError("give --system TEXT or --prefix-file FILE, not both")
    if args.prefix_file and prompt is not None:
        args.system = _prefix_text(args.prefix_file)  # one prompt: the prefix is its system text
    sampling = _sampling(args)
    choice = resolve_model(args.model)
    if choice.is_demo:
        _stderr().line(DEMO_BANNER)
    if args.dump_tokens:
        from .modelfile import Tokenizer
        from .ui.oneshot import dump_tokens

        dump_tokens(Tokenizer.from_gguf(choice.path), prompt, sys.stdout)
        return 0
    if prompt is None:
        return _interactive(args, choice, sampling)

    from .ui.oneshot import OneShot, dump_logprobs, effective_mode, run

    engine = _open_engine(choice.path, args, args.ctx)
    job = OneShot(prompt, effective_mode(args.mode, args.ctx, sys.stderr), args.system, sampling, args.tokens, args.ctx)
    if args.dump_logprobs:
        return dump_logprobs(engine, job, args.dump_logprobs, args.logprobs_top_k)
    if args.dump_activations:
        return _dump_activations(engine, job, args.dump_activations)
    return run(engine, job, sys.stdout, sys.stderr)


def _dump_activations(engine, job, path: str) -> int:
    """--dump-activations: the prompt (as the one-shot renders it) through the model, each
    layer's outputs to an .npz (engine/steering.py save_activations), under the steering in force."""
    from .engine import save_activations
    from .ui.oneshot import prompt_ids

    ids = prompt_ids(engine.tokenizer, job)
    session = engine.session()
    session.drafter = None
    try:
        where = save_activations(path, session.activations(ids), ids)
    finally:
        engine.close()
    _stdout().line(f"wrote {where}: attn, ffn (layers x {len(ids)} tokens x hidden), hidden (streams too), tokens")
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from .conversation.agent_setup import SetupError, set_up
    from .modelfile import DEMO_BANNER, resolve_model
    from .tools import Workspace
    from .ui.agent_ui import run_undo
    from .ui.chat import is_interactive
    from .ui.terminal import Out

    if args.output_format is not None and args.json and args.output_format != "events":
        raise UsageError("--json is --output-format events; give one of them")
    output_format = args.output_format or ("events" if args.json else "text")
    if args.undo is not None:
        if args.prompt is not None:
            raise UsageError("--undo reverts changes and exits; it takes no task (-p)")
        return run_undo(Workspace.discover(), args.undo, Out(sys.stdout, tty=False))
    task = sys.stdin.read() if args.prompt == "-" else args.prompt
    if (args.json or args.output_format) and task is None:
        raise UsageError(f"{'--json' if args.json else '--output-format'} needs a task (-p)")
    sampling = _sampling(args)
    choice = resolve_model(args.model)
    if choice.is_demo:
        _stderr().line(DEMO_BANNER)
    ws = Workspace.discover()
    interactive = task is None and is_interactive(sys.stdin, sys.stdout)
    try:
        setup = set_up(ws, ask_key=_ask_key if interactive else None, say=print)
    except SetupError as e:
        raise UsageError(str(e)) from None
    try:
        return _run_agent(args, task, interactive, ws, setup, sampling, choice, output_format)
    finally:
        setup.close()  # the MCP servers stop with the agent, however it ends


def _ask_key(question: str, keys: str) -> str:
    from .ui.ask import ask_key

    try:
        return ask_key(question, keys)
    except (EOFError, KeyboardInterrupt):
        return "escape"


def _run_agent(args: argparse.Namespace, task: str | None, interactive: bool, ws, setup, sampling, choice,
               output_format: str) -> int:
    from .conversation import Agent
    from .sessions import SessionStore
    from .tools import Policy
    from .ui.agent_ui import banner_lines, pick_session, resume, run_agent_tty, run_headless
    from .ui.chat import default_history_file
    from .ui.terminal import Out

    engine = _open_engine(choice.path, args, args.ctx)
    store = SessionStore(args.sessions) if args.sessions else SessionStore()
    policy = Policy(args.approval, sandbox=args.sandbox, network=not args.no_network,
                    writable=tuple(os.path.abspath(d) for d in args.allow_write))
    note = policy.startup_note()
    if note:
        _say(note)
    agent = Agent(engine, ws, policy, None, sampling=sampling, max_tokens=args.tokens, mode=args.mode,
                  extra_tools=setup.tools(), instructions=setup.instructions,
                  prefix=_prefix_text(args.prefix_file) if args.prefix_file else None)
    err = Out(sys.stderr, tty=False)
    agent.prime(store)
    if args.resume is not None:
        sha = args.resume
        if not sha:
            if not interactive:
                raise UsageError("--resume without a session id needs a terminal "
                                 "(give the id: see 'ds4 agent --resume' or /list)")
            sha = pick_session(store, lambda q: input(q).strip(), Out(sys.stdout, tty=True))
            if sha is None:
                return 1
        if not resume(agent, store, sha, err):
            return 1
    if task is not None:
        for line in [s.line() for s in setup.status if not s.ok] + setup.skipped:  # said at start, like the banner
            _say(f"MCP server {line}")
        return run_headless(agent, task, output_format, sys.stdout, sys.stderr, setup.mcp_summary(), setup.git_commit)
    if not interactive:
        raise UsageError("ds4 agent needs a terminal, or a task with -p")
    head = (f"ds4agent {__version__} agent | {engine.info.name} | workspace {ws.root} | context {args.ctx} | "
            f"approvals: {args.approval} | sandbox: {policy.describe(detail=True)}")
    banner = "\n".join([head, *banner_lines(setup)])
    return run_agent_tty(agent, store, default_history_file(), banner, setup.git_commit, setup.status)


def cmd_serve(args: argparse.Namespace) -> int:
    from .modelfile import DEMO_BANNER, resolve_model
    from .server import Defaults, ServerOptions, serve
    from .server.run import is_loopback
    from .sessions import SessionStore

    sampling = _sampling(args)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.queue < 0:
        raise UsageError(f"--queue must be at least 0, got {args.queue}")
    if not is_loopback(args.host) and not args.api_key:
        _say(f"warning: listening on {args.host} without --api-key: anyone who can reach this port can use the model")
    choice = resolve_model(args.model)
    if choice.is_demo:
        _stderr().line(DEMO_BANNER)
    asked = None if args.parallel == "auto" else _positive(args.parallel, "--parallel")
    system = _prefix_text(args.prefix_file) if args.prefix_file else None
    engine = _open_engine(choice.path, args, args.ctx)
    parallel = _slots(engine, asked)
    store = None
    if not args.no_disk_cache:
        store = SessionStore(args.sessions) if args.sessions else SessionStore()
    opts = ServerOptions(Defaults(sampling, args.tokens, args.mode, args.ctx, system), api_key=args.api_key,
                         cors=args.cors,
                         max_queue=args.queue, min_save_tokens=args.cache_min_tokens, store=store, parallel=parallel)
    return serve(engine, opts, args.host, args.port)


def _positive(text: str, flag: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"{flag} takes a whole number of at least 1 or 'auto', got {text!r}")
    return n


def _slots(engine, asked: int | None) -> int:
    """The server's slots: ``asked``, or as many as the memory holds (Engine.session_room);
    says what each costs, and when this engine runs one session at a time."""
    room, kv = engine.session_room()
    n = room if asked is None else asked
    if n > 1 and not engine.batches:
        _say(f"note: this engine (the Ascend module, a distributed group) runs one session at a time: one slot, "
             f"not {n}")
        n, asked = 1, 1
    gib = kv / 2**30
    _say(f"{n} slot{'s' if n > 1 else ''} (each up to {gib:.2f} GiB of KV at --ctx {engine.ctx}; "
         f"{'--parallel' if asked is not None else 'auto: room for ' + str(room)})")
    return n


def cmd_pull(args: argparse.Namespace) -> int:
    """``ds4 pull``: a published file from the hub (modelfile/pull.py), then (asked first) set
    as the default model, or as the MTP file."""
    from .modelfile.pull import PullError, pull, table, variant
    from .ui.reports import PullProgress, fmt_gib
    from .ui.terminal import Out

    out = _stdout()
    if args.list:
        out.line("\n".join(table()))
        return 0
    try:
        v = variant(args.variant)
        if v.kind == "dspark":
            _say("note: this build does not run DSpark drafters (docs/speculation.md); downloading it anyway")
        err = Out(sys.stderr, tty=sys.stderr.isatty())
        with PullProgress(err, v.name) as progress:
            got = pull(v, args.dir, args.revision, progress)
    except PullError as e:
        raise UsageError(f"ds4 pull {args.variant}: {e}") from None
    if got.already:
        out.line(f"{got.path}: already here and checked ({fmt_gib(got.size)})")
    else:
        resumed = f", resumed after {fmt_gib(got.resumed_from)}" if got.resumed_from else ""
        out.line(f"{got.path}: {fmt_gib(got.size)}, SHA-256 equal to the hub's{resumed}")
    key = {"model": "model", "mtp": "mtp"}.get(v.kind)
    if key is None:
        return 0
    if _settings_value(key) == str(got.path):
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            out.line(f"to use it: ds4 -m {got.path}  (or ds4 pull {v.name} --yes sets '{key}' in config.toml)")
            return 0
        answer = input(f"Set it as '{key}' in {settings.config_path()}? [Y/n] ").strip().lower()
        if answer not in ("", "y", "yes"):
            return 0
    try:
        where = settings.set_config_path(key, str(got.path))
    except settings.SettingsError as e:
        raise UsageError(str(e)) from None
    out.line(f"{where}: {key} = {got.path}")
    return 0


def _settings_value(key: str) -> str | None:
    """config.toml's value of ``key`` as it stands (None when unset or unreadable)."""
    try:
        value = settings.read_settings(settings.config_path(), settings.CONFIG_KEYS).get(key)
    except settings.SettingsError:
        return None
    return value if isinstance(value, str) else None


def _prompt_lines(path: str) -> list[str]:
    """A prompt set: one prompt per line; blank lines and lines starting with # are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise UsageError(f"{path}: no prompts (one per line)")
    return lines


def cmd_steer(args: argparse.Namespace) -> int:
    """``ds4 steer build``: directions from two prompt sets (engine/steering.py), each prompt a
    user turn without thinking, its last row's sublayer output per layer."""
    import datetime

    from .engine import SteeringError, build_directions, write_steering

    if args.steer_command != "build":
        raise UsageError("ds4 steer build --good FILE --bad FILE --out FILE (see 'ds4 steer build --help')")
    from .modelfile import resolve_model
    from .protocol import render

    sets = {k: _prompt_lines(getattr(args, k)) for k in ("good", "bad") + (("control",) if args.control else ())}
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise UsageError(f"{out}: is a directory")
    choice = resolve_model(args.model)
    args.dir_steering_file = None  # (a build measures the model unsteered)
    engine = _open_engine(choice.path, args, args.ctx)
    try:
        tok = engine.tokenizer
        ids = {k: [tok.encode_rendered(render([{"role": "user", "content": p}], thinking_mode="chat")) for p in v]
               for k, v in sets.items()}
        longest = max(len(x) for v in ids.values() for x in v)
        if longest >= args.ctx:
            raise UsageError(f"a prompt of {longest} tokens does not fit --ctx {args.ctx}")
        _say(f"running {sum(len(v) for v in ids.values())} prompts ({args.component} outputs, every layer)")
        try:
            directions, norms = build_directions(engine.session(), ids["good"], ids["bad"], args.component,
                                                 ids.get("control"))
        except SteeringError as e:
            raise UsageError(str(e)) from None
        meta = {"name": out.stem, "made_by": "ds4 steer build", "component": args.component,
                "good": str(args.good), "bad": str(args.bad), "control": str(args.control) if args.control else None,
                "prompts": {k: len(v) for k, v in sets.items()}, "model": engine.info.name,
                "layers": int(directions.shape[0]), "hidden": int(directions.shape[1]),
                "difference_norms": [round(float(n), 6) for n in norms],
                "use": f"--dir-steering-file {out.name} (--dir-steering-{args.component} S: positive removes the bad "
                       "prompts' trait, negative amplifies it)",
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_steering(out, directions, meta)
    finally:
        engine.close()
    flag = "--dir-steering-attn 1 --dir-steering-ffn 0" if args.component == "attn" else ""
    _stdout().line(f"wrote {out} ({directions.shape[0]} layers x {directions.shape[1]}) and {out.name}.json; use: "
                   f"ds4 --dir-steering-file {out} {flag}".rstrip())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """``ds4 eval`` (verify/evaluate.py): run, or regrade, the suites; exit 0 when every case
    graded passes."""
    import json

    from .verify import evaluate as ev

    out = _stdout()
    if args.self_test:
        wrong = ev.self_test_lines()
        out.line("\n".join(wrong) if wrong else "every extractor passes its self-test")
        return 1 if wrong else 0
    try:
        chosen = ev.select(args.suite, args.case)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.list_cases:
        for c in chosen:
            out.line(f"{c.suite:10} {c.id:18} {c.kind:8} budget {c.budget:>5}  {c.prompt.splitlines()[0][:70]}")
        return 0
    if args.regrade:
        if args.trace:
            raise UsageError("--regrade reads a trace; --trace writes one: give one of them")
        try:
            head, records = ev.read_trace(args.regrade)
            graded = ev.regrade(records)
        except ev.TraceError as e:
            raise UsageError(str(e)) from None
        head = {**head, "regraded": True}
        for g in graded:
            out.line(ev.result_line(g))
    else:
        head, graded = _eval_run(args, chosen, out)
    for line in ev.summary(graded):
        out.line(line)
    if args.json:
        Path(args.json).write_text(json.dumps(ev.report(head, graded), indent=1, ensure_ascii=False) + "\n")
    return 0 if all(g.passed for g in graded) else 1


def _eval_run(args: argparse.Namespace, chosen, out):
    from .modelfile import resolve_model
    from .verify import evaluate as ev

    if args.trace and Path(args.trace).exists():
        raise UsageError(f"{args.trace}: already exists (a trace is never overwritten; name another file)")
    if args.tokens < 0:
        raise UsageError(f"-n must be at least 0, got {args.tokens}")
    if args.tokens:
        from dataclasses import replace

        chosen = [replace(c, budget=min(c.budget, args.tokens)) for c in chosen]
    choice = resolve_model(args.model)
    sampling = _sampling(argparse.Namespace(**{**vars(args), "tokens": 1}))
    engine = _open_engine(choice.path, args, args.ctx)
    mode = "chat" if args.nothink else "thinking"
    head = {"model": str(choice.path), "kernels": engine.info.kernels, "backend": engine.info.backend,
            "mode": mode, "temperature": sampling.temperature, "ctx": args.ctx, "token_cap": args.tokens or None}
    if "ds4agent demo model" in str(engine.file.get("general.description", "")):
        _say(f"{choice.path.name} is a model ds4agent generated (random weights): expect every case to fail")
    records, graded = [], []
    try:
        for c in chosen:
            _say(f"{c.suite}/{c.id}: running (budget {c.budget} tokens)")
            rec = ev.run_case(engine, c, mode, sampling)
            records.append(rec)
            g = ev.grade(c, rec)
            graded.append(g)
            out.line(ev.result_line(g))
    finally:
        if args.trace and records:
            ev.write_trace(args.trace, head, records)
        engine.close()
    return head, graded


def cmd_check(args: argparse.Namespace) -> int:
    """``ds4 check``: DeepSeek's official vectors against this model on this machine
    (verify/official.py); exit 0 when every case chosen passes."""
    from .modelfile import resolve_model
    from .verify.official import Checker, VectorError, load_cases, report_line, speed_line

    try:
        cases = load_cases()
    except VectorError as e:
        raise UsageError(f"the official vectors shipped with ds4agent do not read: {e}") from None
    if args.list:
        out = _stdout()
        for c in cases:
            out.line(f"{c.id:24} {len(c.steps)} steps, prompt {len(c.prompt)} characters, captured at ctx {c.ctx}")
        return 0
    if args.case:
        known = {c.id for c in cases}
        unknown = [x for x in args.case if x not in known]
        if unknown:
            raise UsageError(f"no case {unknown[0]!r} (cases: {', '.join(sorted(known))})")
        cases = [c for c in cases if c.id in args.case]
    choice = resolve_model(args.model)
    engine = _open_engine(choice.path, args, max(c.ctx for c in cases))
    try:
        if "ds4agent demo model" in str(engine.file.get("general.description", "")):
            _say(f"{choice.path.name} is a model ds4agent generated (random weights): it cannot give DeepSeek's "
                 "tokens, so every case fails below; run ds4 check -m FILE with the real model")
        out, outcomes = _stdout(), []
        checker = Checker(engine)
        for o in checker.run_all(cases, lambda c, n: _say(f"{c.id}: prefilling {n} tokens")):
            outcomes.append(o)
            out.line(report_line(o))
        passed = sum(o.passed for o in outcomes)
        out.line(speed_line(outcomes))
        out.line(f"{passed} of {len(outcomes)} cases pass ({engine.info.kernels} kernels, {engine.info.backend})")
        return 0 if passed == len(outcomes) else 1
    finally:
        engine.close()


def cmd_bench(args: argparse.Namespace) -> int:
    from .engine.reports import bench as benchmark
    from .modelfile import resolve_model
    from .ui.reports import BenchProgress
    from .ui.terminal import Out

    if (not 1 <= args.ctx_start <= args.ctx_max or args.gen_tokens < 1 or (args.step_mul or 2) <= 1
            or args.step_incr < 1):
        raise UsageError("need 1 <= --ctx-start <= --ctx-max, --gen-tokens >= 1, --step-incr >= 1, --step-mul > 1")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib (pip install 'ds4agent[bench]')") from None
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {args.parallel}")
    choice = resolve_model(args.model)
    engine = _open_engine(choice.path, args, args.ctx_max + args.gen_tokens + 1, "--ctx-max + --gen-tokens + 1 =")
    tok = engine.tokenizer
    text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else _BENCH_TEXT
    ids = tok.encode(text)
    if not ids:
        raise UsageError("the prompt text is empty")
    while len(ids) < args.ctx_max:  # the built-in text (or a short file) repeats to fill the context
        ids = ids + ids
    if args.parallel is not None:
        return _bench_streams(engine, ids, args)
    points = benchmark.frontiers(args.ctx_start, args.ctx_max, args.step_incr, args.step_mul)
    per_token = benchmark.bytes_per_token(engine)
    probe = benchmark.read_probe(engine)
    if probe:
        _say(f"read bandwidth here: {probe / 1e9:.1f} GB/s (every core reading the model's mapping)")

    def share(gen_tps: float) -> str:
        return f" ({100 * per_token * gen_tps / probe:.0f}% of the read bandwidth)" if probe else ""

    drafts: dict = {}
    rows = benchmark.run(engine, ids, points, args.gen_tokens,
                         BenchProgress(Out(sys.stderr, tty=sys.stderr.isatty()), share), drafts)
    if args.csv:
        with open(args.csv, "w", encoding="utf-8") as f:
            benchmark.write_csv(rows, f)
    else:
        benchmark.write_csv(rows, sys.stdout)
    gen = sum(r.gen_tps for r in rows) / len(rows)
    _say(f"{per_token / 1e9:.3f} GB of weights read per decoded token; at {gen:.2f} t/s that is "
         f"{per_token * gen / 1e9:.2f} GB/s{share(gen)}")
    note = benchmark.prefetch_note(engine)
    if note:
        _say(f"CPU kernels' prefetch: {note}")
    if drafts:
        _say(f"speculation: {drafts['drafted']} tokens proposed in {drafts['proposals']} passes, {drafts['accepted']} "
             f"kept ({drafts['mean_accepted']} per pass); --speculate off measures plain decode")
    note = benchmark.streaming_note(engine, sum(r.gen_tokens for r in rows))
    if note:
        _say(note)
    if args.save_profile:
        engine.save_expert_profile(args.save_profile)
        _say(f"expert profile written to {args.save_profile}")
    if args.plot:
        benchmark.plot(rows, args.plot, f"{engine.info.name} ({engine.info.backend}, {engine.info.kernels} kernels)")
    return 0


def _bench_streams(engine, ids: list[int], args: argparse.Namespace) -> int:
    """``ds4 bench --parallel N``: aggregate and per-stream decode of 1, 2, 4 .. N sessions
    advancing together, each after a --ctx-start prefill of its own, side by side."""
    from .engine.reports import bench as benchmark

    if not engine.batches:
        _say("note: this engine runs one session at a time: the streams take turns")
    streams = benchmark.widths(args.parallel)
    _say(f"decode of {args.gen_tokens} tokens per stream after a {args.ctx_start}-token prompt each; "
         f"{', '.join(map(str, streams))} streams, alternating, {args.repeat} run(s) each")

    def line(r) -> None:
        _say(f"  {r.streams} stream(s): {r.aggregate_tps:.2f} t/s aggregate, {r.stream_tps:.2f} t/s per stream")

    rows = benchmark.parallel(engine, ids, streams, args.ctx_start, args.gen_tokens, args.repeat, line)
    one = rows[0].aggregate_tps
    print("streams,aggregate_tps,stream_tps,vs_one_stream")
    for r in rows:
        print(f"{r.streams},{r.aggregate_tps:.2f},{r.stream_tps:.2f},{r.aggregate_tps / one:.2f}")
    return 0


_BENCH_TEXT = (
    "The quick brown fox jumps over the lazy dog while the engine measures how fast it reads a long context. "
    "Each frontier adds new tokens to prefill, then a fixed number of greedy tokens are generated and timed.\n"
)


def main(argv: Sequence[str] | None = None) -> int:
    from .engine import ContextFullError, EngineError
    from .engine.group.launch import GroupError
    from .modelfile import ConfigError, GGUFError
    from .settings import ModelChoiceError

    argv = list(sys.argv[1:] if argv is None else argv)
    # Plain `ds4` and `ds4 -m PATH ...` run the chat.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["chat", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = argv  # --hosts starts the other ranks with the same arguments
        from .engine.group.launch import follower

        if follower() and args.command in ("chat", "agent", "bench", "serve"):
            return _follow(args)  # rank > 0 of a group: no terminal, socket or store here
        handler = {"chat": cmd_chat, "agent": cmd_agent, "bench": cmd_bench, "inspect": cmd_inspect,
                   "demo": cmd_demo, "serve": cmd_serve, "check": cmd_check, "pull": cmd_pull,
                   "eval": cmd_eval, "steer": cmd_steer}[args.command]
        return handler(args)
    except (UsageError, GGUFError, ConfigError, ModelChoiceError, EngineError, ContextFullError) as e:
        _say(f"error: {e}")
        return 2 if isinstance(e, UsageError) else 1
    except GroupError:  # another machine of the group failed: the link said so in one line
        return 1
    except BrokenPipeError:  # `ds4 inspect ... | head`: the reader left; not an error worth a message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        _say(f"error: {where}{e.strerror or e}")
        return 1
    except KeyboardInterrupt:
        _stderr().write("\n")
        _say("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
