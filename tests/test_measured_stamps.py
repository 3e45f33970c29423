"""Measured rows keyed by the digest of the model config they were measured on (issue 24): the committed manifest
data/measured/config_digests.json (mla_lab/report/stamp_measured.py), read by mla_lab.report.data.load_measured; an
edited config detaches its rows and says so (advise output, the report's provenance banner)."""

import json
import shutil
import subprocess
import sys

import pytest

from mla_lab import cli
from mla_lab.paths import MANIFEST_NAME, data_dir, measured_dir
from mla_lab.report.data import combine, config_digest, load_measured
from mla_lab.report.tables import provenance_html, provenance_summary

STAMP = ["-m", "mla_lab.report.stamp_measured"]


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A copy of data/models and data/calibration (byte for byte) as MLA_LAB_DATA; measured rows from the
    committed data/measured (and its manifest)."""
    d = tmp_path / "data"
    measured = measured_dir()
    shutil.copytree(data_dir() / "models", d / "models")
    shutil.copytree(data_dir() / "calibration", d / "calibration")
    monkeypatch.setenv("MLA_LAB_DATA", str(d))
    monkeypatch.setenv("MLA_LAB_MEASURED", str(measured))
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    return d


def _edit(d, model, **kv):
    cfg = d / "models" / model / "config.json"
    c = json.loads(cfg.read_text())
    c.update(kv)
    cfg.write_text(json.dumps(c))
    return c


def test_committed_manifest_is_up_to_date_and_stamps_every_committed_measured_row():
    """The committed manifest is what the script writes today (configs at the rows' git_commit equal today's), and
    every measured row the loader reads is stamped: none detached, none unstamped."""
    r = subprocess.run([sys.executable, *STAMP, "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((measured_dir() / MANIFEST_NAME).read_text())
    entry = doc["files"]["h200/padding_sweep.csv"]
    assert [e["device"] for e in entry] == ["NVIDIA H200"] and entry[0]["rows"] == 224
    for m in ("glm-5", "deepseek-v3.2"):
        assert entry[0]["models"][m] == config_digest(data_dir() / "models" / m / "config.json")
    m = load_measured()
    assert len(m) == 224 and m.attrs["detached"] == [] and m.attrs["unstamped"] == []


def test_unchanged_or_reindented_config_keeps_its_measured_rows(data):
    cfg = data / "models" / "glm-5" / "config.json"
    cfg.write_text(json.dumps(json.loads(cfg.read_text()), indent=4))  # same values, other bytes
    m = load_measured()
    assert m.attrs["detached"] == [] and len(m[m["model"] == "glm-5"]) == 112


def test_edited_heads_detach_that_models_rows_with_one_line_each(data, capsys):
    _edit(data, "glm-5", num_attention_heads=128)
    m = load_measured()
    notes = m.attrs["detached"]
    assert len(notes) == 2 and all("\n" not in n for n in notes), notes  # glm-5 TP4 and TP8
    tp8 = [n for n in notes if "glm-5 TP8" in n][0]
    assert tp8.startswith("56 measured row(s) of glm-5 TP8 detached: measured at [8] heads per rank, the config now "
                          "gives 16; measured with data/models/glm-5/config.json sha256 18e1676ea161, it is now ")
    assert "h200/padding_sweep.csv, NVIDIA H200" in tp8 and "mla_lab/report/stamp_measured.py" in tp8
    assert not (m["model"] == "glm-5").any() and len(m[m["model"] == "deepseek-v3.2"]) == 112
    # the report's banner and provenance.json say it
    both = combine(m.iloc[0:0], m)
    assert "Detached:" in provenance_html(both) and "glm-5 TP8 detached" in provenance_html(both)
    assert provenance_summary(combine(m, m))["measured_detached"] == notes
    # advise prints it as a note
    assert cli.main(["advise"]) == 0
    out = capsys.readouterr().out
    assert "note: 56 measured row(s) of glm-5 TP8 detached" in out


def test_a_value_heads_per_rank_cannot_see_detaches_by_digest_alone(data):
    """index_topk changed: heads per rank are the same, so only the digest knows the rows are of another config."""
    c = _edit(data, "glm-5", index_topk=1024)
    assert c["num_attention_heads"] == 64
    notes = load_measured().attrs["detached"]
    assert len(notes) == 2 and all("heads per rank" not in n for n in notes), notes
    assert all("measured with data/models/glm-5/config.json sha256 18e1676ea161" in n for n in notes)


def test_rows_without_a_stamp_are_kept_by_heads_and_listed(tmp_path, monkeypatch):
    """A fresh GPU run's CSV before the stamp script: attached by heads per rank, named as unstamped; once stamped
    (the script on that root) it is keyed by digest."""
    import pandas as pd

    root = tmp_path / "measured"
    (root / "h200").mkdir(parents=True)
    df = pd.read_csv(measured_dir() / "h200" / "padding_sweep.csv")
    df[(df["model"] == "glm-5") & (df["tp"] == 8)].to_csv(root / "h200" / "new.csv", index=False)
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    m = load_measured(root)
    assert len(m) == 56 and m.attrs["detached"] == []
    assert m.attrs["unstamped"] == ["56 measured row(s) of h200/new.csv carry no config digest (checked by heads per "
                                    "rank only; run mla_lab/report/stamp_measured.py after a GPU run)"]
    r = subprocess.run([sys.executable, *STAMP, "--root", str(root)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 file(s), 56 measured row(s) stamped" in r.stdout, r.stdout + r.stderr
    m = load_measured(root)
    assert len(m) == 56 and m.attrs["unstamped"] == [] and m.attrs["detached"] == []


def test_stamp_script_refuses_a_root_that_is_not_a_folder(tmp_path):
    r = subprocess.run([sys.executable, *STAMP, "--root", str(tmp_path / "nosuch")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a folder" in r.stderr
    assert not (tmp_path / "nosuch").exists()
