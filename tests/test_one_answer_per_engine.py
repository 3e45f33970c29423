"""One answer per engine (issue 39): ``advise`` answers within one engine version (``--engine``, default vLLM
0.33.0) and lists other engines' options in their own section; labels name the engine version a strategy is priced
as; a B200 gets the same answer block, modelled, naming vLLM's FA4 / FlashInfer backends as themselves."""

import re

import pytest

from mla_lab.deployment import Deployment
from mla_lab.sweep.advise import DEFAULT_ENGINE, advise, engine_group, format_advice

NO_MEASURED = None


def _ranked(res):
    return [res["recommendation"], *res["alternatives"]]


@pytest.fixture(scope="module")
def seed():
    return advise(Deployment.seed(), measured=NO_MEASURED)


def test_plain_advise_answers_within_vllm_0_33_0(seed):
    assert DEFAULT_ENGINE == "vllm@0.33.0" and seed["engine"] == DEFAULT_ENGINE
    assert {engine_group(r["engine"]) for r in _ranked(seed)} == {"vllm@0.33.0"}
    assert seed["recommendation"]["label"] == "fa3_sparse@vllm-0.33.0"  # vLLM's own default: no padded workspace
    others = {r["label"]: r for r in seed["other_engines"]}
    assert "per_call_zeros@sglang-dense" in others and "private_workspace@vllm-pr53878" in others
    assert all(engine_group(r["engine"]) != "vllm@0.33.0" for r in seed["other_engines"])
    text = format_advice(seed)
    a, b = text.index("recommended within vllm@0.33.0"), text.index("other engine versions' options")
    assert a < b and "sglang-dense" not in text[a:b]


def test_labels_name_the_engine_version():
    res = advise(Deployment.seed(model="deepseek-v3.2"), measured=NO_MEASURED)
    labels = [r["label"] for r in [*_ranked(res), *res["other_engines"]]]
    assert "fa3_sparse@vllm-0.33.0" in labels and "fa3_sparse@vllm-pr46189" in labels
    assert len(labels) == len(set(labels))  # no two rows print one label
    text = format_advice(res)
    assert not re.search(r"^fa3_sparse ", text, re.M)  # never a bare name whose engine the reader must guess
    pr46189 = next(r for r in res["other_engines"] if r["label"] == "fa3_sparse@vllm-pr46189")
    today = res["recommendation"] if res["recommendation"]["label"] == "fa3_sparse@vllm-0.33.0" else \
        next(r for r in res["alternatives"] if r["label"] == "fa3_sparse@vllm-0.33.0")
    assert pr46189["ttft_change_pct"] > today["ttft_change_pct"]  # the PR-era always-sparse FA3 is the slower one


def test_another_engine_is_answered_within_itself():
    res = advise(Deployment.seed(), engine="sglang@0.5.23", measured=NO_MEASURED)
    assert {engine_group(r["engine"]) for r in _ranked(res)} == {"sglang@0.5.23"}
    assert any(r["label"] == "fa3_sparse@vllm-0.33.0" for r in res["other_engines"])


def _sections(text):
    return [re.sub(r" within \S+", "", ln.split("(")[0]).strip() for ln in text.splitlines()
            if ln.startswith(("recommended", "alternatives", "other engine versions", "strategy@engine"))]


@pytest.mark.parametrize("kv, name", [("bf16", "fa4_sparse"), ("fp8", "flashinfer_sparse")])
def test_b200_gets_the_same_block_modelled_with_its_own_backend(seed, kv, name):
    res = advise(Deployment.seed(arch="b200", kv_cache_dtype=kv), measured=NO_MEASURED)
    text = format_advice(res)
    assert _sections(text) == _sections(format_advice(seed))  # the same answer block as the H200's
    assert res["recommendation"]["label"] == f"{name}@vllm-0.33.0"
    assert not re.search(r"^fa3_sparse@vllm-0\.33\.0", text, re.M)
    assert any(r["strategy"] == "fa3_sparse" and "Hopper" in r["reason"] for r in res["excluded"])
    assert "nothing here ran on a B200" in text and "every number is modelled" in text
    assert "on an H200 only" not in text and "timed on an H200" not in text
    assert all(r["measured_change_pct"] is None for r in [*_ranked(res), *res["other_engines"]])


def test_engines_takes_arch():
    from conftest import run_cli

    rc, out, _ = run_cli(["engines", "--arch", "b200"])
    assert rc == 0
    assert "B200 (sm100)" in out and "FLASH_ATTN_MLA_SPARSE_FA4" in out and "nothing ran on a B200" in out
    rc, _, err = run_cli(["engines", "--arch", "a100"])
    err = err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--arch='a100'" in err[0] and "b200" in err[0]
