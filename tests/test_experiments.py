"""The measurement suite (issue 31): one registry of experiments (mla_lab.measure.experiments), ``mla-lab measure``
(dry run, CPU refusal, the merge of per-process rows, never overwriting), the calibration table, no script loaded by
path, and ``pytest -m gpu tests`` collecting on a bare GPU image."""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mla_lab.measure.experiments import CALIBRATION, EXPERIMENTS, SMOKE_TOKENS, resolve
from mla_lab.measure.experiments.runner import dry_run_lines, gpu_slug, merge_processes, run_dir

REPO = Path(__file__).resolve().parent.parent
MEASURED = REPO / "data" / "measured"


def test_every_experiment_has_rows_shapes_and_provenance():
    assert len(EXPERIMENTS) >= 16  # 20 before the concat study's 4 producers retired (docs/retired.md)
    for e in EXPERIMENTS.values():
        outs = e.outputs()
        assert outs and all(f.endswith(".csv") and cols for f, cols in outs.items()), e.name
        assert e.shapes(), e.name
        cmd = e.command("/o", 3, "/eng")
        assert not any("{" in a for a in cmd), (e.name, cmd)
        if e.argv:  # an experiment above this layer brings its own command line (padding_sweep)
            assert cmd[:2] == ["-m", e.module] and e.smoke_argv, e.name
            continue
        assert callable(e.module_obj().run), e.name
        assert cmd[:3] == ["-m", "mla_lab.measure.experiments", e.name] and "--smoke" not in cmd, (e.name, cmd)
        assert e.command("/o", 3, "/eng", smoke=True)[-1] == "--smoke"


#: Committed round-2 rows written before their module gained columns (the module adds them; the fits read the rest).
OLDER_ROWS = {("engines", "presets.csv"): ["strategy", "content"], ("decode_layer", "decode_layer.csv"): ["content"],
              ("decode_layer", "decode_attn.csv"): ["content"], ("decode_layer", "decode_ops.csv"): ["content"],
              **{("layer_calibration", f): ["content"] for f in ("layer_ops.csv", "layer_e2e.csv", "layer_extras.csv")},
              ("attention_path", "attention_path.csv"): ["content", "q1_ms", "q3_ms"],
              **{("tp_block", f"tp{n}_sim_block.csv"): ["content"] for n in (4, 8)}}


def test_committed_rows_have_the_columns_the_registry_says():
    """Every committed file an experiment writes (under data/measured/h200/) has exactly the registry's row columns
    (besides ``process`` and the provenance columns): the registry describes the data the report reads."""
    prov = {"process", "source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit",
            "timestamp", "gpu", "date_utc", "fit_commit"}
    checked = 0
    for e in EXPERIMENTS.values():
        for f, cols in e.outputs().items():
            path = MEASURED / "h200" / e.folder / f
            if not path.is_file():
                continue
            header = next(csv.reader(path.open()))
            newer = OLDER_ROWS.get((e.name, f), [])
            assert [c for c in header if c not in prov] == [c for c in cols if c not in prov and c not in newer], (
                e.name, f)
            checked += 1
    assert checked >= 15


def test_calibration_table_covers_every_calibration_file():
    files = {p.name for p in (REPO / "data" / "calibration").glob("*.csv")}
    assert files == set(CALIBRATION)
    for name, fit in CALIBRATION.items():
        assert set(fit.experiments) <= set(EXPERIMENTS), name
        module = fit.function.split(":")[0]
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), (name, module)
        for inp in fit.inputs:
            if inp.endswith(".csv") and "<" not in inp:
                assert (MEASURED / inp).is_file(), (name, inp)


def test_resolve_defaults_and_refusal():
    assert [e.name for e in resolve(None)] == [e.name for e in EXPERIMENTS.values() if e.default]
    assert [e.name for e in resolve("moe_decode,presets")] == ["presets", "moe_decode"]
    with pytest.raises(ValueError, match="unknown \\['nope'\\]; allowed: cold_start"):
        resolve("presets,nope")
    with pytest.raises(ValueError, match="unknown \\['concat'\\]; allowed: .* \\(retired ones: docs/retired.md\\)$"):
        resolve("concat")  # a producer retired in issue 38 round four: the refusal points at where it went


