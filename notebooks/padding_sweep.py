# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Padding sweep: Q-concat workspace memory vs TTFT
#
# vLLM PR #53878 allocates the sparse-MLA prefill Q-concat workspace already padded to the 64 (Hopper) or 128
# (Blackwell) heads FlashMLA's sparse kernel needs, instead of copying the real heads into a fresh padded tensor on
# every layer call. This notebook prices that trade for every grid point: **memory** (exact bytes, analytic) and
# **TTFT** (modelled from the arch specs and a calibration, or measured on a GPU when one is present). Every row
# says which (`source` column) and carries its provenance.

# %% tags=["parameters"]
models = ["glm-5", "deepseek-v3.2"]
tp_sizes = [1, 2, 4, 8]
archs = ["h200", "b200"]
max_num_batched_tokens = [8192, 16384]
prompt_lens = [1024, 8192]
kv_cache_dtype = "bf16"
num_prompts = 32
concurrency = None
strategies = ["unfused", "fused", "kernel_native"]
device = "auto"
store_dir = "data/sweeps/padding_sweep"
data_file = "data/padding_sweep.csv"
report_dir = "reports"
check_equivalence = True
force = False

# %%
import pandas as pd
from IPython.display import Markdown, display

from mla_lab import report, sweep

params = sweep.validate_params({k: globals()[k] for k in sweep.DEFAULTS})
df = sweep.run_sweep(params)
display(Markdown(report.provenance_banner(df)))

# %% [markdown]
# ## Fused == unfused on the real heads
# Both strategies run on small random CPU inputs (invalid indices, causal `topk_length`, one row with no valid
# index); the fused workspace's padded heads are poisoned with NaN first.

# %%
if check_equivalence:
    checks = pd.DataFrame([sweep.equivalence_check(num_heads=h, arch=a) for h, a in [(8, "hopper"), (16, "hopper"),
                                                                                     (32, "hopper"), (8, "blackwell")]])
    display(checks)
    assert checks["equal"].all(), "fused and unfused disagree on the real heads"

# %% [markdown]
# ## Memory vs TTFT
# x: extra persistent Q workspace per rank compared with unfused (MiB). y: TTFT change compared with unfused (%).
# Hollow markers are modelled, filled are measured. The `ttft_scope` column says what the TTFT covers.

# %%
from pathlib import Path

measured = report.load_measured()
both = pd.concat([df, measured], ignore_index=True) if len(measured) else df
fig = report.plot_memory_vs_ttft(both)
Path(report_dir).mkdir(parents=True, exist_ok=True)
fig.savefig(Path(report_dir) / "padding_sweep.png", dpi=110)
fig.savefig(Path(report_dir) / "padding_sweep.svg")

# %% [markdown]
# ## Table (TP 8 and the largest max_num_batched_tokens)

# %%
display(report.summary_table(df, tp=max(tp_sizes), max_num_batched_tokens=max(max_num_batched_tokens)))

# %% [markdown]
# ## Failed points
# Points that could not be priced or measured are listed with their reason, never dropped.

# %%
failed = report.failed_points(df)
display(failed if len(failed) else Markdown("No failed points."))
print(f"{len(df)} rows written to {data_file}")
