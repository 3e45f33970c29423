"""The interactive explorer (mla_lab.explore + notebooks/explore.ipynb), driven headless: control changes update
the outputs through the widgets' observers, and every number equals the library functions' answer."""

import re
from pathlib import Path

import pandas as pd
import pytest

from mla_lab.buffers import MIB, memory_account
from mla_lab.deployment import Deployment
from mla_lab.explore import Explorer, explore_point, tp_options
from mla_lab.model.ttft import predict_ttft
from mla_lab.models import load_model

REPO = Path(__file__).resolve().parent.parent
NO_MEASURED = pd.DataFrame()


def test_explore_point_seed_setup_numbers():
    r = explore_point(Deployment.seed(), "fused")
    assert (r["num_heads"], r["padded_heads"], r["prefill_padding"]) == (8, 64, 64)
    assert r["workspace_bytes"] == 16384 * 64 * 576 * 2
    assert r["extra_bytes"] == 1_056_964_608 and r["extra_mib"] == 1008.0
    m = load_model("glm-5")
    assert r["kv_tokens_lost"] == pytest.approx(1_056_964_608 / m.kv_cache_bytes_per_token("bf16"))
    by = {x["strategy"]: x for x in r["per_strategy"]}
    for s in ("per_call_empty:zeros", "private_workspace", "kernel_native"):
        # the explorer prices the deployment it is given (the seed: fp8 weights, experts over the ranks)
        want = predict_ttft(Deployment.seed(), s)
        assert by[s]["ttft_ms"] == pytest.approx(want["ttft_ms_mean"])
        assert by[s]["persistent_bytes"] == memory_account(s, 8, 16384, "h200", "bf16").persistent_bytes
    assert by["per_call_empty:zeros"]["ttft_change_pct"] == 0.0
    assert by["private_workspace"]["ttft_change_pct"] == pytest.approx(
        100 * (by["private_workspace"]["ttft_ms"] / by["per_call_empty:zeros"]["ttft_ms"] - 1))
    assert r["measured"] is None


def test_explorer_and_report_agree_on_the_seed_setup():
    """Issue 10: one pricing path. The PR's setup priced by the explorer, by the report's seed table and by the
    sweep's row builder gives the same TTFT change (to 0.01 percentage points)."""
    from mla_lab.report.tables import seed_setup_table
    from mla_lab.seed import SEED, seed_point
    from mla_lab.sweep.rows import modelled_rows

    e = explore_point(Deployment.of(**SEED), "fused")
    explorer = {x["strategy"]: x["ttft_change_pct"] for x in e["per_strategy"]}["private_workspace"]
    sweep = {r["strategy"]: r["ttft_change_pct"]
             for r in modelled_rows(seed_point(strategies=["fused"]))}["private_workspace"]
    table = seed_setup_table()
    cell = table.set_index("quantity").loc["TTFT change, vLLM #53878 vs vLLM before it (zero padded heads)",
                                           "ours (modelled)"]
    assert abs(explorer - sweep) < 0.01
    assert cell == f"{sweep:+.1f}%"
    # and the explorer's default deployment is the seed
    assert {x["strategy"]: x["ttft_change_pct"] for x in explore_point()["per_strategy"]}["private_workspace"] \
        == pytest.approx(explorer, abs=0.01)


