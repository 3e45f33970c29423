"""No figure is stated twice with different values in the published report (issue 31).

Reads the committed report ``reports/h200/padding_sweep_h200.html`` (and README.md's generated answer block), turns
every table cell that states a figure into a :class:`Figure` with a FIGURE KEY, and fails when one key carries two
values that no single true value could display as (each displayed value ``v`` with ``p`` decimals stands for the
interval ``v +- 0.5 * 10**-p``; two cells agree when their intervals overlap, so ``-1.05`` and ``-1.1`` agree,
``-1.1`` and ``-1.6`` do not).

What counts as the same figure (the key):

- the quantity and its unit (``TTFT change %``, ``mean TTFT ms``, ``persistent extra MiB``, ``KV tokens lost``,
  ``call transient MiB``, ``total token throughput change %``, ``kernel ms``, a validation metric, a figure the PR
  reported);
- the deployment it is for: model geometry, TP, GPU, max_num_batched_tokens, prompt length, KV-cache dtype,
  num_prompts (the seed, :meth:`mla_lab.deployment.Deployment.seed`, spelled out);
- the strategy and, for a change, what it is against;
- whether it is ``modelled``, ``measured`` or ``reported`` (by the PR) - different figures, never compared;
- for a modelled TTFT, which model: the TTFT model (the glossary's "modelled": the lab's cost model, so an
  unqualified "modelled" is this one) or the serving simulation (``vllm bench serve``, always labelled so); and the
  all-reduce term it was priced with (the committed calibration unless the row names another);
- for a measured figure, its basis as the label states it (``5 fresh processes``, ``one process, 11 interleaved
  runs``). A label that says only "measured" states no basis, and is compared with every measured figure of that key
  (a reader cannot tell it apart from them, and the glossary defines "measured" as the between-process figure);
- for a validation figure: the run, its workload as the table labels it (in / out, concurrency, num_prompts when a
  column states it), backend, metric, and whether it is the blind prediction or the post-hoc one.

What is not the same figure, and must be labelled apart (the reader of this test compares them as the labels say):
a graph-timing vs an eager figure, per-rank vs slowest-rank, measured vs modelled, one engine version vs another,
different workloads. Free prose is not read except the answer block (its sentences are parsed by the patterns in
:data:`ANSWER_PATTERNS`, which must all match) and the kernel_native note's kernel times; the figures (PNG/SVG), the
advice code block and the bullet lists are not read. Every table on the page is either read by a reader below or
listed in :data:`UNREAD_TABLES` with the reason none of its cells is stated elsewhere.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pytest

bs4 = pytest.importorskip("bs4", reason="beautifulsoup4 (the lab extra) reads the report's HTML tables")

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "reports" / "h200" / "padding_sweep_h200.html"
METADATA = REPO / "reports" / "h200" / "run_metadata.json"
README = REPO / "README.md"

NUM = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")

# ------------------------------------------------------------------------------------------------ figure records


@dataclass(frozen=True)
class Figure:
    key: tuple          # the quantity, deployment, strategy, against, kind, model / all-reduce term
    basis: str | None   # measured: the basis the label states (None: unstated, compared with every basis)
    value: float
    decimals: int       # displayed precision
    shown: str          # the cell as displayed
    where: str          # page, table, row, column

    def interval(self) -> tuple[float, float]:
        h = 0.5 * 10.0 ** -self.decimals
        return self.value - h, self.value + h


def number(text: str) -> tuple[float, int] | None:
    """The first number of a cell and its displayed decimals (None: no number)."""
    m = NUM.search(text)
    if not m:
        return None
    s = m.group(0).replace(",", "")
    return float(s), (len(s.split(".")[1]) if "." in s else 0)


def conflicts(figures: list[Figure]) -> list[str]:
    """One line per pair of figures with one key whose displayed values no single true value explains."""
    by_key: dict[tuple, list[Figure]] = {}
    for f in figures:
        by_key.setdefault(f.key, []).append(f)
    out = []
    for key, fs in by_key.items():
        for a, b in combinations(fs, 2):
            if a.basis and b.basis and a.basis != b.basis:
                continue  # two measurements the labels tell apart
            (alo, ahi), (blo, bhi) = a.interval(), b.interval()
            if ahi + 1e-9 < blo or bhi + 1e-9 < alo:
                out.append(f"{key}: {a.shown!r} ({a.basis or 'basis unstated'}) at {a.where}  vs  {b.shown!r} "
                           f"({b.basis or 'basis unstated'}) at {b.where}")
    return sorted(set(out))


# ------------------------------------------------------------------------------------------------ deployments


def seed(model: str) -> tuple:
    """The PR's deployment for one model geometry, as a key (model, tp, arch, mbt, prompt_len, kv, num_prompts)."""
    from mla_lab.deployment import Deployment

    d = Deployment.seed(model=model)
    return (d.model.name, d.tp, d.arch.name, d.max_num_batched_tokens, d.prompt_len, d.kv_cache_dtype,
            d.workload.num_prompts)


