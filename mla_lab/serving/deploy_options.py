"""The deployment options public runs use, priced (modelled, nothing fitted to a run that uses them; issue 37;
each rule: docs/serving.md, "The deployments public runs use").

- :class:`SpecDecodePricer` (vLLM 0.33.0 ``--speculative-config`` ``mtp``): the target verifies ``k + 1`` query
  tokens per decoding request (``vllm/v1/worker/gpu_model_runner.py``, ``gpu/spec_decode/rejection_sampler.py``);
  the drafter runs ``k`` passes, the first over the step's tokens (``vllm/v1/spec_decode/llm_base_proposer.py:599``),
  the rest at the batch size (``:688-753``), each one more decoder layer; a decode step costs ``(verify + drafts) /
  acceptance_length`` (an input). Not modelled: the ``k`` lookahead KV slots, ``k + 1`` tokens per request counted
  in the budget.
- :class:`DPAttentionPricer` (SGLang ``--dp n --enable-dp-attention``): a rank holds its group's heads
  (``Deployment.attention_rank``), ``1 / n`` of the requests and its own KV; its step is the attention side of its
  tokens plus the MoE side of every active rank's tokens on ``Deployment.rank``. :func:`dp_attention_memory`:
  SGLang's ``--mem-fraction-static`` priced with vLLM 0.33.0's rule (an assumption).
"""

from __future__ import annotations

import math

from ..deployment import Deployment
from ..model.memory import _layer_bytes, memory_tradeoff
from ..model.ops import layer_ops
from ..model.timing import op_time_ms
from ..workload import Step as WorkStep
from .step import DecodeToken, PrefillChunk, Step
from .step_pricer import CostModelPricer, MemoPricer, launched

#: Ops of :func:`mla_lab.model.ops.layer_ops` on the MoE / MLP side of a layer (run over every rank's tokens under
#: DP attention); every other op (attention, indexer, norms, embedding, LM head) is the rank's own.
MOE_SIDE_OPS = ("mlp_gate_up", "mlp_act", "mlp_down", "mlp_allreduce", "router", "router_topk", "moe_gate_up",
                "moe_act", "moe_down", "moe_combine", "shared_gate_up", "shared_act", "shared_down", "moe_allreduce",
                "moe_dispatch", "moe_combine_a2a", "shared_allreduce")

OPTIONS_NOTES = {
    "speculative": "MTP / EAGLE: k + 1 query tokens verified per request per step, k drafter passes (the first over "
                   "the step's tokens, k - 1 at the batch), acceptance_length tokens per step (an input); "
                   "mla_lab.serving.deploy_options",
    "dp_attention": "DP attention: each rank all heads of its group, its own requests and KV, MoE over all GPUs; "
                    "one representative rank simulated; mla_lab.serving.deploy_options",
}


def spec_verify_step(step: Step, k: int) -> Step:
    """``step`` with each decode token (context ``c``) expanded to ``k + 1`` decode tokens at contexts
    ``c, ..., c + k`` (the verification of ``k`` drafts); prefill chunks unchanged."""
    dec = tuple(DecodeToken(d.req_id, d.context_len + j) for d in step.decode for j in range(k + 1))
    return Step(dec, step.prefill_chunks, step.cudagraph_mode, step.cudagraph_num_tokens)


