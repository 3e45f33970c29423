"""Regression tests of a fresh-user tester's CLI findings: each refusal is one line, exit 2, under a second, and
creates nothing; each fix is checked against the behaviour it replaces (unbounded serve runs, an index written
into a folder that did not exist, a dry run that accepted any --notebook, a 95 % band from 2 runs, truncated
strategy names, a traceback on a closed pipe, options without help, advise's misleading "does not fit")."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from mla_lab import cli, cli_serve
from mla_lab import cli_doors as doors

ROOT = Path(__file__).resolve().parents[1]


_run = run_cli


def _refused(argv: list[str], pattern: str) -> str:
    import re

    t0 = time.perf_counter()
    rc, out, err = _run(argv)
    dt = time.perf_counter() - t0
    assert rc == 2, (argv, rc, out[:300], err)
    assert err.count("\n") == 1 and err.startswith("mla-lab: error: "), err
    assert re.search(pattern, err), (pattern, err)
    assert dt < 5.0, f"{argv} took {dt:.1f} s to refuse"  # ~0.2 s alone; slack for a shared 2-core machine
    return err


# ----------------------------------------------------------------------------------------------------- 1 serve bounds
@pytest.mark.parametrize("argv,pattern", [
    (["--num-prompts", "1000", "--request-rate", "0.0001"], r"request-rate 0\.0001/s .*129,000 engine steps"),
    (["--num-prompts", "400", "--request-rate", "0.0001"], r"engine steps per strategy; allowed: at most 50,000"),
    (["--max-num-seqs", "1", "--num-prompts", "400"], r"1 request\(s\) at a time .*allowed: at most 50,000"),
    (["--num-prompts", "300", "--strategies", "vllm-pre-53878", "vllm-53878", "vllm-56902", "kernel-native",
      "sglang"], r"strategies \(baseline included\) = [0-9,]+ request-steps to simulate; allowed: at most 200,000"),
    (["--num-prompts", "1000"], r"516,000|request-steps to simulate"),
    (["--num-runs", "100"], r"--num-runs=100 .*simulated request-steps; allowed: at most 350,000"),
])
def test_serve_refuses_runs_past_the_bound_at_once(argv, pattern):
    _refused(["serve", *argv], pattern)


@pytest.mark.parametrize("kw", [
    dict(num_prompts=6, prompt_len=1024, output_len=8, mbt=16384, mns=256, rate=0.5),   # arrivals apart
    dict(num_prompts=6, prompt_len=1024, output_len=8, mbt=16384, mns=1, rate=math.inf),  # one lane
    dict(num_prompts=5, prompt_len=3000, output_len=4, mbt=1024, mns=2, rate=math.inf),  # chunked prefill, waves
    dict(num_prompts=8, prompt_len=512, output_len=6, mbt=16384, mns=256, rate=math.inf),  # all together
])
def test_serve_step_bound_bounds_the_simulated_steps(kw):
    """The door's bound is at least the number of engine steps the simulation really takes, per strategy."""
    argv = ["serve", "--json", "--num-prompts", str(kw["num_prompts"]), "--random-input-len", str(kw["prompt_len"]),
            "--random-output-len", str(kw["output_len"]), "--max-num-batched-tokens", str(kw["mbt"]),
            "--max-num-seqs", str(kw["mns"]), "--request-rate", str(kw["rate"]), "--strategies", "vllm-53878"]
    rc, out, err = _run(argv)
    assert rc == 0, err
    res = json.loads(out)
    bound, _ = cli_serve.serve_step_bound(kw["num_prompts"], kw["prompt_len"], kw["output_len"], kw["mbt"], kw["mns"],
                                      kw["num_prompts"], kw["rate"],
                                      res["strategies"][res["baseline"]]["kv_capacity_tokens"])
    steps = [s["num_steps"] for s in res["strategies"].values()]
    assert max(steps) <= bound, (steps, bound)
    assert max(steps) >= 0.5 * bound  # a bound, not a number out of reach: within 2x of the real count here