DESCRIBE = re.compile(r"(?P<model>\S+) TP(?P<tp>\d+) (?P<arch>\w+), max_num_batched_tokens (?P<mbt>\d+), "
                      r"(?P<kv>\w+) KV, .*?(?P<n>\d+) x (?P<L>\d+)-token prompts")


def described(text: str) -> tuple | None:
    """A deployment from :meth:`mla_lab.deployment.Deployment.describe`'s line."""
    m = DESCRIBE.search(text)
    return None if not m else (m["model"], int(m["tp"]), m["arch"], int(m["mbt"]), int(m["L"]), m["kv"], int(m["n"]))


def modelled_how(label: str) -> str:
    """Which model a modelled TTFT is from: the serving simulation if the label says so, else the TTFT model."""
    return "serving simulation" if re.search(r"vllm bench serve|simulation", label, re.I) else "TTFT model"


def measured_basis(label: str) -> str | None:
    """The basis a measured label states (None: unstated)."""
    m = re.search(r"(\d+) fresh processes", label)
    if m:
        return f"{m.group(1)} fresh processes"
    m = re.search(r"one process(?:, (\d+) interleaved runs)?", label)
    if m:
        return "one process" + (f", {m.group(1)} interleaved runs" if m.group(1) else "")
    return None


def change(dep, strategy, against, kind, how=None, comm="committed calibration") -> tuple:
    return ("TTFT change %", dep, strategy, against, kind, how if kind == "modelled" else None, comm)


# ------------------------------------------------------------------------------------------------ page reading


def cells(table) -> tuple[list[str], list[list[str]]]:
    rows = [[c.get_text(" ", strip=True) for c in tr.find_all(["th", "td"])] for tr in table.find_all("tr")]
    return (rows[0], rows[1:]) if rows else ([], [])


def heading(node) -> str:
    h = node.find_previous(["h2", "h3", "h4"])
    return h.get_text(" ", strip=True).rstrip("¶") if h else "?"


def preceding_text(node, tag="strong") -> str:
    s = node.find_previous(tag)
    return s.get_text(" ", strip=True) if s else ""