def test_gpu_slug():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_slug("NVIDIA B200") == "b200"
    assert gpu_slug("Some GPU") == "some-gpu"
    with pytest.raises(ValueError, match="gpu name"):
        gpu_slug(" ")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, **(env or {})})


def test_measure_dry_run_lists_every_experiment_and_its_files():
    r = _cli("measure", "--dry-run", "--processes", "6")
    assert r.returncode == 0, r.stderr
    for e in EXPERIMENTS.values():
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(e.name + " "))
        entry = e.module if e.argv else f"mla_lab.measure.experiments {e.name}"
        assert f"{6 if e.between_process else 1} x python -m {entry} " in line
        assert f"({len(e.shapes())} shapes;" in line
        for f in e.outputs():
            assert f"    -> {e.folder + '/' if e.folder else ''}{f}" in r.stdout
    assert r.stdout.count("*") == sum(e.default for e in EXPERIMENTS.values()) + 1  # + the legend's


def test_measure_smoke_dry_run_states_the_smoke_plan(tmp_path):
    """--smoke --dry-run prints what --smoke runs (one process each, a temp folder, never data/measured), not the
    full run's plan; and creates nothing."""
    r = _cli("measure", "--dry-run", "--smoke", "--processes", "6")
    assert r.returncode == 0, r.stderr
    assert "1 processes each" in r.stdout.splitlines()[0] and "mla_lab_smoke_<gpu>_*/" in r.stdout.splitlines()[0]
    assert "data/measured" not in r.stdout and " 6 x python" not in r.stdout
    assert f"tiny shapes ({SMOKE_TOKENS} tokens)" in r.stdout
    r = _cli("measure", "--dry-run", "--smoke", "--experiments", "presets", "--out", str(tmp_path / "o"))
    assert r.returncode == 0 and f"into {tmp_path / 'o'}/" in r.stdout and not (tmp_path / "o").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_measure_refuses_on_cpu_with_one_line():
    r = _cli("measure", "--experiments", "moe_decode")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "needs a CUDA GPU" in r.stderr


def test_measure_bad_arguments_are_one_line():
    r = _cli("measure", "--dry-run", "--processes", "0")
    assert r.returncode == 2 and "--processes='0': an integer 1..64" in r.stderr
    r = _cli("report", "--measured", "h100")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "GPUs with measured rows: h200" in r.stderr


