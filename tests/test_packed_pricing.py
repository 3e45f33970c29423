"""The ``packed`` strategy priced by the cost model (issue 36, "Priced"): the fit by union size, the union sizes a step
has, the dispatch fallback, the memory account, advise / serve / Blackwell."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from mla_lab.deployment import Deployment
from mla_lab.fits import render
from mla_lab.model import packed_kernel as pk
from mla_lab.model.memory import memory_tradeoff
from mla_lab.model.ops import step_ops
from mla_lab.model.timing import kernel_rate_tflops, step_time_ms
from mla_lab.paths import REPO_ROOT, calibration_dir
from mla_lab.placement import parse_strategy
from mla_lab.sweep.advise import advise, format_advice
from mla_lab.union_layout import union_buffer_bytes
from mla_lab.workload import Step

NO_MEASURED = None

# ------------------------------------------------------------------------------------------------ the fixture
# TEST FIXTURE, not data: the lead's preliminary single-lease numbers on one H200 (2026-12-04, calls 1-2 of the
# packed kernel's development, docs/perf-notes.md "Packed kernel"; T 16384, H 8, topk 2048), in the layout of
# data/measured/h200/between_process/packed_kernels.csv, one process, one round. packed_kernel = the hybrid kernel
# at (64, 8, 2) (call 1; the seed at (16, 8, 2), call 2), packed_triton = the Triton kernel over the whole union at
# (64, 8, 2) (call 1), union_build = the Triton builder (call 2), flashmla_ts_pad64 = padded tokenspeed FlashMLA
# (call 1; stale padded heads: the file has no _zeros rows, so the fit takes these). U, S per group over topk.
_FIXTURE = {  # shape: (U, S, packed_kernel, union_build, flashmla_ts_pad64 ms, s_kv, packed_triton); None: not run
    "seed": (516.0 / 2048, 509.0 / 2048, 0.5277, 0.5332, 2.3394, 16384, 0.8435),
    "o1.0": (1.0, 1.0, 1.0617, 0.9755, 7.2762, 65536, 3.3125),
    "o0.8": (4918.0 / 2048, 1638.0 / 2048, 5.5541, 1.1245, 7.4886, 65536, 6.7824),
    "o0.5": (9216.0 / 2048, 1024.0 / 2048, 11.7731, None, 7.6140, 65536, 12.2475),
    "ctx4096": (4079.92 / 2048, 16.22 / 2048, 5.8382, 1.1315, 7.4073, 4096, 5.4580),
    "ctx32768": (13213.56 / 2048, 0.0, 18.0022, 1.4850, 7.7430, 32768, 17.3404),
    "ctx131072": (7.5763, 0.0, None, 3.6291, None, 131072, None),
}


def _fixture_rows() -> list[dict]:
    rows = []
    for shape, (U, S, kern, build, pad, s_kv, tri) in _FIXTURE.items():
        for kernel, ms in (("packed_kernel", kern), ("union_build", build), ("flashmla_ts_pad64", pad),
                           ("packed_triton", tri)):
            if ms is not None:
                rows.append({"experiment": "packed_kernels", "shape": shape, "kernel": kernel, "T": "16384",
                             "H": "8", "topk": "2048", "s_kv": str(s_kv), "U": str(U), "S": str(S),
                             "process": "1", "round": "0", "ms": str(ms)})
    return rows


def _rel_lstsq(X, y):
    """Independently: the coefficients minimising sum(((X c - y) / y)^2), from the normal equations."""
    A = X / y[:, None]
    return np.linalg.solve(A.T @ A, A.T @ np.ones_like(y))


def test_fit_on_the_fixture_is_least_squares_with_honest_errors(tmp_path):
    """The coefficients solve each block's normal equations on relative errors (recomputed here), the in-sample and
    leave-one-shape-out errors are those of the refit, and the CSV round-trips."""
    fit = pk.fit_packed(rows=_fixture_rows(), rows_csv=tmp_path / "fixture.csv", source_commit="fixture")
    G, K, T = 2048, 2048, 16384
    F = _FIXTURE
    shapes = [s for s in F if F[s][2] is not None]
    X = np.array([[G * F[s][1] * K, G * (F[s][0] - F[s][1]) * K, G if F[s][0] > F[s][1] else 0] for s in shapes])
    y = np.array([F[s][2] * 1e6 for s in shapes])
    ref = _rel_lstsq(X, y)
    assert np.allclose([fit.flash_tile, fit.rest_tile, fit.rest_group], ref, rtol=1e-6)
    t = [s for s in F if F[s][6] is not None]  # Triton only: union key-tiles and groups
    Xt = np.array([[G * F[s][0] * K, G] for s in t], dtype=float)
    yt = np.array([F[s][6] * 1e6 for s in t])
    assert np.allclose([fit.triton_tile, fit.triton_group], _rel_lstsq(Xt, yt), rtol=1e-6)
    # seed's padded kernel: 16 causal 1024-token prompts, sum(topk_length) = 16 x 1024 x 1025 / 2
    valid = {s: 16 * 1024 * 1025 // 2 if s == "seed" else T * K for s in F}
    p = [s for s in F if F[s][4] is not None]
    Xp = np.array([[valid[s], T] for s in p], dtype=float)
    yp = np.array([F[s][4] * 1e6 for s in p])
    assert np.allclose([fit.padded_tile, fit.padded_token], _rel_lstsq(Xp, yp), rtol=1e-6)
    # the build: entries read, valid entries, union keys
    b = [s for s in F if F[s][3] is not None]
    Xb = np.array([[T * K, valid[s], G * F[s][0] * K] for s in b], dtype=float)
    yb = np.array([F[s][3] * 1e6 for s in b])
    assert np.allclose([fit.build_read, fit.build_entry, fit.build_key], _rel_lstsq(Xb, yb), rtol=1e-6)
    # leave-one-shape-out of the kernel block at o0.8: refit on the other five, predict it
    i = shapes.index("o0.8")
    keep = [j for j in range(len(shapes)) if j != i]
    c = _rel_lstsq(X[keep], y[keep])
    e = next(e for e in fit.errors if e["block"] == "kernel" and e["shape"] == "o0.8")
    assert e["loso_pct"] == pytest.approx(100 * (X[i] @ c - y[i]) / y[i], rel=1e-6)
    assert e["in_sample_pct"] == pytest.approx(100 * (X[i] @ ref - y[i]) / y[i], rel=1e-6)
    rows_csv = tmp_path / "h200" / "between_process" / "packed_kernels.csv"
    rows_csv.parent.mkdir(parents=True)
    rows_csv.write_text(render(_fixture_rows()))
    path = tmp_path / pk.PACKED_CSV
    path.write_text(render(pk.fit_packed_file(tmp_path)[pk.PACKED_CSV]))
    back = pk.read_packed_csv(path)
    assert all(getattr(back, n) == getattr(fit, n) for n in pk.TERMS)
    assert back.source_commit == "uncommitted" and len(back.errors) == len(fit.errors)
    with open(path, newline="") as f:
        kinds = {r["kind"] for r in csv.DictReader(f)}
    assert kinds == {"coefficient", "error"}


def test_fit_refuses_too_few_shapes():
    rows = [r for r in _fixture_rows() if r["shape"] in ("seed", "o1.0")]
    with pytest.raises(ValueError, match="2 shapes have packed_kernel rows; allowed: >= 3"):
        pk.fit_packed(rows=rows, rows_csv="x.csv", source_commit="")


def test_committed_calibration_is_the_fit_of_the_committed_rows():
    """Once the rows are committed the calibration must be their fit (python -m mla_lab.fits packed);
    until then there is no calibration file and the cost model says it runs on the dispatch's hand fit."""
    rows, cal = REPO_ROOT / pk.ROWS_CSV, calibration_dir() / pk.PACKED_CSV
    if not rows.is_file():
        assert not cal.exists(), f"{cal} without its rows {rows}"
        assert pk.load_packed_fit() is pk.HAND_FIT and "rows not committed" in pk.HAND_FIT.source
        return
    assert cal.is_file(), "rows committed: write the fit (python -m mla_lab.fits packed)"
    committed, refit = pk.read_packed_csv(cal), pk.fit_packed(rows)
    for n in pk.TERMS:
        assert getattr(committed, n) == pytest.approx(getattr(refit, n), rel=1e-9), n
    assert committed.source == pk.ROWS_CSV and committed.source_commit == refit.source_commit


