"""Every CLI door refuses bad input in one line, in bounded time, creating nothing (issue 24).

Two parts:

- ``ISSUE_24``: each example of issue 24 (and its kin) as a regression case, run as a user runs it (``python -m
  mla_lab.cli`` in a fresh folder): exit 2, one line on stderr naming the argument, no traceback, nothing created
  (not in the folder, not in the lab's cache), done in :data:`BOUND_S`.
- hypothesis drives every command's flags (``sweep`` (with ``--dry-run`` and without), ``advise``, ``serve``,
  ``index``) and ``-p`` names / ``-f`` files with out-of-range, wrong-type, huge, empty and unicode values
  in-process (``mla_lab.cli.main``), with the same assertions. Few examples in the fast suite, more under ``slow``.

A value is drawn only where the lab itself calls it bad (a number outside the flag's stated bounds, text that is
not a number, a name the lab does not know), so every draw must be refused.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mla_lab import cli, cli_sweep
from mla_lab.arch import get_arch
from mla_lab.cli_doors import BOUNDS
from mla_lab.models import load_model, normalize_kv_cache_dtype
from mla_lab.sweep.params import DEFAULTS

REPO = Path(__file__).resolve().parent.parent
#: Seconds a refusal may take here (the README's table has the measured medians, ~0.1-0.3 s; this bound leaves room
#: for a loaded 2-core machine and the first import of the lab in a subprocess).
BOUND_S = float(os.environ.get("MLA_LAB_DOOR_BOUND_S", "8"))
FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------------------------ helpers
def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run_inprocess(argv: list[str]) -> tuple[int, str, float, set[str]]:
    """``cli.main(argv)`` in a fresh empty folder with the cache pointed into it; returns (exit code, stderr,
    seconds, paths created)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        (work / "README.md").write_text("# a file the lab did not write\n")
        before = _tree(root)
        old_cwd, old_cache = os.getcwd(), os.environ.get("MLA_LAB_CACHE")
        os.environ["MLA_LAB_CACHE"] = str(root / "cache")
        err = io.StringIO()
        t0 = time.perf_counter()
        real_publish = cli_sweep.publish

        def let_through(*a, **k):  # a value the doors let through would start the notebook: fail fast instead
            raise RuntimeError("the doors let this input through to the notebook run")

        cli_sweep.publish = let_through
        try:
            os.chdir(work)
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    rc = cli.main(argv)
                except SystemExit as e:  # argparse's own exit (--help): a code, never a traceback
                    rc = e.code
        finally:
            cli_sweep.publish = real_publish
            os.chdir(old_cwd)
            if old_cache is None:
                os.environ.pop("MLA_LAB_CACHE", None)
            else:
                os.environ["MLA_LAB_CACHE"] = old_cache
        dt = time.perf_counter() - t0
        return rc, err.getvalue(), dt, _tree(root) - before


def _assert_refused(argv, rc, err, dt, created, code=2):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == code, f"{argv}: exit {rc}, stderr {err!r}"
    assert len(lines) == 1, f"{argv}: {len(lines)} lines on stderr: {err!r}"
    assert lines[0].startswith("mla-lab: error: "), lines[0]
    assert "Traceback" not in err
    assert not created, f"{argv} created {sorted(created)}"
    assert dt < BOUND_S, f"{argv} took {dt:.1f} s to refuse"


