"""Issue 39, "doors that cannot destroy": each case the issue lists, refused in one line within 10 s with nothing
deleted or replaced (each failed before its fix: the report command deleted data/measured/h200, a failed wheel
check replaced the committed facts, a 491-byte YAML alias bomb hung the sweep door, serve ran 134 s at 1e-9 req/s,
/proc paths passed the door, a x10 measured cell moved a figure, hand-edited records gave internal errors)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from conftest import run_cli

from mla_lab.paths import (
    OUTPUT_MANIFEST,
    REPO_ROOT,
    committed_data_folder,
    read_measured_csv,
    replaceable_files,
    special_filesystem,
    write_output_manifest,
)

MEASURED = REPO_ROOT / "data" / "measured" / "h200"


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_refusal(argv, words, rc=2, limit_s=10.0):
    t0 = time.monotonic()
    got, out, err = run_cli(argv)
    dt = time.monotonic() - t0
    assert got == rc, (got, err[-500:])
    lines = [x for x in err.strip().splitlines() if x.startswith("mla-lab: error:")]
    assert len(lines) == 1 and len(lines[0]) < 2000, err[-500:]
    for w in words:
        assert w in lines[0], lines[0]
    assert dt < limit_s, dt
    return lines[0]


# ------------------------------------------------------------------------------------------------ --overwrite
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (committed data folders are found with it)")
def test_report_into_a_committed_data_folder_deletes_nothing():
    before = _tree(MEASURED)
    _one_line_refusal(["report", "--measured", "h200", "--report-dir", str(MEASURED), "--overwrite"],
                      ["--report-dir", "committed data folder"])
    assert _tree(MEASURED) == before
    assert committed_data_folder(MEASURED) is not None and committed_data_folder(REPO_ROOT / "reports") is None


def test_report_into_a_folder_of_other_files_names_the_first_one(tmp_path):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "a_notes.txt").write_text("mine")
    (d / "sub" / "b.csv").write_text("x")
    before = _tree(d)
    line = _one_line_refusal(["report", "--measured", "h200", "--report-dir", str(d), "--overwrite"],
                             ["a_notes.txt, a file the lab did not write"])
    assert "already holds a report" not in line
    assert _tree(d) == before


def _fake_report(d: Path, name="padding_sweep_h200", run_id="20261202-000000-abcdef12") -> None:
    (d / name).mkdir(parents=True)
    (d / f"{name}.html").write_text(f"<html>run {run_id}</html>")
    (d / f"{name}_rows.csv").write_text("a\n1\n")
    (d / "run_metadata.json").write_text(json.dumps({"report_name": name, "run_id": run_id}))
    for f in ("frontier_1.png", "frontier_1.svg"):
        (d / name / f).write_text(f)


def test_a_report_folder_without_manifest_is_known_by_its_stamp_and_nothing_else(tmp_path):
    """The committed reports/h200 has no manifest yet: its files are the lab's by the report's own stamp (the
    run_id of run_metadata.json inside its html); a foreign file beside them is refused, and so is a figure without
    its twin; a folder whose html lacks the stamp is nobody's."""
    from mla_lab.cli_measure import legacy_report_files

    d = tmp_path / "rep"
    _fake_report(d)
    files = replaceable_files(d, "--report-dir", True, legacy=legacy_report_files)
    assert sorted(p.relative_to(d).as_posix() for p in files) == [
        "padding_sweep_h200.html", "padding_sweep_h200/frontier_1.png", "padding_sweep_h200/frontier_1.svg",
        "padding_sweep_h200_rows.csv", "run_metadata.json"]
    with pytest.raises(ValueError, match="holds output the lab wrote .* --overwrite"):
        replaceable_files(d, "--report-dir", False, legacy=legacy_report_files)
    (d / "padding_sweep_h200" / "my_plot.png").write_text("x")  # no .svg twin: not a figure the report wrote
    with pytest.raises(ValueError, match="my_plot.png, a file the lab did not write"):
        replaceable_files(d, "--report-dir", True, legacy=legacy_report_files)
    (d / "padding_sweep_h200" / "my_plot.png").unlink()
    (d / "padding_sweep_h200.html").write_text("<html>another page</html>")  # the stamp gone
    with pytest.raises(ValueError, match="a file the lab did not write"):
        replaceable_files(d, "--report-dir", True, legacy=legacy_report_files)


