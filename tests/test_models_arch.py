"""Model configs (data/models: HF config.json values) and arch specs."""

import json

import pytest

from mla_lab.arch import ARCHS, detect_arch, get_arch
from mla_lab.models import load_model, model_names


def test_known_models_and_geometry():
    assert {"glm-5", "deepseek-v3.2"} <= set(model_names())
    glm, ds = load_model("glm-5"), load_model("deepseek-v3.2")
    assert (glm.num_attention_heads, glm.num_hidden_layers, glm.hidden_size) == (64, 78, 6144)
    assert (ds.num_attention_heads, ds.num_hidden_layers, ds.hidden_size) == (128, 61, 7168)
    for m in (glm, ds):
        assert m.head_size == 576 and m.d_v == 512 and m.topk == 2048
    assert [glm.heads_per_rank(tp) for tp in (1, 2, 4, 8)] == [64, 32, 16, 8]
    assert [ds.heads_per_rank(tp) for tp in (1, 2, 4, 8)] == [128, 64, 32, 16]


@pytest.mark.parametrize("tp,match", [(3, r"tp=3 does not divide num_attention_heads=64 of model 'glm-5'; allowed tp"),
                                      (0, r"tp=0 must be a positive int"), (-8, r"tp=-8 must be a positive int"),
                                      (2.0, r"tp=2.0 must be a positive int")])
def test_heads_per_rank_errors(tp, match):
    with pytest.raises(ValueError, match=match):
        load_model("glm-5").heads_per_rank(tp)


def test_kv_bytes_per_token():
    ds = load_model("deepseek-v3.2")
    assert ds.kv_cache_bytes_per_token_layer("bf16", include_indexer=False) == 1152
    assert ds.kv_cache_bytes_per_token_layer("fp8", include_indexer=False) == 656
    assert ds.kv_cache_bytes_per_token_layer("bf16") == 1152 + 132
    assert ds.kv_cache_bytes_per_token("fp8") == 61 * (656 + 132)


def test_unknown_and_malformed_configs(tmp_path):
    with pytest.raises(ValueError, match=r"model='llama' is not known .*allowed: \["):
        load_model("llama")
    bad = tmp_path / "bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"is not valid JSON"):
        load_model("bad", path=bad)
    cfg = json.loads(load_model.__globals__["models_dir"]().joinpath("glm-5", "config.json").read_text())
    del cfg["kv_lora_rank"]
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing required field 'kv_lora_rank'"):
        load_model("bad", path=bad)
    cfg["kv_lora_rank"] = "512"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"field 'kv_lora_rank'='512' must be a positive int"):
        load_model("bad", path=bad)
    with pytest.raises(ValueError, match=r"does not exist"):
        load_model("x", path=tmp_path / "nope.json")


def test_arch_table_and_aliases():
    assert {"h100", "h200", "h800", "h20", "b200"} <= set(ARCHS)
    assert get_arch("hopper").name == "h200" and get_arch("Blackwell").name == "b200"
    assert get_arch("h200").prefill_padding == 64 and get_arch("b200").prefill_padding == 128
    assert get_arch("h200").sm == "sm90" and get_arch("b200").sm == "sm100"
    for a in ARCHS.values():
        assert a.source and a.hbm_gbps > 0 and a.bf16_tflops > 0 and a.nvlink_gbps > 0
    with pytest.raises(ValueError, match=r"arch='mi300' is not a known GPU architecture"):
        get_arch("mi300")


def test_detect_arch_on_this_machine():
    import torch

    d = detect_arch()
    if torch.cuda.is_available():
        assert d["device"] != "cpu" and d["prefill_padding"] in (64, 128)
    else:
        assert d == {"device": "cpu", "capability": None, "arch": None, "sm": None, "prefill_padding": None}


def test_h20_is_not_read_as_h200():
    from mla_lab.arch import _match_product

    assert _match_product("NVIDIA H200").name == "h200"
    assert _match_product("NVIDIA H20").name == "h20"
    assert _match_product("NVIDIA H100 80GB HBM3").name == "h100"
    assert _match_product("NVIDIA A100-SXM4-80GB") is None
