"""A model's family (and so the route each engine takes) is read from its config.json, never from its folder name
(issue 32: the same 96-head config was priced with SGLang at -33.2 % in data/models/glm-96h and +4.4 % in
data/models/my-96h). A config whose architecture the lab does not know is priced with a stated assumption that
every output shows (advise text and JSON, serve text and JSON, the sweep row's columns)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mla_lab.models import load_model

ROOT = Path(__file__).resolve().parent.parent
GLM = ROOT / "data" / "models" / "glm-5" / "config.json"


def _data(tmp_path, folders: dict[str, dict]) -> Path:
    """A data folder (MLA_LAB_DATA) with the repository's calibration and one model folder per ``folders`` entry."""
    d = tmp_path / "data"
    shutil.copytree(ROOT / "data" / "calibration", d / "calibration")
    for name, cfg in folders.items():
        (d / "models" / name).mkdir(parents=True)
        (d / "models" / name / "config.json").write_text(json.dumps(cfg))
    return d


def _cli(data: Path, tmp_path: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLA_LAB_DATA": str(data),
           "MLA_LAB_CACHE": str(tmp_path / "cache")}
    env.pop("MLA_LAB_MEASURED", None)
    return subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def _glm96() -> dict:
    cfg = json.loads(GLM.read_text())
    cfg["num_attention_heads"] = cfg["num_key_value_heads"] = 96
    return cfg


def _by_strategy(advice: dict) -> dict:
    rows = [advice["recommendation"], *advice["alternatives"], *advice["other_engines"], *advice["modelled_only"]]
    return {r["strategy"]: r for r in rows if isinstance(r, dict) and "strategy" in r}


def test_the_folder_name_does_not_decide_the_family(tmp_path):
    cfg = _glm96()
    data = _data(tmp_path, {"glm-96h": cfg, "my-96h": cfg})
    assert load_model("glm-96h", data / "models" / "glm-96h" / "config.json").family == "glm"
    assert load_model("my-96h", data / "models" / "my-96h" / "config.json").family == "glm"
    out = {}
    for name in ("glm-96h", "my-96h"):
        r = _cli(data, tmp_path, "advise", "--model", name, "--tp", "8", "--json")
        assert r.returncode == 0, r.stderr
        out[name] = json.loads(r.stdout)
        assert out[name]["deployment"]["model_family"] == "glm"
    a, b = _by_strategy(out["glm-96h"]), _by_strategy(out["my-96h"])
    assert a.keys() == b.keys() and "per_call_zeros@sglang-dense" in a
    for s in a:
        assert a[s]["ttft_change_pct"] == b[s]["ttft_change_pct"], s


def test_a_deepseek_config_in_a_glm_named_folder_is_deepseek(tmp_path):
    cfg = json.loads((ROOT / "data" / "models" / "deepseek-v3.2" / "config.json").read_text())
    data = _data(tmp_path, {"glm-lookalike": cfg})
    assert load_model("glm-lookalike", data / "models" / "glm-lookalike" / "config.json").family == "deepseek"


def test_an_unknown_architecture_is_priced_with_a_stated_assumption_everywhere(tmp_path):
    cfg = _glm96()
    cfg["architectures"] = ["SomeNewDsaForCausalLM"]
    cfg["model_type"] = "some_new_dsa"
    data = _data(tmp_path, {"deepseek-new": cfg})  # a folder name that once decided the family
    m = load_model("deepseek-new", data / "models" / "deepseek-new" / "config.json")
    assert m.family == "other" and "SomeNewDsaForCausalLM" in m.family_note and "assum" in m.family_note
    # advise: text and JSON
    j = _cli(data, tmp_path, "advise", "--model", "deepseek-new", "--json")
    assert j.returncode == 0, j.stderr
    d = json.loads(j.stdout)["deployment"]
    assert d["model_family"] == "other" and d["model_family_note"] == m.family_note
    t = _cli(data, tmp_path, "advise", "--model", "deepseek-new")
    assert t.returncode == 0 and m.family_note in t.stdout.replace("\n", " ")
    # serve: text and JSON
    j = _cli(data, tmp_path, "serve", "--model", "deepseek-new", "--strategies", "sglang", "--json")
    assert j.returncode == 0, j.stderr
    assert json.loads(j.stdout)["deployment"]["model_family_note"] == m.family_note
    t = _cli(data, tmp_path, "serve", "--model", "deepseek-new", "--strategies", "sglang")
    assert t.returncode == 0 and m.family_note in t.stdout.replace("\n", " ")
    # a sweep row
    code = ("import json; from mla_lab.deployment import Deployment; from mla_lab.sweep.rows import modelled_rows\n"
            "d = Deployment.seed(model='deepseek-new')\n"
            "p = d.to_point(strategies=['private_workspace'], shared_workspace_bytes=None, num_runs=7)\n"
            "print(json.dumps([{k: r.get(k) for k in ('model_family', 'model_family_note')} "
            "for r in modelled_rows(p)]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLA_LAB_DATA": str(data), "MLA_LAB_CACHE": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for row in json.loads(r.stdout):
        assert row == {"model_family": "other", "model_family_note": m.family_note}


@pytest.mark.parametrize("name, family", [("glm-5", "glm"), ("glm-5.2", "glm"), ("deepseek-v3.2", "deepseek")])
def test_the_committed_models_keep_their_family(name, family):
    m = load_model(name)
    assert m.family == family and m.family_note == ""
