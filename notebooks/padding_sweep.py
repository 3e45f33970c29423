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
# # Padding sweep: what vLLM PR #53878's pre-padded Q workspace buys, in memory and TTFT
#
# ## 1. The answer
#
# <!-- answer:begin (python -m mla_lab.report.answer --update) -->
# **What PR #53878 bought, as it was** (GLM-5.2 TP8 on an H200, 32 prompts of 1024 tokens, bf16 KV cache, FLASHMLA_SPARSE forced). Modelled: mean TTFT (time to first token) -2.4 % (GLM-5: -2.0 %) for +1008 MiB of persistent workspace per rank; with the attention path measured on one H200 (5 fresh processes, rest modelled) -2.0 % [-2.2, -1.3]. That interval comes from one machine lease (docs/glossary.md) and understates the uncertainty: on two leases the same day the PR's attention path alone, against the pre-PR pad, measured -5.7 % and -2.8 % (docs/perf-notes.md). The PR reported -9.5 % TTFT and +6 % throughput; nothing the lab prices for the PR's change reaches that.
#
# **What it buys in today's engines** (code reading of the release wheels; modelled). vLLM 0.33.0 sends prompts of <= 2048 tokens to dense MHA, so on the PR's benchmark the padded kernel runs only for decode rows, and only when FLASHMLA_SPARSE is forced: the PR's workspace then changes mean TTFT by 0.0 % and TPOT (time per output token) by 0.0 %. vLLM's default there, FA3 sparse on the real heads, pads nowhere: TPOT -3.4 %, throughput +3.2 % against the forced FlashMLA path (the ratio of the two rows of `mla-lab serve --model glm-5.2 --strategies shared_workspace:none@vllm-0.33.0-flashmla fa3_sparse@vllm-0.33.0`). SGLang 0.5.23's default runs these prompts through the padded `flashmla_sparse` inside its prefill CUDA graphs (`mla-lab engines`). On a B200 (sm100; modelled, nothing ran there) vLLM 0.33.0 takes FA4's sparse kernel (bf16 KV) or FlashInfer's (fp8 KV) on the real heads and pads nowhere (`mla-lab engines --arch b200`, `mla-lab advise --arch b200`).
#
# **Can -9.5 % be told from one run's noise?** Not by this lab. Its model predicted the PR's own 'main' run, blind, at 6.70 s; the run took 9.92 s (ratio 0.68), so its single-run noise band is not validated and it does not rule noise out. Blind predictions of four public runs were committed before reading them; 35 published figures of 2 of them matched the workload the lab assumed (gpustack_dsv32_v0.13.0, pr46189): median |error| 21 %, 2 of 35 inside the lab's single-run band; the other 125 figures came from other workloads or GPUs than assumed and are published unscored. FA3 sparse against FLASHMLA_SPARSE (PR #46189's table): at concurrency 1-8 the lab predicted TPOT -14 to -4 %, the runs showed -42 to -20 %: the direction right, the size about a third. Runs of one vLLM configuration that should not differ (gpustack's DeepSeek-V3.2 page) differ by up to 31 % in mean TTFT and 3.2 % in throughput, against the lab's +-1.9 % and +-1.8 %: one run each of two builds cannot separate -9.5 % from noise, and the lab no longer claims it can. Blind round two (issue 37: 13 public SGLang runs in 5 deployments on H200 and B200, all with MTP or DP attention, which the lab did not model when it predicted them and priced at the nearest vLLM TP8 configuration) gave median |error| duration 74 % (n 5), throughput 44 % (n 23), TTFT 60 % (n 13), TPOT 98 % (n 13); round one duration 58 % (n 1), throughput 137 % (n 3), TTFT 50 % (n 1), TPOT 14 % (n 25); both duration 66 % (n 6), throughput 58 % (n 26), TTFT 55 % (n 14), TPOT 21 % (n 38). Post hoc (not blind; data/validation/blind_2026-12b_posthoc.json), the round-two cells with MTP or DP attention re-predicted with the options, median |error|: TTFT 29 % (without the options 76 %, blind 63 %, 23 rows); TPOT 36 % (without the options 58 %, blind 55 %, 28 rows); throughput 22 % (without the options 47 %, blind 48 %, 28 rows). KV capacity is now taken as vLLM 0.33.0 computes it from the memory torch reports (GLM-5 TP8 H200: 329,280 tokens per rank, each term with its source in `mla-lab advise --json`); its check against public startup logs scored no blind case: 4 deployments were predicted blind in two rounds, but no KV line of theirs could be read back. The two figures it could compare, not blind (vllm-project/recipes#893, read before predicting; a 1M-context launch of another case, read after), say the lab leaves too much for the KV cache: available KV memory +40 % and +50 %; after reading vLLM's code for missed terms (post hoc, in-sample) +38 % and +49 % (`data/validation/kv_capacity_2026-12_posthoc.json`): take the KV capacity as an upper bound.
#
# **What does better** (measured on one H200 with the engines' own kernels, 5 fresh processes, graph timing; 16384-token step of 1024-token prompts, 8 heads per rank): FA3 sparse 2.21 ms against FlashMLA padded to 64 heads 2.49 ms (vLLM 0.33.0's build); SGLang's 16-row Triton tile 2.35 ms; FlashMLA's own 8-head path 2.73 ms (slower than padding). A kernel that only gathers each token's top-k rows takes 1.61 ms (65 % of padded FlashMLA): the gather, not the padded heads' MMAs, sets the time, so removing the padding saves about a tenth of the kernel. At decode, FA3 splits the keys over SMs: one token with 2048 keys takes 20 us against 63 us for padded FlashMLA (one CTA per token); at 256 tokens they are within 1 %. Served, the difference is larger than these kernels and the lab's model say: PR #46189's runs show FA3 sparse cutting TPOT by a fifth to two fifths at concurrency 1-8 (above).
#
# **Pack tokens, not heads** (the lab's kernel, docs/packed.md; the kernel measured on one H200, 5 fresh processes, graph timing, 16384 tokens, 8 heads; the step modelled). 8 neighbouring tokens x 8 heads fill FlashMLA's 64-row tile and gather the union of their top-k sets once: at 1024-token prompts 3.30x padded FlashMLA with the union build (the kernel alone 4.46x, FlashMLA's unmasked bound 7.51x); at 80 % pairwise overlap 1.21x (bound 3.17x), at a 4096-token context with random top-k 1.20x (bound 4.02x); where neighbours share little the dispatch keeps the padded kernel, at most 1.5 % slower. The lab's Triton tile runs at a third to three fifths of FlashMLA's speed per key, so issue 36's bars (5x, 2x, 2.5x) are missed. It holds 320 MiB per rank (real-head Q and the union lists: +176 MiB over the unpadded Q, against the PR's +1008 MiB). Modelled for GLM-5 TP8 (neighbouring tokens past the top-k assumed to share 44 % of their keys, TensorRT-LLM blog 21): mean TTFT +31.2 % against vLLM 0.33.0's answer at 1024-token prompts (its dense MHA route stays faster: the crossover does not move), -20.4 % at 4096 and -6.0 % at 8192 tokens, where vLLM runs FA3 sparse.
#
# **What to do.** For prompts of <= 2048 tokens the route matters more than the padding: dense MHA (all keys, heads up-projected; exact up to top-k) is modelled at -28.4 % TTFT against the PR's path (GLM-5: -34.9 %; `mla-lab advise --model glm-5.2`: its `fa3_sparse@vllm-0.33.0` row against its `private_workspace@vllm-pr53878` row); vLLM 0.33.0 takes it by default, and plain `mla-lab advise` recommends that, within vLLM 0.33.0; SGLang 0.5.23 takes it only with its prefill CUDA graphs off (listed under other engines as `per_call_zeros@sglang-dense`). For longer prompts keep vLLM 0.33.0's default backend, FA3 sparse: no padded workspace, no copy. If FLASHMLA_SPARSE must be forced: with the PR's build the pre-padded workspace costs 1008 MiB per rank at max_num_batched_tokens 16384 (10,554 KV tokens at GLM-5 TP8); with vLLM 0.33.0 forced, the shared view costs -144 MiB (no unpadded Q buffer is left). `mla-lab advise --memory-budget-mib N` ranks the strategies that fit a budget and says which deployments it tips out of fitting.
# <!-- answer:end -->