class Reader:
    """Turns one page's tables into figures; ``read`` names the tables it read."""

    def __init__(self, page: str, soup, num_prompts: int):
        self.page, self.soup, self.num_prompts = page, soup, num_prompts
        self.figures: list[Figure] = []
        self.unread: list[str] = []

    def add(self, key, text, where, basis=None, value=None):
        n = number(text) if value is None else value
        if n is not None:
            self.figures.append(Figure(key, basis, n[0], n[1], text, f"{self.page} / {where}"))

    def read(self):
        from mla_lab.placement import BASELINE, PR_STRATEGY, SEED_COMPARISONS

        comparisons = {label: (s, a) for label, s, a in SEED_COMPARISONS}
        for i, t in enumerate(self.soup.find_all("table")):
            head, rows = cells(t)
            where = f"table {i} ({heading(t)})"
            if head[:2] == ["model geometry", "comparison"]:
                self.seed_answer(head, rows, where, comparisons, PR_STRATEGY)
            elif head[:2] == ["quantity", "PR #53878 (reported)"]:
                self.seed_setup(head, rows, where, BASELINE, PR_STRATEGY)
            elif "comm term" in head:
                self.comm(head, rows, where, BASELINE, PR_STRATEGY)
            elif {"strategy", "ttft_ms", "model", "arch", "prompt_len"} <= set(head):
                self.summary(t, head, rows, where, BASELINE)
            elif head and head[0].startswith("metric (vllm bench serve"):
                self.serving(t, head, rows, where)
            elif head[:2] == ["metric", "lab's prediction [single-run 95 % band]"]:
                for r in rows:
                    self.add(("PR main run", r[0], "lab, blind"), r[1], f"{where} / {r[0]}")
                    self.add(("PR main run", r[0], "real"), r[2], f"{where} / {r[0]}")
            elif head[:1] == ["run"] and "backend" in head:
                self.validation(t, head, rows, where)
            elif head[:2] == ["runs", "metric"]:
                for r in rows:
                    band = [float(x) for x in NUM.findall(r[4])]
                    half = max(abs(x) for x in band)
                    self.add(("real repeats", r[1], "lab's A vs A' band, +- %"), f"{half:.1f}", f"{where} / {r[1]}")
                    self.add(("real repeats", r[1], "largest change between two %"), r[3], f"{where} / {r[1]}")
            else:
                self.unread.append(" | ".join(head[:4]))
        return self

    def seed_answer(self, head, rows, where, comparisons, pr):
        for r in rows:
            row = dict(zip(head, r))
            dep, (s, a) = seed(row["model geometry"]), comparisons[row["comparison"]]
            w = f"{where} / {row['model geometry']}, {row['comparison']}"
            for col, v in row.items():
                if col.startswith("TTFT, modelled"):
                    self.add(change(dep, s, a, "modelled", modelled_how(col)), v, f"{w} / {col}")
                elif col.startswith("TTFT, attention path measured"):
                    self.add(change(dep, s, a, "measured"), v, f"{w} / {col}", measured_basis(col + " " + v))
                elif col.startswith("persistent extra MiB"):
                    x, y = v.split("/")
                    self.add(("persistent extra MiB", dep, s, "modelled"), x, f"{w} / {col}")
                    self.add(("persistent extra MiB", dep, a, "modelled"), y, f"{w} / {col}")
                elif col.startswith("call transient MiB"):
                    x, y = v.split("/")
                    self.add(("call transient MiB", dep, s, "modelled"), x, f"{w} / {col}")
                    self.add(("call transient MiB", dep, a, "modelled"), y, f"{w} / {col}")
                elif col.startswith("PR #53878 reported") and v != "-":
                    self.add(("PR #53878 reported", "TTFT change %"), v, f"{w} / {col}")
                    m = re.search(r"\+(\d+) MiB peak", v)
                    self.add(("PR #53878 reported", "extra peak MiB"), m.group(1), f"{w} / {col}")

    def seed_setup(self, head, rows, where, base, pr):
        by = {r[0]: dict(zip(head, r)) for r in rows}
        model = re.match(r"(\S+) geometry", by["setup"]["ours (modelled)"]).group(1).lower()
        dep = seed(model)
        for label, row in by.items():
            w = f"{where} / {label}"
            if label.startswith("TTFT change, vLLM #53878 vs vLLM before it (zero padded heads)"):
                s, a = pr, base
            elif label.startswith("TTFT change, kernel_native"):
                s, a = "kernel_native", base
                self.kernel_note(row["note"], w)
            else:
                s = a = None
            if s:
                self.add(("PR #53878 reported", "TTFT change %"), row["PR #53878 (reported)"], w) if s == pr else None
                self.add(change(dep, s, a, "modelled", modelled_how(row["note"].split(";")[0])),
                         row["ours (modelled)"], f"{w} / ours (modelled)")
                self.add(change(dep, s, a, "measured"), row["ours (measured)"], f"{w} / ours (measured)",
                         measured_basis(row["ours (measured)"]))
            elif label == "extra memory per GPU":
                self.add(("PR #53878 reported", "extra peak MiB"), row["PR #53878 (reported)"], w)
                self.add(("persistent extra MiB", dep, pr, "modelled"), row["ours (modelled)"], w)
            elif label == "total token throughput":
                self.add(("PR #53878 reported", "total token throughput change %"), row["PR #53878 (reported)"], w)
                how = modelled_how(row["note"])
                self.add(("total token throughput change %", dep, pr, base, "modelled", how, "committed calibration"),
                         row["ours (modelled)"], w)

    KERNELS = (("FlashMLA, h_q 8 (no padding)", r"h_q = 8 measured (\d+\.\d+) ms"),
               ("FlashMLA padded to 64 heads", r"padded to 64 heads \((\d+\.\d+) ms\)"),
               ("FA3 sparse", r"FA3 sparse (\d+\.\d+) ms"), ("top-k gather only", r"gather alone (\d+\.\d+) ms"))

    def kernel_note(self, note, where):
        for name, pat in self.KERNELS:
            m = re.search(pat, note)
            assert m, f"the kernel_native note no longer states {name} as {pat!r}: {note}"
            self.add(("kernel ms, seed step", name, "measured"), m.group(1), f"{where} / note",
                     measured_basis(note))

    def comm(self, head, rows, where, base, pr):
        for r in rows:
            row = dict(zip(head, r))
            dep, term = seed(row["model"]), row["comm term"]
            w = f"{where} / {row['model']}, {term}"
            self.add(("mean TTFT ms", dep, base, "modelled", "TTFT model", term), row["TTFT before the PR ms"], w)
            for col, v in row.items():
                m = re.match(r"PR vs before, (zeros|stale), (modelled|attention measured)(?: \([^)]*\))? %", col)
                if m:
                    kind = "modelled" if m.group(2) == "modelled" else "measured"
                    self.add(change(dep, pr, f"per_call_empty:{m.group(1)}", kind, modelled_how(col), term), v,
                             f"{w} / {col}", measured_basis(col) if kind == "measured" else None)

    def summary(self, t, head, rows, where, base):
        cap = t.find("caption")
        if cap is None and t.find_parent("details") is not None:  # the full table folded under its narrow view
            cap = t.find_previous("table").find("caption")
        shared = dict(re.findall(r"(\w+) = ([^,.]+)", cap.get_text(" ", strip=True))) if cap else {}
        for r in rows:
            row = {**shared, **dict(zip(head, r))}
            dep = (row["model"], int(row["tp"]), row["arch"], int(row["max_num_batched_tokens"]), int(row["prompt_len"]),
                   row["kv_cache_dtype"], self.num_prompts)
            src = row.get("source")  # None: the table does not say which (kind unstated)
            scope = row.get("ttft_scope", "")
            kind = src if src in ("modelled", "measured") else "unstated"
            basis = measured_basis(f"{src or ''} {scope}") if kind == "measured" else None
            w = f"{where} / {row['model']} {row['arch']} {row['prompt_len']} {row['strategy']} ({src or 'source not shown'})"
            s = row["strategy"]
            self.add(("mean TTFT ms", dep, s, kind, "TTFT model" if kind == "modelled" else None,
                      "committed calibration"), row["ttft_ms"], f"{w} / ttft_ms", basis)
            if "ttft_change_pct" in row:
                self.add(change(dep, s, base, kind, "TTFT model"), row["ttft_change_pct"], f"{w} / ttft_change_pct",
                         basis)
            self.add(("persistent extra MiB", dep, s, "modelled"), row["extra_persistent_mib"], w)
            self.add(("KV tokens lost", dep, s, "modelled"), row["kv_tokens_lost"], w)

    def serving(self, t, head, rows, where):
        dep = described(preceding_text(t))
        assert dep, f"{where}: no deployment line (Deployment.describe) before the serving table"
        strategies = [c.rsplit(", ", 1)[0] for c in head[1:] if c.endswith(", change %") and "reported" not in c]
        base = strategies[0]  # the serving table's changes are against its first strategy (its change is 0)
        for r in rows:
            row = dict(zip(head, r))
            metric = row[head[0]]
            qty = {"Mean TTFT (ms)": "TTFT change %", "Total token throughput (tok/s)":
                   "total token throughput change %"}.get(metric)
            if qty is None:
                continue
            for s in strategies:
                key = (qty, dep, s, base, "modelled", modelled_how(head[0]), "committed calibration")
                self.add(key, row[f"{s}, change %"], f"{where} / {metric} / {s}")
            rep = row.get("PR #53878 reported, change %", "")
            if rep:
                self.add(("PR #53878 reported", qty), rep, f"{where} / {metric} / reported")

    def validation(self, t, head, rows, where):
        blind = any(c.startswith("lab (median)") for c in head)
        lab_col = next(c for c in head if c.startswith("lab"))
        metric_of = None if "metric" in head else re.search(r"([A-Za-z ]+TPOT \(ms\)|[A-Za-z ]+TTFT \(ms\))",
                                                             t.find_previous("p").get_text(" ", strip=True))
        wl_col = next(c for c in head if c.startswith("workload"))
        for r in rows:
            row = dict(zip(head, r))
            metric = (row["metric"] if "metric" in row else metric_of.group(1)).strip().lower()
            wl = row[wl_col]  # as the table labels it (a post-hoc row names the run's num_prompts)
            k = ("validation", row["run"], wl, row["backend"], metric)
            how = "blind" if blind else ("post-hoc" if "post-hoc" in lab_col else None)  # None: unstated
            self.add(k + ("lab",), row[lab_col], f"{where} / {row['run']} {wl} {row['backend']} / {lab_col}", how)
            self.add(k + ("real",), row["real"], f"{where} / {row['run']} {wl} {row['backend']} / real")


