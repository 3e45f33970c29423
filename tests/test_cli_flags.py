"""Every flag the CLI accepts acts or is refused (issue 22): each flag of ``advise``, ``serve`` and ``sweep`` is
driven with a valid value and the output must differ from the defaults' output (or the command must refuse it in
one line, for a value whose deployment does not fit). A table per command lists every flag, and a test checks the
table covers every flag of the parser, so a flag added later without a case fails here.

``sweep`` is checked through ``--dry-run``, whose plan carries every validated parameter the notebook gets
(the notebook's use of them is tested in tests/test_notebook.py).
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from mla_lab import cli

_run = run_cli


def _flags_of(cmd: str) -> set[str]:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "cmd").choices[cmd]
    return {s for a in sub._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


# (flags and value, "change" | "refuse", what the refusal must name)
ADVISE = [
    (["--engine", "vllm@0.24.0"], "change", None),
    (["--engine", "vllm@9.9"], "refuse", r"--engine='vllm@9.9' is not valid; allowed: \['vllm@pr53878-before'"),
    (["--model", "deepseek-v3.2"], "change", None),
    (["--tp", "4"], "refuse", r"does not fit: glm-5 TP4"),
    (["--tensor-parallel-size", "4"], "refuse", r"does not fit: glm-5 TP4"),
    (["--arch", "b200"], "change", None),
    (["--max-num-batched-tokens", "8192"], "change", None),
    (["--prompt-len", "2048"], "change", None),
    (["--random-input-len", "2048"], "change", None),
    (["--kv-cache-dtype", "fp8"], "change", None),
    (["--num-prompts", "16"], "change", None),
    (["--concurrency", "16"], "change", None),
    (["--max-concurrency", "16"], "change", None),
    (["--weight-dtype", "bf16"], "refuse", r"does not fit: .*bf16 weights"),
    (["--moe-parallel", "tp"], "change", None),
    (["--gpu-memory-utilization", "0.8"], "change", None),
    (["--memory-budget-mib", "100"], "change", None),
    (["--memory-budget-tokens", "1000"], "change", None),
    (["--no-measured"], "change", None),
    (["--prompt-len", "4096", "--packed-overlap", "0.9"], "change-vs:--prompt-len=4096", None),
    (["--packed-overlap", "1.5"], "refuse", r"--packed-overlap=1.5 must be a number in \[0, 1\]"),
    (["--packed-overlap", "abc"], "refuse", r"--packed-overlap: 'abc' is not a number; allowed: a number in \[0, 1\]"),
    (["--random-output-len", "512"], "refuse", r"--random-output-len='512' is not used by advise"),
    (["--request-rate", "4"], "refuse", r"--request-rate='4' is not used by advise"),
    (["--num-speculative-tokens", "1", "--acceptance-length", "1.7"], "change", None),
    (["--acceptance-length", "1.7"], "refuse", r"--acceptance-length=1.7 is given without --num-speculative-tokens"),
    (["--dp-attention", "8"], "change", None),
]
SERVE = [
    (["--num-speculative-tokens", "1", "--acceptance-length", "1.7"], "change", None),
    (["--num-speculative-tokens", "1", "--acceptance-length", "2.5"], "refuse", r"acceptance_length=2.5 is not allowed"),
    (["--dp-attention", "8"], "change", None),
    (["--engine", "vllm@0.33.0"], "change", None),
    (["--engine", "sglang@9"], "refuse", r"--engine='sglang@9' is not valid; allowed:"),
    (["--model", "deepseek-v3.2"], "change", None),
    (["--tensor-parallel-size", "4"], "refuse", r"does not fit: glm-5 TP4"),
    (["--tp", "4"], "refuse", r"does not fit: glm-5 TP4"),
    (["--arch", "b200"], "change", None),
    (["--max-num-batched-tokens", "8192"], "change", None),
    (["--kv-cache-dtype", "fp8"], "change", None),
    (["--weight-dtype", "bf16"], "refuse", r"does not fit: .*bf16 weights"),
    (["--moe-parallel", "tp"], "change", None),
    (["--gpu-memory-utilization", "0.8"], "change", None),
    (["--random-input-len", "2048"], "change", None),
    (["--prompt-len", "2048"], "change", None),
    (["--random-output-len", "64"], "change", None),
    (["--num-prompts", "16"], "change", None),
    (["--max-concurrency", "8"], "change", None),
    (["--request-rate", "4"], "change", None),
    (["--max-num-seqs", "4"], "change", None),
    (["--seed", "1", "--request-rate", "4"], "change-vs:--request-rate=4", None),
    (["--strategies", "sglang"], "change", None),
    (["--json"], "change", None),
    (["--num-runs", "20"], "change", None),  # the noise Monte-Carlo (mla_lab.serving.noise): medians and bands
]


def _check(cmd, base_argv, extra, kind, pattern):
    import re

    rc0, out0, _ = _run([cmd, *base_argv])
    assert rc0 == 0
    rc, out, err = _run([cmd, *base_argv, *extra])
    if kind == "refuse":
        assert rc == 2 and err.count("\n") == 1 and re.search(pattern, err), (extra, rc, err)
        return
    assert rc == 0, (extra, err)
    if kind.startswith("change-vs:"):
        rc0, out0, _ = _run([cmd, *base_argv, *kind.split(":", 1)[1].split("=")])
    assert out != out0, f"{cmd} {extra} printed the same as without it"


@pytest.mark.parametrize("extra,kind,pattern", ADVISE, ids=[" ".join(c[0]) for c in ADVISE])
def test_every_advise_flag_acts(extra, kind, pattern):
    _check("advise", ["--json"] if "--json" not in extra else [], extra, kind, pattern)


@pytest.mark.parametrize("extra,kind,pattern", SERVE, ids=[" ".join(c[0]) for c in SERVE])
def test_every_serve_flag_acts(extra, kind, pattern):
    base = ["--strategies", "vllm-53878", "--num-prompts", "32"]
    if extra[0] in ("--strategies", "--num-prompts"):
        base = []
    _check("serve", base, extra, kind, pattern)


# sweep: the dry-run plan's validated parameters change (or a one-line refusal)
SWEEP = [
    (["--tensor-parallel-size", "8"], "tp_sizes", [8]),
    (["--max-num-batched-tokens", "[4096]"], "max_num_batched_tokens", [4096]),
    (["--max-num-seqs", "128"], "max_num_seqs", 128),
    (["--kv-cache-dtype", "fp8"], "kv_cache_dtype", ["fp8"]),
    (["--gpu-memory-utilization", "0.8"], "gpu_memory_utilization", 0.8),
    (["--num-prompts", "16"], "num_prompts", 16),
    (["--random-input-len", "[2048]"], "prompt_lens", [2048]),
    (["--random-output-len", "512"], "output_len", 512),
    (["--max-concurrency", "8"], "concurrency", 8),
    (["--request-rate", "4"], "request_rate", 4),
    (["--num-runs", "5"], "num_runs", 5),
    (["--force"], "force", True),
    (["--overwrite"], "overwrite", True),
    (["--executor", "local"], "executor", "local"),
]
SWEEP_OTHER = {"--params-file", "--param", "--notebook", "--report-name", "--timeout", "--dry-run", "--address",
               "--seed", "--executor"}


@pytest.mark.parametrize("extra,name,value", SWEEP, ids=[" ".join(c[0]) for c in SWEEP])
def test_every_sweep_flag_reaches_the_parameters(extra, name, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["sweep", "--dry-run", "-p", "models", "[glm-5]", "-p", "archs", "[h200]", *extra])
    assert rc == 0, err
    assert json.loads(out)["params"][name] == value
    assert not any(tmp_path.iterdir()), "a dry run wrote a file"


def test_sweep_seed_reaches_the_parameters(tmp_path, monkeypatch):
    """``--seed`` (vllm bench serve's) is the sweep's ``seed``: the serving section's arrival times
    (:func:`mla_lab.report.serving.serve_swept`, tested in tests/test_report_serving.py)."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["sweep", "--dry-run", "-p", "models", "[glm-5]", "--seed", "3"])
    assert rc == 0 and json.loads(out)["params"]["seed"] == 3, err


def test_sweep_flag_and_its_p_twin_must_agree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["sweep", "--dry-run", "--num-prompts", "16", "-p", "num_prompts", "16"])
    assert rc == 0 and json.loads(out)["params"]["num_prompts"] == 16
    rc, out, err = _run(["sweep", "--dry-run", "--num-prompts", "16", "-p", "num_prompts", "32"])
    assert rc == 2 and "--num-prompts 16 conflicts with -p/-f num_prompts=32" in err