# %% [markdown]
# ## Contents
# 1. [The answer](#1.-The-answer) (above)
# 2. [What the PR bought, and what it buys today](#2.-What-the-PR-bought,-and-what-it-buys-today)
# 3. [Is it noise? How far the model is validated](#3.-Is-it-noise?-How-far-the-model-is-validated)
# 4. [Which route or kernel does better](#4.-Which-route-or-kernel-does-better)
# 5. [What to do for your deployment](#5.-What-to-do-for-your-deployment)
# 6. [Details: memory, the sweep's tables, methods](#6.-Details:-memory,-the-sweep's-tables,-methods)
#
# vLLM PR #53878 allocates the sparse-MLA prefill Q-concat workspace already padded to the 64 (Hopper) or 128
# (Blackwell) heads FlashMLA's sparse kernel needs, instead of copying the real heads into a fresh padded tensor on
# every layer call. This report prices that trade for every grid point: **memory** (exact bytes, analytic) and
# **TTFT** (modelled from the arch specs and a calibration, or measured on a GPU). Every row says which (`source`
# column) and carries its provenance; the banner below sums it up.
#
# Words: **TTFT** = time to first token; **TPOT** = time per output token (the first excluded); **the seed** = the
# PR's own deployment (GLM-5 / GLM-5.2 geometry, TP 8, H200, bf16 KV cache, `--max-num-batched-tokens 16384`, 32 x
# 1024-token prompts); **H'** = the padded head count the kernel runs (`prefill_padding`: 64 on Hopper, 128 on Blackwell);
# **stale padded heads** = padding that holds old data instead of zeros; **measured** = timed on a GPU (median and
# [min, max] over fresh processes), **modelled** = the lab's cost model. The full glossary: `docs/glossary.md`.

