"""Issue 32: corrupt stored or measured files are named in one line (which file, which row) and never silently drop
rows: a truncated measured CSV, a garbage cell, a point file missing its rows. Every file is a copy in tmp_path."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import pytest

from mla_lab import cli
from mla_lab.paths import REPO_ROOT
from mla_lab.report.data import load_measured
from mla_lab.sweep import run_sweep

MEASURED = REPO_ROOT / "data" / "measured"
SWEEP_CSV = "h200/padding_sweep.csv"


@pytest.fixture
def measured(tmp_path):
    """A copy of the committed measured sweep CSV with its manifest (config_digests.json), nothing else."""
    root = tmp_path / "measured"
    (root / "h200").mkdir(parents=True)
    shutil.copy(MEASURED / SWEEP_CSV, root / SWEEP_CSV)
    shutil.copy(MEASURED / "config_digests.json", root / "config_digests.json")
    return root


def test_the_copy_loads_whole(measured):
    assert len(load_measured(measured)) == 224  # the 224 H200 measurements the issue counts


def test_truncated_mid_row_is_named_with_its_row(measured):
    p = measured / SWEEP_CSV
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) * 3 // 10])  # cut inside a row
    with pytest.raises(ValueError, match=r"padding_sweep\.csv: row \d+ has \d+ fields, the header \d+ \(a truncated"):
        load_measured(measured)


def test_truncated_at_a_line_end_is_named_by_its_stamp(measured):
    """A file cut at a line end parses cleanly: 161 of 224 measured rows went missing with exit 0."""
    p = measured / SWEEP_CSV
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[: len(lines) * 3 // 10]))
    # the manifest's row count of the whole file (csv_rows) names it first; its measured-row stamp (224) backs it up
    with pytest.raises(ValueError, match=r"padding_sweep\.csv holds \d+ (measured )?rows; its stamp in "
                                         r".*config_digests\.json counts \d+ \(rows were lost"):
        load_measured(measured)


def test_garbage_cell_makes_advise_name_the_file_and_row(measured, tmp_path, monkeypatch):
    """One garbage cell made every ``advise`` exit 2 with ``Expecting value: line 1 column 1 (char 0)``."""
    import csv

    p = measured / SWEEP_CSV
    rows = list(csv.reader(p.open(newline="")))
    col = rows[0].index("attn_path_ms_steps")
    n = next(i for i, r in enumerate(rows) if i and r[rows[0].index("source")] == "measured" and r[col])
    rows[n][col] = "garbage"
    with p.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    monkeypatch.setenv("MLA_LAB_MEASURED", str(measured))
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["advise"])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err.getvalue()
    assert re.search(rf"padding_sweep\.csv: row {n + 1}: attn_path_ms_steps='garbage' is not a JSON list", lines[0])


def test_point_file_without_rows_is_named_and_computed_again(tmp_path, capsys):
    """A point file ``{"status": "ok"}`` failed every re-run with ``KeyError: 'rows'``."""
    params = dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384], prompt_lens=[1024],
                  strategies=["vllm-53878"], device="cpu", store_dir=str(tmp_path / "st"),
                  data_file=str(tmp_path / "x.csv"))
    first = run_sweep(params, progress=False)
    (point,) = (tmp_path / "st" / "points").glob("*.json")
    point.write_text(json.dumps({"status": "ok"}))
    capsys.readouterr()
    again = run_sweep(params, progress=False)
    err = capsys.readouterr().err
    assert f"point file {point} is missing 'key': computing the point again" in err
    assert len(again) == len(first) and (again["status"] == "ok").all()
    assert json.loads(point.read_text())["rows"]


def test_cut_between_process_file_and_corrupt_manifest_are_named(tmp_path):
    """A between-process CSV cut in half moved the seed's measured figure silently (-1.05 -> -0.98 %), and a
    manifest that no longer parses hid it: both refused in one line naming the file (issue 32's tester)."""
    import shutil

    from mla_lab.paths import REPO_ROOT, read_measured_csv

    src = REPO_ROOT / "data" / "measured"
    m = tmp_path / "measured"
    (m / "h200" / "between_process").mkdir(parents=True)
    shutil.copy(src / "config_digests.json", m)
    f = m / "h200" / "between_process" / "presets.csv"
    lines = (src / "h200" / "between_process" / "presets.csv").read_text().splitlines(keepends=True)
    f.write_text("".join(lines[: len(lines) // 2]))
    with pytest.raises(ValueError, match=r"presets\.csv holds \d+ rows; its stamp in .*counts \d+ \(rows were lost"):
        read_measured_csv(f)
    (m / "config_digests.json").write_text('{"x":')
    with pytest.raises(ValueError, match=r"config_digests\.json cannot be read"):
        read_measured_csv(f)