#: Tables whose cells no other table or the answer block states, by their first header cells, and why.
UNREAD_TABLES = {
    "TTFT of the last request (s) | TPOT (ms)": "pairs consistent with the main run's duration (derived, shown once)",
    "component | lab, ms per step | status | alternative": "the main run's gap decomposition (shown once)",
    "workload | lab [95 % band] | real": "FA3 vs FLASHMLA change per workload (the answer states only its range)",
    "run | level | op_class | split": "validation MAPE of the TTFT model (shown once)",
    "TP | measured | files | ranks": "which TP sizes were measured (status, no figure stated elsewhere)",
    "TP | model | T | block": "per-rank TP timings: the narrow view and its full table are compared by test_measure_tp",
    "TP | priced by | latency_us | bw_gbps": "the all-reduce fit per TP (shown once)",
    "model | tp | arch | max_num_batched_tokens": "deployments that do not fit (status and reason, no figure)",
    "num_heads | padded_heads | strategies | max_abs_diff_out": "the equivalence check (shown once)",
    "component | status | seconds in this run | what the sources allow (s)": "the first token's gap by component "
    "(shown once; the answer states none of its cells)",
    "run | workload (in / out) | not modelled (priced at the nearest configuration) | metric": "blind round two per "
    "run (the answer states only the medians, computed from the same score file)",
}