# %% tags=["parameters"]
# Every parameter is typed and explained (`papermill --help-notebook notebooks/padding_sweep.ipynb` lists them);
# a name papermill injects that is not declared here is refused in the next cell.
models: list = ["glm-5", "deepseek-v3.2"]  # model names under data/models
tp_sizes: list = [8]  # vLLM --tensor-parallel-size values (TP 1-4 do not load the default models on an H200)
archs: list = ["h200", "b200"]  # GPU names or aliases (h200, b200, hopper, blackwell)
max_num_batched_tokens: list = [8192, 16384]  # vLLM --max-num-batched-tokens values (also the workspace rows)
prompt_lens: list = [1024, 8192]  # vllm bench serve --random-input-len values (tokens)
kv_cache_dtype: str = "bf16"  # vLLM --kv-cache-dtype: bf16 or fp8 (or a list of both)
num_prompts: int = 32  # vllm bench serve --num-prompts
concurrency: int = None  # vllm bench serve --max-concurrency (None: num_prompts)
# engine presets (vllm-pre-53878, vllm-53878, vllm-56902, sglang-dense, kernel-native), the shared workspace zeroed per
# call, and the sub-chunked workspace at S rows (":views": the consumer takes per-chunk views); see mla_lab.placement
strategies: list = ["vllm-pre-53878", "vllm-53878", "vllm-56902", "vllm-fa3-sparse", "sglang-dense",
                    "sglang-flashmla-sparse", "kernel-native", "shared_workspace:zero_per_call", "subchunk:1024",
                    "subchunk:2048", "subchunk:4096", "subchunk:8192", "subchunk:1024:views", "subchunk:2048:views",
                    "subchunk:4096:views", "subchunk:8192:views", "subchunk:1024:graph2", "subchunk:2048:graph2",
                    "subchunk:4096:graph2", "subchunk:8192:graph2", "packed"]  # presets, canonical, the lab's kernel
