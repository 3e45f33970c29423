"""The serve door: a ``mla-lab serve`` run's checks (before it simulates anything), its noise runs, its text and JSON.
Heavier imports are function-local (``mla-lab --help`` loads none of them)."""

from __future__ import annotations

import json
import math

from . import cli_doors as doors
from .cli_doors import MAX_NOISE_STEPS, MAX_SERVE_STEPS, MAX_SERVE_TOTAL_STEPS, MIN_NOISE_RUNS, DoorError

NAN = float("nan")
__all__ = ["add_parser", "cmd_serve", "serve_step_bound", "check_serve", "serve_summary", "band_note", "format_serve"]


def serve_step_bound(num_prompts: int, prompt_len: int, output_len: int, max_num_batched_tokens: int,
                     max_num_seqs: int, concurrency: int, request_rate: float,
                     kv_capacity_tokens: float = math.inf) -> tuple[int, str]:
    """An upper bound on the engine steps one serving strategy simulates, and the case it assumes (for messages).

    A request needs at most ``ceil(L / T) + output_len`` steps and every step advances one, so serial (a finite rate)
    is ``P x (ceil(L / T) + output_len)``; at ``--request-rate inf`` ``lanes = min(concurrency, max_num_seqs, KV
    capacity // (L + output_len))`` run together, ``ceil(P / lanes)`` waves of ``ceil(lanes x L / T) + output_len``.
    """
    serial = num_prompts * (math.ceil(prompt_len / max_num_batched_tokens) + output_len)
    if not math.isinf(request_rate):
        return serial, f"--request-rate {request_rate:g}/s (arrivals may not overlap: bounded as serial)"
    fit = kv_capacity_tokens // (prompt_len + output_len) if math.isfinite(kv_capacity_tokens) else concurrency
    lanes = int(max(min(concurrency, max_num_seqs, fit), 1))
    waves = math.ceil(num_prompts / lanes) * (math.ceil(lanes * prompt_len / max_num_batched_tokens) + output_len)
    return min(serial, waves), f"{lanes} request(s) at a time"


def check_serve(args, strategies=None):
    """``cli_doors.check_deployment`` for ``mla-lab serve`` plus its step bounds (:data:`MAX_SERVE_STEPS` per strategy,
    :data:`MAX_SERVE_TOTAL_STEPS` over all, :data:`MAX_NOISE_STEPS` over the noise runs; ``--num-runs`` 1 or >=
    :data:`MIN_NOISE_RUNS`). ``strategies``: canonical, baseline excluded (default ``args.strategies``). Returns the
    checked Deployment; DoorError (one line, O(1)) otherwise.
    """
    if 1 < args.num_runs < MIN_NOISE_RUNS:
        raise DoorError(f"--num-runs={args.num_runs} is too few for the 95 % band the noise Monte-Carlo prints (its "
                        f"2.5th and 97.5th percentiles need at least {MIN_NOISE_RUNS} runs); allowed: 1 (one "
                        f"deterministic simulation) or {MIN_NOISE_RUNS}..{doors.BOUNDS['num_runs'][1]:,}")
    doors.check_sim_time(args.num_prompts, args.request_rate, "--request-rate")
    conc = args.concurrency if args.concurrency is not None else args.num_prompts
    opts = doors.deployment_options(args)
    dep, mem = doors.check_deployment(args, workload_in_flight=False)
    steps, case = serve_step_bound(args.num_prompts, args.prompt_len, args.output_len,
                                   args.max_num_batched_tokens, args.max_num_seqs, conc, args.request_rate,
                                   float(mem["kv_capacity_tokens"]))
    what = (f"--num-prompts {args.num_prompts} x (--random-input-len {args.prompt_len}, --random-output-len "
            f"{args.output_len}) at {case} is up to {steps:,} engine steps per strategy")
    if steps > MAX_SERVE_STEPS:
        raise DoorError(f"{what}; allowed: at most {MAX_SERVE_STEPS:,} (fewer prompts or output tokens, more "
                        "concurrency, --request-rate inf)")
    from .placement import BASELINE

    n_strat = len(set(strategies if strategies is not None else args.strategies) | {BASELINE})
    # a prefill chunk costs ~2 decode request-steps (measured: --max-num-batched-tokens 256 --random-input-len 16384
    # --num-prompts 700 --random-output-len 1, 4 strategies x 45,500 request-steps: 20.7 s), so it counts twice
    work = args.num_prompts * (2 * math.ceil(args.prompt_len / args.max_num_batched_tokens) + args.output_len)
    if work * n_strat > MAX_SERVE_TOTAL_STEPS:
        raise DoorError(f"--num-prompts {args.num_prompts} x (2 x ceil(--random-input-len {args.prompt_len} / "
                        f"{args.max_num_batched_tokens}) + --random-output-len {args.output_len}) x "
                        f"{n_strat} strategies (baseline included) = {work * n_strat:,} request-steps to simulate; "
                        f"allowed: at most {MAX_SERVE_TOTAL_STEPS:,} (~14 s; fewer strategies, prompts or output "
                        "tokens)")
    if args.num_runs > 1 and (opts["num_speculative_tokens"] or opts["dp_attention"] > 1):
        raise DoorError(f"--num-runs={args.num_runs} with --num-speculative-tokens / --dp-attention: the noise "
                        "Monte-Carlo does not price these options; allowed: --num-runs 1 (one deterministic "
                        "simulation with them)")
    total = work * args.num_runs * n_strat
    if args.num_runs > 1 and total > MAX_NOISE_STEPS:
        raise DoorError(f"--num-runs={args.num_runs} x {n_strat} strategies x {work:,} request-steps is {total:,} "
                        f"simulated request-steps; allowed: at most {MAX_NOISE_STEPS:,} (~13 s; fewer runs, "
                        "strategies, prompts or output tokens)")
    return dep


