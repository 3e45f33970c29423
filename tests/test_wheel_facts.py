"""Issue 29: the engine facts checked against the release wheels (mla_lab.engines.wheel_check, ast only).

The synthetic tests run everywhere. The wheel tests need the release wheels (vLLM's is ~336 MB, so CI does not fetch
it): they look in env MLA_LAB_WHEELS (default /work/wheels) and skip, with that reason, when a wheel is absent.
"""

import json
import os
from pathlib import Path

import pytest

from mla_lab.engines import Source, engine_version, version_facts
from mla_lab.engines.wheel_check import check_source, check_wheel, find_wheel, format_report, write_report

REPO = Path(__file__).resolve().parent.parent
WHEELS = Path(os.environ.get("MLA_LAB_WHEELS", "/work/wheels"))
RELEASES = [("vllm", "0.33.0"), ("sglang", "0.5.23"), ("vllm", "0.24.0"), ("vllm", "0.13.0")]

SRC = '''class FlashMLASparseImpl:
    def __init__(self, num_heads):
        super().__init__()
        self.prefill_padding = 128 if current_platform.is_device_capability_family(100) else 64
        self.t = {16: 128, 64: 256}.get(num_heads, 256)
        out = flash_attn_varlen_func(q=q_rope, k=k, q_v=q_nope, fa_version=3)
'''


def _src(code, line="4", scope="FlashMLASparseImpl.__init__"):
    return Source("x.py", line, code, scope)


def test_check_source_holds_moves_fails_and_misses():
    pad64 = _src("self.prefill_padding = 64")
    status, found, instead, _ = check_source(SRC, pad64)
    assert status == "fails" and found == []
    assert instead == ["x.py:4: self.prefill_padding = 128 if current_platform.is_device_capability_family(100) "
                       "else 64"]
    ok = _src("self.prefill_padding = (128 if current_platform.is_device_capability_family(100) else 64)")
    assert check_source(SRC, ok)[:2] == ("holds", ["4"])  # parentheses do not matter: ast, not text
    assert check_source(SRC, _src(ok.code, line="9"))[0] == "moved"
    assert check_source(SRC, _src("flash_attn_varlen_func(fa_version=3)", line="6"))[0] == "holds"
    assert check_source(SRC, _src("flash_attn_varlen_func(fa_version=4)", line="6"))[0] == "fails"
    assert check_source(SRC, _src("{64: 256}", line="5"))[0] == "holds"  # a dict entry in a bigger literal
    assert check_source(SRC, _src("{64: 128}", line="5"))[0] == "fails"
    assert check_source(SRC, _src("x = 1", scope="Nope.__init__"))[0] == "missing"
    assert check_source(None, pad64)[0] == "missing"


def test_committed_reports_cover_every_release_fact():
    for engine, version in RELEASES:
        rep = json.loads((REPO / "data" / "engines" / f"wheel_facts_{engine}-{version}.json").read_text())
        want = {(p, f.key, s.path, s.code) for p, f, s in version_facts(engine_version(engine, version))
                if p != "lab (PR-era)"}
        got = {(f["preset"], f["key"], f["path"], f["code"]) for f in rep["facts"]}
        assert got == want, (engine, version)
        assert all(f["status"] == "holds" for f in rep["facts"]), (engine, version)
        assert (REPO / "data" / "engines" / f"wheel_facts_{engine}-{version}.md").read_text() == format_report(rep)
    v33 = json.loads((REPO / "data" / "engines" / "wheel_facts_vllm-0.33.0.json").read_text())
    stale = {c["key"] for c in v33["lab_claims"] if not c["still_holds"]}
    assert {"prefill_padding", "decode_threshold", "decode_threshold.fa3", "prefill_route.glm"} <= stale


def test_write_report_refuses_to_overwrite(tmp_path):
    rep = {"engine": "vllm", "version": "0.33.0", "wheel": "w", "wheel_built": "d", "release_date": "d",
           "counts": {"holds": 0, "moved": 0, "fails": 0, "missing": 0}, "facts": []}
    write_report(rep, tmp_path)
    with pytest.raises(ValueError, match="exists; allowed: pass --overwrite"):
        write_report(rep, tmp_path)
    write_report(rep, tmp_path, overwrite=True)


@pytest.mark.parametrize("engine,version", RELEASES)
def test_the_facts_hold_in_the_release_wheel(engine, version):
    wheel = find_wheel(WHEELS, engine, version) if WHEELS.is_dir() else None
    if wheel is None:
        pytest.skip(f"no {engine}-{version} wheel in {WHEELS} (set MLA_LAB_WHEELS, or `mla-lab engines --download "
                    f"{engine}=={version} --wheel-dir DIR`; CI does not fetch it)")
    rep = check_wheel(wheel)
    bad = [f for f in rep["facts"] if f["status"] != "holds"]
    assert not bad, bad
    committed = json.loads((REPO / "data" / "engines" / f"wheel_facts_{engine}-{version}.json").read_text())
    assert [(f["key"], f["found"]) for f in rep["facts"]] == [(f["key"], f["found"]) for f in committed["facts"]]
    assert [c["still_holds"] for c in rep["lab_claims"]] == [c["still_holds"] for c in committed["lab_claims"]]


def test_a_newer_fact_fails_against_an_older_wheel():
    """Not vacuous on real files: vLLM 0.33.0's prefill_padding fact read in the 0.24.0 wheel fails, and the check
    says what stands there instead."""
    wheel = find_wheel(WHEELS, "vllm", "0.24.0") if WHEELS.is_dir() else None
    if wheel is None:
        pytest.skip(f"no vllm-0.24.0 wheel in {WHEELS} (set MLA_LAB_WHEELS)")
    import zipfile

    p, f, s = next(x for x in version_facts(engine_version("vllm", "0.33.0"))
                   if x[0] == "vllm@0.33.0" and x[1].key == "prefill_padding")
    text = zipfile.ZipFile(wheel).read(s.path).decode()
    status, _, instead, _ = check_source(text, s)
    assert status == "fails"
    assert instead == ["vllm/v1/attention/backends/mla/flashmla_sparse.py:578-580: self.prefill_padding = 128 if "
                       "current_platform.is_device_capability_family(100) else 64"]