# ------------------------------------------------------------------------------------------------ issue 24 cases
ISSUE_24 = [
    ("advise_num_prompts_huge", ["advise", "--num-prompts", "99999999999999999999"],
     r"--num-prompts: '99999999999999999999' is out of range; allowed: 1\.\.100,000 \(.+\)"),
    ("advise_prompt_len_10M", ["advise", "--no-measured", "--prompt-len", "10000000"],
     r"--prompt-len.*'10000000' is out of range; allowed: 1\.\.1,048,576"),
    ("advise_prompt_len_huge", ["advise", "--prompt-len", "99999999999999999999"], r"--prompt-len.*out of range"),
    ("advise_num_prompts_100000", ["advise", "--num-prompts", "100000"],
     r"100000 x prompt_len=1024 .* 6,250 prefill steps .*allowed: at most 2,048"),
    ("advise_mbt_1", ["advise", "--max-num-batched-tokens", "1"],
     r"max_num_batched_tokens=1 is below max_num_seqs=256; allowed: >= max_num_seqs .*vllm/config/scheduler\.py"),
    ("advise_prompt_does_not_fit", ["advise", "--prompt-len", "200000"],
     r"does not fit advise.s TTFT model, which holds every prompt.s KV in flight at once: .*needs 6,400,000 KV tokens in flight .*KV capacity [0-9,]+ tokens.*mla-lab serve. .*queues"),
    ("advise_weights_do_not_fit", ["advise", "--tp", "2"], r"does not fit: glm-5 TP2 h200 .*weights \(.* GiB"),
    ("advise_output_len_refused", ["advise", "--random-output-len", "512"],
     r"--random-output-len='512' is not used by advise: .*mla-lab serve"),
    ("advise_request_rate_refused", ["advise", "--request-rate", "4"], r"--request-rate='4' is not used by advise"),
    ("sweep_dry_run_store_dir_readme", ["sweep", "--dry-run", "-p", "store_dir", "README.md"],
     r"store_dir='README\.md' is a file; allowed: a folder"),
    ("sweep_dry_run_data_file_under_readme", ["sweep", "--dry-run", "-p", "data_file", "README.md/x.csv"],
     r"data_file='README\.md/x\.csv': its folder is a file"),
    ("sweep_report_name_sub_dir", ["sweep", "--report-name", "sub/dir"],
     r"--report-name='sub/dir' is not allowed; allowed: a basename"),
    ("sweep_tp_conflict", ["sweep", "--dry-run", "--tensor-parallel-size", "8", "-p", "tp_sizes", "[4]"],
     r"--tensor-parallel-size 8 conflicts with -p/-f tp_sizes=\[4\]; allowed: one of the two"),
    ("sweep_prompt_len_10M", ["sweep", "--dry-run", "-p", "prompt_lens", "[10000000]"],
     r"prompt_lens entry=10000000 is out of range; allowed: 1\.\.1,048,576"),
    ("sweep_num_prompts_huge", ["sweep", "--dry-run", "--num-prompts", "99999999999999999999"],
     r"num_prompts=99999999999999999999 is out of range"),
    ("sweep_mbt_1", ["sweep", "--dry-run", "--max-num-batched-tokens", "1"],
     r"max_num_batched_tokens=1 is below max_num_seqs=256; allowed: >= max_num_seqs"),
    ("sweep_tp_sizes_float", ["sweep", "--dry-run", "-p", "tp_sizes", "8.5"], r"tp_sizes=8\.5 must be"),
    ("serve_num_prompts_huge", ["serve", "--num-prompts", "99999999999999999999"], r"--num-prompts.*out of range"),
    ("serve_weights_do_not_fit", ["serve", "--tensor-parallel-size", "2"], r"does not fit: glm-5 TP2"),
    ("serve_unknown_strategy", ["serve", "--strategies", "padded"], r"--strategies holds 'padded'; allowed: presets"),
    ("serve_mbt_below_max_num_seqs", ["serve", "--max-num-batched-tokens", "128"],
     r"max_num_batched_tokens=128 is below max_num_seqs=256"),
]


@pytest.mark.parametrize("case_id,argv,pattern", ISSUE_24, ids=[c[0] for c in ISSUE_24])
def test_issue_24_example_is_refused_in_one_line(case_id, argv, pattern, tmp_path):
    """The command as a user types it, in a fresh folder: exit 2, one line matching ``pattern``, nothing created."""
    import re

    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("# not a store\n")
    before = _tree(tmp_path)
    env = {**os.environ, "MLA_LAB_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", *argv], cwd=work, capture_output=True, text=True,
                       timeout=120, env=env)
    dt = time.perf_counter() - t0
    _assert_refused(argv, r.returncode, r.stderr, dt, _tree(tmp_path) - before)
    assert re.search(pattern, r.stderr), r.stderr