def serve_summary(res: dict, runs=None, num_runs: int = 1) -> dict:
    """A JSON-able view of a ``serve_benchmark`` result: per strategy every metric, its change vs the baseline,
    the KV capacity, KV tokens lost and % of capacity beside the extra MiB (``runs``: the noise Monte-Carlo's
    result, attached as given)."""
    from .placement import preset_label, strategy_notes

    base_cap = res["strategies"][res["baseline"]]["kv_capacity_tokens"]
    strategies = {s: {"preset": r["preset"], "preset_label": preset_label(r["preset"] or ""),
                      "metrics": {k: float(v) for k, v in r["metrics"].items()},
                      "change_pct": {k: float(v) for k, v in r["change_pct"].items()},
                      "kv_capacity_tokens": int(r["kv_capacity_tokens"]),
                      "kv_tokens_lost": round(float(r["kv_tokens_lost"])),
                      "kv_capacity_pct_lost": 100.0 * float(r["kv_tokens_lost"]) / base_cap if base_cap > 0 else NAN,
                      "extra_mib": float(r["extra_mib"]), "num_steps": int(r["num_steps"])}
                  for s, r in res["strategies"].items()}
    return {"deployment": res["deployment"], "bench": res["bench"], "baseline": res["baseline"],
            "strategies": strategies, "source": "modelled", "options": res.get("options", {}),
            "notes": list(res.get("notes", [])) + strategy_notes(strategies),
            **({} if runs is None else {"noise": runs}), "num_runs": num_runs,
            "band": band_note(res["bench"]["request_rate"], num_runs)}


def band_note(request_rate: float, num_runs: int) -> str:
    """What the serving changes' band is: ``deterministic`` at an infinite rate with one run (every request at t=0;
    the noise runs are optional), ``95 % band over N single runs`` with the noise Monte-Carlo, and ``one run: band
    unknown`` for one run at a finite rate (there one run's change flips sign from seed to seed: issue 32)."""
    if num_runs > 1:
        return f"95 % band over {num_runs} single runs (2.5th-97.5th percentile; mla_lab.serving.noise)"
    if math.isinf(request_rate):
        return "deterministic: one run, every request at t=0 (--num-runs 20 adds the single-run band)"
    return "one run: band unknown"


