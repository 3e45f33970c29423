"""docs/perf-notes.md's reproduction block: the 2026-12-02 run against the rows committed before it
(``mla_lab.report.reproduce``), recomputed from the committed files and git."""

import io
import json
import subprocess

import pandas as pd
import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.placement import TIMED_STRATEGIES
from mla_lab.report import reproduce


def _have_old() -> bool:
    r = subprocess.run(["git", "cat-file", "-e", f"{reproduce.OLD_COMMIT}^{{commit}}"], cwd=REPO_ROOT,
                       capture_output=True)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(not _have_old(), reason=f"commit {reproduce.OLD_COMMIT} is not in this clone "
                                "(shallow): the old rows are read from git")


def test_perf_notes_block_is_current():
    text = (REPO_ROOT / "docs" / "perf-notes.md").read_text()
    block = text[text.index(reproduce.BEGIN) + len(reproduce.BEGIN):text.index(reproduce.END)].strip()
    assert block == reproduce.render_markdown().strip()


def test_routes_change_recomputed_by_hand():
    """The routes row, recomputed without the module: per-process medians, median over processes, new / old - 1."""
    path = "data/measured/h200/between_process/routes.csv"
    old = pd.read_csv(io.StringIO(subprocess.run(["git", "show", f"{reproduce.OLD_COMMIT}:{path}"], cwd=REPO_ROOT,
                                                 capture_output=True, text=True, check=True).stdout))
    new = pd.read_csv(REPO_ROOT / path)
    keys = ["model", "prompt_len", "route", "sdpa_backend", "v_padded", "exact_topk"]

    def med(d):
        return d.groupby(keys + ["process"], dropna=False)["ms"].median().groupby(level=list(range(len(keys))),
                                                                                  dropna=False).median()
    a, b = med(new), med(old)
    change = 100 * (a / b - 1)
    row = next(r for r in reproduce.compare() if r["file"] == "routes.csv")
    assert row["keys"] == len(change) == 90
    assert row["median"] == pytest.approx(change.median(), abs=1e-9)
    assert row["max_abs"] == pytest.approx(change.abs().max(), abs=1e-9)
    # the launch-bound ops moved by more than the heavy ones, and mostly downwards
    s = reproduce.small_ops()
    assert s["median"] < row["median"] < 0 and s["below_old_min"] > 0


def test_the_kept_files_are_the_old_ones():
    """The density series of concat_round4.csv is the rows committed before the run; strategies.csv is the third
    call's (all five strategies, 5 processes, its run record beside it)."""
    st = pd.read_csv(REPO_ROOT / "data/measured/h200/between_process/strategies.csv")
    rec = json.loads((REPO_ROOT / reproduce.STRATEGIES_RUN / "provenance.json").read_text())
    assert set(st["git_commit"]) == {rec["provenance"]["git_commit"]} and sorted(set(st["process"])) == [1, 2, 3, 4, 5]
    assert set(st["strategy"]) == set(TIMED_STRATEGIES) and rec["experiments"]["attention_strategies"]["exit"] == [0] * 5
    for path, sel in (("data/measured/h200/between_process/concat_round4.csv", "density"),):
        old = pd.read_csv(io.StringIO(subprocess.run(["git", "show", f"{reproduce.OLD_COMMIT}:{path}"],
                                                     cwd=REPO_ROOT, capture_output=True, text=True,
                                                     check=True).stdout))
        new = pd.read_csv(REPO_ROOT / path)
        if sel:
            old, new = old[old["series"] == sel], new[new["series"] == sel]
            assert len(new) == 120
        pd.testing.assert_frame_equal(old.reset_index(drop=True), new.reset_index(drop=True))


def test_the_two_leases_strategies_figures_in_perf_notes():
    """docs/perf-notes.md's between-lease sentence, recomputed from the 0834 run's strategies rows and the committed
    (0900) file: median over processes of the per-process medians, seed shape."""
    def med(path):
        d = pd.read_csv(REPO_ROOT / path)
        return d.groupby(["shape", "strategy", "process"])["ms"].median().groupby(["shape", "strategy"]).median()

    a = med("data/measured/h200/runs/2026-12-02T0834_measure/between_process/strategies.csv")
    b = med("data/measured/h200/between_process/strategies.csv")
    ch = (100 * (b[a.index] / a - 1)).round(1)
    pr = lambda m: 100 * (m["seed", "private_workspace"] / m["seed", "per_call_empty:zeros"] - 1)  # noqa: E731
    text = " ".join((REPO_ROOT / "docs/perf-notes.md").read_text().split())
    assert (f"by +{ch.min():.1f} to +{ch.max():.1f} % (seed `private_workspace` {a['seed', 'private_workspace']:.3f} ms "
            f"at 0834, {b['seed', 'private_workspace']:.3f} ms at 0900; the PR's path against the pre-PR pad at the "
            f"seed: {pr(a):.1f} % at 0834, {pr(b):.1f} % at 0900)") in text