def test_ctrl_c_prints_one_line_and_exits_130(monkeypatch, capsys):
    """Ctrl-C during a run (here: inside the notebook run) prints one line and exits 130; the store is untouched
    by the CLI (points are written one file each as they finish; tests/test_resume.py checks the resume)."""

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_sweep, "publish", interrupted)
    monkeypatch.setattr(cli.doors, "check_sweep", lambda params: None)
    rc = cli.main(["sweep"])
    err = capsys.readouterr().err
    assert rc == 130
    assert err.count("\n") == 1 and err.startswith("mla-lab: interrupted; ") and "resumes" in err


# ------------------------------------------------------------------------------------------------ fuzzed values
def _outside(name: str):
    lo, hi, _ = BOUNDS[name]
    return st.one_of(st.integers(max_value=lo - 1), st.integers(min_value=hi + 1),
                     st.integers(min_value=hi + 1, max_value=10**40)).map(str)


def _not_an_int():
    def bad(s: str) -> bool:
        try:
            int(s.strip().replace("_", ""), 10)
        except ValueError:
            return True
        return False

    return st.one_of(st.text(max_size=12).filter(bad), st.floats(allow_nan=True, allow_infinity=True).map(repr)
                     .filter(bad), st.sampled_from(["", " ", "1e3", "0x10", "８", "٣", "1.0", "nan", "—"]).filter(bad))


def _int_value(name: str):
    return st.one_of(_outside(name), _not_an_int())


def _bad_name(valid):
    def bad(s: str) -> bool:
        try:
            valid(s)
        except (ValueError, TypeError):
            return True
        return False

    return st.one_of(st.text(max_size=16), st.sampled_from(["", "GLM-6", "h100x", "ü", "💥", "a" * 300])).filter(bad)


def _bad_float(lo_ok, hi_ok):
    """Numbers outside [lo_ok, hi_ok] (or nan/inf/text) as strings."""
    def bad(s: str) -> bool:
        try:
            v = float(s)
        except ValueError:
            return True
        return not (lo_ok(v) and hi_ok(v))

    return st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8)).filter(bad)