def _options_lines(opts: dict) -> list[str]:
    """The deployment options of a serve result (modelled), one line each."""
    out = []
    if "speculative" in opts:
        o = opts["speculative"]
        out.append(f"MTP (modelled): {o['num_speculative_tokens']} draft tokens per step, acceptance length "
                   f"{o['acceptance_length']:g} (an input)")
    if "dp_attention" in opts:
        o = opts["dp_attention"]
        out.append(f"DP attention {o['dp']} (modelled): {o['heads_per_rank']} heads per rank "
                   f"({o['padded_heads_per_rank']} padded), one rank simulated with {o['num_prompts']} prompts at "
                   f"concurrency {o['concurrency']}, throughputs x {o['active_ranks']} ranks")
    return out


def format_serve(out: dict) -> str:
    """The serving result as a terminal table: per metric the baseline's value and each strategy's change (%, two
    decimals), then each strategy's memory cost."""
    from .placement import strategy_notes
    from .serving.metrics import SERVE_METRICS

    d, b, base = out["deployment"], out["bench"], out["baseline"]
    others = [s for s in out["strategies"] if s != base]
    rate = b["request_rate"]
    head = [f"vllm bench serve (modelled): {d['model']} TP{d['tp']} {d['arch']}, max_num_batched_tokens "
            f"{d['max_num_batched_tokens']}, max_num_seqs {d['max_num_seqs']}, {d['kv_cache_dtype']} KV, "
            f"{d['weight_dtype']} weights, experts {d['moe_parallel']}",
            *([f"model family: {d['model_family_note']}"] if d.get("model_family_note") else []),
            f"workload: {b['num_prompts']} prompts, input {b['random_input_len']}, output {b['random_output_len']}, "
            f"max concurrency {b['max_concurrency'] or 'unlimited'}, request rate "
            f"{'inf' if math.isinf(rate) else f'{rate:g}/s'}, seed {b['seed']}",
            *_options_lines(out.get("options") or {}), ""]
    names = [out["strategies"][s].get("preset_label") or out["strategies"][s]["preset"] or s for s in others]
    w0, w = 32, max([16] + [len(n) + 2 for n in names])  # every column as wide as its name: none truncated
    lines = [f"{'metric':<{w0}}{'baseline':>{w}}" + "".join(f"{n:>{w}}" for n in names),
             f"{'':<{w0}}{'value':>{w}}" + "".join(f"{'change %':>{w}}" for _ in names)]
    bm = out["strategies"][base]["metrics"]
    for k, label in SERVE_METRICS:
        if k not in bm:
            continue
        v = bm[k]
        row = f"{label:<{w0}}" + (f"{v:>{w},.0f}" if float(v).is_integer() and k == "completed" else f"{v:>{w},.2f}")
        for s in others:
            c = out["strategies"][s]["change_pct"].get(k, float("nan"))
            row += f"{c:>+{w}.2f}" if c == c else f"{'-':>{w}}"
        lines.append(row)
    band = f"; {out['band']} (--num-runs 20 gives it)" if out.get("band") == "one run: band unknown" else ""
    lines += [f"baseline: {base}; changes are (strategy - baseline) / baseline x 100{band}", "",
              "memory per rank vs the baseline (persistent workspace):"]
    wp, ws = max([16] + [len(n) for n in names]), max([28] + [len(s) for s in others])
    for s, n in zip(others, names):
        r = out["strategies"][s]
        lines.append(f"  {n:<{wp}} {s:<{ws}} {r['extra_mib']:+8.1f} MiB = {r['kv_tokens_lost']:,} KV "
                     f"tokens lost ({r['kv_capacity_pct_lost']:.1f} % of KV capacity)")
    if out.get("noise"):
        from .serving.noise import format_noise

        lines += ["", format_noise(out["noise"])]
    lines += [f"note: {n}" for n in strategy_notes(out["strategies"])]
    lines.append("every number is modelled (a step-level simulation of vllm bench serve; docs/serving.md)")
    return "\n".join(head + lines)


