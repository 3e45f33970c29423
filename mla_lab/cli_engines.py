"""``mla-lab engines``: the engine versions the lab describes (mla_lab.engines), and the check of their facts
against a release wheel (``--check-wheel`` / ``--download``, mla_lab.engines.wheel_check)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .cli_doors import DoorError, rel_path

__all__ = ["add_parser", "cmd_engines"]


_ENGINE_COLS = (("preset", 21), ("engine", 6), ("version", 15), ("release", 10), ("prefill route", 13),
                ("padding", 7), ("decode backend", 21), ("padded path", 40))


def cmd_engines(args) -> int:
    """``mla-lab engines``: the engine presets (GLM-5 TP8, H200, bf16 KV, 1024-token prompts), or the wheel check."""
    from .deployment import Deployment
    from .engines import engine_preset
    from .placement import engine_table

    if args.check_wheel or args.download:
        return _check_wheels(args)
    for flag, on in (("--write", args.write), ("--overwrite", args.overwrite)):
        if on:
            raise DoorError(f"{flag} writes the wheel check's report; allowed: with --check-wheel PATH.whl or "
                            "--download ENGINE==VERSION")
    arch = _engines_arch(getattr(args, "arch", "h200"))
    rows = engine_table(Deployment.seed(arch=arch.name))
    for r in rows:
        p = engine_preset(r["preset"])
        r["decode_backend"] = "FLASH_ATTN_MLA_SPARSE (fa3)" if r["decode_route"] == "fa3-sparse" and \
            r["engine"] == "sglang" else r["backend"]
        r["facts"] = [{"key": f.key, "value": f.value, "text": f.text, "sources": [s.cite() for s in f.sources]}
                      for f in p.facts]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    print(f"engine presets for GLM-5 TP8 (8 heads per rank), {arch.name.upper()} ({arch.sm}), bf16 KV, 1024-token "
          "prompts, 16384 tokens per step (PR #53878's benchmark); modelled from the engines' sources (a code "
          "reading, not run" + (f"; nothing ran on a {arch.name.upper()}" if arch.sm != "sm90" else "") + ")")
    print(" ".join(t.ljust(w) for t, w in _ENGINE_COLS).rstrip())
    for r in rows:
        vals = (r["preset"], r["engine"], r["version"], r["release_date"], r["prefill_route"] or "-",
                str(r["padding"]) if r["padding"] else "none", r["decode_backend"] or "-", r["padded_path"])
        print(" ".join(str(v).ljust(w) for v, (_, w) in zip(vals, _ENGINE_COLS)).rstrip())
        print("    sources: " + ", ".join(r["sources"]))
    print("mla-lab engines --json gives every fact with its file:line; --check-wheel PATH.whl checks them (ast)")
    return 0


#: GPUs whose engine facts the lab holds (:mod:`mla_lab.engines`: sm90 and sm100).
ENGINE_SMS = ("sm90", "sm100")


def _engines_arch(name):
    """The GPU card of ``--arch`` whose sm the engine facts cover (:data:`ENGINE_SMS`); else DoorError."""
    from .arch import ARCHS, get_arch

    allowed = [a for a in ARCHS if get_arch(a).sm in ENGINE_SMS]
    try:
        arch = get_arch(name)
    except (ValueError, KeyError, TypeError):
        arch = None
    if arch is None or arch.sm not in ENGINE_SMS:
        raise DoorError(f"--arch={name!r} is not valid; allowed: {allowed} (GPUs whose engine facts the lab holds)")
    return arch


def _check_wheels(args) -> int:
    from .engines.wheel_check import check_wheel, download_wheel, format_report

    wd = Path(args.wheel_dir)
    if args.download and any(q.exists() and not q.is_dir() for q in (wd, *wd.parents)):
        raise DoorError(f"--wheel-dir={args.wheel_dir!r} is a file or under one; allowed: a folder for the wheels")
    if args.overwrite and not args.write:
        raise DoorError("--overwrite replaces the report --write writes; allowed: --write --overwrite")
    wheels = list(args.check_wheel or [])
    for spec in args.download or []:
        eng, _, ver = spec.partition("==")
        if not ver:
            raise DoorError(f"--download={spec!r} is not valid; allowed: <engine>==<version>, e.g. vllm==0.33.0")
        try:
            wheels.append(str(download_wheel(eng, ver, args.wheel_dir)))
        except (ValueError, RuntimeError) as e:
            raise DoorError(f"--download={spec!r}: {e}") from None
    bad = 0
    for w in wheels:
        try:
            rep = check_wheel(w)
        except ValueError as e:
            raise DoorError(f"--check-wheel={w!r}: {e}") from None
        bad += rep["counts"]["fails"] + rep["counts"]["missing"]
        if args.write:
            _write_checked(w, rep, args.overwrite)
        print(json.dumps(rep, indent=1) if args.json else format_report(rep))
    return 1 if bad else 0


def _write_checked(wheel: str, rep: dict, overwrite: bool) -> None:
    """``--write``: the wheel check's report into ``data/engines`` when every fact held or moved; a failed check writes
    nothing (issue 39) and says so on stderr. DoorError: a report file exists without ``overwrite``.
    """
    from .engines.wheel_check import write_report
    from .paths import data_dir

    c = rep["counts"]
    if c["fails"] + c["missing"]:
        print(f"mla-lab: {wheel}: not written (the check failed: {c['fails']} fails, {c['missing']} missing); the "
              "facts under data/engines are unchanged", file=sys.stderr)
        return
    try:
        j, m = write_report(rep, data_dir() / "engines", overwrite=overwrite)
    except ValueError as e:
        raise DoorError(str(e)) from None
    print(f"mla-lab: wrote {rel_path(j)} and {rel_path(m)}")


def add_parser(sub) -> None:
    """The ``engines`` sub-command on ``sub`` (argparse sub-parsers)."""
    en = sub.add_parser("engines", help="the engine versions the lab describes (vLLM / SGLang releases and PR-era "
                                        "builds): route, padding, decode backend, sources; or check a wheel")
    en.add_argument("--json", action="store_true", help="every preset with its facts and their file:line")
    en.add_argument("--arch", default="h200",
                    help="the GPU whose backends and padding to show: h200 (sm90, default) or b200 (sm100; modelled "
                         "from the engines' sources, nothing ran on a B200)")
    en.add_argument("--check-wheel", nargs="+", default=None, metavar="WHEEL",
                    help="release wheel(s) to check the facts against (read with ast; never installed or imported)")
    en.add_argument("--download", nargs="+", default=None, metavar="ENGINE==VERSION",
                    help="pip download --no-deps the release wheel(s) first (e.g. vllm==0.33.0; ~336 MB), then check")
    en.add_argument("--wheel-dir", default=os.environ.get("MLA_LAB_WHEELS", "wheels"),
                    help="where --download puts wheels (default env MLA_LAB_WHEELS or ./wheels)")
    en.add_argument("--write", action="store_true",
                    help="write data/engines/wheel_facts_<engine>-<version>.json and .md")
    en.add_argument("--overwrite", action="store_true", help="with --write: replace existing report files")