_DEPLOYMENT = {
    "--model": _bad_name(load_model), "--arch": _bad_name(get_arch),
    "--kv-cache-dtype": _bad_name(normalize_kv_cache_dtype),
    "--weight-dtype": _bad_name(lambda s: ["fp8", "bf16"].index(s)),
    "--moe-parallel": _bad_name(lambda s: ["ep", "tp"].index(s)),
    "--max-num-batched-tokens": _int_value("max_num_batched_tokens"),
    "--gpu-memory-utilization": _bad_float(lambda v: v > 0, lambda v: v <= 1),
}
FLAGS = {
    "advise": {**_DEPLOYMENT, "--tp": _int_value("tp"), "--prompt-len": _int_value("prompt_len"),
               "--num-prompts": _int_value("num_prompts"), "--concurrency": _int_value("concurrency"),
               "--memory-budget-mib": _bad_float(lambda v: v >= 0, lambda v: v < float("inf")),
               "--memory-budget-tokens": _bad_float(lambda v: v >= 0, lambda v: v < float("inf"))},
    "serve": {**_DEPLOYMENT, "--tensor-parallel-size": _int_value("tp"),
              "--random-input-len": _int_value("prompt_len"), "--random-output-len": _int_value("output_len"),
              "--num-prompts": _int_value("num_prompts"), "--max-concurrency": _int_value("concurrency"),
              "--max-num-seqs": _int_value("max_num_seqs"), "--seed": _int_value("seed"),
              "--num-runs": _int_value("num_runs"), "--request-rate": _bad_float(lambda v: v > 0, lambda v: True)},
    "sweep": {"--timeout": _int_value("timeout"), "--num-runs": _int_value("num_runs"), "--seed": _int_value("seed"),
              "--report-name": st.one_of(st.text(max_size=10).map(lambda s: s + "/x"), st.sampled_from(
                  ["", ".", "..", "a b", "ü/", "x.html", "-x", "a" * 101]))},
    "index": {"--report-dir": st.just("README.md"), "--report-name": st.sampled_from(["", "a/b", "..", "x y"])},
}
#: -p names with values the sweep refuses (wrong type, out of range, huge, empty, unicode).
_P_INT = ["num_prompts", "num_runs", "output_len", "max_num_seqs", "concurrency"]
_P_LIST = ["tp_sizes", "max_num_batched_tokens", "prompt_lens"]
P_VALUES = st.one_of(
    st.tuples(st.sampled_from(_P_INT), st.one_of(
        st.integers(max_value=0), st.integers(min_value=2**21, max_value=10**30),
        st.sampled_from(["'32'", "[]", "{}", "1.5", "true", "ü", "''", "-1"])).map(str)),
    st.tuples(st.sampled_from(_P_LIST), st.one_of(
        st.lists(st.integers(max_value=0), min_size=1, max_size=3),
        st.lists(st.integers(min_value=2**21, max_value=10**30), min_size=1, max_size=2),
        st.sampled_from([[], ["eight"], [1.5], "x", {"a": 1}])).map(str)),
    st.tuples(st.text(min_size=1, max_size=10).filter(lambda s: s.replace("-", "_") not in DEFAULTS
                                                     and s.strip() and not s.startswith("-")), st.just("1")),
    st.tuples(st.sampled_from(["models", "archs", "strategies", "kv_cache_dtype", "device", "executor",
                               "weight_dtype", "moe_parallel"]),
              st.sampled_from(["[]", "[ü]", "[gpt-2]", "42", "null", "[[1]]", "💥"])),
    st.tuples(st.sampled_from(["store_dir", "report_dir"]), st.sampled_from(["README.md", "README.md/sub", "''"])),
    st.tuples(st.just("request_rate"), st.sampled_from(["0", "-1", "'fast'", "[]", ".nan", "-.inf"])),
    st.tuples(st.just("gpu_memory_utilization"), st.sampled_from(["0", "-1", "1.5", "'fast'", "[]", ".nan"])),
)


def _flag_case(draw_cmd):
    return draw_cmd.flatmap(lambda cmd: st.sampled_from(sorted(FLAGS[cmd])).flatmap(
        lambda flag: FLAGS[cmd][flag].map(lambda v: (cmd, flag, v))))


CASES = _flag_case(st.sampled_from(sorted(FLAGS)))


def _argv(case) -> list[str]:
    cmd, flag, value = case
    argv = [cmd, f"{flag}={value}"]
    if cmd == "sweep" and flag != "--report-name":
        argv.append("--dry-run")
    return argv


def _check_flag(case):
    argv = _argv(case)
    if case[0] == "index":  # README.md must exist for the "a file, not a folder" case
        return _check_index(argv)
    rc, err, dt, created = _run_inprocess(argv)
    _assert_refused(argv, rc, err, dt, created)


def _check_index(argv):
    with tempfile.TemporaryDirectory() as tmp:
        old = os.getcwd()
        os.chdir(tmp)
        try:
            Path("README.md").write_text("x")
            before = _tree(Path(tmp))
            err = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    rc = cli.main(argv)
                except SystemExit as e:
                    rc = e.code
            _assert_refused(argv, rc, err.getvalue(), time.perf_counter() - t0, _tree(Path(tmp)) - before)
        finally:
            os.chdir(old)