def cmd_serve(args) -> int:
    """``mla-lab serve``: checks, the simulation per strategy (and its noise runs), the summary printed."""
    doors.check_engine(args.engine)
    if args.engine is not None:
        from .placement import engine_strategies

        args.strategies = list(args.strategies) + engine_strategies(args.engine)
    strategies = doors.check_strategies(args.strategies)
    if args.num_runs is None:  # a finite rate: one run's change is noise-sized, so the band is the default
        args.num_runs = 1 if math.isinf(args.request_rate) else MIN_NOISE_RUNS
    dep = check_serve(args, strategies)  # the Deployment, checked once
    from .serving import BenchConfig, serve_benchmark

    bench = BenchConfig(num_prompts=args.num_prompts, random_input_len=args.prompt_len,
                        random_output_len=args.output_len, request_rate=args.request_rate,
                        max_concurrency=args.concurrency, seed=args.seed)
    res = serve_benchmark(dep, strategies, bench)
    runs = None
    if args.num_runs > 1:  # N single runs per strategy of the noise model: each metric's median and 95 % band
        from .serving.noise import serve_benchmark_noise

        runs = serve_benchmark_noise(dep, strategies, bench, num_runs=args.num_runs, seed=args.seed)
    out = serve_summary(res, runs, num_runs=args.num_runs)
    print(json.dumps(out, indent=1, default=str) if args.json else format_serve(out))
    return 0


def add_parser(sub) -> None:
    """The ``serve`` sub-command on ``sub`` (argparse sub-parsers)."""
    from .placement import SERVE_PRESETS

    B, R = doors.arg_type, doors.range_help
    sv = sub.add_parser("serve", help="the vllm bench serve simulation for one deployment: every metric per "
                                      "strategy and its change vs the baseline (modelled)")
    doors.deployment_flags(sv, tp_flags=("--tensor-parallel-size", "--tp"))
    sv.add_argument("--random-input-len", "--prompt-len", dest="prompt_len", metavar="RANDOM_INPUT_LEN",
                    type=B("prompt_len"), default=1024, help=f"input tokens per request, {R('prompt_len')} (default 1024)")
    sv.add_argument("--random-output-len", dest="output_len", metavar="RANDOM_OUTPUT_LEN", type=B("output_len"),
                    default=128, help=f"output tokens per request, {R('output_len')} (default 128)")
    sv.add_argument("--num-prompts", type=B("num_prompts"), default=32,
                    help=f"requests, {R('num_prompts')} (default 32; with the step bound below)")
    sv.add_argument("--max-concurrency", dest="concurrency", metavar="MAX_CONCURRENCY", type=B("concurrency"),
                    default=None, help="most requests in flight, 1..num_prompts (default unlimited)")
    sv.add_argument("--request-rate", type=doors.rate_type, default=float("inf"),
                    help="requests/s, a number > 0 or inf (default inf: every request at t = 0, vLLM's default); a "
                         "finite rate is bounded as serial requests: num_prompts x (prefill steps + output_len) "
                         f"<= {MAX_SERVE_STEPS:,} steps per strategy")
    sv.add_argument("--max-num-seqs", type=B("max_num_seqs"), default=256,
                    help=f"vLLM's most sequences per engine step, {R('max_num_seqs')} (default 256)")
    sv.add_argument("--seed", type=B("seed"), default=0,
                    help=f"vllm bench serve --seed (arrival times), {R('seed')} (default 0)")
    sv.add_argument("--num-runs", type=B("num_runs"), default=None,
                    help=f"noise Monte-Carlo runs per strategy (mla_lab.serving.noise): 1 = one deterministic run, "
                         f"or {MIN_NOISE_RUNS}..{doors.BOUNDS['num_runs'][1]:,} (a 95 %% band needs at least "
                         f"{MIN_NOISE_RUNS} runs); default 1 at --request-rate inf, {MIN_NOISE_RUNS} at a "
                         "finite rate (one run there flips sign from seed to seed: its band is shown)")
    sv.add_argument("--strategies", nargs="+", default=list(SERVE_PRESETS),
                    help="presets, aliases or canonical strategies (default vllm-pre-53878 vllm-53878 vllm-56902; "
                         "the baseline is always run)")
    sv.add_argument("--json", action="store_true", help="print the result as JSON")
    sv.add_argument("--engine", default=None,
                    help="an engine version preset, e.g. vllm@0.33.0 or sglang@0.5.23 (mla-lab engines lists them; "
                         "first names such as vllm-53878 map to theirs): its strategies join --strategies")
