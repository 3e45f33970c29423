"""Sweep: params validation, grid, modelled rows, resumable store, fused == unfused."""

import pytest

from mla_lab.strategies import equivalence_check
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.rows import modelled_rows as price_point
from mla_lab.sweep.store import ResultStore, point_key

TINY = dict(models=["glm-5"], tp_sizes=[8], archs=["h200", "b200"], max_num_batched_tokens=[16384],
            strategies=["unfused", "fused", "kernel_native"],
            prompt_lens=[1024], device="cpu")


def test_default_grid_size():
    p = validate_params({})
    assert len(expand_grid(p)) == 2 * 1 * 2 * 2 * 2  # models x tp_sizes [8] (the TP that loads) x archs x mbt x L


def test_seed_point_rows():
    pt = expand_grid(validate_params(TINY))[0]
    rows = {r["strategy"]: r for r in price_point(pt)}
    fused, unfused = rows["private_workspace"], rows["per_call_empty:zeros"]  # the aliases' canonical names
    assert fused["extra_persistent_bytes"] == 1_056_964_608
    assert fused["extra_persistent_mib"] == 1008
    assert unfused["extra_persistent_bytes"] == 0
    assert fused["q_concat_heads"] == 64 and unfused["q_concat_heads"] == 8
    assert fused["ttft_ms"] < unfused["ttft_ms"]
    assert unfused["ttft_change_pct"] == 0
    assert fused["preset"] == "vllm-53878" and unfused["preset"] == "vllm-pre-53878"
    assert rows["per_call_empty:stale"]["ttft_ms"] > unfused["ttft_ms"]  # stale padded heads cost kernel time
    assert all(r["source"] == "modelled" and r["git_commit"] for r in rows.values())


def test_run_sweep_resumes_without_duplicates(tmp_path):
    params = dict(TINY, store_dir=str(tmp_path / "st"), data_file=str(tmp_path / "out.csv"))
    df1 = run_sweep(params, progress=False)
    assert len(df1) == 2 * 4  # 2 archs x 4 strategies (unfused -> both ends of vllm-pre-53878)
    assert (tmp_path / "out.csv").is_file()
    files = sorted((tmp_path / "st" / "points").glob("*.json"))
    assert len(files) == 2
    mtimes = [f.stat().st_mtime_ns for f in files]
    df2 = run_sweep(params, progress=False)
    assert len(df2) == len(df1)
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # skipped, not rewritten
    df3 = run_sweep(dict(params, force=True), progress=False)
    assert len(df3) == len(df1)


def test_failed_point_is_recorded_and_sweep_goes_on(tmp_path):
    params = dict(TINY, tp_sizes=[3, 8], archs=["h200"], store_dir=str(tmp_path / "st"),
                  data_file=str(tmp_path / "o.csv"))
    df = run_sweep(params, progress=False)
    failed = df[df["status"] == "failed"]
    assert len(failed) == 1 and failed.iloc[0]["tp"] == 3
    assert "tp=3 does not divide num_attention_heads=64" in failed.iloc[0]["reason"]
    assert (df[df["status"] == "ok"]["tp"] == 8).all() and len(df[df["status"] == "ok"]) == 4


@pytest.mark.parametrize(
    "raw,match",
    [({"modelz": ["glm-5"]}, r"unknown sweep parameter\(s\) \['modelz'\]; allowed"),
     ({"tp_sizes": []}, r"tp_sizes=\[\] gives an empty grid"),
     ({"tp_sizes": ["8"]}, r"tp_sizes holds '8' \(str\); every entry must be int"),
     ({"tp_sizes": [0]}, r"tp_sizes holds 0; every entry must be a positive int"),
     ({"models": ["gpt-2"]}, r"model='gpt-2' is not known"),
     ({"archs": ["v100"]}, r"arch='v100' is not a known GPU architecture"),
     ({"kv_cache_dtype": "int8"}, r"kv_cache_dtype='int8' is not supported"),
     ({"device": "tpu"}, r"device='tpu' is not allowed"),
     ({"strategies": ["padded"]}, r"strategies holds 'padded'; allowed"),
     ({"num_prompts": 0}, r"num_prompts=0 must be a positive int"),
     ({"force": "yes"}, r"force='yes' must be true or false"),
     ({"max_num_batched_tokens": 16384.5}, r"max_num_batched_tokens=16384.5 must be a list")],
)
def test_params_errors(raw, match):
    with pytest.raises(ValueError, match=match):
        validate_params(raw)


def test_store_atomic_files(tmp_path):
    st = ResultStore(tmp_path)
    k = point_key({"a": 1}, "v1")
    assert k != point_key({"a": 1}, "v2") and k == point_key({"a": 1}, "v1")
    st.write(k, {"a": 1}, [{"x": 1}, {"x": 2}])
    assert st.has(k) and st.rows() == [{"x": 1}, {"x": 2}]
    assert not list((tmp_path / "points").glob("*.tmp"))


@pytest.mark.parametrize("num_heads,arch", [(8, "hopper"), (16, "hopper"), (32, "hopper"), (8, "blackwell"),
                                            (64, "hopper")])
def test_fused_equals_unfused(num_heads, arch):
    r = equivalence_check(num_heads=num_heads, arch=arch, seed=num_heads)
    assert r["equal"], r
    assert r["max_abs_diff_out"] == 0.0


def test_a_value_given_twice_is_one_grid_value():
    """`--tensor-parallel-size '[8, 8]'` and `-p models '[glm-5, GLM-5]'` give one point, not two or four."""
    from mla_lab.sweep.params import validate_params

    p = validate_params({"models": ["glm-5", "GLM-5"], "tp_sizes": [8, 8], "archs": ["h200"],
                         "max_num_batched_tokens": [16384, 16384], "prompt_lens": [1024],
                         "kv_cache_dtype": ["bf16", "auto"]})
    assert (p.models, p.tp_sizes, p.max_num_batched_tokens) == (["glm-5"], [8], [16384])
    assert len(p.kv_cache_dtype) == 1