# ----------------------------------------------------------------------------------------------------- 2 index
def test_index_refuses_a_missing_empty_or_foreign_report_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nope" / "deeper"
    _refused(["index", "--report-dir", str(missing)], r"--report-dir .*/nope/deeper: no such folder")
    assert not (tmp_path / "nope").exists()
    _refused(["index", "--report-dir", ""], r"--report-dir '': empty")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a report")
    _refused(["index", "--report-dir", str(foreign)], r"holds no report the lab published")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["foreign", "notes.txt"]  # nothing created


def test_index_refuses_a_report_name_with_no_report_and_keeps_the_index(tmp_path, monkeypatch):
    """A mistyped --report-name rebuilt the index without its latest-report link (exit 0); now it is refused in one
    line naming the reports there, and the index is left as it was. Left out, the name keeps its default."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r1.json").write_text(json.dumps({"run_id": "r1", "html": "runs/r1.html"}))
    for name in ("runs/r1.html", "padding_sweep.html", "index.html"):
        (tmp_path / name).write_text("<html></html>")
    _refused(["index", "--report-dir", ".", "--report-name", "padding_swep"],
             r"--report-name='padding_swep': no padding_swep\.html in \.; allowed: \['padding_sweep'\]")
    assert (tmp_path / "index.html").read_text() == "<html></html>"
    rc, _, err = _run(["index", "--report-dir", "."])
    assert rc == 0 and 'href="padding_sweep.html"' in (tmp_path / "index.html").read_text(), err


def test_check_report_missing_file_is_bad_input(tmp_path):
    _refused(["check-report", str(tmp_path / "nope.html")], r"check-report .*/nope\.html: no such file")
    (tmp_path / "x.txt").write_text("x")
    _refused(["check-report", str(tmp_path / "x.txt")], r"not an \.html file")


# ----------------------------------------------------------------------------------------------------- 3 notebook
@pytest.mark.parametrize("nb,pattern", [
    ("nope.ipynb", r"--notebook='nope\.ipynb': no such file"),
    ("README.md", r"--notebook='README\.md' is not a \.ipynb file"),
    ("/etc", r"--notebook='/etc' is not a regular file"),
    ("", r"--notebook='' is empty"),
])
def test_sweep_dry_run_checks_the_notebook(nb, pattern, monkeypatch):
    monkeypatch.chdir(ROOT)
    _refused(["sweep", "--dry-run", "--notebook", nb], pattern)


def test_sweep_dry_run_refuses_json_that_is_no_notebook_and_a_notebook_without_parameters(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("[1, 2]")
    _refused(["sweep", "--dry-run", "--notebook", str(bad)], r"holds no 'cells' list")
    bad.write_text("{not json")
    _refused(["sweep", "--dry-run", "--notebook", str(bad)], r"not readable notebook JSON")
    bad.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": "x = 1"}]}))
    _refused(["sweep", "--dry-run", "--notebook", str(bad)], r"has no cell tagged 'parameters'")


def test_sweep_dry_run_prints_notebook_report_name_and_timeout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb = str(ROOT / "notebooks" / "padding_sweep.ipynb")
    rc, out, err = _run(["sweep", "--dry-run", "--notebook", nb, "--report-name", "mine", "--timeout", "77",
                         "-p", "store_dir", str(tmp_path / "store"), "-p", "report_dir", str(tmp_path / "rep"),
                         "-p", "data_file", str(tmp_path / "d.csv")])
    assert rc == 0, err
    plan = json.loads(out)
    assert (plan["notebook"], plan["report_name"], plan["timeout_s"]) == (nb, "mine", 77)
    assert list(tmp_path.iterdir()) == []  # the dry run wrote nothing
    _refused(["sweep", "--dry-run", "--timeout", "0"], r"--timeout: '0' is out of range")


# ----------------------------------------------------------------------------------------------------- 4 num-runs
@pytest.mark.parametrize("n", ["2", "19"])
def test_serve_num_runs_between_1_and_20_is_refused(n):
    _refused(["serve", "--num-runs", n], rf"--num-runs={n} is too few for the 95 % band .*at least 20 runs\); "
                                         r"allowed: 1 .* or 20\.\.1,000")


def test_serve_help_states_the_num_runs_rule():
    rc, out, _ = _run(["serve", "--help"])
    assert rc == 0 and "95 % band needs at least 20 runs" in " ".join(out.split())


# ----------------------------------------------------------------------------------------------------- 5 labels
def test_serve_table_shows_every_strategy_name_whole():
    rc, out, err = _run(["serve", "--num-prompts", "2", "--random-output-len", "4", "--strategies",
                         "subchunk:2048:graph2", "shared_workspace:zero_per_call"])
    assert rc == 0, err
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    for name in ("subchunk:2048:graph2", "shared_workspace:zero_per_call"):
        assert name in header.split(), (name, header)


# ----------------------------------------------------------------------------------------------------- 6 pipe
def test_closed_stdout_exits_quietly():
    """The reader is gone before anything is written (deterministic EPIPE): no error line, SIGPIPE's status.
    (``--help`` would not do: argparse swallows an OSError while printing help.)"""
    p = subprocess.Popen([sys.executable, "-m", "mla_lab.cli", "advise", "--no-measured"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    p.stdout.close()
    err = p.stderr.read().decode()
    rc = p.wait(timeout=60)
    assert err == "", err
    assert rc == 141


# ----------------------------------------------------------------------------------------------------- 7 help
def test_every_option_of_every_command_has_a_help_line_with_its_range():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "cmd")
    bounded = set()
    for cmd, p in sub.choices.items():
        for a in p._actions:
            if not a.option_strings or a.help == "==SUPPRESS==":
                continue
            assert a.help and a.help.strip(), (cmd, a.option_strings)
            name = getattr(a.type, "bound", "")
            if name in doors.BOUNDS:  # integer flags state their allowed range
                lo, hi, _ = doors.BOUNDS[name]
                tighter = name == "concurrency" and "1..num_prompts" in a.help  # bounded by --num-prompts
                assert tighter or f"..{hi:,}" in a.help, (cmd, a.option_strings, a.help)
                bounded.add((cmd, a.dest))
    # the range branch ran: advise's and serve's bounded integer flags were all seen
    assert {("advise", "tp"), ("advise", "max_num_batched_tokens"), ("serve", "tp")} <= bounded, sorted(bounded)


# ----------------------------------------------------------------------------------------------------- 8 advise
def test_advise_kv_refusal_explains_the_model_and_points_to_serve():
    _refused(["advise", "--prompt-len", "16384"], r"does not fit advise's TTFT model, which holds every prompt's KV "
                                                  r"in flight at once: .*'mla-lab serve' .*queues")
    rc, _, err = _run(["serve", "--random-input-len", "16384", "--num-prompts", "4", "--random-output-len", "2"])
    assert rc == 0, err  # the workload advise cannot hold at once runs through serve's queue


def test_weights_refusal_suggests_only_what_can_help():
    err = _refused(["advise", "--tp", "4"], r"does not fit: glm-5 TP4 .*weights \(")
    assert "fp8 weights" not in err.split("allowed:")[1]  # they are fp8 already
    assert "--gpu-memory-utilization" not in err  # the weights exceed the GPU: more of it cannot help
    assert "a larger TP" in err
    err = _refused(["advise", "--weight-dtype", "bf16"], r"does not fit: glm-5 TP8 .*bf16 weights")
    assert "fp8 weights" in err.split("allowed:")[1]


# ----------------------------------------------------------------------------------------------------- 9 types, -f
def test_memory_budget_tokens_is_an_int():
    _refused(["advise", "--memory-budget-tokens", "1.5"], r"--memory-budget-tokens: '1\.5' is not an integer")
    assert doors.budget_type("--memory-budget-tokens", integer=True)("1000") == 1000


def test_params_file_device_and_empty_file(tmp_path):
    _refused(["sweep", "--dry-run", "-f", "/dev/null"], r"-f '/dev/null' is not a regular file")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    _refused(["sweep", "--dry-run", "-f", str(empty)], r"-f '.*empty\.yaml' is empty")