@pytest.mark.parametrize("cmd,table,other", [
    ("advise", ADVISE, {"--json"}),
    ("serve", SERVE, set()),
    ("sweep", SWEEP, SWEEP_OTHER),
])
def test_the_tables_cover_every_flag(cmd, table, other):
    """A flag of the parser without a case here fails (flags that only pick what to run are listed in ``other``
    and tested where they act: tests/test_bad_input.py, tests/test_fuzz_doors.py)."""
    covered = {f for extra, *_ in table for f in extra if f.startswith("--")} | other
    assert _flags_of(cmd) <= covered, sorted(_flags_of(cmd) - covered)


def test_notebook_parameters_are_typed_and_an_undeclared_name_is_refused():
    """papermill --help-notebook shows a type and a help line for every parameter (issue 22: "Unknown type" for
    all); a name papermill would inject without the notebook declaring it (``-p tp_size 8``) is refused."""
    import papermill as pm

    from mla_lab.paths import notebooks_dir
    from mla_lab.sweep.params import DEFAULTS, NOTEBOOK_ONLY, check_notebook_names

    params = pm.inspect_notebook(str(notebooks_dir() / "padding_sweep.ipynb"))
    assert set(params) == set(DEFAULTS) | set(NOTEBOOK_ONLY)
    untyped = [n for n, p in params.items() if p["inferred_type_name"] in ("None", "Unknown type") or not p["help"]]
    assert not untyped, untyped
    check_notebook_names([*DEFAULTS, *NOTEBOOK_ONLY, "In", "Out", "_i1", "__annotations__", "get_ipython"])
    with pytest.raises(ValueError, match=r"^unknown notebook parameter\(s\) \['tp_size'\]; allowed: \[.*'tp_sizes'"):
        check_notebook_names([*DEFAULTS, "tp_size"])