def _check_p(pair, dry_run: bool):
    argv = ["sweep", "-p", pair[0], pair[1]] + (["--dry-run"] if dry_run else [])
    rc, err, dt, created = _run_inprocess(argv)
    _assert_refused(argv, rc, err, dt, created)


def _check_yaml(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "params.yaml"
        f.write_text(text, encoding="utf-8")
        argv = ["sweep", "--dry-run", "-f", str(f)]
        rc, err, dt, created = _run_inprocess(argv)
        _assert_refused(argv, rc, err, dt, created)


YAML_TEXTS = st.one_of(
    st.sampled_from(["- 1\n- 2\n", "models: [glm-5\n", "tp_sizes: 8.5\n", "num_prompts: 1e40\n",
                     "prompt_lens: [99999999999999999999]\n", "ü: 1\n", "store_dir: README.md\n", "42\n",
                     "tp_size: [8]\n", "num_prompts: '32'\n", "models: []\n", "tensor_parallel_size: [8]\n"
                     "tp_sizes: [4]\n"]),
    st.dictionaries(st.sampled_from(_P_INT), st.integers(min_value=10**7, max_value=10**30), min_size=1)
    .map(lambda d: "".join(f"{k}: {v}\n" for k, v in d.items())),
)


@FAST
@given(CASES)
def test_fuzzed_flag_is_refused_in_one_line(case):
    _check_flag(case)


@FAST
@given(P_VALUES, st.booleans())
def test_fuzzed_p_value_is_refused_in_one_line(pair, dry_run):
    _check_p(pair, dry_run)


@FAST
@given(YAML_TEXTS)
def test_fuzzed_yaml_file_is_refused_in_one_line(text):
    _check_yaml(text)


@pytest.mark.slow
@SLOW
@given(CASES)
def test_fuzzed_flag_is_refused_in_one_line_many(case):
    _check_flag(case)


@pytest.mark.slow
@SLOW
@given(P_VALUES, st.booleans())
def test_fuzzed_p_value_is_refused_in_one_line_many(pair, dry_run):
    _check_p(pair, dry_run)


@pytest.mark.slow
@SLOW
@given(YAML_TEXTS)
def test_fuzzed_yaml_file_is_refused_in_one_line_many(text):
    _check_yaml(text)


@pytest.mark.slow  # a notebook run through papermill (a minute or more on 2 cores)
def test_ctrl_c_mid_sweep_is_one_line_exit_130_and_the_store_resumes(tmp_path):
    """SIGINT to the command's process group (what Ctrl-C in a terminal sends) once the sweep runs: exit 130, one
    line on stderr (no kernel ZMQError: the kernel's own stderr goes to runs/<id>.kernel.log), and the finished
    points are kept: the same command then reports them stored."""
    import signal

    args = [sys.executable, "-m", "mla_lab.cli", "sweep", "-p", "models", "[glm-5]", "-p", "archs", "[h200]",
            "-p", "device", "cpu", "-p", "store_dir", "st", "-p", "data_file", "rows.csv"]
    from mla_lab.sweep.store import code_version

    version = code_version()
    env = {**os.environ, "MLA_LAB_CACHE": str(tmp_path / "cache")}
    # SIGINT's default disposition, as a terminal gives it: a pytest-xdist worker ignores SIGINT and a child would
    # inherit that (Python keeps an inherited SIG_IGN), so Ctrl-C would never reach the command under `make test`
    p = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         start_new_session=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in p.stderr:  # wait for the sweep's first finished point
        lines.append(line)
        if "points  elapsed" in line:
            break
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C once the sweep runs (synchronised on its first finished point)
    _, rest = p.communicate(timeout=300)
    err = "".join(lines) + (rest or "")
    assert p.returncode == 130, err[-2000:]
    mine = [ln for ln in err.splitlines() if not ln.startswith("[mla-lab] ")]  # the sweep's own progress lines
    assert mine == ["mla-lab: interrupted; every point finished so far is stored (one file per point) and the same "
                    "command resumes from them"], mine
    assert "Traceback" not in err and "ZMQError" not in err
    import json

    points = list((tmp_path / "st" / "points").glob("*.json"))
    assert points and all(json.loads(p.read_text())["status"] == "ok" for p in points)  # whole files, no torn write
    r = subprocess.run([*args, "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0
    if code_version() == version:  # the same code: the re-run finds every finished point (points are keyed by it)
        assert json.loads(r.stdout)["stored"] == len(points)


def test_memory_tradeoff_never_returns_a_negative_capacity():
    """Issue 24: memory_tradeoff (public API) returned -20,320 tokens at 131072 batched tokens; now 0 with
    fits=False and the reason, and every strategy's % lost is NaN (no capacity to take a share of). Since issue 37
    (torch's 150.1e9 B total instead of 141e9 B) 131072 batched tokens leave a KV cache; 163840 do not."""
    import math

    from mla_lab.deployment import Deployment
    from mla_lab.model.memory import memory_tradeoff

    for over in ({"max_num_batched_tokens": 163840}, {"tp": 2}, {"weight_dtype": "bf16"}):
        mem = memory_tradeoff(Deployment.seed(**over), strategies=["private_workspace"])
        assert mem["kv_capacity_tokens"] == 0.0 and mem["fits"] is False, over
        assert "leave no KV cache" in mem["fit_reason"]
        assert math.isnan(mem["strategies"]["private_workspace"]["kv_capacity_pct_lost"])
    ok = memory_tradeoff(Deployment.seed(), strategies=["private_workspace"])
    assert ok["fits"] and ok["fit_reason"] == "" and ok["kv_capacity_tokens"] > 200_000


def test_dry_run_creates_nothing(tmp_path):
    """Issue 24: ``sweep --dry-run -p data_file nosuch/dir/x.csv`` created ``nosuch/dir`` and dry runs created the
    store folder. Now the plan is printed (with the store's real path, stored 0) and the folder stays empty."""
    import json

    before = _tree(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", "sweep", "--dry-run", "-p", "data_file",
                        "nosuch/dir/x.csv", "-p", "store_dir", "new/store"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "MLA_LAB_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["stored"] == 0 and plan["store_dir"] == str(tmp_path / "new" / "store")
    assert plan["store_exists"] is False and plan["points"] == plan["to_compute"] > 0
    assert _tree(tmp_path) == before


def test_measured_rows_of_an_edited_config_are_detached_and_said_so(tmp_path, monkeypatch, capsys):
    """Issue 24: after num_attention_heads of glm-5 is edited, the measured rows taken on the 8-head geometry stayed
    attached ("measured -1.6 %"). Now they are detached with a note, and advise shows no measured value for it."""
    import json
    import shutil

    from mla_lab.paths import data_dir, measured_dir
    from mla_lab.report.data import load_measured

    data, measured = tmp_path / "data", measured_dir()
    shutil.copytree(data_dir() / "models", data / "models")
    shutil.copytree(data_dir() / "calibration", data / "calibration")
    cfg = data / "models" / "glm-5" / "config.json"
    c = json.loads(cfg.read_text())
    c["num_attention_heads"] = 128
    cfg.write_text(json.dumps(c))
    monkeypatch.setenv("MLA_LAB_DATA", str(data))
    monkeypatch.setenv("MLA_LAB_MEASURED", str(measured))
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    m = load_measured()
    notes = m.attrs["detached"]
    assert any("glm-5 TP8 detached: measured at [8] heads per rank, the config now gives 16" in n for n in notes), notes
    assert not ((m["model"] == "glm-5") & (m["tp"] == 8)).any()
    assert cli.main(["advise", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("glm-5 TP8 detached" in n for n in out["measured_detached"])
    rec = out["recommendation"]
    assert rec["measured_change_pct"] is None and all(a["measured_change_pct"] is None for a in out["alternatives"])
