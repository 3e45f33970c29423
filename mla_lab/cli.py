"""``mla-lab`` command line: run the papermill-parameterized sweep notebook and publish it as HTML.

Also ``advise``, ``serve``, ``engines``, ``index``, ``check-report``, ``measure``, ``report`` (docs/cli.md has each).
Every door refuses bad input in one line (exit 2) before anything is priced or written (:mod:`mla_lab.cli_doors`);
imports are lazy (``mla-lab --help`` loads neither torch nor pandas).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import cli_doors as doors
from . import cli_engines, cli_measure, cli_report, cli_serve, cli_sweep
from .cli_doors import CLIError, DoorError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mla-lab: error: <what>; see mla-lab <cmd> --help`` (exit 2)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        msg = " ".join(str(message).split())
        self.exit(2, f"mla-lab: error: {msg} (see {self.prog} --help)\n")


def _cmd_advise(args) -> int:
    """``mla-lab advise``: the deployment checked once, then the ranked strategies printed (text or JSON)."""
    for flag, v in (("--random-output-len", args.random_output_len), ("--request-rate", args.request_rate)):
        if v is not None:
            raise DoorError(f"{flag}={v!r} is not used by advise: it ranks strategies by the modelled TTFT of the "
                            "prefill, which neither the output length nor the request rate changes; allowed: omit "
                            "it here, or use 'mla-lab serve' (the vllm bench serve simulation) with it")
    dep, _ = doors.check_deployment(args)
    from .sweep.advise import advise, format_advice

    doors.check_engine(args.engine)
    measured = None
    if not args.no_measured:
        from .report.data import load_measured_cached

        measured = load_measured_cached()
    try:
        res = advise(dep, memory_budget_mib=args.memory_budget_mib, memory_budget_tokens=args.memory_budget_tokens,
                     measured=measured, engine=args.engine, packed_overlap=args.packed_overlap)
    except ValueError as e:  # the deployment was built (and checked) once, above; a bad --packed-overlap is refused
        if "packed_overlap" in str(e):
            raise DoorError(str(e).replace("packed_overlap=", "--packed-overlap=")) from None
        raise
    attrs = getattr(measured, "attrs", {}) if measured is not None else {}
    detached = list(attrs.get("detached", [])) + [  # rows no manifest counts: a cut file could not be detected
        f"{u} (no stamp in a manifest: lost rows cannot be detected; python -m mla_lab.report.stamp_measured)"
        for u in attrs.get("unstamped", [])]
    if args.json:
        print(json.dumps({**res, "measured_detached": detached}, indent=1, default=str))
    else:
        print(format_advice(res) + "".join(f"\nnote: {n}" for n in detached))
    return 0


def _add_advise(sub) -> None:
    """The ``advise`` sub-command on ``sub`` (argparse sub-parsers)."""
    B, R = doors.arg_type, doors.range_help
    ad = sub.add_parser("advise", help="for one deployment and a memory budget: the strategy (and S) with the "
                                       "lowest TTFT, ranked alternatives, what does not fit")
    doors.deployment_flags(ad, tp_flags=("--tp", "--tensor-parallel-size"))
    ad.add_argument("--prompt-len", "--random-input-len", dest="prompt_len", type=B("prompt_len"), default=1024,
                    help=f"tokens per prompt, {R('prompt_len')} (default 1024)")
    ad.add_argument("--num-prompts", type=B("num_prompts"), default=32,
                    help=f"prompts in the workload, {R('num_prompts')} (default 32)")
    ad.add_argument("--concurrency", "--max-concurrency", dest="concurrency", type=B("concurrency"), default=None,
                    help="prompts in flight at once, 1..num_prompts (default num_prompts); advise's TTFT model holds "
                         "their KV at once")
    ad.add_argument("--memory-budget-mib", type=doors.budget_type("--memory-budget-mib"), default=None,
                    help="most persistent extra MiB per rank a strategy may take, a number >= 0 (default no limit)")
    ad.add_argument("--memory-budget-tokens", type=doors.budget_type("--memory-budget-tokens", integer=True),
                    default=None, help="most KV-cache tokens per rank a strategy may cost, a whole number >= 0 "
                                       "(default no limit)")
    ad.add_argument("--random-output-len", default=None, help=argparse.SUPPRESS)  # refused with a reason
    ad.add_argument("--request-rate", default=None, help=argparse.SUPPRESS)  # refused with a reason
    ad.add_argument("--no-measured", action="store_true", help="use modelled TTFT only (ignore data/measured)")
    ad.add_argument("--engine", default=None,
                    help="the engine version to answer within (default vllm@0.33.0; e.g. sglang@0.5.23, vllm@pr53878: "
                         "mla-lab engines lists them; first names such as vllm-53878 map to theirs): only its "
                         "strategies are ranked, other engines' options are listed in their own section")
    ad.add_argument("--packed-overlap", type=doors.overlap_type, default=None,
                    help="the pairwise overlap of neighbouring tokens' top-k sets past the top-k that the lab's "
                         "packed kernel is priced at, 0..1 (default 0.44: TensorRT-LLM tech blog 21, an assumption)")
    ad.add_argument("--json", action="store_true", help="print the result as JSON")


def build_parser() -> argparse.ArgumentParser:
    """The ``mla-lab`` argument parser, one sub-command per door module (every integer flag bounded:
    :data:`mla_lab.cli_doors.BOUNDS`; every option has a one-line help with its unit and allowed range)."""
    ap = _Parser(prog="mla-lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for add in (cli_sweep.add_parser, _add_advise, cli_serve.add_parser, cli_engines.add_parser,
                cli_report.add_parsers, cli_measure.add_parsers):
        add(sub)
    return ap


_COMMANDS = {"sweep": cli_sweep.cmd_sweep, "advise": _cmd_advise, "serve": cli_serve.cmd_serve,
             "engines": cli_engines.cmd_engines, "index": cli_report.cmd_index,
             "check-report": cli_report.cmd_check_report,
             "measure": lambda args: cli_measure.cmd_measure(args, _stamp),
             "report": lambda args: cli_measure.cmd_report(args, main)}


def _stamp(root) -> int:
    """Stamp the measured rows under ``root`` with the model configs they were measured on (issue 24)."""
    from .report.stamp_measured import main as stamp

    return stamp(["--root", str(root)])


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 a run failure, 2 bad input, 130 interrupted, 141 a closed
    pipe). Every failure is one line on stderr (``MLA_LAB_TRACEBACK=1`` re-raises unexpected errors).
    """
    try:
        args = build_parser().parse_args(argv)
        rc = _COMMANDS[args.cmd](args)
        sys.stdout.flush()  # a closed pipe raises here, inside the handler below, not at interpreter exit
        return rc
    except (ValueError, CLIError) as e:  # bad input (DoorError is a ValueError): 2; a run failure: 1
        print(f"mla-lab: error: {_one_line(e)}", file=sys.stderr)
        return 1 if isinstance(e, CLIError) else 2
    except BrokenPipeError:  # stdout closed by the reader (mla-lab advise | head): quiet, as SIGPIPE would be
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        except (OSError, ValueError):
            pass
        return 128 + 13  # 141: the shell's status for a process ended by SIGPIPE
    except KeyboardInterrupt:
        print("mla-lab: interrupted; every point finished so far is stored (one file per point) and the same "
              "command resumes from them", file=sys.stderr)
        return 130
    except Exception as e:  # the system's refusal, a bug or a broken install: one line, the traceback on request
        if os.environ.get("MLA_LAB_TRACEBACK"):
            raise
        if isinstance(e, (OSError, OverflowError, MemoryError, RecursionError)):
            print(f"mla-lab: error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        else:
            print(f"mla-lab: error: internal error {type(e).__name__}: {_one_line(e)[:300]} (MLA_LAB_TRACEBACK=1 "
                  "shows the traceback)", file=sys.stderr)
        return 1


#: The longest error line printed (characters): a message that echoes a value is cut, never the terminal flooded.
MAX_ERROR_CHARS = 1500


def _one_line(e: BaseException) -> str:
    s = " ".join(str(e)[: 4 * MAX_ERROR_CHARS].split()) or type(e).__name__
    return s if len(s) <= MAX_ERROR_CHARS else s[: MAX_ERROR_CHARS - 5] + " ..."


if __name__ == "__main__":
    sys.exit(main())