# ------------------------------------------------------------------------------------------------ the answer block

#: (pattern, figures): each named group of each pattern becomes one figure of the answer block.
ANSWER_PATTERNS = [
    (r"What PR #53878 bought, as it was \((?P<m>GLM-[\d.]+) TP8 .*?Modelled: mean TTFT \(time to first "
     r"token\) (?P<was>[-+]\d+\.\d) % \(GLM-5: (?P<was5>[-+]\d+\.\d) %\) for (?P<mib>[-+]\d+) MiB .*?with the "
     r"attention path measured on one H200 \((?P<basis>\d+ fresh processes), rest modelled(?:, (?P<mm>GLM-[\d.]+))?\) "
     r"(?P<meas>[-+]\d+\.\d) %", "was"),
    (r"predicted the PR's own 'main' run, blind, at (?P<pred>\d+\.\d+) s; the run took (?P<real>\d+\.\d+) s", "main"),
    (r"differ by up to (?P<ttft>\d+) % in mean TTFT and (?P<tput>\d+\.\d) % in throughput, against the lab's "
     r"\+-(?P<bt>\d+\.\d) % and \+-(?P<bp>\d+\.\d) %", "repeats"),
    (r"FA3 sparse (?P<fa3>\d+\.\d+) ms against FlashMLA padded to 64 heads (?P<pad>\d+\.\d+) ms .*?FlashMLA's own "
     r"8-head path (?P<native>\d+\.\d+) ms .*?top-k rows takes (?P<gather>\d+\.\d+) ms", "kernels"),
    (r"dense MHA .*? is modelled at (?P<d>[-+]\d+\.\d) % TTFT against the PR's path \(GLM-5: (?P<d5>[-+]\d+\.\d) %[;)]",
     "dense"),
    (r"costs (?P<mib>\d+) MiB per rank at max_num_batched_tokens 16384 \((?P<lost>[\d,]+) KV tokens at GLM-5 TP8\)",
     "memory"),
]


