"""Doors a fresh-user pass found open after issue 32's first fixes (each failed before its fix): the report command
replacing a committed report, measure's dry run accepting paths the run could not use, engines flags that did
nothing, a garbage number in a measured row, the sweep's data file mode."""

import os
import shutil

import pytest
from conftest import run_cli

from mla_lab.paths import REPO_ROOT


def test_report_refuses_to_replace_a_report_without_overwrite(tmp_path):
    d = tmp_path / "rep"
    d.mkdir()
    (d / "padding_sweep_h200.html").write_text("<html>an earlier report</html>")
    rc, out, err = run_cli(["report", "--measured", "h200", "--report-dir", str(d)])
    # issue 39: the folder holds a file the lab did not write (no manifest, no stamp): named, not "a report"
    assert rc == 2 and "padding_sweep_h200.html, a file the lab did not write" in err
    assert "already holds a report" not in err and len(err.strip().splitlines()) == 1
    assert (d / "padding_sweep_h200.html").read_text() == "<html>an earlier report</html>"


def test_report_refuses_a_file_as_its_folder_before_any_work(tmp_path):
    f = tmp_path / "afile.txt"
    f.write_text("x")
    rc, _, err = run_cli(["report", "--measured", "h200", "--report-dir", str(f / "sub")])
    assert rc == 2 and "is a file, not a folder" in err


@pytest.mark.parametrize("args, words", [
    (["--out", "{f}"], "is a file, not a folder"),
    (["--out", "{f}/x"], "is a file, not a folder"),
    (["--experiments", ""], "names no experiment"),
    (["--experiments", "engine_kernels", "--engine-root", "/nonexistent/engine"], "--engine-root"),
])
def test_measure_dry_run_refuses_what_the_run_would(tmp_path, args, words):
    f = tmp_path / "afile.txt"
    f.write_text("x")
    rc, _, err = run_cli(["measure", "--dry-run", *[a.format(f=f) for a in args]])
    assert rc == 2 and words in err


@pytest.mark.parametrize("args", [["--write"], ["--overwrite"]])
def test_engines_flags_that_write_need_a_wheel(args):
    rc, _, err = run_cli(["engines", *args])
    assert rc == 2 and "--check-wheel" in err


def test_engines_download_into_a_file_is_refused(tmp_path):
    f = tmp_path / "afile.txt"
    f.write_text("x")
    rc, _, err = run_cli(["engines", "--download", "vllm==0.33.0", "--wheel-dir", str(f)])
    assert rc == 2 and "--wheel-dir" in err


def test_a_garbage_number_in_a_measured_row_is_named(tmp_path):
    import csv

    from mla_lab.report.data import load_measured

    m = tmp_path / "measured"
    shutil.copytree(REPO_ROOT / "data" / "measured" / "h200", m / "h200",
                    ignore=shutil.ignore_patterns("runs", "archive", "between_process", "round*"))
    shutil.copy(REPO_ROOT / "data" / "measured" / "config_digests.json", m)
    p = m / "h200" / "padding_sweep.csv"
    rows = list(csv.reader(p.open()))
    i, s = rows[0].index("ttft_ms"), rows[0].index("source")
    n = next(k for k, r in enumerate(rows) if k and r[s] == "measured")
    rows[n][i] = "1143.82abc"
    with p.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with pytest.raises(ValueError, match=rf"padding_sweep\.csv: row {n + 1}: ttft_ms='1143.82abc' is not a number"):
        load_measured(m)


@pytest.mark.slow  # a notebook run (~50 s on 2 cores)
def test_the_sweep_data_file_gets_a_normal_mode(tmp_path):
    rc, _, err = run_cli(["sweep", "-p", "models", "[glm-5]", "-p", "tp_sizes", "[8]", "-p", "archs", "[h200]",
                          "-p", "max_num_batched_tokens", "[16384]", "-p", "prompt_lens", "[1024]",
                          "-p", "strategies", "[vllm-53878]", "-p", "store_dir", str(tmp_path / "st"),
                          "-p", "data_file", str(tmp_path / "rows.csv"), "-p", "report_dir", str(tmp_path / "rep"),
                          "-p", "check_equivalence", "false"])
    if rc != 0 and "lab' extra" in err:
        pytest.skip("the lab extra (papermill) is not installed here")
    assert rc == 0, err
    umask = os.umask(0)
    os.umask(umask)
    assert (os.stat(tmp_path / "rows.csv").st_mode & 0o777) == (0o666 & ~umask)
