# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python (mla_lab)
#     language: python
#     name: mla-lab
# ---

# %% [markdown]
# # Explore one configuration: padded Q workspace, memory and TTFT
#
# Pick a model, TP size, GPU architecture, `max_num_batched_tokens`, KV-cache dtype, prompt length, number of
# prompts, concurrency, weight dtype, MoE layout and strategy (every sweep parameter that changes a number). The numbers and the chart below update in place as you change a control (no cell to
# re-run): heads per rank and the padded head count vLLM's rule gives, the Q workspace in bytes and MiB, the extra
# memory as KV-cache tokens lost per rank, and the modelled TTFT of every strategy. The model is analytic
# (`mla_lab.buffers.memory_account`, `mla_lab.sweep.rows.modelled_rows`), so it answers instantly; where
# `data/measured/` holds measured rows for the selection, they are shown beside it.

# %% tags=["parameters"]
# The initial selection (papermill can set these too).
model = "glm-5"
tp = 8
arch = "h200"
max_num_batched_tokens = 16384
kv_cache_dtype = "bf16"
prompt_len = 1024
num_prompts = 32
concurrency = 32
weight_dtype = "fp8"
moe_parallel = "ep"
strategy = "fused"

# %%
from mla_lab.explore import Explorer

explorer = Explorer(model=model, tp=tp, arch=arch, max_num_batched_tokens=max_num_batched_tokens,
                    kv_cache_dtype=kv_cache_dtype, prompt_len=prompt_len, num_prompts=num_prompts,
                    concurrency=concurrency, weight_dtype=weight_dtype, moe_parallel=moe_parallel, strategy=strategy)
explorer

# %% [markdown]
# From code: `explorer.set(model="deepseek-v3.2", tp=16, arch="b200")` changes several controls at once, and
# `explorer.result` holds every number the widgets show (`per_strategy`, `workspace_bytes`, `kv_tokens_lost`,
# `measured`...). The seed setup of vLLM PR #53878 is the initial selection: GLM-5, TP 8, Hopper, bf16 KV cache,
# 16384 batched tokens, 32 x 1024-token prompts (+1008 MiB per rank for the padded workspace).