def test_constants_agree_with_the_kernels():
    """The pricing repeats a few kernel constants (importing the kernels loads torch): they must agree."""
    from mla_lab.kernels import packed, union

    assert pk.DISPATCH_MARGIN == packed.DISPATCH_MARGIN
    assert pk.PROGRAMS_PER_SM == union.DEFAULT_PROGRAMS_PER_SM
    h = packed.H200_PACKED_COST
    f = pk.HAND_FIT
    assert (f.flash_tile, f.rest_tile, f.triton_tile, f.triton_group, f.build_read, f.padded_tile,
            f.padded_token) == (h.flash_tile, h.rest_tile, h.triton_tile, h.triton_group, h.build_entry,
                                h.padded_tile, h.padded_token)
    # the dispatch's fit prices the build per [T, topk] entry read, as PackedCost does; no other term
    assert f.rest_group == f.build_entry == f.build_key == 0.0
    for H in (8, 16, 32):
        for rows in (64, 128):
            assert pk.packed_group_size(H, rows) == packed.packed_group_size(H, rows)
    assert pk.packed_group_size(64) is None and union.union_buffer_bytes is union_buffer_bytes


def test_default_overlap_is_the_published_figure():
    from mla_lab.kernels.index_sets import published_overlaps

    pub = {p["id"]: p for p in published_overlaps()}
    assert pub["trtllm_blog21_ablation"]["overlap_low"] == pk.PACKED_OVERLAP_DEFAULT
    assert "trtllm_blog21_ablation" in pk.PACKED_OVERLAP_SOURCE and "assumption" in pk.PACKED_OVERLAP_SOURCE