def test_explorer_has_a_control_for_every_sweep_parameter_that_changes_a_number():
    from mla_lab.sweep.params import DEFAULTS

    ex = Explorer(measured=NO_MEASURED)
    # sweep parameter -> explorer control (grid lists map to one value each); the rest do not change numbers
    grid = {"models": "model", "tp_sizes": "tp", "archs": "arch", "max_num_batched_tokens": "max_num_batched_tokens",
            "prompt_lens": "prompt_len", "kv_cache_dtype": "kv_cache_dtype", "num_prompts": "num_prompts",
            "concurrency": "concurrency", "weight_dtype": "weight_dtype", "moe_parallel": "moe_parallel",
            "strategies": "strategy", "gpu_memory_utilization": "gpu_memory_utilization"}
    no_number = {"device", "store_dir", "data_file", "report_dir", "check_equivalence", "force", "overwrite",
                 "executor", "ray_address", "num_runs", "shared_workspace_bytes",
                 # the serving section's inputs: they change no number the explorer shows
                 "output_len", "max_num_seqs", "request_rate", "seed"}
    assert set(grid) <= set(DEFAULTS) and set(DEFAULTS) - set(grid) <= no_number
    assert set(grid.values()) <= set(ex.controls)
    before = ex.result["per_strategy"][1]["ttft_ms"]
    after = ex.set(weight_dtype="bf16", moe_parallel="tp")
    assert after is None or after["per_strategy"][1]["ttft_ms"] != before
    # the advice panel answers for the same deployment
    assert ex.advice is None or ex.advice["deployment"]["weight_dtype"] == "bf16"


# the seed on an H20 (96 GB) does not fit: 89 GiB of fp8 weights per rank leave no KV cache, so no memory number
@pytest.mark.parametrize("arch,kv,padded,extra_mib", [("b200", "bf16", 128, 16384 * 120 * 1152 / MIB),
                                                      ("h200", "fp8", 8, 0.0), ("h20", "bf16", 64, None)])
def test_explore_point_arch_and_dtype(arch, kv, padded, extra_mib):
    r = explore_point(Deployment.seed(arch=arch, kv_cache_dtype=kv), "fused")
    assert r["padded_heads"] == padded
    if extra_mib is None:
        assert r["fits_in_memory"] is False and r["extra_mib"] is None and "no KV cache" in r["fit_reason"]
    else:
        assert r["fits_in_memory"] is True and r["extra_mib"] == pytest.approx(extra_mib)


def test_explore_point_rejects_what_the_library_rejects():
    with pytest.raises(ValueError, match="does not divide num_attention_heads"):
        explore_point(Deployment.seed(tp=3))
    with pytest.raises(ValueError, match="must be a mla_lab.deployment.Deployment"):
        explore_point("glm-5")
    with pytest.raises(ValueError, match="strategy='padded'"):
        explore_point(strategy="padded")


def test_tp_options_divide_the_heads():
    for m in ("glm-5", "deepseek-v3.2"):
        heads = load_model(m).num_attention_heads
        opts = tp_options(m)
        assert opts and all(heads % t == 0 for t in opts) and 8 in opts


def test_widget_changes_update_outputs_without_rerunning():
    ex = Explorer(measured=NO_MEASURED)
    assert ex.result["num_heads"] == 8 and "8 → 64" in ex.summary.value
    png_seed = ex.chart.value
    assert png_seed[:8] == b"\x89PNG\r\n\x1a\n"
    # a user moving one control: the observer recomputes and re-renders
    ex.controls["tp"].value = 4  # GLM-5 TP4 on an H200 does not fit: the reason, no number (issue 22)
    assert ex.result["num_heads"] == 16 and "does not fit" in ex.summary.value and "MiB" not in ex.summary.value
    ex.set(model="deepseek-v3.2", tp=8)  # 128 heads / 8 = 16 per rank, fits
    assert ex.result["num_heads"] == 16 and ex.result["padded_heads"] == 64
    assert ex.result["extra_bytes"] == 16384 * (64 - 16) * 1152
    assert "16 → 64" in ex.summary.value and f"{16384 * 48 * 1152:,} B" in ex.summary.value
    assert ex.chart.value != png_seed
    ex.controls["kv_cache_dtype"].value = "fp8"
    assert ex.result["padded_heads"] == 16 and ex.result["extra_bytes"] == 0
    ex.controls["strategy"].value = "per_call_empty:zeros"
    assert ex.result["workspace_bytes"] == 16384 * 16 * 1152
    bold = re.findall(r"<tr style='font-weight:bold[^']*'><td[^>]*>([\w:]+)<", ex.summary.value)
    assert bold == ["per_call_empty:zeros"]  # the selected strategy's row stands out