class SpecDecodePricer(MemoPricer):
    """A step pricer under MTP (module docstring) around ``base`` (a pricer with ``price``); a drafter pass is the
    mean of the target's ``num_layers``; ``num_speculative_tokens`` and ``acceptance_length`` checked at the door."""

    def __init__(self, base, num_layers: int, num_speculative_tokens: int, acceptance_length: float):
        self.base, self.L, self.k, self.a = base, num_layers, num_speculative_tokens, acceptance_length

    def _total(self, step: Step) -> float:
        return self.base.price(step)["total_ms"]

    def _pass_ms(self, step: Step) -> float:
        return self.base.price(step)["gpu_ms"] / self.L

    def price(self, step: Step) -> dict:
        """``{"total_ms" (the simulated step: one token per request), "verify_ms", "draft_ms", "prefill_ms",
        "engine_step_ms" (what one real engine step costs)}``, ms."""
        prefill_only = Step((), step.prefill_chunks, "NONE", None) if step.prefill_chunks else None
        pre = (self._total(prefill_only) + self._pass_ms(prefill_only)) if prefill_only else 0.0
        if not step.decode:
            return {"total_ms": pre, "verify_ms": 0.0, "draft_ms": self._pass_ms(step), "prefill_ms": pre,
                    "engine_step_ms": pre}
        verify = spec_verify_step(step, self.k)
        batch = Step(step.decode, (), step.cudagraph_mode, step.cudagraph_num_tokens)
        draft = self._pass_ms(verify) + (self.k - 1) * self._pass_ms(batch)
        engine = self._total(verify) + draft
        total = pre + (engine - pre) / self.a if prefill_only else engine / self.a
        return {"total_ms": total, "verify_ms": self._total(verify), "draft_ms": draft, "prefill_ms": pre,
                "engine_step_ms": engine}