def answer_figures(text: str, page: str) -> list[Figure]:
    """The figures the answer block states, keyed as the tables' (every pattern must match)."""
    from mla_lab.placement import BASELINE, PR_STRATEGY, SEED_COMPARISONS

    dense = next(s for _, s, _ in SEED_COMPARISONS if "dense" in s)
    text = " ".join(text.replace("**", "").split())  # README's markdown or the report's rendered text
    out: list[Figure] = []

    def add(key, s, what, basis=None):
        v, d = number(s)
        out.append(Figure(key, basis, v, d, s, f"{page} / answer block / {what}"))

    for pat, name in ANSWER_PATTERNS:
        m = re.search(pat, text)
        assert m, f"{page}: the answer block no longer has its '{name}' sentence in the form {pat!r}"
        g = m.groupdict()
        if name == "was":
            main, g5 = seed(g["m"].lower()), seed("glm-5")
            add(change(main, PR_STRATEGY, BASELINE, "modelled", "TTFT model"), g["was"], "modelled TTFT change")
            add(change(g5, PR_STRATEGY, BASELINE, "modelled", "TTFT model"), g["was5"], "modelled TTFT change, GLM-5")
            add(("persistent extra MiB", main, PR_STRATEGY, "modelled"), g["mib"], "persistent MiB")
            meas = seed(g["mm"].lower()) if g.get("mm") else main  # the sentence's model unless it names another
            add(change(meas, PR_STRATEGY, BASELINE, "measured"), g["meas"], "measured TTFT change", g["basis"])
        elif name == "main":
            add(("PR main run", "benchmark duration (s)", "lab, blind"), g["pred"], "main run, predicted")
            add(("PR main run", "benchmark duration (s)", "real"), g["real"], "main run, real")
        elif name == "repeats":
            add(("real repeats", "mean TTFT (ms)", "largest change between two %"), g["ttft"], "repeats, TTFT")
            add(("real repeats", "total token throughput (tok/s)", "largest change between two %"), g["tput"],
                "repeats, throughput")
            add(("real repeats", "mean TTFT (ms)", "lab's A vs A' band, +- %"), g["bt"], "repeats, TTFT band")
            add(("real repeats", "total token throughput (tok/s)", "lab's A vs A' band, +- %"), g["bp"],
                "repeats, throughput band")
        elif name == "kernels":
            for k, label in (("fa3", "FA3 sparse"), ("pad", "FlashMLA padded to 64 heads"),
                             ("native", "FlashMLA, h_q 8 (no padding)"), ("gather", "top-k gather only")):
                add(("kernel ms, seed step", label, "measured"), g[k], f"kernel {label}", "5 fresh processes")
        elif name == "dense":
            add(change(seed("glm-5.2"), dense, PR_STRATEGY, "modelled", "TTFT model"), g["d"], "dense route")
            add(change(seed("glm-5"), dense, PR_STRATEGY, "modelled", "TTFT model"), g["d5"], "dense route, GLM-5")
        elif name == "memory":
            add(("persistent extra MiB", seed("glm-5"), PR_STRATEGY, "modelled"), g["mib"], "workspace MiB")
            add(("KV tokens lost", seed("glm-5"), PR_STRATEGY, "modelled"), g["lost"], "KV tokens lost")
    return out