device: str = "auto"  # auto (GPU if torch sees one), cpu (modelled only) or cuda
store_dir: str = "data/sweeps/padding_sweep"  # the point store (one file per point; a re-run resumes)
data_file: str = "data/padding_sweep.csv"  # the tidy CSV written at the end
report_dir: str = "reports"  # where the published reports go
check_equivalence: bool = True  # run every strategy on small CPU inputs and compare the real heads
force: bool = False  # recompute points already stored
overwrite: bool = False  # True: data_file may replace an existing file the lab did not write
weight_dtype: str = "fp8"  # TTFT model: fp8 (as the PR's GLM-5.2-FP8) or bf16 weights
moe_parallel: str = "ep"  # TTFT model: ep (experts over the TP ranks, vLLM -ep) or tp (every expert TP-sharded)
num_runs: int = 7  # interleaved repeats of each measured strategy (GPU)
shared_workspace_bytes: int = None  # None: the fused-MoE scratch at max_num_batched_tokens (vLLM after PR #56902)
gpu_memory_utilization: float = 0.9  # vLLM --gpu-memory-utilization: the KV-cache budget
output_len: int = 128  # serving section: vllm bench serve --random-output-len
max_num_seqs: int = 256  # serving section: vllm serve --max-num-seqs
request_rate: str = "inf"  # serving section: vllm bench serve --request-rate ("inf" or requests/s)
seed: int = 0  # serving section: vllm bench serve --seed (arrival times)
executor: str = "local"  # local (this kernel) or ray (Ray tasks; pip install 'mla_lab[ray]')
ray_address: str = None  # with executor ray: None starts a local Ray instance; auto or host:6379 joins one
figure_dir: str = None  # set by mla-lab sweep (not a sweep parameter): this run's figures (None: <report_dir>/figures)
run_id: str = None  # set by mla-lab sweep (not a sweep parameter): the run's id

# %% tags=["remove-output"]
_names = list(globals())  # the parameters cell's names and any papermill injected, before the first import
from pathlib import Path

import pandas as pd
from IPython.display import HTML, Markdown, display

from mla_lab import report, sweep
from mla_lab.deployment import Deployment
from mla_lab.placement import PRESETS
from mla_lab.report.cache import cached_call, plotted_rows, publish_cached, publish_cached_many
from mla_lab.report.noise_figures import load_noise_distribution, noise_sentences, plot_noise
from mla_lab.report.route_figures import plot_routes, route_summary, route_table, routes_available
from mla_lab.report.serving import (
    plot_rate_curve,
    plot_serving_changes,
    plotted,
    rate_curve,
    serve_swept_cached,
    serving_details_html,
    swept_deployment,
)
from mla_lab.serving import serve_benchmark
from mla_lab.strategies import equivalence_check

ENGINE_PRESETS = list(PRESETS)

sweep.params.check_notebook_names(_names)  # papermill -p tp_size 8 (a typo) is refused, not dropped with a warning
params = sweep.validate_params({k: v for k, v in globals().items() if k in sweep.DEFAULTS})
figs = Path(figure_dir) if figure_dir else Path(report_dir) / "figures"
saved = {}  # figure name -> PNG and SVG paths
df = sweep.run_sweep(params)  # progress goes to the terminal; the HTML report leaves this cell's output out
kv_shown = params.kv_cache_dtype[0]  # the figures show one KV-cache dtype, the first of the grid; each names the rest

# %%
measured = report.measured_for(params)
both = report.combine(df, measured)
report.save_provenance(both, figs, run_id=run_id)
display(HTML(report.provenance_html(both, run_id)))

# %% [markdown]
# ## 2. What the PR bought, and what it buys today
#
# ### The PR's numbers, answered
# vLLM PR #53878's benchmark (TP 8, Hopper, bf16 KV cache, `--max-num-batched-tokens 16384`, 32 prompts x 1024
# tokens at concurrency 32) for GLM-5's geometry and GLM-5.2's (an indexer on 21 of 78 layers). A strategy is where
# the padded Q lives x what its padded heads hold: vLLM before the PR padded with `new_empty` per call (zeros or
# stale), at the PR with a private workspace (zeros), after PR #56902 with the shared workspace (stale); SGLang pads
# with `new_zeros` per call. Modelled, and with the attention path measured on an H200 in 5 fresh processes (median
# and [min, max] over processes; the rest of the step modelled).