def test_one_process_entry_refuses_a_retired_experiment_in_one_line():
    r = subprocess.run([sys.executable, "-m", "mla_lab.measure.experiments", "fused_bmm", "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith("name='fused_bmm'; allowed: cold_start") and "docs/retired.md" in r.stderr


def test_merge_processes_puts_process_first_and_never_overwrites(tmp_path):
    for k, extra in ((2, ""), (1, ",x")):
        d = tmp_path / f"p{k}"
        d.mkdir()
        (d / "a.csv").write_text("T,us" + (",note" if extra else "") + f"\n16384,{k}.5{extra}\n")
    dest = tmp_path / "m" / "a.csv"
    n = merge_processes([(2, tmp_path / "p2" / "a.csv"), (1, tmp_path / "p1" / "a.csv")], dest)
    rows = list(csv.DictReader(dest.open()))
    assert n == 2 and dest.read_text().splitlines()[0] == "process,T,us,note"
    assert [(r["process"], r["us"], r["note"]) for r in rows] == [("1", "1.5", "x"), ("2", "2.5", "")]
    with pytest.raises(FileExistsError):
        merge_processes([(1, tmp_path / "p1" / "a.csv")], dest)


def test_a_run_over_committed_files_goes_to_a_new_run_folder():
    exps = resolve("presets,moe_decode")
    dest, clash = run_dir(MEASURED / "h200", exps, overwrite=False)
    assert dest.parent == MEASURED / "h200" / "runs" and len(clash) == 2
    assert run_dir(MEASURED / "h200", exps, overwrite=True) == (MEASURED / "h200", [])
    assert dry_run_lines(exps, 5, "x")[0].startswith("mla-lab measure --dry-run: 2 experiments")


def test_no_test_loads_a_script_by_path():
    """Tests import the package; none loads a file of benchmarks/ (or any script) by path."""
    bad = []
    for p in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location", "run_path"):
                bad.append(f"{p.name}:{node.lineno} {node.attr}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("benchmarks/") \
                    and node.value.endswith(".py"):
                bad.append(f"{p.name}:{node.lineno} {node.value}")
    assert not bad, bad


def test_benchmarks_holds_thin_drivers_only():
    """benchmarks/: shell drivers named by experiment (no "round"), no Python library code, under ~1.5k lines."""
    files = [p for p in (REPO / "benchmarks").rglob("*") if p.is_file() and "archive" not in p.parts]
    assert not [p.name for p in files if p.suffix == ".py"]
    assert not [p.name for p in files if "round" in p.name]
    assert sum(len(p.read_text().splitlines()) for p in files) < 1500


BLOCKER = '''import sys
BLOCK = {"jupyterlab", "papermill", "nbconvert", "nbformat", "ipykernel", "ipywidgets", "jupytext", "matplotlib",
         "PIL", "playwright", "pyarrow", "jinja2", "IPython", "jupyter_client", "xdist", "packaging", "hypothesis",
         "ruff", "pre_commit", "nbstripout", "ray"}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the bare GPU image)", name=name)
sys.meta_path.insert(0, _Block())
'''


@pytest.mark.slow
def test_gpu_tests_collect_on_a_bare_gpu_image(tmp_path):
    """``python -m pytest -m gpu tests`` with every lab and dev extra unimportable (the GPU image has torch,
    triton, pytest and the package's own dependencies: numpy, pandas, pyyaml) collects without an error and
    selects the GPU tests (on CPU they skip with the reason)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "MLA_LAB_REQUIRE_GPU": ""}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:hypothesispytest", "-p", "no:xdist", "-p",
                        "no:cacheprovider", "-m", "gpu", "tests", "--collect-only", "-q"], capture_output=True,
                       text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "error" not in r.stdout.lower()
    collected = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert len(collected) >= 50 and any(ln.startswith("tests/test_gpu_kernels.py::") for ln in collected)


class _FakeExperiment:
    """A between-process experiment without a GPU: each process writes one row (its number) after ``sleep`` s;
    processes listed in ``fail`` exit 1 before writing (the registry's interface, duck-typed)."""

    name, module, folder, between_process, timeout_s = "fake", "fake_module", "between_process", True, 30

    def __init__(self, sleep: float = 0.0, fail: tuple[int, ...] = ()):
        self.sleep, self.fail = sleep, fail

    def outputs(self):
        return {"fake.csv": ["value"]}

    def command(self, out, process, engine_root=".engine", smoke=False):
        code = (f"import sys, time, pathlib; time.sleep({self.sleep}); k = {process}\n"
                f"if k in {tuple(self.fail)!r}: sys.exit(1)\n"
                f"pathlib.Path({str(out)!r}, 'fake.csv').write_text('value\\n' + str(10 * k) + '\\n')")
        return ["-c", code]


def _rows(path):
    return [(int(r["process"]), int(r["value"])) for r in csv.DictReader(open(path))]


def test_a_budgeted_run_stops_starting_processes_and_resume_finishes_it(tmp_path):
    """--budget-s: no process starts once the budget is spent (exit 3, nothing merged); --resume runs only the
    processes left and merges all of them, process 1's rows kept from the first call."""
    from mla_lab.measure.experiments.runner import run

    log = []
    rc = run([_FakeExperiment(sleep=0.3)], 3, tmp_path / "out", budget_s=0.1, log=log.append)
    dest = tmp_path / "out"
    rec = json.loads((dest / "provenance.json").read_text())
    assert rc == 3 and rec["experiments"]["fake"]["exit"] == [0] and not (dest / "between_process/fake.csv").exists()
    assert any("--resume" in line for line in log)
    first = (dest / ".processes/fake/p1/fake.csv").stat().st_mtime_ns
    rc = run([_FakeExperiment()], 3, tmp_path / "ignored", resume=dest, log=log.append)
    rec = json.loads((dest / "provenance.json").read_text())
    assert rc == 0 and rec["experiments"]["fake"]["exit"] == [0, 0, 0] and rec["experiments"]["fake"]["merged"]
    assert _rows(dest / "between_process/fake.csv") == [(1, 10), (2, 20), (3, 30)]
    assert (dest / ".processes/fake/p1/fake.csv").stat().st_mtime_ns == first  # not run again
    assert not (tmp_path / "ignored").exists() and len(rec["resumed_utc"]) == 1


def test_resume_retries_a_failed_process_and_refuses_another_process_count(tmp_path):
    from mla_lab.measure.experiments.runner import run

    rc = run([_FakeExperiment(fail=(2,))], 3, tmp_path, log=lambda s: None)
    assert rc == 1 and _rows(tmp_path / "between_process/fake.csv") == [(1, 10), (3, 30)]  # the others' rows kept
    assert not json.loads((tmp_path / "provenance.json").read_text())["experiments"]["fake"]["merged"]
    assert run([_FakeExperiment()], 3, tmp_path, resume=tmp_path, log=lambda s: None) == 0
    assert _rows(tmp_path / "between_process/fake.csv") == [(1, 10), (2, 20), (3, 30)]
    with pytest.raises(ValueError, match="--processes=5"):
        run([_FakeExperiment()], 5, tmp_path, resume=tmp_path, log=lambda s: None)


def test_measure_resume_and_budget_refusals_are_one_line(tmp_path):
    for args, name in ((["--resume", str(tmp_path)], "--resume="), (["--budget-s", "0"], "--budget-s='0'"),
                       (["--budget-s", "-3"], "--budget-s='-3'"), (["--budget-s", "inf"], "--budget-s='inf'")):
        r = subprocess.run([sys.executable, "-m", "mla_lab.cli", "measure", *args, "--dry-run"],
                           capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 2 and name in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_resume_runs_again_a_merged_experiment_whose_files_are_gone(tmp_path):
    from mla_lab.measure.experiments.runner import resume_lines, run

    assert run([_FakeExperiment()], 2, tmp_path, log=lambda s: None) == 0
    rec = json.loads((tmp_path / "provenance.json").read_text())
    assert resume_lines(rec, [_FakeExperiment()], 2).endswith("nothing left to run")
    (tmp_path / "between_process/fake.csv").unlink()
    log = []
    assert run([_FakeExperiment()], 2, tmp_path, resume=tmp_path, log=log.append) == 0
    assert any("are gone: run again" in line for line in log)
    assert _rows(tmp_path / "between_process/fake.csv") == [(1, 10), (2, 20)]


def test_a_param_the_experiment_never_reads_is_refused_in_one_line(tmp_path, capsys):
    """A typo in ``--param`` would run a GPU lease with the default: refused before anything runs (exit 2, one
    line naming the key, its value and the keys that experiment reads); a key it reads passes."""
    from mla_lab.measure.experiments.entry import main, param_names

    assert main(["tp_block", "--param", "tpx=4", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("--param tpx='4': tp_block reads no such parameter; allowed: ")
    assert "runs" in err and "cpu_dry_run" in err
    assert main(["presets", "--param", "rounds=3", "--out", str(tmp_path / "never")]) == 2
    assert "presets reads no such parameter; allowed: none" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    assert main(["routes", "--param", "models=glm-5", "--dry-run"]) == 0
    assert param_names(EXPERIMENTS["engines"].module_obj()) == ["repeats", "window_ms"]


def test_every_registry_param_is_one_its_experiment_reads():
    from mla_lab.measure.experiments.entry import param_names

    for name, e in EXPERIMENTS.items():
        if not e.argv:
            assert {k for k, _ in e.params} <= set(param_names(e.module_obj())), name


def test_first_token_dry_run_prints_its_plan_on_cpu():
    """issue 37: the first-token experiment's plan (new shapes after the ready-check shape; allocator growth at the
    seed step) prints without CUDA; a real run without CUDA or without --out is refused in one line."""
    from mla_lab.measure.experiments import first_token
    from mla_lab.measure.experiments.entry import main

    r = subprocess.run([sys.executable, "-m", "mla_lab.measure.experiments", "first_token", "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["outputs"] == first_token.OUTPUTS
    ts = [p["T"] for p in doc["plan"] if p["what"].startswith("triton_jit")]
    assert ts[0] == 1024 and len(set(ts)) == len(ts)  # the ready-check shape first, then shapes not seen before
    assert any(t % 16 for t in ts)  # one token count Triton specialises differently
    assert main(["first_token", "--process", "0", "--dry-run"]) == 2
    assert main(["first_token"]) == 2  # a run without --out
    if not __import__("torch").cuda.is_available():
        assert main(["first_token", "--out", "/nonexistent/never-written"]) == 2
