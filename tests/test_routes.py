"""Route selection per engine rule, model and prompt length (mla_lab.routes), refusals where not equivalent."""

from __future__ import annotations

import pytest

from mla_lab.routes import (
    ROUTES,
    EngineRule,
    check_route,
    is_equivalent,
    model_family,
    route_for,
    route_table,
    rules,
)

TOPK = 2048  # index_topk of GLM-5 and DeepSeek-V3.2 (config.json)


def M(name: str):
    """The committed model's config: its family comes from config.json ``architectures``, not from ``name``."""
    from mla_lab.models import load_model

    return load_model(name)


@pytest.mark.parametrize("rule,model,L,route", [
    # vLLM, DeepSeek-V3.2: dense MHA when every prefill has seq_len <= topk (#47327), else the backend's route
    ("vllm-flashmla", "deepseek-v3.2", 1024, "mha-dense"),
    ("vllm-flashmla", "deepseek-v3.2", 2048, "mha-dense"),
    ("vllm-flashmla", "deepseek-v3.2", 2049, "sparse-mqa"),
    ("vllm-fa3", "deepseek-v3.2", 4096, "fa3-sparse"),
    # FLASH_ATTN_MLA_SPARSE handles requests of <= 1024 query tokens as decodes (MQA): no dense route at 1024
    ("vllm-fa3", "deepseek-v3.2", 1024, "fa3-sparse"),
    ("vllm-fa3", "deepseek-v3.2", 1025, "mha-dense"),
    ("vllm-fa3", "deepseek-v3.2", 2048, "mha-dense"),
    # vLLM, GLM-5/5.2: MQA-only wrapper (#52512), short prompts too
    ("vllm-flashmla", "glm-5.2", 1024, "sparse-mqa"),
    ("vllm-flashmla", "glm-5", 512, "sparse-mqa"),
    ("vllm-fa3", "glm-5.2", 1024, "fa3-sparse"),
    # SGLang default H200: dense MHA <= 2048 tokens for both families, flashmla_sparse above
    ("sglang-dense", "glm-5", 1024, "mha-dense"),
    ("sglang-dense", "glm-5", 2048, "mha-dense"),
    ("sglang-dense", "glm-5", 2049, "sparse-mqa"),
    ("sglang-dense", "deepseek-v3.2", 8192, "sparse-mqa"),
    # the padded route forced
    ("sglang-flashmla", "glm-5", 1024, "sparse-mqa"),
])
def test_prefill_route(rule, model, L, route):
    assert route_for(rule, M(model), TOPK, "prefill", L).route == route


@pytest.mark.parametrize("rule,decode", [("vllm-flashmla", "sparse-mqa"), ("vllm-fa3", "fa3-sparse"),
                                         ("sglang-dense", "fa3-sparse"), ("sglang-flashmla", "sparse-mqa")])
def test_decode_route(rule, decode):
    for model in ("glm-5", "deepseek-v3.2"):
        assert route_for(rule, M(model), TOPK, "decode").route == decode


def test_vllm_dense_needs_every_prefill_short():
    """#47327: one prefill longer than topk sends the whole batch to the sparse route."""
    assert route_for("vllm-flashmla", M("deepseek-v3.2"), TOPK, "prefill", [1024] * 15).route == "mha-dense"
    assert route_for("vllm-flashmla", M("deepseek-v3.2"), TOPK, "prefill", [1024] * 15 + [3000]).route == "sparse-mqa"


def test_query_len_threshold_and_context():
    """A chunk of 512 new tokens after 1536 of context: a decode-class request on FA3 sparse, a prefill on FlashMLA."""
    assert route_for("vllm-fa3", M("deepseek-v3.2"), TOPK, "prefill", 2048, 512).route == "fa3-sparse"
    assert route_for("vllm-flashmla", M("deepseek-v3.2"), TOPK, "prefill", 2048, 512).route == "mha-dense"
    assert route_for("vllm-flashmla", M("deepseek-v3.2"), TOPK, "prefill", 4096, 512).route == "sparse-mqa"
    with pytest.raises(ValueError, match="query_len=600 exceeds its seq_len=500"):
        route_for("sglang-dense", M("glm-5"), TOPK, "prefill", 500, 600)
    with pytest.raises(ValueError, match="query_lens has 1 entries for 2 seq_lens"):
        route_for("sglang-dense", M("glm-5"), TOPK, "prefill", [500, 600], [10])


def test_dense_route_only_where_equivalent():
    """Every rule, model and length: a dense route is chosen only when top-k covers every earlier key."""
    for rule in rules():
        for model in ("glm-5", "glm-5.2", "deepseek-v3.2"):
            for L in (1, 100, 2047, 2048, 2049, 4096, 131072):
                r = route_for(rule, M(model), TOPK, "prefill", L).route
                assert r in ROUTES
                assert is_equivalent(r, L, TOPK)
                if r == "mha-dense":
                    assert L <= TOPK


def test_refusals():
    with pytest.raises(ValueError, match="mha-dense.*glm-5.*seq_len=4096.*not equivalent above topk=2048"):
        check_route("mha-dense", "glm-5", 4096, TOPK)
    assert check_route("mha-dense", "glm-5", 2048, TOPK) == "mha-dense"
    assert check_route("mha-masked", "glm-5", 65536, TOPK) == "mha-masked"  # masked = the top-k set: equivalent
    bad = EngineRule("bad", "sglang", "sparse-mqa", "fa3-sparse", 4096, ("glm",), False, "test rule")
    with pytest.raises(ValueError, match="dense_kv_len_threshold=4096 > topk=2048"):
        route_for(bad, M("glm-5"), TOPK, "prefill", 1024)


@pytest.mark.parametrize("call,match", [
    (lambda: route_for("vllm", M("glm-5"), TOPK, "prefill", 1024), "engine rule='vllm' is not valid"),
    (lambda: route_for("sglang-dense", M("glm-5"), TOPK, "extend", 1024), "phase='extend' is not valid"),
    (lambda: route_for("sglang-dense", M("glm-5"), TOPK, "prefill"), "seq_lens=None"),
    (lambda: route_for("sglang-dense", M("glm-5"), TOPK, "prefill", 0), "seq_len"),
    (lambda: route_for("sglang-dense", M("glm-5"), TOPK, "prefill", []), "seq_lens=\\[\\] is empty"),
    (lambda: check_route("dense", "glm-5", 10, TOPK), "route='dense' is not valid"),
])
def test_bad_input_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_route_table_and_family():
    t = route_table("sglang-dense", M("glm-5"), TOPK, (1024, 4096))
    assert t == [{"prompt_len": 1024, "prefill_route": "mha-dense", "decode_route": "fa3-sparse"},
                 {"prompt_len": 4096, "prefill_route": "sparse-mqa", "decode_route": "fa3-sparse"}]
    assert model_family(M("glm-5.2")) == "glm" and model_family(M("deepseek-v3.2")) == "deepseek"
    assert model_family("glm") == "glm"  # a family name is accepted as such
    # a model or folder name does not decide the family (issue 32)
    for name in ("GLM-5.2-FP8", "deepseek-v3.2", "tiny"):
        with pytest.raises(ValueError, match="does not give a family"):
            model_family(name)
    # a model no engine rule names takes no dense route (the lab's own test geometries)
    assert route_for("sglang-dense", "other", TOPK, "prefill", 1024).route == "sparse-mqa"