# %%
from mla_lab.report.seed_answer import seed_answer  # noqa: E402

answer_rows = seed_answer()  # one set of rows: the tables below and the sentences state each figure from it
display(HTML(report.html_table(report.seed_answer_table(answer_rows))))
display(Markdown("\n".join(f"- {line}" for line in report.seed_sentences(answer_rows))))
served = cached_call(serve_benchmark, Deployment.seed(), ENGINE_PRESETS)  # the PR's setup, whatever the grid
display(HTML(report.html_table(report.seed_setup_table(df, measured, serving=served, answer_rows=answer_rows))))

# %% [markdown]
# ## 3. Is it noise? How far the model is validated
#
# ### Is the PR's -9.5 % one run's noise?
# The PR's benchmark is one `vllm bench serve` run per build. Modelled, not measured: the single-run distribution of
# the change between two builds, from 1000 simulated runs per build (`mla_lab.serving.noise`: API-server arrival
# queue, async scheduling, per-step CPU time, and the H200's step-time spreads and cold first step measured in 5
# fresh processes), committed in `data/validation/pr53878_noise_distribution.csv`; the PR's -9.5 % TTFT and +6 %
# throughput are marked with their percentiles.

# %%
noise_dist = load_noise_distribution()
saved["noise_pr53878"] = publish_cached(lambda: plot_noise(noise_dist), "noise_pr53878", figs,
                                        key=Path(noise_dist["path"]).read_bytes())
display(Markdown("\n".join(f"- {line}" for line in noise_sentences(noise_dist))))

# %% [markdown]
# ### Validated on real runs: the PR's main run, the blind set, real repeats
# The lab's prediction of the PR's own run, scored; the missing time decomposed; four public runs predicted before
# they were read (`data/validation/blind_2026-12.json`, committed first); real repeats beside the noise model above
# (`mla_lab.validation`; also in docs/serving.md).

# %%
from mla_lab.validation.docs_tables import validation_markdown  # noqa: E402

display(Markdown(validation_markdown()))

# %% [markdown]
# ### Validation of the TTFT model (measured on an H200)
# The TTFT model (`mla_lab.model`) prices every op of a decoder layer on one rank; its
# efficiencies were fitted on an H200 (`data/calibration/h200_ops.csv`). Predicted vs measured per op and per layer;
# the table gives the MAPE per op class (in sample, and leaving one model out). Differences between strategies are
# validated from interleaved pairs (`layer_paired_delta`); the difference of two unpaired timings is noise-bound
# and left out. The padded-head content factor: 1.4 % MAPE on 48 H200 shapes (1.7 % leaving one shape out,
# `data/calibration/h200_content.csv`); decode and mixed steps: `docs/serving.md`. Details: `docs/ttft-model.md`.

# %%
val = report.load_validation()
if len(val):
    saved["validation"] = publish_cached(lambda: report.plot_validation(val), "validation", figs, key=val)
    display(HTML(report.html_table(report.validation_table(val))))
else:
    display(Markdown("No validation measurements under `data/measured`."))

# %% [markdown]
# ### Real TP ranks vs the one-GPU simulation, and the all-reduce (measured on 2 H200s; TP 4 and 8 not yet)
# The lab simulates TP by giving one GPU a rank's share of heads. Real NCCL runs (one process per GPU, heads split,
# latent KV replicated, o_proj all-reduce) against that simulation plus the all-reduce the cost model prices: every
# rank, not only the slowest. Which world sizes were measured, then each rank, then the all-reduce term per world
# size (a latency + bandwidth fit where measured, the assumption where not). Details: `docs/scaling.md`.

# %%
display(HTML(report.html_table(report.tp_status_table())))
ranks = report.tp_rank_table()
display(HTML(report.html_table(ranks.round(3))) if len(ranks) else Markdown("No TP measurements under `data/measured`."))
display(HTML(report.html_table(report.comm_fit_table().round(2))))

