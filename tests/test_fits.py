"""The calibration fits (mla_lab.fits): each fit, run on the committed measured rows, gives the committed calibration
file (every column but the ones naming the fit's own run), and the refit door refuses bad input in one line."""

from __future__ import annotations

import csv
import io

import pytest

from mla_lab.fits import FITS, main, refit, render
from mla_lab.paths import calibration_dir, measured_dir


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


#: the decode fits take ~5 s idle, ~9 s on two busy cores (the fast suite fails a test over 10 s); the content
#: factor's grid search is vectorised (mla_lab.model.content._grid: ~1 s, was 30-60 s)
SLOW = {"decode"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(FITS)])
def test_refit_gives_the_committed_file(name):
    fit = FITS[name]
    files = fit.fit(measured_dir())
    assert fit.file in files
    for file, rows in files.items():
        path = measured_dir() / file if "/" in file else calibration_dir() / file
        committed = path.read_bytes().decode()
        got = render(rows)
        assert got.splitlines()[0] == committed.splitlines()[0], file  # the same columns in the same order
        drop = lambda r: {k: v for k, v in r.items() if k not in fit.volatile}  # noqa: E731
        assert [drop(r) for r in _rows(got)] == [drop(r) for r in _rows(committed)], file
        assert got.endswith("\r\n") == committed.endswith("\r\n"), file  # the same line ends


@pytest.mark.parametrize("name", sorted(FITS))
def test_each_file_has_its_loader_and_its_inputs(name):
    fit = FITS[name]
    assert fit.load() is not None and (calibration_dir() / fit.file).is_file()
    assert all((measured_dir() / i).is_file() for i in fit.inputs if "<" not in i), fit.inputs


def test_refit_writes_what_the_loader_reads(tmp_path):
    out = tmp_path / "cal"
    written = refit("moe_decode", out_dir=out)
    assert written == [out / "h200_moe_decode.csv"]
    assert FITS["moe_decode"].load(written[0]) == FITS["moe_decode"].load()


def _refused(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert __import__("re").search(match, err), err


def test_door_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys):
    _refused(capsys, ["nope"], "name='nope' is not a fit; allowed: ")
    _refused(capsys, ["subchunk", "--measured-dir", str(tmp_path / "absent")], "is not an existing folder")
    _refused(capsys, ["subchunk", "--measured-dir", str(tmp_path), "--out-dir", str(tmp_path)], "does not exist")
    _refused(capsys, ["comm", "--measured-dir", str(tmp_path), "--out-dir", str(tmp_path)], "no all-reduce rows")
    foreign = tmp_path / "h200_subchunk.csv"
    foreign.write_text("hello\n")
    _refused(capsys, ["subchunk", "--out-dir", str(tmp_path)], "exists; pass --overwrite")
    _refused(capsys, ["subchunk", "--out-dir", str(tmp_path), "--overwrite"], "header is not this fit's")
    assert foreign.read_text() == "hello\n" and sorted(p.name for p in tmp_path.iterdir()) == ["h200_subchunk.csv"]


def test_overwrite_replaces_the_fits_own_file(tmp_path, capsys):
    assert main(["subchunk_graph", "--out-dir", str(tmp_path)]) == 0
    p = tmp_path / "h200_subchunk_graph.csv"
    before = p.read_bytes()
    assert main(["subchunk_graph", "--out-dir", str(tmp_path), "--overwrite"]) == 0
    assert p.read_bytes() == before and "wrote" in capsys.readouterr().out
    assert sorted(x.name for x in tmp_path.iterdir()) == ["h200_subchunk_graph.csv"]  # no temporary file left
