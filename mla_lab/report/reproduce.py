"""One H200 run against the rows committed before it: how far a re-measurement moves the between-process figures.

The 2026-12-02 ``mla-lab measure`` run (``data/measured/h200/runs/2026-12-02T0834_measure/``) replaced the rows under
:data:`BETWEEN`; :func:`compare` reads the previous ones (``git show <OLD_COMMIT>:<path>``; RuntimeError in a shallow
clone) and gives per file of :data:`FILES`, over the keys both runs measured, the % change of the median over
processes of the per-process medians. ``--update-docs`` writes the block of docs/perf-notes.md.
"""

from __future__ import annotations

import io
import subprocess

import pandas as pd

from ..paths import REPO_ROOT
from .blocks import block_main

__all__ = ["lease_pr_change", "OLD_COMMIT", "FILES", "SMALL_MS", "BEGIN", "END", "compare", "largest", "small_ops", "render_markdown", "main"]

#: The tree before the adopted run (main at 6a7dec2, 2026-12-02): the between-process rows as committed there.
OLD_COMMIT = "6a7dec28895d"
BETWEEN = "data/measured/h200/between_process/"
#: strategies.csv came from a third call the same day (``mla-lab measure --experiments attention_strategies`` at
#: 6a7dec2, all five strategies: ``data/measured/h200/runs/2026-12-02T0900_strategies/``); the 0834 run's own
#: rows there measured 2 of the 5 and stay in its run folder.
STRATEGIES_RUN = "data/measured/h200/runs/2026-12-02T0900_strategies/"
#: file -> (value column, key columns); concat_round4 compares its ``main`` series only.
FILES: dict[str, tuple[str, list[str]]] = {
    "cold_start.csv": ("steady_gpu_ms", ["what"]),
    "step_spread.csv": ("gpu_ms", ["what"]),
    "presets.csv": ("ms", ["shape", "strategy", "kernel_backend", "concat_backend"]),
    "subgraph.csv": ("ms", ["shape", "variant"]),
    "strategies.csv": ("ms", ["shape", "strategy"]),
    "routes.csv": ("ms", ["model", "num_heads", "prompt_len", "num_prompts", "T", "route", "sdpa_backend",
                          "v_padded", "exact_topk"]),
    "moe_decode.csv": ("ms", ["model", "ep", "T", "pairs", "experts_hit", "local_experts", "impl", "timing"]),
    "content_loop.csv": ("step_ms", ["content", "layers", "T", "num_heads"]),
    "concat_ceiling.csv": ("us", ["T", "num_heads", "padded_heads", "method", "timer"]),
    "concat_round4.csv": ("us", ["T", "H", "Hp", "dtype", "method", "variant", "config", "timer"]),
    "fused_bmm.csv": ("us", ["model", "T", "H", "Hp", "d_nope", "method", "timer"]),
    "engine_kernels.csv": ("ms", ["experiment", "shape", "kernel", "kernel_backend", "T", "H", "h_q", "topk",
                                  "ctx_len", "num_splits"]),
}
#: Below this time (ms, the old run's best process) an operation is launch-bound on the H200 (a few kernels of tens of microseconds).
SMALL_MS = 0.2
BEGIN = "<!-- reproduce:begin (python -m mla_lab.report.reproduce --update-docs) -->"
END = "<!-- reproduce:end -->"


#: The 0834 run's own strategies rows (2 of the 5 strategies, the first lease of the day).
FIRST_LEASE_STRATEGIES = "data/measured/h200/runs/2026-12-02T0834_measure/between_process/strategies.csv"


def lease_pr_change() -> dict:
    """The PR's attention path (``private_workspace``) against the pre-PR pad (``per_call_empty:zeros``) at the
    seed on two leases the same day: ``{"first", "second"}`` in % (median over 5 processes of the per-process
    medians; :data:`FIRST_LEASE_STRATEGIES` and the committed ``between_process/strategies.csv``)."""
    out = {}
    for name, path in (("first", FIRST_LEASE_STRATEGIES), ("second", BETWEEN + "strategies.csv")):
        d = pd.read_csv(REPO_ROOT / path)
        d = d[d["shape"] == "seed"]
        m = d.groupby(["strategy", "process"])["ms"].median().groupby("strategy").median()
        out[name] = float(100 * (m["private_workspace"] / m["per_call_empty:zeros"] - 1))
    return out


def _old(name: str) -> pd.DataFrame:
    path = BETWEEN + name
    r = subprocess.run(["git", "show", f"{OLD_COMMIT}:{path}"], cwd=REPO_ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git show {OLD_COMMIT}:{path} failed ({r.stderr.strip()}); the comparison needs the "
                           "repository's history (not a shallow clone)")
    return pd.read_csv(io.StringIO(r.stdout))


def _new(name: str) -> pd.DataFrame:
    return pd.read_csv(REPO_ROOT / BETWEEN / name)