# %% [markdown]
# #### The PR's TTFT change under each all-reduce term
# At the PR's TP=8 the all-reduce was never measured, so the denominator of every TTFT change there is the least
# certain term. The seed answer priced with the committed term (the assumption at TP=8), the ideal ring (a lower
# bound) and the TP=2 fit carried to TP=8 by the ring formula (an extrapolation, not a measurement). Modelled; the
# "attention measured" columns splice in the H200's attention path.

# %%
display(HTML(report.html_table(report.seed_comm_sensitivity().round(2))))

# %% [markdown]
# ## 4. Which route or kernel does better
#
# ### The route beats the copy: attention path per route and prompt length
# Measured on one H200 in 5 fresh processes (`data/measured/h200/between_process/routes.csv`): a 16384-token step of
# 16384 / L prompts of L tokens, per layer call, padded sparse MQA (FlashMLA at 64 heads: before the PR and with it)
# against dense causal MHA with the real heads (kv_b_proj up-projection, K assembly, SDPA). Above top-k (2048)
# dense attention is not what sparse attention computes: dashed, a lower bound for masked MHA.

# %%
if routes_available():
    saved["routes"] = publish_cached(lambda: plot_routes(route_table()), "routes", figs, key=route_table())
display(Markdown("\n".join(f"- {line}" for line in route_summary())))

# %% [markdown]
# ## 5. What to do for your deployment
#
# ### Advice for the swept deployment
# `mla-lab advise` for the swept deployment (named below: the PR's when the grid holds it, else the closest point that
# fits; the serving section after it runs the same one) under a 300 MiB budget of persistent extra memory: the
# strategy with the lowest TTFT that fits, the ranked alternatives and what the budget excludes.

# %%
serve_dep, serve_note = swept_deployment(params)
if serve_dep is None:
    display(Markdown(f"**No advice**: {serve_note}."))
else:
    display(Markdown(f"**{serve_dep.describe()}** ({serve_note})"))
    advice = sweep.advise(serve_dep, memory_budget_mib=300, measured=measured)
    display(Markdown("```\n" + sweep.format_advice(advice) + "\n```"))

# %% [markdown]
# ### Serving: `vllm bench serve` for the swept deployment
# A step-level simulation of vLLM v1 serving the sweep's workload (`num_prompts`, `concurrency`, `output_len`,
# `request_rate`, `seed`, `max_num_seqs`) on one deployment of the grid, named below: the PR's (GLM-5 TP8 H200,
# `--max-num-batched-tokens 16384`, 1024-token prompts) when the grid holds it, else the closest point that fits.
# Chunked prefill, decode steps through the same padded kernel (uniform decode batches as CUDA graphs, mixed steps
# eager), each step priced by the lab's cost model with the decode terms fitted on the H200
# (`data/calibration/h200_decode.csv`). Modelled. One figure: each metric's change per strategy; the full table is
# folded below it. Then the change in TTFT and throughput against the request rate.

# %%
if serve_dep is None:
    display(Markdown(f"**No serving run**: {serve_note}."))
else:
    display(Markdown(f"**{serve_dep.describe()}** (as for the advice); request rate {params.request_rate}, seed "
                     f"{params.seed}, max_num_seqs {params.max_num_seqs}"))
    served_swept = serve_swept_cached(params, ENGINE_PRESETS, serve_dep)  # simulated once per input digest
    saved["serving_changes"] = publish_cached(lambda: plot_serving_changes(served_swept), "serving_changes", figs,
                                              key=plotted(served_swept))
    display(HTML(serving_details_html(served_swept)))
    rates = sorted({1.0, 4.0, 16.0, float("inf")} | (set() if params.request_rate == "inf"
                                                      else {float(params.request_rate)}))
    curve_dep = serve_dep.replace(concurrency=None, max_num_seqs=params.max_num_seqs)  # no client-side limit
    curve = cached_call(rate_curve, curve_dep, ["vllm-pre-53878", "vllm-53878", "vllm-56902"], rates,
                        seed=params.seed)
    saved["rate_curve"] = publish_cached(lambda: plot_rate_curve(curve), "rate_curve", figs, key=curve)