def dp_share(deployment: Deployment) -> dict:
    """One DP-attention rank's share of the run (module docstring): ``num_prompts``, ``concurrency``,
    ``max_num_batched_tokens``, ``max_num_seqs`` (each ``ceil(x / dp)``, at least 1) and ``active_ranks``
    (``min(dp, concurrency)``: the ranks that hold requests)."""
    d, dp = deployment, deployment.dp_attention
    return {"num_prompts": math.ceil(d.num_prompts / dp), "concurrency": math.ceil(d.concurrency / dp),
            "max_num_batched_tokens": max(1, d.max_num_batched_tokens // dp),
            "max_num_seqs": max(1, math.ceil(d.max_num_seqs / dp)), "active_ranks": min(dp, d.concurrency)}


def _replicate(step: Step, n: int) -> Step:
    """``step`` as ``n`` ranks' identical shares (request ids offset per rank)."""
    off = 1 + max([d.req_id for d in step.decode] + [c.req_id for c in step.prefill_chunks] + [0])
    dec = tuple(DecodeToken(d.req_id + r * off, d.context_len) for r in range(n) for d in step.decode)
    ch = tuple(PrefillChunk(c.req_id + r * off, c.start, c.num_tokens) for r in range(n) for c in step.prefill_chunks)
    return Step(dec, ch, step.cudagraph_mode, step.cudagraph_num_tokens)


class DPAttentionPricer(MemoPricer):
    """One DP-attention rank's step (module docstring) of a ``deployment`` with ``dp_attention > 1``; the other
    arguments as :class:`~mla_lab.serving.step_pricer.CostModelPricer`'s."""

    def __init__(self, deployment: Deployment, strategy: str, calibration=None, decode_cal=None):
        d = deployment
        self.attn = CostModelPricer(d.attention_rank, strategy, calibration, decode_cal)
        self.moe = CostModelPricer(d.rank, strategy, calibration, decode_cal)
        self.moe_a2a, self.active = d.moe_parallel == "ep", dp_share(d)["active_ranks"]
        self.L, self.dcal = d.model.num_hidden_layers, self.attn.decode_cal

    def _moe_by_op(self, step: Step) -> dict:
        glob = _replicate(step, self.active)
        if not self.moe_a2a:
            return self.moe.price(glob)["by_op"]
        # DeepEP dispatch / combine: the rank's own T/ep share goes out and comes back (ops.py ep_comm="all_to_all"
        # with ep = the active ranks' tokens); no all-gather (attention is data-parallel, nothing to replicate)
        by = {k: v for k, v in self.moe.price(glob)["by_op"].items() if k != "moe_allreduce"}
        n_moe = self.L - min(self.moe.model.first_k_dense_replace, self.L)
        ops = {op.name: op for op in layer_ops(self.moe.rank, self.moe.strategy, _work(glob), "moe",
                                               ep_comm="all_to_all")}
        for name in ("moe_dispatch", "moe_combine_a2a", "shared_allreduce"):
            if name in ops:
                by[name] = op_time_ms(ops[name], self.moe.arch, self.moe.gcal, self.moe.tp) * n_moe
        return by

    def price(self, step: Step) -> dict:
        """``{"total_ms", "gpu_ms", "host_ms", "launch", "attention_side_ms", "moe_side_ms", "by_op"}`` (ms)."""
        attn = {k: v for k, v in self.attn.price(step)["by_op"].items() if k not in MOE_SIDE_OPS}
        moe = {k: v for k, v in self._moe_by_op(step).items() if k in MOE_SIDE_OPS}
        attn_ms, moe_ms = sum(attn.values()), sum(moe.values())
        gpu = attn_ms + moe_ms + self.dcal.layer_fixed_us * 1e-3 * self.L
        return {**launched(gpu, step, self.attn.n_ops, self.dcal), "attention_side_ms": attn_ms,
                "moe_side_ms": moe_ms, "by_op": attn | moe}


def _work(step: Step):
    """``step`` as a :class:`mla_lab.workload.Step` (the cost model's chunks)."""
    return WorkStep([(d.req_id, d.context_len - 1, 1) for d in step.decode]
                    + [(10**9 + c.req_id, c.start, c.num_tokens) for c in step.prefill_chunks])


def dp_attention_memory(deployment: Deployment, strategies, *, mtp_layers: int = 0) -> dict:
    """:func:`~mla_lab.model.memory.memory_tradeoff` of one DP-attention rank: the attention weights replicated over
    its group (per layer, one attention block at ``tp / dp`` minus one at ``tp``) come off the KV budget in whole
    blocks (vLLM 0.33.0's rule); ``kv_capacity_tokens`` the rank's, ``dp_attention`` ``{"dp",
    "extra_attention_weight_bytes", "tokens_before"}`` added."""
    d = deployment
    mem = memory_tradeoff(d, strategies=strategies, mtp_layers=mtp_layers)
    extra = (d.model.num_hidden_layers + mtp_layers) * (_layer_bytes(d.attention_rank)[0] - _layer_bytes(d.rank)[0])
    kv = mem["kv_capacity"]
    available = kv["available_bytes"] - extra
    blocks = max(int(available // (kv["block_size"] * kv["bytes_per_token"])), 0)
    tokens = blocks * kv["block_size"]
    terms = kv["terms"] + [{"term": "DP attention: attention weights replicated over the group", "value": extra,
                            "unit": "bytes", "status": "estimate",
                            "source": "mla_lab.model.memory._layer_bytes at tp / dp minus at tp, x layers"},
                           {"term": "KV capacity per DP rank (its own requests)", "value": tokens, "unit": "tokens",
                            "status": "computed", "source": "mla_lab.serving.deploy_options"}]
    out = {**mem, "kv_capacity": {**kv, "available_bytes": available, "num_blocks": blocks, "tokens": tokens,
                                  "terms": terms},
           "kv_capacity_tokens": float(tokens), "kv_budget_bytes": available, "fits": available > 0 and tokens > 0}
    if not out["fits"]:
        out["fit_reason"] = (f"DP attention's replicated attention weights ({extra / 2**30:.1f} GiB per rank) leave "
                             "no KV cache")
    out["dp_attention"] = {"dp": d.dp_attention, "extra_attention_weight_bytes": extra,
                           "tokens_before": mem["kv_capacity_tokens"]}
    return out


def per_rank_deployment(deployment: Deployment) -> Deployment:
    """The representative DP rank's workload and engine limits as a Deployment (same engine, ``dp_share``)."""
    sh = dp_share(deployment)
    return deployment.replace(num_prompts=sh["num_prompts"], concurrency=sh["concurrency"],
                              max_num_batched_tokens=max(sh["max_num_batched_tokens"], sh["max_num_seqs"]),
                              max_num_seqs=sh["max_num_seqs"])

