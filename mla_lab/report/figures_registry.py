"""One source per figure (issue 39): each :class:`Quantity` the pages state, the one function computing it from a
named committed file, and the patterns (group ``v``) finding its statements on the pages. ``tests/test_one_value.py``
checks every statement equals the computed value at its own rounding; where two figures legitimately differ (two
leases, measured vs modelled), they are two quantities and the words around the number say which.

    python -m mla_lab.report.figures_registry     # every quantity, its value, source and where it is stated
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import pandas as pd

from ..deployment import Deployment
from ..measure.spread import paired_change
from ..paths import REPO_ROOT
from ..placement import BASELINE
from ..sweep.advise import advise, format_advice
from ..sweep.params import validate_params
from ..sweep.rows import modelled_rows
from ..sweep.run import plan_sweep
from .answer import answer_figures
from .data import load_measured
from .reproduce import lease_pr_change
from .seed_answer import seed_answer

__all__ = ["Quantity", "QUANTITIES", "pages", "statements", "agrees"]

NUM = r"[-+\u2212]?\d+(?:,\d{3})*(?:\.\d+)?"


@dataclass(frozen=True)
class Quantity:
    """One figure the pages state: ``name``, ``source`` (the committed file and the function reading it, in words),
    ``compute`` (the value in the unit printed), ``patterns`` (regexes whose group ``v`` captures a statement)."""

    name: str
    source: str
    compute: Callable[[], float]
    patterns: tuple[str, ...]


@lru_cache(maxsize=None)
def _seed_rows() -> dict:
    return {(r["model"], r["strategy"], r["against"]): r for r in seed_answer(("glm-5", "glm-5.2"))}


def _seed(model: str, strategy: str, against: str, key: str) -> Callable[[], float]:
    return lambda: float(_seed_rows()[(model, strategy, against)][key])


@lru_cache(maxsize=1)
def _presets_copy() -> dict:
    """The PR's attention path against the pre-PR pad in ``data/measured/h200/between_process/presets.csv`` (5 fresh
    processes): the copy removed (median over processes of the per-process difference, ms) and the paired change."""
    p = pd.read_csv(REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "presets.csv")
    p = p[p["shape"] == "seed"]
    med = p.groupby(["strategy", "process"])["ms"].median().unstack()
    ch = paired_change(p, [], "strategy", "private_workspace", "per_call_empty:zeros")[()]
    return {"copy_ms": float((med.loc["per_call_empty:zeros"] - med.loc["private_workspace"]).median()),
            "change_pct": float(ch["median"])}


def _pad_copy_modelled_ms() -> float:
    """The cost model's pad copy of vLLM before the PR (``per_call_empty``) per layer call at the seed (T = 16384,
    8 -> 64 heads): the baseline row's ``pad_copy_ms`` over its steps and layers (:func:`mla_lab.sweep.rows.
    modelled_rows`, calibration ``data/calibration/h200_ops.csv``)."""
    d = Deployment.seed()
    row = next(r for r in modelled_rows(d.to_point(strategies=[BASELINE], shared_workspace_bytes=None, num_runs=7))
               if r["strategy"] == BASELINE)
    return row["pad_copy_ms"] / row["num_steps"] / d.model.num_hidden_layers


def _answer(key: str) -> Callable[[], float]:
    return lambda: float(answer_figures()[key])


_PCT = r"(?P<v>[-+\u2212]\d+\.\d+) ?%"
SEED = "vLLM PR #53878 vs vLLM before it at the seed (GLM-5 TP8 H200, 32 x 1024 tokens)"
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("pr_ttft_modelled_glm5", f"{SEED}, modelled: mla_lab.report.seed_answer (the TTFT model)",
             _seed("glm-5", "private_workspace", "per_call_empty:zeros", "modelled_pct"),
             (r"\| -9\.5 % \| " + _PCT + r" \(GLM-5\.2", r"\(GLM-5: " + _PCT + r"\) for [-+]\d+ MiB",
              r"PR vs before it, padded heads zeros, modelled \| " + _PCT,
              r"\| committed: the assumption \| \d+ \| " + _PCT,
              r"\nprivate_workspace@vllm-pr53878 +[\d.]+ +" + _PCT.replace(" ?%", ""))),
    Quantity("pr_ttft_modelled_glm52", f"{SEED}, GLM-5.2, modelled: mla_lab.report.seed_answer",
             _seed("glm-5.2", "private_workspace", "per_call_empty:zeros", "modelled_pct"),
             (r"\| -9\.5 % \| [-+]\d\.\d % \(GLM-5\.2: " + _PCT, r"Modelled: mean TTFT \(time to first token\) " + _PCT,
              r"PR vs before it, padded heads zeros, modelled \| [-+]\d\.\d % \| " + _PCT,
              r"beside the PR's own " + _PCT)),
    Quantity("pr_ttft_measured_glm5", f"{SEED}, attention path measured (5 fresh processes, rest modelled): "
             "data/measured/h200/between_process/presets.csv via mla_lab.report.seed_answer",
             _seed("glm-5", "private_workspace", "per_call_empty:zeros", "measured_pct"),
             (r"\| " + _PCT + r" \[[-+]\d\.\d, [-+]\d\.\d\] \(GLM-5\.2: [-+]\d\.\d %\) \|",
              r"zeros, attention path measured[^|\n]*\| " + _PCT + r" \[",
              r"\nprivate_workspace@vllm-pr53878 +(?:\S+ +){7}(?P<v>[-+]\d+\.\d+) \[")),
    Quantity("pr_ttft_measured_glm52", f"{SEED}, GLM-5.2, attention path measured: between_process/presets.csv",
             _seed("glm-5.2", "private_workspace", "per_call_empty:zeros", "measured_pct"),
             (r"\] \(GLM-5\.2: " + _PCT + r"\) \|", r"rest modelled\) " + _PCT + r" \[",
              r"zeros, attention path measured[^|\n]*\| [-+]\d\.\d % \[[^]]*\] \| " + _PCT + r" \[")),
    Quantity("pad_copy_measured_ms", "the copy PR #53878 removes per layer call, measured at the seed: "
             "data/measured/h200/between_process/presets.csv (median over 5 processes of the per-process difference)",
             lambda: _presets_copy()["copy_ms"],
             (r"removes a (?P<v>\d\.\d+) ms copy", r"pad copy the PR removes is (?P<v>\d\.\d+) ms",
              r"(?P<v>\d\.\d+) ms pad copy \(measured")),
    Quantity("pad_copy_modelled_ms", "vLLM's pre-PR pad copy per layer call at the seed, modelled: "
             "mla_lab.sweep.rows.modelled_rows (pad_copy_ms), calibration data/calibration/h200_ops.csv",
             _pad_copy_modelled_ms,
             (r"(?P<v>\d\.\d+) ms pad copy \(modelled", r"pad copy is (?P<v>\d\.\d+) ms modelled")),
    Quantity("attention_path_presets_pct", "the PR's attention path vs the pre-PR pad, paired over 5 processes: "
             "data/measured/h200/between_process/presets.csv (the 0834 lease)",
             lambda: _presets_copy()["change_pct"],
             (r"ms measured, attention path " + _PCT + r" \[[-+]\d\.\d, [-+]\d\.\d\]",)),
    Quantity("attention_path_lease1_pct", "the same, ratio of medians, the 0834 lease's strategies run: "
             "data/measured/h200/runs/2026-12-02T0834_measure/between_process/strategies.csv "
             "(mla_lab.report.reproduce.lease_pr_change)", lambda: lease_pr_change()["first"],
             (r"pre-PR pad, measured " + _PCT + r" and", r"pre-PR pad: " + _PCT + r" and",
              r"at the seed: " + _PCT + r" at 0834")),
    Quantity("attention_path_lease2_pct", "the same on a second lease (0900): between_process/strategies.csv "
             "(mla_lab.report.reproduce.lease_pr_change)", lambda: lease_pr_change()["second"],
             (r"pre-PR pad, measured [-+]\d\.\d % and " + _PCT, r"pre-PR pad: [-+]\d\.\d % and " + _PCT,
              r"at 0834, " + _PCT + r" at 0900")),
    Quantity("dense_route_glm52_pct", "dense MHA vs the PR's path at the seed, GLM-5.2, modelled: "
             "mla_lab.report.seed_answer", _answer("dense_glm52_pct"),
             (r"keys, heads up-projected; exact up to top-k\) is modelled at " + _PCT,
              r"is modelled at " + _PCT + r" TTFT\s+against the PR's path for GLM-5\.2")),
    Quantity("dense_route_glm5_pct", "the same, GLM-5", _answer("dense_glm5_pct"),
             (r"TTFT against the PR's path \(GLM-5: " + _PCT + r"[;)]", r"for GLM-5\.2 \(GLM-5: " + _PCT + r"\)")),
    Quantity("fa3_tpot_today_pct", "vLLM 0.33.0's FA3 sparse vs FLASHMLA_SPARSE forced, TPOT, GLM-5.2, the serving "
             "simulation (mla_lab.serving.serve_benchmark)", _answer("fa3_tpot_pct"),
             (r"pads nowhere: TPOT " + _PCT,)),
    Quantity("fa3_tput_today_pct", "the same, output throughput", _answer("fa3_tput_pct"),
             (r"pads nowhere: TPOT [-+]\d\.\d %, throughput " + _PCT,)),
    Quantity("pr_extra_mib", "the PR's build: persistent extra MiB per rank (mla_lab.buffers.memory_account)",
             _answer("extra_mib"),
             (r"with the PR's build the pre-padded workspace costs (?P<v>\d+) MiB per rank",
              r"\nprivate_workspace@vllm-pr53878 +[\d.]+ +\S+ +\d+ +(?P<v>[-+]\d+) ",
              r"\| \+1032 MiB peak \| \+(?P<v>\d+) MiB \(")),
    Quantity("forced_today_mib", "vLLM 0.33.0, FLASHMLA_SPARSE forced: extra MiB per rank "
             "(mla_lab.report.seed_answer.pr_trade_by_engine)", _answer("forced_today_mib"),
             (r"vLLM 0\.33\.0 forced, (?:it|the shared view) (?:prices|costs) (?P<v>[-+]\d+) MiB",
              r"\nshared_workspace:none@vllm-0\.33\.0-flashmla +[\d.]+ +\S+ +\d+ +(?P<v>[-+]\d+) ")),
    Quantity("default_grid_points", "the sweep's default grid: mla_lab.sweep.run.plan_sweep(DEFAULTS)",
             lambda: float(plan_sweep(validate_params({}))["points"]),
             (r"(?<!earlier )default grid (?:is )?\(?(?P<v>\d+) points", r'"points": (?P<v>\d+),\n "stored"')),
)


def _cli_texts() -> dict[str, str]:
    """The CLI's own text for the PR's deployment: ``mla-lab advise`` (the measured rows read as the CLI reads
    them) and ``mla-lab sweep --dry-run``, rendered in-process by the functions the commands call."""
    adv = format_advice(advise(Deployment.seed(), measured=load_measured(), engine=None))
    dry = json.dumps(plan_sweep(validate_params({})), indent=1, default=str)
    return {"cli: mla-lab advise": "\n" + adv, "cli: mla-lab sweep --dry-run": dry}


def pages(cli: bool = True) -> dict[str, str]:
    """``{name: text}`` of every page a figure may be stated on: README.md, docs/*.md, the report notebook's text
    (``notebooks/padding_sweep.py``: the answer block, the sections' words and the tables' captions) and, with
    ``cli``, the CLI's own text (:func:`_cli_texts`). Markdown line breaks are kept (patterns use ``\\s``)."""
    out = {"README.md": (REPO_ROOT / "README.md").read_text(),
           **{f"docs/{p.name}": p.read_text() for p in sorted((REPO_ROOT / "docs").glob("*.md"))}}
    nb = REPO_ROOT / "notebooks" / "padding_sweep.py"
    out["notebooks/padding_sweep.py"] = "\n".join(ln[2:] if ln.startswith("# ") else ln
                                                  for ln in nb.read_text().split("\n"))
    if cli:
        out.update(_cli_texts())
    return out


def statements(q: Quantity, texts: dict[str, str]) -> list[tuple[str, str]]:
    """``[(page, printed number)]``: every statement of ``q`` the patterns find on ``texts``."""
    # single line breaks inside a paragraph read as one space (layout); table rows, paragraph breaks and a terminal's
    # lines stay
    flat = {n: t if n.startswith("cli:") else re.sub(r"(?<![\n|])\n(?![\n|#-])", " ", t) for n, t in texts.items()}
    return [(n, m.group("v")) for n, t in flat.items() for pat in q.patterns for m in re.finditer(pat, t)]


def agrees(printed: str, value: float) -> bool:
    """``printed`` (``-1.8``, ``+0.17``, ``1,008``, ``\u22121.2``) is ``value`` at the printed number's rounding (half a
    unit of its last digit; an integer: half of one)."""
    s = printed.replace("\u2212", "-").replace(",", "")
    decimals = len(s.split(".")[1]) if "." in s else 0
    return abs(float(s) - value) <= 0.5 * 10 ** -decimals + 1e-9


def main(argv=None) -> int:
    texts = pages()
    bad = 0
    for q in QUANTITIES:
        v = q.compute()
        found = statements(q, texts)
        wrong = [(p, s) for p, s in found if not agrees(s, v)]
        bad += len(wrong)
        print(f"{q.name} = {v:.4g}  ({q.source}); stated {len(found)}x: "
              + ", ".join(sorted({p for p, _ in found}))
              + "".join(f"\n    DIFFERS: {p} says {s}" for p, s in wrong))
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