def test_the_committed_h200_report_is_recognised_for_its_first_re_render():
    from mla_lab.cli_measure import legacy_report_files

    d = REPO_ROOT / "reports" / "h200"
    if (d / OUTPUT_MANIFEST).is_file():
        files = replaceable_files(d, "--report-dir", True, legacy=legacy_report_files)
    else:
        files = replaceable_files(d, "--report-dir", True, legacy=legacy_report_files)
        assert len(files) == len(legacy_report_files(d))
    assert {p.name for p in files} >= {"padding_sweep_h200.html", "run_metadata.json", "padding_sweep_h200_rows.csv"}


def test_a_manifest_lists_what_overwrite_may_replace(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    (d / "a.html").write_text("a")
    write_output_manifest(d, [d / "a.html"], "test")
    assert {p.name for p in replaceable_files(d, "--report-dir", True)} == {"a.html", OUTPUT_MANIFEST}
    (d / "a.html").write_text("edited by hand")
    with pytest.raises(ValueError, match="a.html changed since the lab wrote it"):
        replaceable_files(d, "--report-dir", True)
    (d / "a.html").write_text("a")
    (d / "b.txt").write_text("b")
    with pytest.raises(ValueError, match="b.txt, a file the lab did not write"):
        replaceable_files(d, "--report-dir", True)


# ------------------------------------------------------------------------------------- a failed check writes nothing
def test_a_failed_wheel_check_writes_nothing(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(REPO_ROOT / "data" / "engines", data / "engines")
    monkeypatch.setenv("MLA_LAB_DATA", str(data))
    before = _tree(data / "engines")
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "x = 1\n")
    rc, out, err = run_cli(["engines", "--check-wheel", str(wheel), "--write", "--overwrite"])
    assert rc == 1 and "not written (the check failed" in err
    assert _tree(data / "engines") == before


# ------------------------------------------------------------------------------------------- parsed input bounded
def _bomb(levels: int, key: str = "device") -> str:
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return f"{key}: [" + ", ".join(parts) + "]\n"


@pytest.mark.parametrize("levels", [6, 9])
def test_a_yaml_alias_bomb_is_refused_at_parse(tmp_path, levels):
    f = tmp_path / "bomb.yaml"
    f.write_text(_bomb(levels))
    assert len(f.read_bytes()) < 600  # the bomb: 491 bytes
    _one_line_refusal(["sweep", "--dry-run", "-f", str(f)], ["anchor or alias"], limit_s=5)
    _one_line_refusal(["sweep", "--dry-run", "-p", "models", "[&a [x], *a]"], ["-p models", "anchor or alias"])


def test_a_huge_parameter_file_is_refused_before_parsing(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("models: [" + ", ".join(["glm-5"] * 20000) + "]\n")
    _one_line_refusal(["sweep", "--dry-run", "-f", str(f)], ["bytes", "at most"])


def test_an_echoed_value_is_bounded():
    line = _one_line_refusal(["sweep", "--dry-run", "-p", "device", "[" + ", ".join(["x" * 50] * 500) + "]"],
                             ["device="])
    assert len(line) < 600  # 10**4 characters given; reprlib: 6 entries of 60 characters


# ---------------------------------------------------------------------------------- serving: simulated time bound
@pytest.mark.parametrize("rate", ["1e-9", "1e-12", "1e-20"])
def test_serve_refuses_a_rate_beyond_the_simulated_time_bound(rate):
    _one_line_refusal(["serve", "--request-rate", rate, "--num-prompts", "2", "--random-output-len", "4"],
                      ["--request-rate", "simulated seconds", "allowed: >="])


def test_the_slowest_rate_allowed_runs_bounded():
    """At the bound (num_prompts / rate = 1e8 s) the run is quick and its memory does not grow with simulated time
    (the per-second output-token buckets are sparse)."""
    import resource

    t0 = time.monotonic()
    rc, out, err = run_cli(["serve", "--request-rate", "2e-8", "--num-prompts", "2", "--random-output-len", "4",
                            "--num-runs", "1", "--json"])
    assert rc == 0, err[-300:]
    assert time.monotonic() - t0 < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: under 4 GiB


def test_the_sweep_refuses_a_request_rate_beyond_the_bound_in_its_dry_run():
    _one_line_refusal(["sweep", "--dry-run", "-p", "request_rate", "1.0e-20"], ["request_rate", "simulated seconds"])


def test_sparse_buckets_give_the_same_peak():
    from mla_lab.serving.metrics import RequestRecord, bench_metrics

    recs = [RequestRecord(req_id=0, input_len=8, output_len=3, arrival_s=0.0, send_s=0.0, token_times_s=(0.5, 0.7, 1.2)),
            RequestRecord(req_id=1, input_len=8, output_len=2, arrival_s=1e6, send_s=1e6,
                          token_times_s=(1e6 + 0.1, 1e6 + 0.2))]
    m = bench_metrics(recs)
    assert m["max_output_tokens_per_s"] == 2.0  # bucket 0 holds 0.5 and 0.7; bucket 1 holds 1.2


# --------------------------------------------------------------------------------------------- special filesystems
@pytest.mark.parametrize("argv, words", [
    (["sweep", "--dry-run", "-p", "store_dir", "/proc/mla_lab_store"], ["store_dir", "proc filesystem"]),
    (["sweep", "--dry-run", "-p", "data_file", "/proc/self/rows.csv"], ["data_file", "proc filesystem"]),
    (["sweep", "--dry-run", "-p", "report_dir", "/sys/mla_lab"], ["report_dir", "sysfs filesystem"]),
    (["measure", "--dry-run", "--out", "/proc/mla_lab"], ["--out", "proc filesystem"]),
    (["measure", "--dry-run", "--out", "/sys/kernel/mla_lab"], ["--out", "sysfs filesystem"]),
    (["report", "--measured", "h200", "--report-dir", "/proc/mla_lab"], ["--report-dir", "proc filesystem"]),
])
def test_special_filesystems_are_refused_in_the_door_and_the_dry_run(argv, words):
    if special_filesystem("/proc/x") is None:
        pytest.skip("no /proc on this machine")
    _one_line_refusal(argv, words)


# ----------------------------------------------------------------------------------- measured values: range, provenance
def _copy(tmp_path, rel: str) -> Path:
    dst = tmp_path / Path(rel).name
    shutil.copy2(MEASURED / rel, dst)
    return dst


def _edit_csv(p: Path, row: int, col: str, fn) -> None:
    """Row ``row`` (1 = header) of CSV ``p``: ``col`` set to ``fn(old text)``."""
    import csv

    rows = list(csv.reader(p.open(newline="")))
    j = rows[0].index(col)
    rows[row - 1][j] = fn(rows[row - 1][j])
    with p.open("w", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.parametrize("rel, col, fn, words", [
    ("between_process/presets.csv", "ms", lambda v: str(float(v) * 10), ["row 2", "ms=", "away from the median"]),
    ("between_process/presets.csv", "median_ms", lambda v: str(float(v) * 10), ["row 2", "median_ms", "not the median"]),
    ("between_process/strategies.csv", "ms", lambda v: "nan", ["row 2", "ms='nan' is not a finite number"]),
    ("between_process/strategies.csv", "ms", lambda v: "", ["row 2", "ms is empty"]),
    ("between_process/strategies.csv", "ms", lambda v: "fast", ["row 2", "ms='fast' is not a number"]),
    ("between_process/engine_kernels.csv", "bytes", lambda v: "-5", ["row 2", "bytes=-5 is outside"]),
    ("padding_sweep.csv", "attn_path_ms_step0", lambda v: str(float(v) * 10), ["outside its own quartiles"]),
    ("padding_sweep.csv", "ttft_ms", lambda v: str(float(v) * 10), ["ttft_ms=", "outside its own interval"]),
])
def test_an_edited_measured_cell_is_refused_naming_file_row_and_column(tmp_path, rel, col, fn, words):
    import pandas as pd

    p = _copy(tmp_path, rel)
    read_measured_csv(p)  # the committed file passes
    d = pd.read_csv(p)
    row = 2
    if "source" in d.columns:
        row = int(d.index[(d["source"] == "measured") & d[col].notna()][0]) + 2
        words = [w if w != "row 2" else f"row {row}" for w in words]
    _edit_csv(p, row, col, fn)
    with pytest.raises(ValueError) as e:
        read_measured_csv(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_every_committed_measured_csv_passes_the_checks():
    files = sorted((REPO_ROOT / "data" / "measured").rglob("*.csv"))
    assert len(files) > 40
    for f in files:
        read_measured_csv(f)


def test_a_x10_cell_stops_advise_in_one_line(tmp_path, monkeypatch):
    root = tmp_path / "measured"
    shutil.copytree(REPO_ROOT / "data" / "measured", root)
    _edit_csv(root / "h200" / "between_process" / "presets.csv", 2, "ms", lambda v: str(float(v) * 10))
    monkeypatch.setenv("MLA_LAB_MEASURED", str(root))
    monkeypatch.setenv("MLA_LAB_NO_CACHE", "1")
    _one_line_refusal(["advise"], ["presets.csv: row 2: ms=", "away from the median"], limit_s=30)


def test_a_x10_point_file_value_never_reaches_the_csv(tmp_path):
    from mla_lab.sweep.store import payload_problem

    row = {"source": "measured", "ttft_ms": 1100.0, "ttft_ms_ci_lo": 1099.0, "ttft_ms_ci_hi": 1101.0,
           "attn_path_ms_step0": 2.5, "attn_path_q1_step0": 2.4, "attn_path_q3_step0": 2.6,
           "attn_path_ms_steps": "[2.5, 2.5]"}
    payload = {"key": "k", "point": {}, "status": "ok", "reason": "", "rows": [row]}
    assert payload_problem(payload) == ""
    for col in ("ttft_ms", "attn_path_ms_step0"):
        bad = {**row, col: row[col] * 10}
        assert "implausible measured value in rows[0]" in payload_problem({**payload, "rows": [bad]})
    assert "not a list of finite times" in payload_problem({**payload, "rows": [{**row, "attn_path_ms_steps":
                                                                                  "[2.5, NaN]"}]})
    assert "attn_path_ms_steps holds 25" in payload_problem({**payload, "rows": [{**row, "attn_path_ms_steps":
                                                                                   [2.5, 25.0]}]})


# --------------------------------------------------------------------------------- hand-editable records, file named
@pytest.mark.parametrize("text, words", [
    ("not json", "is not readable JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"processes": 5}', "experiments is NoneType"),
    ('"a string"', "holds a JSON str"),
    ('{"processes": 5, "experiments": {"padding_sweep": "x"}}', "experiments['padding_sweep'] is str"),
    ('{"processes": 5, "experiments": {"padding_sweep": {"exit": "0"}}}', ".exit is not a list"),
    ('{"processes": "5", "experiments": {}}', "processes='5' is not an int"),
])
def test_a_hand_edited_resume_record_is_named(tmp_path, text, words):
    run = tmp_path / "run"
    run.mkdir()
    (run / "provenance.json").write_text(text)
    _one_line_refusal(["measure", "--dry-run", "--resume", str(run)], [str(run / "provenance.json"), words])


def test_a_non_utf8_resume_record_is_named(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "provenance.json").write_bytes(b"\xff\xfe{")
    _one_line_refusal(["measure", "--dry-run", "--resume", str(run)], ["provenance.json is not readable JSON"])


def test_index_names_a_run_record_it_cannot_read(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r1.html").write_text("<html></html>")
    (runs / "r1.json").write_text(json.dumps({"run_id": "r1", "html": "runs/r1.html", "created_utc": "2026"}))
    (runs / "bad.json").write_bytes(b"\xff\xfe{")
    (runs / "r2.json").write_text(json.dumps({"run_id": "r2", "html": "runs/r1.html", "figures": {"a": "x"}}))
    rc, out, err = run_cli(["index", "--report-dir", str(tmp_path)])
    assert rc == 0 and "index of 1 report(s)" in out
    assert "bad.json skipped: not readable UTF-8 JSON" in err and "r2.json skipped: figures holds" in err


# ---------------------------------------------------------------------------------------------- Deployment.seed
def test_seed_with_fewer_prompts_needs_no_concurrency():
    from mla_lab.deployment import Deployment

    d = Deployment.seed(num_prompts=1)
    assert (d.num_prompts, d.concurrency) == (1, 1)
    assert Deployment.seed(num_prompts=100).concurrency == Deployment.seed().concurrency
    with pytest.raises(ValueError, match="concurrency=32 exceeds num_prompts=1"):  # given by the caller: refused
        Deployment.seed(num_prompts=1, concurrency=32)


def test_git_status_is_unchanged_by_these_doors():
    """The cases above ran in this process against the checkout: git sees no change they made under data/."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    r = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "data/measured", "data/engines"],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout == ""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git (committed data folders are found with it)")
@pytest.mark.parametrize("name, value", [("store_dir", "data"), ("store_dir", "data/measured/h200"),
                                         ("report_dir", "data/calibration"),
                                         ("data_file", "data/measured/h200/padding_sweep.csv")])
def test_the_sweep_never_writes_into_a_committed_data_folder(name, value):
    before = _tree(REPO_ROOT / "data" / "measured")
    _one_line_refusal(["sweep", "--dry-run", "-p", name, str(REPO_ROOT / value), "--overwrite"],
                      [name, "committed data folder"])
    _one_line_refusal(["sweep", "-p", name, str(REPO_ROOT / value), "--overwrite"], [name, "committed data folder"])
    assert _tree(REPO_ROOT / "data" / "measured") == before
    assert committed_data_folder(REPO_ROOT / "data", direct=True) is None  # the default data/padding_sweep.csv


def test_the_explorer_prices_no_more_steps_than_advise():
    from mla_lab import explore
    from mla_lab.cli_doors import MAX_PRICED_STEPS
    from mla_lab.deployment import Deployment

    assert explore.MAX_PRICED_STEPS == MAX_PRICED_STEPS
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="prefill steps to price per strategy; allowed: at most 2,048"):
        explore.explore_point(Deployment.seed(prompt_len=2**40))
    with pytest.raises(ValueError, match="measured= a int is not a DataFrame"):
        explore.explore_point(measured=5)
    assert time.monotonic() - t0 < 5


def test_the_sweep_never_rewrites_a_users_index_or_page(tmp_path):
    d = tmp_path / "site"
    d.mkdir()
    (d / "index.html").write_text("<html>my site</html>")
    _one_line_refusal(["sweep", "--dry-run", "-p", "report_dir", str(d)], ["holds index.html, which the lab did not"])
    (d / "index.html").unlink()
    (d / "padding_sweep.html").write_text("<html>my page</html>")
    _one_line_refusal(["sweep", "--dry-run", "-p", "report_dir", str(d), "--overwrite"],
                      ["holds padding_sweep.html, which no run the lab published there names"])
    assert (d / "padding_sweep.html").read_text() == "<html>my page</html>"