def _per_key(d: pd.DataFrame, value: str, keys: list[str]) -> pd.DataFrame:
    """Per key: median, min and max over processes of the per-process medians of ``value``."""
    if "series" in d:
        d = d[d["series"] == "main"]
    d = d.dropna(subset=[value])
    per = d.groupby(keys + ["process"], dropna=False)[value].median().groupby(level=list(range(len(keys))),
                                                                               dropna=False)
    return pd.DataFrame({"median": per.median(), "min": per.min(), "max": per.max()})


def _joined(name: str) -> pd.DataFrame:
    value, keys = FILES[name]
    new, old = _per_key(_new(name), value, keys), _per_key(_old(name), value, keys)
    return new.add_suffix("_new").join(old.add_suffix("_old"), how="inner")


def compare() -> list[dict]:
    """Per file of :data:`FILES`: ``file``, ``keys`` (compared), ``keys_new``, ``median`` / ``p10`` / ``p90`` /
    ``max_abs`` of the % change of the per-key median."""
    out = []
    for name, (value, keys) in FILES.items():
        j = _joined(name)
        r = 100 * (j["median_new"] / j["median_old"] - 1)
        out.append({"file": name, "keys": len(j), "keys_new": len(_per_key(_new(name), value, keys)),
                    "median": float(r.median()), "p10": float(r.quantile(0.1)), "p90": float(r.quantile(0.9)),
                    "max_abs": float(r.abs().max())})
    return out


def largest(name: str) -> dict:
    """The key of ``name`` whose median moved most: ``key``, ``old`` / ``new`` medians with their ``_min`` /
    ``_max`` over processes, ``change`` (%)."""
    j = _joined(name)
    r = 100 * (j["median_new"] / j["median_old"] - 1)
    pos = int(r.abs().to_numpy().argmax())
    row, k = j.iloc[pos], j.index[pos]
    names = list(j.index.names)
    varying = [i for i, n in enumerate(names) if j.index.get_level_values(n).nunique(dropna=False) > 1]
    key = k if isinstance(k, tuple) else (k,)
    return {"key": " / ".join(str(key[i]) for i in varying if pd.notna(key[i])), "old": float(row["median_old"]),
            "new": float(row["median_new"]), "old_min": float(row["min_old"]), "old_max": float(row["max_old"]),
            "new_min": float(row["min_new"]), "new_max": float(row["max_new"]), "change": float(r.iloc[pos])}


def small_ops(name: str = "routes.csv") -> dict:
    """The launch-bound keys of ``name`` (the old run's best process under :data:`SMALL_MS` ms): ``n``, ``routes``
    (their ``route`` values), ``below_old_min`` (new median under the old run's smallest per-process median),
    ``median`` (their % change), ``min_ratio_median`` (% change of the per-key minimum over processes: the best
    process of each run)."""
    j = _joined(name)
    j = j[j["min_old"] < SMALL_MS]
    return {"n": len(j), "routes": sorted(set(j.index.get_level_values("route"))),
            "below_old_min": int((j["median_new"] < j["min_old"]).sum()),
            "median": float((100 * (j["median_new"] / j["median_old"] - 1)).median()),
            "min_ratio_median": float((100 * (j["min_new"] / j["min_old"] - 1)).median())}


def render_markdown() -> str:
    rows = compare()
    lines = [f"Rows of the 2026-12-02 run against the rows as committed at {OLD_COMMIT} (`git show "
             f"{OLD_COMMIT}:<file>`; strategies.csv from a third call the same day, `{STRATEGIES_RUN}`): per key, the median over the 5 processes of the per-process medians; new / old - 1 "
             "over the keys both runs measured (`mla_lab.report.reproduce`).", "",
             "| file | keys compared | median change | p10 | p90 | max abs |", "|---|---|---|---|---|---|"]
    for r in rows:
        keys = f"{r['keys']}" if r["keys"] == r["keys_new"] else f"{r['keys']} of {r['keys_new']}"
        lines.append(f"| {r['file']} | {keys} | {r['median']:+.1f} % | {r['p10']:+.1f} % | {r['p90']:+.1f} % | "
                     f"{r['max_abs']:.1f} % |")
    lines += ["", "Where the largest change of each file sits (median [min, max] over processes, old -> new):", ""]
    for r in rows:
        g = largest(r["file"])
        unit = "us" if FILES[r["file"]][0] == "us" else "ms"
        lines.append(f"- {r['file']}: {g['key']}: {g['old']:.3f} [{g['old_min']:.3f}, {g['old_max']:.3f}] -> "
                     f"{g['new']:.3f} [{g['new_min']:.3f}, {g['new_max']:.3f}] {unit} ({g['change']:+.1f} %)")
    s = small_ops()
    lines += ["", f"routes.csv's launch-bound operations (the old run's best process under {SMALL_MS} ms; routes "
              f"{', '.join(s['routes'])}): {s['n']} keys, median change {s['median']:+.1f} %; {s['below_old_min']} of "
              f"{s['n']} new medians lie below the old run's smallest per-process median, while their per-key minima "
              f"over processes moved {s['min_ratio_median']:+.1f} % (median)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    return block_main(argv, __spec__.name, REPO_ROOT / "docs" / "perf-notes.md", BEGIN, END, render_markdown,
                      "reproduce")


if __name__ == "__main__":
    raise SystemExit(main())