def test_set_several_controls_and_model_change_keeps_a_valid_tp():
    ex = Explorer(measured=NO_MEASURED)
    r = ex.set(model="deepseek-v3.2", tp=16, arch="b200", prompt_len=8192, num_prompts=4,
               max_num_batched_tokens=8192)
    assert (r["num_heads"], r["padded_heads"]) == (8, 128)
    assert r["selection"]["prompt_len"] == 8192 and r["num_steps"] == 4  # 4 x 8192 tokens in 8192-token chunks
    assert list(ex.controls["tp"].options) == tp_options("deepseek-v3.2")
    with pytest.raises(ValueError, match="is not offered"):
        ex.set(prompt_len=1000)
    with pytest.raises(ValueError, match="unknown control"):
        ex.set(heads=8)


def test_a_rejected_selection_shows_an_error_instead_of_raising():
    ex = Explorer(measured=NO_MEASURED)
    ex._hold = True
    ex.controls["tp"].options = [3]  # not a divisor of 64: only reachable by code, but must not crash the UI
    ex._hold = False
    ex.update()
    assert ex.result is None and "does not divide" in ex.error
    assert "Cannot price this selection" in ex.summary.value and ex.chart.value == b""


def test_measured_rows_for_the_selection_are_shown_beside_the_model():
    rows = [dict(model="glm-5", tp=8, arch="h200", max_num_batched_tokens=16384, kv_cache_dtype="bf16",
                 prompt_len=1024, num_prompts=32, strategy=s, ttft_ms=t, source="measured", device="NVIDIA H200",
                 git_commit="abc123", file="h200/padding_sweep.csv", status="ok")
            for s, t in (("per_call_empty:zeros", 400.0), ("private_workspace", 362.0))]
    rows.append(dict(rows[0], tp=4, ttft_ms=1.0))  # another selection: not shown
    ex = Explorer(measured=pd.DataFrame(rows))
    by = {x["strategy"]: x for x in ex.result["per_strategy"]}
    assert by["per_call_empty:zeros"]["measured_ttft_ms"] == 400.0
    assert by["private_workspace"]["measured_ttft_ms"] == 362.0
    assert by["kernel_native"]["measured_ttft_ms"] is None
    assert len(ex.result["measured"]) == 2
    assert "Measured rows for this selection (2)" in ex.measured_out.value and "NVIDIA H200" in ex.measured_out.value
    assert ">362.00</td>" in ex.summary.value
    ex.controls["max_num_batched_tokens"].value = 8192  # another selection that fits: no row of it
    assert ex.result["fits_in_memory"] and ex.result["measured"] is None and "No measured rows" in ex.measured_out.value
    # 32 x 16384 tokens in flight exceed the KV cache (329,280 tokens per rank with the H200's memory as torch
    # reports it): no number
    ex.set(max_num_batched_tokens=16384, prompt_len=16384)
    assert not ex.result["fits_in_memory"] and ex.result["measured"] is None
    assert "does not fit" in ex.measured_out.value


@pytest.mark.slow
def test_explore_notebook_runs_headless_and_shows_the_widget(tmp_path):
    import papermill as pm

    from mla_lab.kernelspec import ensure_kernel

    out = tmp_path / "explore.ipynb"
    pm.execute_notebook(str(REPO / "notebooks" / "explore.ipynb"), str(out), kernel_name=ensure_kernel(),
                        parameters={"tp": 4, "arch": "b200"}, progress_bar=False, cwd=str(REPO / "notebooks"))
    import nbformat

    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)
    # the widget state saved with the notebook holds the rendered numbers for tp=4 on b200: 16 -> 128 heads
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    html_values = [m["state"].get("value", "") for m in state.values() if m.get("model_name") == "HTMLModel"]
    assert any("16 → 128" in v for v in html_values), "widget state not saved with the executed notebook"
