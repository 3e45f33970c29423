"""The validation block of docs/serving.md (issue 30), rendered from the committed validation files only:
``pr53878_main_decomposition.json`` (the PR's main run scored and decomposed), ``blind_2026-12_score.json`` (the
blind set scored, with the real repeats beside the lab's band). Nothing is re-simulated here.

    python -m mla_lab.validation.docs_tables [--update-docs]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..paths import REPO_ROOT
from ..serving.noise import NOISE_METRICS
from . import BLIND_B_SCORE, BLIND_B_WORKLOADS, BLIND_POSTHOC, BLIND_SCORE, PR53878_DECOMPOSITION

BEGIN = "<!-- validation:begin (python -m mla_lab.validation.docs_tables --update-docs) -->"
END = "<!-- validation:end -->"
DOCS = REPO_ROOT / "docs" / "serving.md"
#: metric -> its name in the tables: NOISE_METRICS' label, lower case but for an abbreviation ("P99 TTFT (ms)")
_NAMES = {k: label[0].lower() + label[1:] if label[1].islower() else label for k, label in NOISE_METRICS}


def _wl(w: dict) -> str:
    c = w.get("max_concurrency")
    return f"{w['random_input_len']} / {w['random_output_len']}" + (f", conc {c}" if c else "")


def validation_markdown(dec: dict | None = None, score: dict | None = None) -> str:
    """The block (markdown)."""
    dec = dec or json.loads(PR53878_DECOMPOSITION.read_text())
    score = score or json.loads(BLIND_SCORE.read_text())
    out = ["### The PR's main run, scored (validation, not a fit)", "",
           f"The lab's prediction (`{dec['prediction_file']}`, committed before the run was read) against the run "
           f"({dec['real']['source']}):", "",
           "| metric | lab's prediction [single-run 95 % band] | the real run | ratio |", "|---|---|---|---|"]
    for s in dec["score"]:
        lo, hi = s["band95"]
        out.append(f"| {_NAMES[s['metric']]} | {s['predicted']:.2f} [{lo:.2f}, {hi:.2f}] | {s['real']:.2f} | "
                   f"{s['ratio_predicted_over_real']:.2f} |")
    out += ["", f"The gap: {dec['gap_s']:.2f} s. The run ends when the last request's 128th token arrives, so "
            "duration ~ TTFT of the last request + 127 x its TPOT. Pairs consistent with the run's "
            f"{dec['real']['duration']:.2f} s (the lab's own: TTFT_last {dec['lab_ttft_last_s']:.2f} s, TPOT "
            f"{dec['lab_tpot_ms']:.1f} ms):", "", "| TTFT of the last request (s) | TPOT (ms) |", "|---|---|"]
    out += [f"| {p['ttft_last_s']:.2f} | {p['tpot_ms']:.1f} |" for p in dec["consistent_pairs"]]
    out += ["", "Candidates for the missing time (the lab's decode step of the run: 32 tokens, 1088-key contexts, "
            f"{dec['decode_step_graph_ms']:.1f} ms as one CUDA graph, {dec['decode_step_eager_ms']:.1f} ms launched "
            "eagerly):", "", "| component | lab, ms per step | status | alternative | closes (s) | share of the gap |",
            "|---|---|---|---|---|---|"]
    for c in dec["components"]:
        lab = "-" if c["lab_ms_per_step"] is None else f"{c['lab_ms_per_step']:.2f}"
        closes = "-" if c["closes_s"] is None else f"{c['closes_s']:.2f}"
        share = "-" if c["share_of_gap"] is None else f"{100 * c['share_of_gap']:.0f} %"
        out.append(f"| {c['component']} | {lab} | {c['status']} | {c['alternative'] or '-'} | {closes} | {share} |")
    r = dec["revised"]
    out += ["", f"Revised (in-sample: made after the run was read): the lab's deterministic run today gives "
            f"{r['duration']:.2f} s, {r['output_throughput']:.0f} output tok/s, mean TPOT {r['mean_tpot_ms']:.1f} ms. "
            "No candidate the lab can price closes the gap; a decode step launched eagerly would close most of it, "
            "but the engine's code says decode ran as one CUDA graph, so the gap stays unexplained and is "
            "published as a miss.", ""]
    out += _first_token_lines(dec) + ["### The blind set", "", score["sentence"] + ".", ""] + _round_two_lines() + [
        "| run | workload (in / out) | backend | metric | lab (median) [95 % band] | real | error |", "|---|---|---|---|---|---|---|"]
    for row in [x for x in score["rows"] if x["comparable"]]:
        lo, hi = row["band95"]
        out.append(f"| {row['case']} | {_wl(row['workload'])} | {row['backend']} | {_NAMES.get(row['metric'], row['metric'])} "
                   f"| {row['predicted']:.1f} [{lo:.1f}, {hi:.1f}] | {row['real']:.1f} | {row['error_pct']:+.0f} % |")
    out += ["", "The change FA3 sparse vs FLASHMLA_SPARSE in PR #46189's runs (mean TPOT, %): "
            + score["changes_sentence"] + ".", "", "| workload | lab [95 % band] | real |", "|---|---|---|"]
    for c in score["changes"]:
        lo, hi = c["band95"]
        out.append(f"| {_wl(c['workload'])} | {c['predicted_pct']:+.1f} [{lo:+.1f}, {hi:+.1f}] | {c['real_pct']:+.1f} |")
    reasons = sorted({(x["case"], x["reason"]) for x in score["rows"] if not x["comparable"]})
    out += ["", "Published, not scored (the run was not the workload the lab assumed before reading):", ""]
    out += [f"- {case}: {why}" for case, why in reasons]
    out += [f"- {n['case']}: {n['workload']} {n['backend']}: not predicted" for n in score["not_predicted"]]
    if BLIND_POSTHOC.exists():
        ph = json.loads(BLIND_POSTHOC.read_text())["rows"]
        out += ["", "### Post-hoc: each run's workload as its source states it (not blind, nothing fitted)", "",
                "The same model after reading, with the runs' own num_prompts, request rate and concurrency "
                "(`data/validation/blind_2026-12_posthoc.json`, deterministic runs). Mean TPOT (ms):", "",
                "| run | workload (in / out, the run's num_prompts) | backend | lab (post-hoc, deterministic) | real | "
                "error |", "|---|---|---|---|---|---|"]
        for r in [x for x in ph if x["metric"] == "mean_tpot_ms"]:
            n = (r.get("as_run") or {}).get("num_prompts")
            wl = _wl(r["workload"]) + (f", num_prompts {n}" if n else "")  # not the blind set's assumed num_prompts
            out.append(f"| {r['case']} | {wl} | {r['backend']} | {r['posthoc']:.1f} | {r['real']:.1f} | "
                       f"{r['error_pct']:+.0f} % |")
        fm = [abs(r["error_pct"]) for r in ph if r["metric"] == "mean_tpot_ms" and r["case"] == "pr46189"
              and r["backend"] == "FLASHMLA_SPARSE" and (r["workload"]["max_concurrency"] or 0) <= 8]
        fa = [r["error_pct"] for r in ph if r["metric"] == "mean_tpot_ms" and r["case"] == "pr46189"
              and r["backend"] == "FLASH_ATTN_MLA_SPARSE" and r["workload"]["max_concurrency"] == 1]
        if fm and fa:
            out += ["", f"What the misses say: at concurrency 1-8 the lab prices FLASHMLA_SPARSE's TPOT within "
                    f"{max(fm):.0f} % of PR #46189's runs, but FA3 sparse's {min(fa):+.0f} to {max(fa):+.0f} % too slow "
                    "at concurrency 1. The lab prices FA3's decode step as FlashMLA's minus the kernels' measured "
                    "difference (about 44 us per layer at one token); the runs show about three times that, so the "
                    "old engine's FlashMLA decode path carried a per-layer cost the lab's decode calibration spread "
                    "over every strategy (an explanation, not yet measured). The gpustack runs are saturated "
                    "(hundreds of requests at once): there the lab is off by tens of percent either way, with its "
                    "no-preemption admission and the chat endpoint's tokenisation as candidates."]
    out += ["", "### Noise from real repeats", "",
            "| runs | metric | values | largest change between two | the lab's A vs A' 95 % band |", "|---|---|---|---|---|"]
    for rp in score["repeats"]:
        band = rp["lab_band95_pct"]
        out.append(f"| {rp['source']} | {_NAMES.get(rp['metric'], rp['metric'])} | "
                   f"{', '.join(f'{v:g}' for v in rp['values'])} | {rp['max_pairwise_change_pct']:.1f} % | "
                   + (f"[{band[0]:+.1f}, {band[1]:+.1f}] %" if band else "-") + " |")
    out += ["", "Real runs of one configuration spread wider than the lab's single-run model, so the lab does not "
            "claim to rule out that -9.5 % (or +6 %) is one run's noise; the percentiles in the prediction block "
            "above are the model's, not the world's."]
    return "\n".join(out)


def _first_token_lines(dec: dict) -> list[str]:
    """The first token, explained (issue 37): the components of the first-token gap, their status and share."""
    ft = dec.get("first_token")
    if not ft:
        return []
    out = ["#### The first token, explained", "",
           f"PR #46189's decode steps put the missing time in the first token: the last request's TTFT about "
           f"{dec['cross_check']['implied_ttft_last_s']:.2f} s against the lab's {dec['lab_ttft_last_s']:.2f} s, a "
           f"{ft['gap_s']:.2f} s gap. Its candidates (`first_token` in the decomposition file):", "",
           "| component | status | seconds in this run | what the sources allow (s) | share of the gap |",
           "|---|---|---|---|---|"]
    for c in ft["components"]:
        sec = "not known" if c["seconds"] is None else f"{c['seconds']:.3f}"
        share = "-" if c["share_of_gap"] is None else f"{100 * c['share_of_gap']:.0f} %"
        status = c["status"] + (f": {c['measured_summary']}" if c.get("measured_summary") else "")
        out.append(f"| {c['component']} | {status} | {sec} | {c['range_s'][0]:g} - {c['range_s'][1]:g} | {share} |")
    measured = sorted({c["measured_source"] for c in ft["components"] if c.get("measured_source")})
    out += ["", "Sources: " + " ".join(f"({i}) {c['source']}." for i, c in enumerate(ft["components"], 1))
            + "".join(f" Measured: {m}." for m in measured), "",
            f"Explained by measured or cited components with a size: {ft['explained_s']:.3f} s "
            f"({100 * ft['explained_share']:.0f} %); {ft['note']}.", ""]
    return out


def _round_two_lines() -> list[str]:
    """Round two's sentence (issue 37), from its committed score file when it exists."""
    if not BLIND_B_SCORE.exists():
        return []
    sc = json.loads(BLIND_B_SCORE.read_text())
    wl = json.loads(BLIND_B_WORKLOADS.read_text())
    notes = {c["id"]: "; ".join(x.split(" (")[0] for x in c["not_modelled"]) for c in wl["cases"]}
    out = [sc["medians_sentence"] + ".", "",
           "Round two's protocol (`data/validation/blind_2026-12b_workloads.json`, then `blind_2026-12b.json`, then "
           "`blind_2026-12b_results.json`, three commits): " + wl["protocol"], "",
           "| run | workload (in / out) | not modelled (priced at the nearest configuration) | metric | lab (median) "
           "[95 % band] | real | error |", "|---|---|---|---|---|---|---|"]
    keep = {"duration", "total_token_throughput", "mean_ttft_ms", "mean_tpot_ms", "median_ttft_ms", "median_tpot_ms"}
    for r in [x for x in sc["rows"] if x["comparable"] and x["metric"] in keep]:
        if r["metric"].startswith("median") and r["case"].startswith("gpustack"):
            continue  # the run states the mean: the table shows it
        lo, hi = r["band95"]
        out.append(f"| {r['case']} | {_wl(r['workload'])} | {notes.get(r['case'], '')} | "
                   f"{_NAMES.get(r['metric'], r['metric'])} | {r['predicted']:.1f} [{lo:.1f}, {hi:.1f}] | "
                   f"{r['real']:.1f} | {r['error_pct']:+.0f} % |")
    out += ["", "Not predicted (decided before the predictions, in the workloads file): "
            + "; ".join(f"{n['case']} {_wl(n['workload'])}" for n in sc["not_predicted"]) + ". The gpustack runs' "
            "command adds `--context-length 32768` and FA3 NSA kernels to the recommended command the workloads file "
            "recorded (seen after the predictions' commit; scored, with that note in the results file).", ""]
    return out


def update_docs(path: Path = DOCS) -> None:
    """Replace the block between :data:`BEGIN` and :data:`END` in ``path`` (appended at the end if absent)."""
    text = path.read_text()
    block = BEGIN + "\n" + validation_markdown() + "\n" + END
    if BEGIN in text and END in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n## Validation against real runs (issue 30)\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.docs_tables")
    ap.add_argument("--update-docs", action="store_true")
    if ap.parse_args(argv).update_docs:
        update_docs()
        print(f"-> {DOCS}")
    else:
        print(validation_markdown())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