# ------------------------------------------------------------------------------------------------ union sizes


@pytest.mark.parametrize("lens,g", [([37, 300, 5, 70], 8), ([1024] * 3, 8), ([8, 9, 15, 1, 64], 4),
                                    ([100, 27], 2), ([33] * 5, 16)])
def test_causal_union_matches_brute_force(lens, g):
    """Per group: S and U of step_union (causal, every prompt <= topk) against the union builder's reference on
    causal_indices, group by group."""
    import torch

    from mla_lab.kernels.index_sets import causal_indices
    from mla_lab.kernels.union import build_union_ref

    topk = 1024
    d = causal_indices(lens, topk, seed=0)
    sets = build_union_ref(d.indices, d.topk_length, g, d.s_kv)
    chunks = [(i, 0, n) for i, n in enumerate(lens)]
    st = pk.step_union(chunks, topk, g, overlap=0.44)
    assert st.shared == pytest.approx(float(sets.shared_len.sum()))
    assert st.rest == pytest.approx(float(sets.rest_len.sum()))
    assert st.groups_with_rest == float((sets.rest_len > 0).sum())
    assert st.sum_topk == float(d.topk_length.sum()) and st.T == sum(lens)
    # the per-group function itself, on the groups inside one prompt
    pos = torch.cat([torch.arange(n) for n in lens]).numpy()
    req = np.concatenate([np.full(n, i) for i, n in enumerate(lens)])
    one = [q for q in range(len(pos) // g) if req[q * g] == req[q * g + g - 1]]
    S, U = pk.causal_group_union(pos[[q * g for q in one]], pos[[q * g + g - 1 for q in one]])
    assert np.array_equal(S, sets.shared_len[one].numpy()) and np.array_equal(U, sets.union_len[one].numpy())


def test_overlap_model_matches_the_generators_closed_form():
    """Past the top-k the union follows the common-core model (mla_lab.kernels.index_sets)."""
    from mla_lab.kernels.index_sets import overlap_union_expected

    topk, g, L = 2048, 8, 65536
    st = pk.step_union([(0, L - 8, 8)], topk, g, overlap=0.8)  # one group, context L
    e = overlap_union_expected(topk, L, 0.8, g)
    assert st.union == pytest.approx(e["union"], rel=2e-3)  # the model's integer core vs the solved real core
    assert st.union / topk == pytest.approx(1 + 7 * 0.2, rel=0.02)  # ~2.4 x topk (issue 36)
    # below the random baseline the overlap is raised to it: a random top-k of a 4096-key context
    r = pk.step_union([(0, 4088, 8)], topk, g, overlap=0.0)
    assert r.union == pytest.approx(overlap_union_expected(topk, 4096, topk / 4096, g)["union"], rel=1e-3)


# ------------------------------------------------------------------------------------------------ the dispatch


def test_large_random_context_prices_the_fallback():
    """A 128K-token prompt's last chunk at the random baseline (overlap 0): packing is predicted slower than 0.98 x
    padded, so the step is priced on FA3 sparse, and the ops say so."""
    d = Deployment.seed(prompt_len=131072, num_prompts=1, concurrency=1)
    step = Step([(0, 131072 - 16384, 16384)])
    plan = pk.packed_plan(d.rank, step, overlap=0.0)
    assert plan.path == "fallback" and plan.packed_ms >= pk.DISPATCH_MARGIN * plan.padded_ms
    assert "fallback to FA3 sparse" in plan.reason
    ops = {op.name: op for op, _ in step_ops(d.rank, "packed:0", step)}
    fa3 = {op.name: op for op, _ in step_ops(d.rank, "fa3_sparse", step)}
    assert ops["kernel"].impl == "attn_fa3_sparse" and ops["kernel"].dims["packed_path"] == "fallback"
    assert "concat" not in ops and ops["kernel"].flops == fa3["kernel"].flops
    t_packed = step_time_ms(d.rank, "packed:0", step)["total"]
    assert t_packed == pytest.approx(step_time_ms(d.rank, "fa3_sparse", step)["total"], rel=1e-12)
    # the seed step packs (every prompt <= topk: exact union sizes, the overlap plays no part)
    seed = Step([(i, 0, 1024) for i in range(16)])
    p0, p1 = pk.packed_plan(d.rank, seed, 0.0), pk.packed_plan(d.rank, seed, 1.0)
    assert p0.path == p1.path == "packed" and p0.packed_ms == p1.packed_ms


def test_blackwell_is_modelled_at_a_128_row_tile():
    d = Deployment.seed(arch="b200")
    plan = pk.packed_plan(d.rank, Step([(i, 0, 1024) for i in range(16)]))
    assert plan.tile_rows == 128 and plan.stats.g == 16 == pk.packed_group_size(8, 128)
    ops = {op.name: op for op, _ in step_ops(d.rank, "packed", Step([(i, 0, 1024) for i in range(16)]))}
    t = step_time_ms(d.rank, "packed", Step([(i, 0, 1024) for i in range(16)]))["by_op"]["kernel"]
    h200 = Deployment.seed().arch
    from mla_lab.model.calibration import resolve_calibration

    cal = resolve_calibration(None)
    scale = kernel_rate_tflops(h200, cal)[0] / kernel_rate_tflops(d.arch, cal)[0]
    assert t == pytest.approx(ops["kernel"].dims["packed_ms"] * scale * d.model.num_hidden_layers, rel=1e-9)
    s = pk.packed_summary(d)
    assert "modelled (no Blackwell measurement)" in s["line"]


# ------------------------------------------------------------------------------------------------ memory, advise


def _seed_union_bytes(d: Deployment) -> int:
    """Independently: the builder's outputs at max_num_batched_tokens (g = 8 at 8 heads on sm90; the CUDA builder,
    whose table is in shared memory: no global scratch)."""
    return union_buffer_bytes(d.max_num_batched_tokens, d.model.topk, 64 // d.num_heads, 16384, 1)["outputs"]


def test_blackwell_union_bytes_count_the_triton_builders_scratch():
    """g = 16 runs the Triton builder (the CUDA one refuses it): its scratch at 2 programs per SM x 148 SMs over
    max(max_num_batched_tokens, prompt_len) keys is counted too."""
    d = Deployment.seed(arch="b200")
    b = union_buffer_bytes(d.max_num_batched_tokens, d.model.topk, 16, max(16384, d.prompt_len), 2 * 148)
    assert pk.packed_union_bytes(d.rank, d.prompt_len) == b["total"] > b["outputs"]


def _all_rows(a: dict) -> list[dict]:
    return [a["recommendation"], *a["alternatives"], *a["excluded"], *a.get("other_engines", []),
            *a.get("lab_kernels", [])]


def test_advise_lists_packed_with_real_head_q_plus_union_buffers():
    """Answering within vLLM 0.33.0 (the default), packed is listed beside the answer (the lab's kernel runs in no
    engine) with its memory: Q at the real heads + the union buffers, no padded workspace."""
    d = Deployment.seed()
    a = advise(d, measured=NO_MEASURED)
    assert [s["strategy"] for s in a["lab_kernels"]] == ["packed"]
    assert all(s["strategy"] != "packed" for s in [a["recommendation"], *a["alternatives"]])
    rows = _all_rows(a)
    p = a["lab_kernels"][0]
    q = d.max_num_batched_tokens * d.num_heads * 576 * 2  # [max_num_batched_tokens, H, 576] bf16, no padded heads
    want = q + _seed_union_bytes(d)
    assert p["persistent_mib"] == pytest.approx(want / 2**20, rel=1e-12)
    base = next(r for r in rows if r["strategy"] == "per_call_empty:zeros")
    assert p["extra_persistent_mib"] == pytest.approx((want - base["persistent_mib"] * 2**20) / 2**20, rel=1e-12)
    pr = next(r for r in rows if r["strategy"] == "private_workspace")
    assert pr["persistent_mib"] == pytest.approx(d.max_num_batched_tokens * 64 * 576 * 2 / 2**20)  # padded, 64
    assert math.isfinite(p["ttft_ms"]) and p["label"].startswith("packed (mla_lab kernel")
    assert a["packed"]["steps_packed"] == a["packed"]["steps"] == 2 and a["packed"]["overlap_assumed"]
    text = format_advice(a)
    assert "in no engine, not ranked against vllm@0.33.0" in text and "assumed" in text
    # with the caller's own candidates and no engine, packed is ranked with them
    own = advise(d, measured=NO_MEASURED, strategies=["vllm-53878"], packed_overlap=0.44)
    assert "packed" in [s["strategy"] for s in [own["recommendation"], *own["alternatives"]]]


def test_advise_packed_overlap_option_and_refusal():
    d = Deployment.seed(prompt_len=32768, num_prompts=4, concurrency=4)
    lo = advise(d, measured=NO_MEASURED)
    hi = advise(d, measured=NO_MEASURED, packed_overlap=0.9)
    t = {r["strategy"]: r["ttft_ms"] for a in (lo, hi) for r in _all_rows(a)}
    assert lo["packed"]["steps_fallback"] == lo["packed"]["steps"]  # 0.44 at 32K: every step on FA3 sparse
    assert t["packed"] == pytest.approx(t["fa3_sparse@vllm-0.33.0"], rel=1e-12)
    assert hi["packed"]["steps_packed"] > 0 and t["packed:0.9"] < t["fa3_sparse@vllm-0.33.0"]
    with pytest.raises(ValueError, match=r"packed_overlap=1.5 must be a number in \[0, 1\]"):
        advise(Deployment.seed(), packed_overlap=1.5)
    with pytest.raises(ValueError, match="packed overlap 'x' must be a number"):
        parse_strategy("packed:x")


def test_memory_account_is_computed_once_and_refuses_packed_without_union_bytes():
    from mla_lab.buffers import memory_account

    m = memory_tradeoff(Deployment.seed(), strategies=["packed"])
    assert m["accounts"]["packed"].persistent_bytes == 16384 * 8 * 576 * 2 + _seed_union_bytes(Deployment.seed())
    with pytest.raises(ValueError, match="strategy='packed' needs union_bytes"):
        memory_account("packed", 8, 16384, "h200", "bf16")


def test_seed_memory_figures_of_the_doc():
    """docs/packed.md, "Pricing": 144 MiB of Q + 184.3 MiB of union buffers = 328.3 MiB per rank at the seed,
    against PR #53878's 1152 MiB padded workspace."""
    d = Deployment.seed()
    acc = memory_tradeoff(d, strategies=["packed", "private_workspace"])["accounts"]
    q = d.max_num_batched_tokens * d.num_heads * 576 * 2
    text = (REPO_ROOT / "docs" / "packed.md").read_text()
    figures = (f"{q / 2**20:.0f} MiB of Q + {(acc['packed'].persistent_bytes - q) / 2**20:.1f} MiB of\nunion buffers"
               f" = {acc['packed'].persistent_bytes / 2**20:.1f} MiB per rank, against PR #53878's "
               f"{acc['private_workspace'].persistent_bytes / 2**20:.0f} MiB")
    assert figures.replace("\n", " ") in " ".join(text.split())


def test_plan_matches_the_kernels_dispatch_on_built_sets():
    """Under the hand fit the plan's predictions equal mla_lab.kernels.packed.choose_path's on the union sets the
    builder's reference makes for the same causal prompts (every group, stride 1)."""
    from mla_lab.kernels.index_sets import causal_indices
    from mla_lab.kernels.packed import choose_path
    from mla_lab.kernels.union import build_union_ref

    d = Deployment.seed()
    lens = [1024, 700, 300, 2000, 72]
    data = causal_indices(lens, d.model.topk, seed=1)
    sets = build_union_ref(data.indices, data.topk_length, 8, data.s_kv)
    T = sum(lens)
    path, ms = choose_path(sets, 1, T, d.model.topk, float(data.topk_length.sum()))
    plan = pk.packed_plan(d.rank, Step([(i, 0, n) for i, n in enumerate(lens)]), fit=pk.HAND_FIT)
    assert plan.path == "packed" and path == {"hybrid": "packed", "triton": "packed_triton"}[plan.mode]
    assert plan.packed_ms == pytest.approx(ms[path], rel=1e-9)
    assert plan.padded_ms == pytest.approx(ms["padded"], rel=1e-9)


def test_fit_figures_of_the_doc():
    """docs/packed.md, "Pricing": the fit's errors as stated, from data/calibration/h200_packed.csv."""
    f = pk.read_packed_csv(calibration_dir() / pk.PACKED_CSV)
    worst = {}
    for e in f.errors:
        worst[e["block"]] = max(worst.get(e["block"], 0.0), abs(float(e["in_sample_pct"])))
    err = {(e["block"], e["shape"]): e for e in f.errors}
    ctx = err[("path_check", "ctx131072")]
    text = " ".join((REPO_ROOT / "docs" / "packed.md").read_text().split())
    for claim in (f"within {worst['kernel']:.1f} % of every shape in sample",
                  f"the seed's error is {float(err[('kernel', 'seed')]['loso_pct']):+.0f} % and overlap 1.0's "
                  f"{float(err[('kernel', 'o1.0')]['loso_pct']):+.0f} %",
                  f"Triton-only kernel is within {worst['triton']:.1f} %, the padded kernel within "
                  f"{worst['padded']:.1f} %, and the build within {worst['build']:.1f} %",
                  f"come within {worst['path_check']:.1f} % of the fitted sum",
                  f"costs {float(ctx['measured_ms']) - float(ctx['fitted_ms']):.1f} ms more than its fitted parts"):
        assert claim in text, claim
    assert max(worst, key=worst.get) != "kernel" and worst["path_check"] == pytest.approx(
        abs(float(ctx["in_sample_pct"])))  # the path's worst shape is the 128K context


@pytest.mark.parametrize("rows, names", [
    (b"# a README\n", "0 shapes have packed_kernel rows"),
    (b"shape,variant\n\xd0\xff\xfe\n", "'utf-8' codec can't decode"),
    (None, "h200_packed.csv exists; pass --overwrite"),
])
def test_packed_refit_refuses_in_one_line(rows, names, tmp_path, capsys):
    """``python -m mla_lab.fits packed``: a rows file that is not the packed_kernels rows, or a committed file without
    --overwrite: one line on stderr, exit 2, nothing printed on stdout, nothing written."""
    from mla_lab.fits import main

    measured = tmp_path if rows is not None else REPO_ROOT / "data" / "measured"
    if rows is not None:
        (tmp_path / pk.FIT_GPU / "between_process").mkdir(parents=True)
        (tmp_path / pk.FIT_GPU / "between_process" / "packed_kernels.csv").write_bytes(rows)
    committed = (calibration_dir() / pk.PACKED_CSV).read_bytes()
    assert main(["packed", "--measured-dir", str(measured)]) == 2
    out, err = capsys.readouterr()
    assert names in err and len(err.strip().splitlines()) == 1 and out == ""
    assert (calibration_dir() / pk.PACKED_CSV).read_bytes() == committed


def test_packed_line_on_b200_names_no_hopper_kernel_as_running():
    """FA3 sparse is a Hopper kernel (advise --arch b200 excludes fa3_sparse for it): on sm100 the packed line names
    vLLM 0.33.0's real-head sm100 kernel for the fallback and decode, and says it is priced with FA3 sparse's model;
    on an H200 it still names FA3 sparse."""
    b = pk.packed_summary(Deployment.seed(arch="b200", prompt_len=32768, num_prompts=4, concurrency=4))
    assert b["steps_fallback"] > 0  # the fallback wording is exercised too
    assert "FA3 sparse per token" not in b["line"] and "fallback to FA3 sparse" not in b["line"]
    assert b["line"].count(pk.SM100_REAL_HEAD) == 2 and "FA4 or FlashInfer sparse" in pk.SM100_REAL_HEAD
    h = pk.packed_summary(Deployment.seed(prompt_len=32768, num_prompts=4, concurrency=4))
    assert "decode per token: FA3 sparse;" in h["line"] and "priced on the fallback (FA3 sparse)" in h["line"]


def test_doc_says_what_the_sweep_default_holds():
    """docs/packed.md, "Where it shows": the sweep prices ``packed`` by default (it said the opposite after the
    default changed); the sentence follows :data:`mla_lab.placement.SWEEP_STRATEGIES`."""
    from mla_lab.placement import SWEEP_STRATEGIES

    text = " ".join((REPO_ROOT / "docs" / "packed.md").read_text().split())
    assert SWEEP_STRATEGIES[-1] == "packed"
    assert "The sweep prices it by default: `packed` is the last of the sweep's default `strategies`" in text
    assert "not in the sweep's default list" not in text


@pytest.mark.parametrize("over, tile, scope", [
    ({}, "8 tokens x 8 heads per 64-row tile", "measured kernel ("),
    ({"arch": "b200"}, "16 tokens x 8 heads per 128-row tile", "modelled (no Blackwell measurement)"),
    ({"model": "deepseek-v3.2"}, "4 tokens x 16 heads per 64-row tile",
     "modelled kernel (the 8-head rows' per-tile fit applied at g = 4, an extrapolation"),
    ({"tp": 16}, "4 heads per rank: not packed", "the packed kernel unused (every step on the fallback)"),
])
def test_packed_line_says_its_packing_and_whether_its_kernel_was_measured(over, tile, scope):
    """The strategy's label says "8 tokens x 8 heads per tile" (the measured case); the per-deployment line says
    the deployment's own packing, and "measured kernel" only where the rows were measured (8 heads, a 64-row tile):
    at 16 heads per rank (DeepSeek-V3.2 TP8) the per-tile fit is an extrapolation (docs/packed.md) and said so."""
    s = pk.packed_summary(Deployment.seed(**over))
    assert s["line"].startswith(f"{pk.PACKED_LABEL_SHORT}, {tile}: {scope}") and s["scope"].startswith(scope)


def test_packed_line_says_when_the_overlap_does_not_enter():
    """``advise --packed-overlap 0.8`` at the seed printed the same TTFT as the default with nothing saying why: with
    1024-token prompts (<= the top-k of 2048) every token selects its whole prefix and the assumed overlap past the
    top-k does not enter. The line says so there, and not at 4096-token prompts, where the overlap moves the TTFT."""
    seed = {o: pk.packed_summary(Deployment.seed(), f"packed:{o}") for o in (0.2, 0.8)}
    long = {o: pk.packed_summary(Deployment.seed(prompt_len=4096), f"packed:{o}") for o in (0.2, 0.8)}
    assert all("unused here: no prompt is longer than the top-k" in s["line"] for s in seed.values())
    assert not any("unused here" in s["line"] for s in long.values())
    t = {(n, o): advise(d, measured=NO_MEASURED, packed_overlap=o)["lab_kernels"][0]["ttft_ms"]
         for n, d in (("seed", Deployment.seed()), ("long", Deployment.seed(prompt_len=4096))) for o in (0.2, 0.8)}
    assert t[("seed", 0.2)] == t[("seed", 0.8)] and t[("long", 0.2)] != t[("long", 0.8)]