def report_answer_text(soup) -> str:
    h = soup.find(id="1.-The-answer")
    assert h is not None, "the report has no '1. The answer' section"
    cell = h.find_parent(class_="jp-Cell")
    return cell.get_text(" ", strip=True)


def readme_answer_text() -> str:
    from mla_lab.report.answer import BEGIN, END

    text = README.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)]


def figures_of(html: str, page: str, num_prompts: int, with_answer: bool = True) -> tuple[list[Figure], list[str]]:
    soup = bs4.BeautifulSoup(html, "html.parser")
    r = Reader(page, soup, num_prompts).read()
    figs = r.figures + (answer_figures(report_answer_text(soup), page) if with_answer else [])
    return figs, r.unread


# ------------------------------------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def report_figures():
    assert REPORT.is_file(), f"{REPORT.relative_to(REPO)} is committed (mla-lab report --measured h200 --overwrite)"
    n = json.loads(METADATA.read_text())["params"]["num_prompts"]
    figs, unread = figures_of(REPORT.read_text(), REPORT.name, n)
    return figs + answer_figures(readme_answer_text(), README.name), unread


def test_every_table_is_read_or_declared(report_figures):
    figs, unread = report_figures
    undeclared = [u for u in unread if not any(u.startswith(k) or k.startswith(u) for k in UNREAD_TABLES)]
    assert not undeclared, f"tables neither read nor declared in UNREAD_TABLES: {undeclared}"
    assert len(figs) > 300, len(figs)  # the readers did read the report (not an empty page)


def test_shared_keys_are_compared(report_figures):
    """The check compares something: the seed's PR change is stated in >= 4 places, modelled and measured."""
    from mla_lab.placement import BASELINE, PR_STRATEGY

    figs, _ = report_figures
    keys = {}
    for f in figs:
        keys.setdefault(f.key, []).append(f)
    dep = seed("glm-5")
    assert len(keys[change(dep, PR_STRATEGY, BASELINE, "modelled", "TTFT model")]) >= 4
    assert len(keys[change(dep, PR_STRATEGY, BASELINE, "measured")]) >= 3
    assert sum(len(v) > 1 for v in keys.values()) >= 40


def test_no_figure_is_stated_twice_with_different_values(report_figures):
    figs, _ = report_figures
    bad = conflicts(figs)
    assert not bad, f"{len(bad)} figure(s) stated with different values:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------------ self-test

