"""TPOT per engine version at concurrency 1, 8, 64 and 256 (issue 29), modelled: the serving simulation with each
version's route rule and decode kernel, GLM-5 TP8 H200 (its FA3 decode validated in docs/serving.md).

    python -m mla_lab.report.engine_serving [--update-docs]    # --update-docs: the table of docs/engines.md
"""

from __future__ import annotations

import sys

from ..deployment import Deployment
from ..paths import REPO_ROOT
from ..placement import engine_strategies
from ..serving import serve_benchmark
from .blocks import block_main

__all__ = ["tpot_by_engine", "table_markdown", "CONCURRENCIES", "ENGINES"]

CONCURRENCIES = (1, 8, 64, 256)
ENGINES = ("vllm@pr53878-before", "vllm@pr53878", "vllm@0.33.0-flashmla", "vllm@0.33.0", "sglang@0.5.23")
BEGIN = "<!-- engine-tpot:begin (python -m mla_lab.report.engine_serving --update-docs) -->"
END = "<!-- engine-tpot:end -->"
DOCS = REPO_ROOT / "docs" / "engines.md"


def tpot_by_engine(model: str = "glm-5", concurrencies=CONCURRENCIES) -> dict:
    """``{engine: {concurrency: mean TPOT ms}}`` (deterministic runs)."""
    strat = {e: engine_strategies(e)[0] for e in ENGINES}
    out = {e: {} for e in ENGINES}
    for c in concurrencies:
        d = Deployment.seed(model=model, num_prompts=max(4, 2 * c), concurrency=c)  # 1024 in / 128 out
        r = serve_benchmark(d, list(dict.fromkeys(strat.values())), baseline=strat[ENGINES[0]])
        for e, s in strat.items():
            out[e][c] = float(r["strategies"][s]["metrics"]["mean_tpot_ms"])
    return out


def table_markdown(t: dict | None = None) -> str:
    t = t or tpot_by_engine()
    cs = list(next(iter(t.values())))
    lines = ["| engine version | " + " | ".join(f"conc {c}" for c in cs) + " |", "|---" * (len(cs) + 1) + "|"]
    lines += [f"| {e} | " + " | ".join(f"{row[c]:.1f}" for c in cs) + " |" for e, row in t.items()]
    return ("Mean TPOT (ms), modelled: GLM-5 TP8, H200, bf16 KV, fp8 weights (EP), 1024 in / 128 out, 2 x concurrency "
            "prompts (`mla_lab.report.engine_serving`).\n\n" + "\n".join(lines))


def main(argv=None) -> int:
    return block_main(argv, __spec__.name, DOCS, BEGIN, END, table_markdown, "engine-tpot")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
