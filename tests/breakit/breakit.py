"""The break-it pass of issue 39: >= 300 bad inputs thrown at every door of the lab, each case classified.

Doors: ``advise``, ``serve``, ``sweep`` (flags, ``-p`` and ``-f``, dry run and run), ``engines``, ``report``,
``measure --dry-run`` (and ``--resume`` records), ``index``, ``check-report``, hand-edited measured files read by
``advise``, and the Python API (``Deployment.of`` / ``Deployment.seed``, ``explore.explore_point``,
``serving.run_benchmark``). A CLI case runs as a user runs it, ``python -m mla_lab.cli ARGV`` in a fresh temporary
folder (cache and measured overrides pointed into it where the case says), with a 10 s timeout; an API case runs in
this process under a 10 s ``SIGALRM``.

Every case says what is due: ``refuse`` (bad input: exit 2, one ``mla-lab: error:`` line, no traceback), ``ok``
(a valid edge the door must take: exit 0) or ``either`` (an edge a door may take or refuse, e.g. full-width digits,
which Python's ``int`` reads: only a traceback, a hang or a write counts against it). Each outcome is one of:

- ``refusal``: refused in one line (exit 2, or 1 for a failed run such as a failed wheel check, stated per case);
- ``traceback``: a Python traceback, an ``internal error`` line, or more than one error line;
- ``hang``: not done in 10 s;
- ``accepted_where_refusal_due``: exit 0 where a refusal was due;
- ``ok``: an ``ok`` case that ran (exit 0); ``failed_where_ok_due``: an ``ok`` case refused or failed;
- and, independently, ``wrong_write`` (a file created or changed outside the case's temporary folder: the
  worktree is listed, paths with size and mtime, before and after each case, ``.git``, ``__pycache__`` and
  ``.hypothesis`` left out; inside the temporary folder a refusal may create nothing) and ``data_loss`` (a file
  that existed before the case, in the worktree or in the temporary folder, deleted or changed).

Run: ``python tests/breakit/breakit.py [--out data/validation/breakit_<date>.json] [--only DOOR]``. 1-4 min on a
2-core machine. Exit 0 when there are 0 data losses, 0 wrong writes and 0 hangs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0
SKIP_PARTS = {".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ipynb_checkpoints"}


@dataclass
class Case:
    door: str
    name: str
    argv: list | None = None  # CLI arguments ({tmp} is the case's temporary folder)
    call: object = None  # an API case: a function of the temporary folder
    expect: str = "refuse"  # "refuse", "ok" or "either" (a door may take or refuse it: only how is judged)
    setup: object = None  # function(tmp: Path) preparing files in the temporary folder
    env: dict = field(default_factory=dict)  # extra environment ({tmp} formatted)
    refusal_rc: tuple = (2,)


# ----------------------------------------------------------------------------------------------------- bad values
BAD_INT = ["-1", "abc", "nan", "1e400", "99999999999999999999", "", "1_0x", "0x10", "3.5"]
#: Values a door may take or refuse (no answer is due): full-width digits (Python's int() reads them as 12).
EDGE_INT = ["\uff11\uff12"]
BAD_FLOAT = ["-1", "abc", "nan", "-inf", "1e400x", "", "0x", "--"]


def _user_files(tmp: Path) -> None:
    """Files a user owns in the temporary folder (a refusal must leave them as they are)."""
    (tmp / "work").mkdir(exist_ok=True)
    (tmp / "work" / "README.md").write_text("# mine\n")
    (tmp / "userdir").mkdir(exist_ok=True)
    (tmp / "userdir" / "notes.txt").write_text("my notes\n")
    (tmp / "userdir" / "padding_sweep_h200.html").write_text("<html>my page</html>")
    (tmp / "afile").write_text("x")
    (tmp / "empty").mkdir(exist_ok=True)
    (tmp / "site").mkdir(exist_ok=True)  # a user's web folder: the sweep would rewrite its index
    (tmp / "site" / "index.html").write_text("<html>my site</html>")
    (tmp / "site" / "padding_sweep.html").write_text("<html>my page</html>")


def _bomb(levels: int, key: str) -> str:
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return f"{key}: [" + ", ".join(parts) + "]\n"


def _write(rel: str, text: str | bytes):
    def setup(tmp: Path) -> None:
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return setup


def _fake_wheel(name: str, entries: dict | None, raw: bytes | None = None):
    def setup(tmp: Path) -> None:
        p = tmp / name
        if raw is not None:
            p.write_bytes(raw)
            return
        with zipfile.ZipFile(p, "w") as z:
            for k, v in (entries or {}).items():
                z.writestr(k, v)
    return setup


def _measured_edit(rel: str, col: str, fn, row: int | None = None):
    """A copy of data/measured under the temporary folder with one cell of ``rel`` edited (the first measured row
    holding the column, or ``row``)."""
    def setup(tmp: Path) -> None:
        root = tmp / "measured"
        shutil.copytree(REPO / "data" / "measured", root)
        p = root / rel
        rows = list(csv.reader(p.open(newline="")))
        j = rows[0].index(col)
        r = row
        if r is None:
            src = rows[0].index("source") if "source" in rows[0] else None
            r = next(i for i, x in enumerate(rows[1:], start=1) if x[j].strip() and (src is None or x[src] == "measured"))
        rows[r][j] = fn(rows[r][j])
        with p.open("w", newline="") as f:
            csv.writer(f).writerows(rows)
    return setup


# ---------------------------------------------------------------------------------------------------- the cases
def cli_cases() -> list[Case]:
    C: list[Case] = []
    # advise: every numeric flag with values outside its stated range or not a number
    for flag in ("--tp", "--max-num-batched-tokens", "--prompt-len", "--num-prompts", "--concurrency",
                 "--memory-budget-tokens"):
        C += [Case("advise", f"{flag}={v!r}", ["advise", flag, v],
                   # a budget has no upper bound ("a whole number >= 0"): 10**20 tokens is "no limit", not bad input
                   expect="either" if flag == "--memory-budget-tokens" and v.isdigit() else "refuse") for v in BAD_INT]
        C += [Case("advise", f"{flag}={v!r}", ["advise", flag, v], expect="either") for v in EDGE_INT]
    for flag in ("--memory-budget-mib", "--gpu-memory-utilization"):
        C += [Case("advise", f"{flag}={v!r}", ["advise", flag, v]) for v in BAD_FLOAT]
    C += [Case("advise", f"--gpu-memory-utilization={v}", ["advise", "--gpu-memory-utilization", v])
          for v in ("0", "1.5", "2")]
    for flag, vals in (("--model", ["nope", "", "../../etc/passwd", "x" * 5000, "glm-5/../glm-5"]),
                       ("--arch", ["nope", "", "h2OO"]), ("--kv-cache-dtype", ["fp4", "", "bf16,fp8"]),
                       ("--engine", ["nope", "vllm@9.9.9", ""]), ("--weight-dtype", ["int4"]),
                       ("--moe-parallel", ["dp"])):
        C += [Case("advise", f"{flag}={v[:20]!r}", ["advise", flag, v]) for v in vals]
    C += [Case("advise", "--random-output-len given", ["advise", "--random-output-len", "5"]),
          Case("advise", "--request-rate given", ["advise", "--request-rate", "1"]),
          Case("advise", "unknown flag", ["advise", "--foo", "1"]),
          Case("advise", "--concurrency over --num-prompts", ["advise", "--num-prompts", "4", "--concurrency", "8"]),
          Case("advise", "--tp not dividing the heads", ["advise", "--tp", "3"]),
          Case("advise", "--prompt-len the KV cannot hold", ["advise", "--prompt-len", "1048576", "--num-prompts",
                                                            "100000"]),
          Case("advise", "--max-num-batched-tokens under --max-num-seqs", ["advise", "--max-num-batched-tokens", "8"]),
          Case("advise", "--arch sm90 (a family name)", ["advise", "--arch", "sm90"], expect="either"),
          Case("advise", "the seed (valid)", ["advise", "--no-measured"], expect="ok"),
          Case("advise", "one prompt (valid)", ["advise", "--no-measured", "--num-prompts", "1"], expect="ok")]
    # serve
    for flag in ("--tensor-parallel-size", "--random-input-len", "--random-output-len", "--num-prompts",
                 "--max-concurrency", "--max-num-seqs", "--seed", "--num-runs", "--max-num-batched-tokens"):
        C += [Case("serve", f"{flag}={v!r}", ["serve", flag, v]) for v in BAD_INT[:7]]
        C += [Case("serve", f"{flag}={v!r}", ["serve", flag, v], expect="either") for v in EDGE_INT]
    C += [Case("serve", f"--request-rate={v}", ["serve", "--request-rate", v, "--num-prompts", "2",
                                                  "--random-output-len", "4"])
          for v in ("0", "-1", "nan", "abc", "-inf", "1e-9", "1e-12", "1e-20", "1e-300", "")]
    C += [Case("serve", f"--num-runs={v}", ["serve", "--num-runs", v]) for v in ("2", "19", "0")]
    C += [Case("serve", f"--strategies {v!r}", ["serve", "--strategies", v]) for v in ("nope", "", "padded")]
    C += [Case("serve", "work over the step bound", ["serve", "--num-prompts", "100000", "--random-output-len",
                                                     "100000"]),
          Case("serve", "noise runs over the bound", ["serve", "--num-runs", "2000", "--num-prompts", "384"]),
          Case("serve", "slowest rate allowed (valid)", ["serve", "--request-rate", "2e-8", "--num-prompts", "2",
                                                         "--random-output-len", "4", "--num-runs", "1"], expect="ok"),
          Case("serve", "one prompt (valid)", ["serve", "--num-prompts", "1", "--random-output-len", "2"],
               expect="ok")]
    # sweep -p (dry run and run): names, types, ranges, paths
    P = [("tp_sizes", "[]"), ("tp_sizes", "[0]"), ("tp_sizes", "[a]"), ("tp_sizes", "[-8]"), ("tp_sizes", "[3]"),
         ("tp_sizes", "{a: 1}"), ("prompt_lens", "[0]"), ("prompt_lens", "[1099511627776]"), ("prompt_lens", "[1.5]"),
         ("models", "[nope]"), ("models", "[]"), ("models", "[[glm-5]]"), ("archs", "[x]"), ("archs", "[]"),
         ("max_num_batched_tokens", "[1]"), ("kv_cache_dtype", "fp4"), ("num_prompts", "0"),
         ("num_prompts", "true"), ("num_prompts", "99999999999999999999"), ("concurrency", "1000"),
         ("request_rate", "0"), ("request_rate", "-1"), ("request_rate", "1.0e-20"), ("request_rate", ".nan"),
         ("request_rate", "abc"), ("seed", "-1"), ("seed", "4294967296"), ("strategies", "[nope]"),
         ("device", "tpu"), ("executor", "mpi"), ("num_runs", "0"), ("output_len", "0"), ("max_num_seqs", "0"),
         ("shared_workspace_bytes", "-1"), ("overwrite", "1"), ("force", "maybe"), ("nope", "1"),
         ("figure_dir", "x"), ("gpu_memory_utilization", "1.5"), ("models", "[&a glm-5, *a]"),
         ("store_dir", "/proc/mla_lab"), ("store_dir", "/sys/mla_lab"), ("store_dir", "{tmp}/afile"),
         ("store_dir", "{tmp}/afile/sub"), ("store_dir", str(REPO / "data")),
         ("store_dir", str(REPO / "data/measured/h200")), ("data_file", "/proc/self/rows.csv"),
         ("data_file", "/sys/kernel/rows.csv"), ("data_file", "{tmp}/userdir"), ("data_file", "{tmp}/work/README.md"),
         ("data_file", str(REPO / "data/measured/h200/padding_sweep.csv")), ("data_file", "{tmp}/afile/x.csv"),
         ("report_dir", "/sys/mla_lab"), ("report_dir", "{tmp}/afile"), ("report_dir", str(REPO / "data/calibration")),
         ("report_dir", "{tmp}/site")]
    for name, v in P:
        C.append(Case("sweep", f"--dry-run -p {name} {v[:40]}", ["sweep", "--dry-run", "-p", name, v]))
    for name, v in P[::3]:  # the run makes the same checks before anything runs
        C.append(Case("sweep", f"-p {name} {v[:40]} (run)", ["sweep", "-p", name, v]))
    C += [Case("sweep", f"{flag}={v!r}", ["sweep", "--dry-run", flag, v])
          for flag in ("--tensor-parallel-size", "--random-input-len", "--num-prompts", "--num-runs", "--seed",
                       "--max-num-batched-tokens") for v in ("-1", "abc", "[]", "99999999999999999999")]
    C += [Case("sweep", "flag against its -p twin", ["sweep", "--dry-run", "--tensor-parallel-size", "8", "-p",
                                                     "tp_sizes", "[4]"]),
          Case("sweep", "--overwrite into a user's page", ["sweep", "--dry-run", "-p", "report_dir", "{tmp}/site",
                                                          "--overwrite"]),
          Case("sweep", "--report-name sub/dir", ["sweep", "--dry-run", "--report-name", "sub/dir"]),
          Case("sweep", "--report-name ..", ["sweep", "--dry-run", "--report-name", ".."]),
          Case("sweep", "--notebook missing", ["sweep", "--notebook", "{tmp}/nope.ipynb"]),
          Case("sweep", "-p value of 100 KB", ["sweep", "--dry-run", "-p", "models", "[" + "a, " * 40000 + "a]"]),
          Case("sweep", "the default grid's dry run (valid)", ["sweep", "--dry-run"], expect="ok"),
          Case("sweep", "slowest request_rate allowed (valid dry run)", ["sweep", "--dry-run", "-p", "request_rate",
                                                                         "4e-7"], expect="ok")]
    # sweep -f files
    F = {"bomb6.yaml": _bomb(6, "device"), "bomb9.yaml": _bomb(9, "device"), "bomb_models.yaml": _bomb(9, "models"),
         "list.yaml": "- a\n- b\n", "scalar.yaml": "42\n", "empty.yaml": "", "bad.yaml": "a: [\n",
         "unknown.yaml": "nope: 1\n", "types.yaml": "tp_sizes: abc\n", "huge_int.yaml": "num_prompts: " + "9" * 400,
         "twins.yaml": "tp_sizes: [8]\ntensor_parallel_size: [4]\n", "binary.yaml": b"\xff\xfe\x00\x01",
         "big.yaml": "models: [" + ", ".join(["glm-5"] * 20000) + "]\n", "tags.yaml": "models: !!python/name:os.system\n",
         "merge.yaml": "base: &b {tp_sizes: [8]}\n<<: *b\n", "deep.yaml": "models: " + "[" * 5000 + "]" * 5000 + "\n",
         "proc_paths.yaml": "store_dir: /proc/mla_lab\n", "nul.yaml": "models: [\"glm-5\\0\"]\n"}
    for fname, text in F.items():
        C.append(Case("sweep -f", fname, ["sweep", "--dry-run", "-f", "{tmp}/" + fname], setup=_write(fname, text)))
    C += [Case("sweep -f", "a folder", ["sweep", "--dry-run", "-f", "{tmp}/userdir"]),
          Case("sweep -f", "/dev/zero", ["sweep", "--dry-run", "-f", "/dev/zero"]),
          Case("sweep -f", "missing", ["sweep", "--dry-run", "-f", "{tmp}/nope.yaml"])]
    # engines
    W = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    C += [Case("engines", "fake wheel --write --overwrite", ["engines", "--check-wheel", "{tmp}/" + W, "--write",
                                                              "--overwrite"], setup=_fake_wheel(W, {"x.py": "x=1"}),
               env={"MLA_LAB_DATA": "{tmp}/data"}, refusal_rc=(1,)),
          Case("engines", "fake wheel --write", ["engines", "--check-wheel", "{tmp}/" + W, "--write"],
               setup=_fake_wheel(W, {"x.py": "x=1"}), env={"MLA_LAB_DATA": "{tmp}/data"}, refusal_rc=(1,)),
          Case("engines", "fake wheel, the committed facts as target", ["engines", "--check-wheel", "{tmp}/" + W,
                                                                         "--write", "--overwrite"],
               setup=_fake_wheel(W, {"x.py": "x=1"}), refusal_rc=(1,)),
          Case("engines", "not a zip", ["engines", "--check-wheel", "{tmp}/" + W], setup=_fake_wheel(W, None, b"no")),
          Case("engines", "not a wheel name", ["engines", "--check-wheel", "{tmp}/afile"]),
          Case("engines", "unknown version", ["engines", "--check-wheel", "{tmp}/vllm-9.9.9-x-y.whl"],
               setup=_fake_wheel("vllm-9.9.9-x-y.whl", {"a": "b"})),
          Case("engines", "missing wheel", ["engines", "--check-wheel", "{tmp}/nope.whl"]),
          Case("engines", "a folder as wheel", ["engines", "--check-wheel", "{tmp}/userdir"]),
          Case("engines", "--download without version", ["engines", "--download", "vllm"]),
          Case("engines", "--download into a file", ["engines", "--download", "vllm==0.33.0", "--wheel-dir",
                                                     "{tmp}/afile"]),
          Case("engines", "--write alone", ["engines", "--write"]),
          Case("engines", "--overwrite alone", ["engines", "--overwrite"]),
          Case("engines", "--overwrite without --write", ["engines", "--check-wheel", "{tmp}/" + W, "--overwrite"],
               setup=_fake_wheel(W, {"x.py": "x=1"})),
          Case("engines", "the table (valid)", ["engines"], expect="ok")]
    # report --measured
    for rd, ow in [(str(REPO / "data/measured/h200"), True), (str(REPO / "data/measured/h200"), False),
                   (str(REPO / "data"), True), (str(REPO / "docs"), True), (str(REPO), True), ("{tmp}/userdir", True),
                   ("{tmp}/userdir", False), ("{tmp}/work", True), ("{tmp}/afile", True), ("{tmp}/afile/sub", True),
                   ("/proc/mla_lab", True), ("/sys/mla_lab", True), ("/dev/null", True), (str(REPO / "reports/h200"),
                                                                                        False)]:
        C.append(Case("report", f"--report-dir {rd.replace(str(REPO), '<repo>')}{' --overwrite' if ow else ''}",
                      ["report", "--measured", "h200", "--report-dir", rd] + (["--overwrite"] if ow else [])))
    C += [Case("report", f"--measured {v!r}", ["report", "--measured", v]) for v in ("nope", "", "../h200", "h100",
                                                                                    "b200")]
    # measure --dry-run
    C += [Case("measure", f"--out {v}", ["measure", "--dry-run", "--out", v])
          for v in ("/proc/mla_lab", "/sys/mla_lab", "{tmp}/afile", "{tmp}/afile/sub", "/dev/mla_lab")]
    C += [Case("measure", f"--experiments {v!r}", ["measure", "--dry-run", "--experiments", v])
          for v in ("", "nope", ",,,", "padding_sweep,nope")]
    C += [Case("measure", f"--processes {v}", ["measure", "--dry-run", "--processes", v]) for v in ("0", "65", "abc")]
    C += [Case("measure", f"--budget-s {v}", ["measure", "--dry-run", "--budget-s", v])
          for v in ("0", "-1", "nan", "inf", "abc")]
    C += [Case("measure", "--engine-root missing", ["measure", "--dry-run", "--experiments", "engine_kernels",
                                                    "--engine-root", "{tmp}/nope"]),
          Case("measure", "--resume missing", ["measure", "--dry-run", "--resume", "{tmp}/nope"]),
          Case("measure", "--resume a file", ["measure", "--dry-run", "--resume", "{tmp}/afile"]),
          Case("measure", "--resume a folder without record", ["measure", "--dry-run", "--resume", "{tmp}/empty"]),
          Case("measure", "the plan (valid)", ["measure", "--dry-run"], expect="ok")]
    R = {"not_json": "not json", "list": "[1, 2]", "no_experiments": '{"processes": 5}', "string": '"a string"',
         "entry_string": '{"processes": 5, "experiments": {"padding_sweep": "x"}}',
         "exit_string": '{"processes": 5, "experiments": {"padding_sweep": {"exit": "0"}}}',
         "processes_string": '{"processes": "5", "experiments": {}}', "non_utf8": b"\xff\xfe{",
         "other_processes": '{"processes": 3, "experiments": {}}',
         "unknown_experiment": '{"processes": 5, "experiments": {"nope": {}}}',
         "merged_string": '{"processes": 5, "experiments": {"padding_sweep": {"merged": "yes"}}}'}
    for k, text in R.items():
        C.append(Case("measure --resume", k, ["measure", "--dry-run", "--resume", "{tmp}/run"],
                      setup=_write("run/provenance.json", text)))
    # index, check-report
    C += [Case("index", f"--report-dir {v}", ["index", "--report-dir", v])
          for v in ("{tmp}/nope", "{tmp}/afile", "{tmp}/empty", "", "/proc")]
    C += [Case("index", f"--report-name {v!r}", ["index", "--report-name", v]) for v in ("a/b", "", "..", "x y")]
    C += [Case("index", "a run record not UTF-8 (valid run beside it)", ["index", "--report-dir", "{tmp}/rep"],
               setup=lambda t: (_write("rep/runs/r1.html", "<html></html>")(t),
                                _write("rep/runs/r1.json", '{"run_id": "r1", "html": "runs/r1.html"}')(t),
                                _write("rep/runs/bad.json", b"\xff\xfe{")(t),
                                _write("rep/runs/r2.json", '{"run_id": "r2", "html": 5}')(t)), expect="ok")]
    C += [Case("check-report", f"{v}", ["check-report", v]) for v in ("{tmp}/nope.html", "{tmp}/afile",
                                                                        "{tmp}/userdir", "{tmp}/work/README.md")]
    # measured files edited by hand, read by advise (its measured column)
    env = {"MLA_LAB_MEASURED": "{tmp}/measured", "MLA_LAB_NO_CACHE": "1"}
    M = [("h200/between_process/presets.csv", "ms", lambda v: str(float(v) * 10)),
         ("h200/between_process/presets.csv", "ms", lambda v: str(float(v) / 10)),
         ("h200/between_process/presets.csv", "ms", lambda v: "nan"),
         ("h200/between_process/presets.csv", "ms", lambda v: "fast"),
         ("h200/between_process/presets.csv", "ms", lambda v: ""),
         ("h200/between_process/presets.csv", "median_ms", lambda v: str(float(v) * 10)),
         ("h200/between_process/presets.csv", "process", lambda v: "999"),
         ("h200/between_process/strategies.csv", "ms", lambda v: str(float(v) * 10)),
         ("h200/between_process/strategies.csv", "ms", lambda v: "-1"),
         ("h200/between_process/strategies.csv", "ms", lambda v: "inf"),
         ("h200/padding_sweep.csv", "attn_path_ms_step0", lambda v: str(float(v) * 10)),
         ("h200/padding_sweep.csv", "attn_path_ms_step0", lambda v: "nan"),
         ("h200/padding_sweep.csv", "attn_path_ms_step0", lambda v: "abc"),
         ("h200/padding_sweep.csv", "attn_path_ms_steps", lambda v: "[1.0, NaN]"),
         ("h200/padding_sweep.csv", "attn_path_ms_steps", lambda v: "[30.0, 30.0]"),
         ("h200/padding_sweep.csv", "ttft_ms", lambda v: str(float(v) * 10)),
         ("h200/padding_sweep.csv", "tp", lambda v: "eight")]
    for rel, col, fn in M:
        C.append(Case("measured files", f"{rel.split('/')[-1]} {col} edited", ["advise"],
                      setup=_measured_edit(rel, col, fn), env=env))
    return C


# ------------------------------------------------------------------------------------------------------- API cases
def api_cases() -> list[Case]:
    from mla_lab.deployment import Deployment

    C = []
    bad_of = [dict(tp=0), dict(tp=3), dict(tp=True), dict(model="nope"), dict(model=None), dict(arch="nope"),
              dict(prompt_len=-1), dict(prompt_len=0), dict(num_prompts=0), dict(num_prompts=1.5),
              dict(max_num_batched_tokens=1), dict(kv_cache_dtype="fp4"), dict(weight_dtype="int4"),
              dict(moe_parallel="dp"), dict(gpu_memory_utilization=0), dict(gpu_memory_utilization=float("nan")),
              dict(concurrency=1000), dict(concurrency=0), dict(max_num_seqs=0), dict(nope=1)]
    for kw in bad_of:
        C.append(Case("api", f"Deployment.seed({kw})", call=lambda t, kw=kw: Deployment.seed(**kw)))
    C.append(Case("api", "Deployment.seed(num_prompts=1)", call=lambda t: Deployment.seed(num_prompts=1),
                  expect="ok"))
    C.append(Case("api", "Deployment.seed(num_prompts=5)", call=lambda t: Deployment.seed(num_prompts=5),
                  expect="ok"))

    def explore(arg):
        from mla_lab.explore import explore_point
        return explore_point(**arg)

    for kw in (dict(deployment="glm-5"), dict(strategy="nope"), dict(strategy=None), dict(measured=5)):
        C.append(Case("api", f"explore_point({kw})", call=lambda t, kw=kw: explore(kw)))

    def bench(dep, strategies, **kw):
        from mla_lab.serving import serve_benchmark
        return serve_benchmark(dep, strategies, **kw)

    C.append(Case("api", "explore_point(prompt_len=2**40)",
                  call=lambda t: explore(dict(deployment=Deployment.seed(prompt_len=2**40)))))
    C.append(Case("api", "serve_benchmark(a str)", call=lambda t: bench("glm-5", ["vllm-53878"])))
    C.append(Case("api", "serve_benchmark(strategies=['nope'])", call=lambda t: bench(Deployment.seed(), ["nope"])))
    C.append(Case("api", "serve_benchmark(bench=5)", call=lambda t: bench(Deployment.seed(), ["vllm-53878"],
                                                                           bench=5)))
    return C


# ------------------------------------------------------------------------------------------------------ running
def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_PARTS and not (Path(dirpath) == REPO and d == ".venv")]
        for n in filenames:
            p = Path(dirpath) / n
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def _diff(before: dict, after: dict) -> tuple[list, list]:
    """(created or changed, deleted or changed pre-existing) paths."""
    new = [p for p in after if p not in before or after[p] != before[p]]
    lost = [p for p in before if p not in after or after[p] != before[p]]
    return new, lost


def _classify(case: Case, rc, err: str, timed_out: bool) -> str:
    if timed_out:
        return "hang"
    errs = [x for x in err.splitlines() if x.startswith("mla-lab: error:")]
    if "Traceback (most recent call last)" in err or "internal error" in err or len(errs) > 1:
        return "traceback"
    if case.expect == "ok" or (case.expect == "either" and rc == 0):
        return "ok" if rc == 0 else "failed_where_ok_due"
    if rc == 0:
        return "accepted_where_refusal_due"
    if rc in case.refusal_rc and (len(errs) == 1 or rc == 1):
        return "refusal"
    return "traceback" if rc not in (1, 2) else "refusal_not_one_line"


def run_cli_case(case: Case, tmp: Path) -> dict:
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLA_LAB_CACHE": str(tmp / "cache"),
           **{k: v.replace("{tmp}", str(tmp)) for k, v in case.env.items()}}
    t0 = time.monotonic()
    # its own process group: a case cut at the timeout takes its children (a notebook kernel) with it
    proc = subprocess.Popen([sys.executable, "-m", "mla_lab.cli", *argv], cwd=tmp / "work", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        rc, timed_out = proc.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc, timed_out = None, True
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 2), "stderr": err, "stdout_chars": len(out or ""),
            "timed_out": timed_out}


class _Alarm(Exception):
    pass


def run_api_case(case: Case, tmp: Path) -> dict:
    def on_alarm(signum, frame):
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
    t0 = time.monotonic()
    rc, err, timed_out = 0, "", False
    try:
        case.call(tmp)
    except _Alarm:
        timed_out, rc = True, None
    except ValueError as e:
        msg = " ".join(str(e).split())
        rc, err = 2, f"mla-lab: error: {msg}" if "\n" not in str(e).strip() else f"mla-lab: error: {msg}\n" \
                                                                                      "mla-lab: error: (multi-line)"
    except Exception as e:  # noqa: BLE001 - what the pass counts
        rc, err = 1, f"internal error {type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 2), "stderr": err, "timed_out": timed_out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--only", default=None, help="run only the cases of this door")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    cases = cli_cases() + api_cases()
    if args.only:
        cases = [c for c in cases if c.door == args.only]
    counts = {k: 0 for k in ("cases", "refusal", "ok", "traceback", "hang", "accepted_where_refusal_due",
                             "failed_where_ok_due", "refusal_not_one_line", "wrong_write", "data_loss")}
    results = []
    t_all = time.monotonic()
    for i, case in enumerate(cases, 1):
        with tempfile.TemporaryDirectory(prefix="mla_lab_breakit_") as td:
            tmp = Path(td)
            _user_files(tmp)
            if case.setup:
                case.setup(tmp)
            if case.env.get("MLA_LAB_DATA", "").startswith("{tmp}"):  # the committed facts, copied for the case
                shutil.copytree(REPO / "data" / "engines", Path(case.env["MLA_LAB_DATA"].replace("{tmp}", td)) /
                                "engines")
            repo0, tmp0 = _snapshot(REPO), _snapshot(tmp)
            r = run_cli_case(case, tmp) if case.argv is not None else run_api_case(case, tmp)
            repo1, tmp1 = _snapshot(REPO), _snapshot(tmp)
            verdict = _classify(case, r["rc"], r["stderr"], r["timed_out"])
            new_repo, lost_repo = _diff(repo0, repo1)
            new_tmp, lost_tmp = _diff(tmp0, tmp1)
            allowed_tmp = [p for p in new_tmp if Path(p).is_relative_to(tmp / "cache")]  # the lab's cache
            wrong = new_repo + ([p for p in new_tmp if p not in allowed_tmp] if verdict == "refusal" else [])
            lost = lost_repo + lost_tmp
        counts["cases"] += 1
        counts[verdict] += 1
        counts["wrong_write"] += bool(wrong)
        counts["data_loss"] += bool(lost)
        first = next((x for x in r["stderr"].splitlines() if x.strip()), "")
        results.append({"door": case.door, "case": case.name, "expect": case.expect, "verdict": verdict,
                        "rc": r["rc"], "seconds": r["seconds"], "stderr_lines": len(r["stderr"].splitlines()),
                        "first_line": first[:240], "wrong_writes": [p.replace(str(REPO), "<repo>") for p in wrong][:5],
                        "data_loss": [p.replace(str(REPO), "<repo>") for p in lost][:5]})
        flag = "" if verdict in ("refusal", "ok") and not wrong and not lost else "  <--"
        print(f"[{i}/{len(cases)}] {case.door}: {case.name[:60]}: {verdict} ({r['seconds']} s){flag}", flush=True)
    out = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "timeout_s": TIMEOUT_S,
           "wall_s": round(time.monotonic() - t_all, 1), "commit": _commit(), "counts": counts,
           "max_seconds": max((r["seconds"] for r in results), default=0), "results": results}
    print(json.dumps({k: out[k] for k in ("counts", "wall_s", "max_seconds")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if counts["data_loss"] == counts["wrong_write"] == counts["hang"] == 0 else 1


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