_SYNTH = """<h3>The PR's numbers, answered</h3>
<table><tr><th>model geometry</th><th>comparison</th><th>TTFT, modelled</th>
<th>TTFT, attention path measured (5 fresh processes, [min, max])</th></tr>
<tr><td>glm-5</td><td>vLLM #53878 vs vLLM before it, padded heads zeros</td><td>-2.0 %</td>
<td>-1.1 % [-1.7, -0.9]</td></tr></table>
<table><tr><th>model</th><th>comm term</th><th>priced by</th><th>TTFT before the PR ms</th>
<th>PR vs before, zeros, modelled %</th><th>PR vs before, zeros, attention measured{comm} %</th></tr>
<tr><td>glm-5</td><td>committed calibration</td><td>x</td><td>1076.23</td><td>-2.04</td><td>{measured}</td></tr></table>
<table><tr><th>model</th><th>arch</th><th>prompt_len</th><th>strategy</th><th>ttft_ms</th><th>ttft_change_pct</th>
<th>ttft_scope</th><th>source</th><th>extra_persistent_mib</th><th>kv_tokens_lost</th></tr>
<caption>Every row: tp = 8, kv_cache_dtype = bf16, max_num_batched_tokens = 16384.</caption>
<tr><td>glm-5</td><td>h200</td><td>1024</td><td>private_workspace</td><td>1094.23</td><td>-1.65</td>
<td>full_layer (attention path measured{basis})</td><td>measured</td><td>1008.00</td><td>10554</td></tr></table>"""


@pytest.mark.parametrize("measured, comm, basis, expect", [
    # the summary row's unlabelled -1.65 against the 5-process -1.1 and the comm table's unlabelled -1.05
    ("-1.05", "", "", [("-1.1 % [-1.7, -0.9]", "-1.65"), ("-1.05", "-1.65")]),
    # every measured label states its basis: two figures, each stated once
    ("-1.05", " (5 fresh processes)", ", one process, 11 interleaved runs", []),
    # the comm table's unlabelled -1.05 is compared with the one-process -1.65 too
    ("-1.05", "", ", one process, 11 interleaved runs", [("-1.05", "-1.65")]),
    # the comm table's unlabelled -1.6 against the 5-process -1.1 (it agrees with the one-process -1.65)
    ("-1.6", "", ", one process, 11 interleaved runs", [("-1.1 % [-1.7, -0.9]", "-1.6")]),
])
def test_checker_flags_a_conflicting_pair(measured, comm, basis, expect):
    page = _SYNTH.format(measured=measured, comm=comm, basis=basis)
    figs, _ = figures_of(page, "synthetic", 32, with_answer=False)
    bad = conflicts(figs)
    assert len(bad) == len(expect), bad
    for (a, b), line in zip(sorted(expect), sorted(bad)):
        assert f"{a!r}" in line and f"{b!r}" in line, (a, b, line)


def test_displayed_precision_decides_agreement():
    a = Figure(("k",), None, -1.05, 2, "-1.05", "a")
    assert not conflicts([a, Figure(("k",), None, -1.1, 1, "-1.1", "b")])   # -1.05 can display as -1.1
    assert conflicts([a, Figure(("k",), None, -1.2, 1, "-1.2", "b")])       # it cannot display as -1.2
    b = Figure(("k",), "5 fresh processes", -1.6, 1, "-1.6", "b")
    assert not conflicts([b, Figure(("k",), "one process", -1.0, 1, "-1.0", "c")])  # labelled apart
    assert conflicts([b, Figure(("k",), None, -1.0, 1, "-1.0", "c")])  # basis unstated: compared


def test_report_answer_is_readme_answer():
    """The committed report states README's answer word for word (both come from ``mla_lab.report.answer``): a
    README block updated without re-rendering ``reports/h200`` (mla-lab report --measured h200 --overwrite) fails."""
    def bare(text: str) -> str:  # markdown's markers and all white space out: the words and figures stay
        return re.sub(r"\s+|\*\*|`", "", text)

    soup = bs4.BeautifulSoup(REPORT.read_text(), "html.parser")
    report = bare(report_answer_text(soup))
    readme = bare(readme_answer_text())
    assert readme and readme in report, "reports/h200's answer is not README's: re-render it (mla-lab report " \
                                        "--measured h200 --overwrite)"