# %% [markdown]
# ## 6. Details: memory, the sweep's tables, methods
#
# ### Memory vs TTFT, one panel per deployment
# x: persistent extra Q memory per rank against vLLM before the PR (MiB; persistent bytes are budgeted and cost
# KV-cache tokens). y: TTFT change against vLLM before the PR with zero padded heads (%). Hollow markers are
# modelled; filled markers with error bars are measured. The orange, olive and teal lines are the sub-chunked
# workspace at S rows (copy out / views to the consumer / two workspaces in one CUDA graph); the red staircase is that deployment's Pareto frontier
# (kernel-native, real-head FlashMLA, is modelled only: never on it). Deployments whose weights or workload do not fit say so.

# %%
has_ok = len(report.ok_rows(both)) > 0
if has_ok:
    # each figure rendered once per input (mla_lab.report.cache); SGLang's DP attention drawn as its own modelled
    # point (every rank holds all heads: the no-padding point)
    frontier_key = (plotted_rows(both), kv_shown, "dp_attention")
    for i, out in enumerate(publish_cached_many(
            lambda: report.plot_frontier_grid(both, kv_cache_dtype=kv_shown, dp_attention=True),
            "frontier_", figs, key=frontier_key)):
        saved[f"frontier_{i + 1}"] = out
    unfit = report.not_fitting(both, kv_cache_dtype=kv_shown)
    if report.kv_dtype_note(both, kv_shown):  # the figure's title says it too; so does this section's text
        display(Markdown(f"*{report.kv_dtype_note(both, kv_shown)}*"))
    if len(unfit):
        display(Markdown(f"**{len(unfit)} deployment(s) do not fit** (never a result, no panel):"))
        display(HTML(report.html_table(unfit)))
else:
    display(Markdown("**No grid point could be priced**: see *Failed points* below for each reason."))

# %% [markdown]
# ### Per TP size: TTFT change and extra memory of vLLM #53878

# %%
if has_ok:
    saved["tp_bars"] = publish_cached(lambda: report.plot_tp_bars(both, kv_cache_dtype=kv_shown), "tp_bars", figs,
                                      key=frontier_key)

# %% [markdown]
# ### TTFT change of vLLM #53878 over heads per rank x prompt length

# %%
if has_ok:
    saved["ttft_heatmap"] = publish_cached(lambda: report.plot_heatmap(both, kv_cache_dtype=kv_shown),
                                           "ttft_heatmap", figs, key=frontier_key)

# %% [markdown]
# ### Table (largest TP and max_num_batched_tokens of the grid)

# %%
if has_ok:
    display(HTML(report.summary_html(both, tp=max(params.tp_sizes),
                                     max_num_batched_tokens=max(params.max_num_batched_tokens))))

# %% [markdown]
# ### Method check: every strategy gives the same real heads
# Every real strategy runs on small random CPU inputs (invalid indices, causal `topk_length`, one row with no
# valid index) and is compared bit for bit with a `new_zeros` pad; padded heads are poisoned with NaN first.

# %%
if check_equivalence:
    # seeded inputs: run once per digest of the package's sources and the torch version (mla_lab.report.cache)
    checks = pd.DataFrame([{k: v for k, v in cached_call(equivalence_check, num_heads=h, arch=a).items()
                            if k != "per_strategy"}
                           for h, a in [(8, "hopper"), (16, "hopper"), (32, "hopper"), (8, "blackwell")]])
    checks["strategies"] = checks["strategies"].map(len)
    display(HTML(report.html_table(checks)))
    assert checks["equal"].all(), "a strategy's real heads differ from the reference"

# %% [markdown]
# ### Failed points
# Points that could not be priced or measured are listed with their reason, never dropped.

# %%
failed = report.failed_points(df)
display(HTML(report.html_table(failed)) if len(failed) else Markdown("No failed points."))
print(f"{len(df)} rows written to {data_file}; figures (PNG + SVG) in {figs}")
