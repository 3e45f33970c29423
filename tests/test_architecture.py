"""The package's layering (issue 10): an import graph built from the sources (ast), checked against the stack.

Stack, top to bottom; a module may import modules of its own unit or of units strictly below it, never above,
never a sibling unit on the same layer, and nothing in a circle:

    mla_lab (package root), cli, explore
    cli_engines, cli_report, cli_serve, cli_sweep (commands split from cli)
    report, cli_doors, cli_measure
    sweep, fits (the calibration fits of committed measurements and the written PR prediction)
    measure, serving
    model
    strategies, seed
    kernels, buffers, deployment
    rank (what one TP rank of a deployment holds: the view the layers below the door take)
    models, arch, workload, provenance, kernelspec, placement
    labels (how outputs name the strategies whose names mislead, and the measurement they quote)
    routes (engine route rules: placement's presets name their routes)
    engines (engine versions and their facts as data; the wheel check)
    paths, _validate, union_layout (the union builder's byte layout, shared by kernels and buffers without torch)

Function-local imports are only for optional heavy dependencies (torch.cuda paths, triton, flash_mla, ray,
ipywidgets, matplotlib, papermill, the browser library): a function-local import of a module of this package fails,
except in the command line (``cli``, ``cli_doors``: nothing imports them, so their lazy imports cannot hide a circle;
``mla-lab --help`` must not load torch, issue 22). Function-local imports still count as edges of the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "mla_lab"

STACK = [
    ("mla_lab", "cli", "explore"),
    ("cli_engines", "cli_report", "cli_serve", "cli_sweep"),
    ("report", "cli_doors", "cli_measure"),
    ("sweep", "fits", "validation"),
    ("measure", "serving"),
    ("model",),
    ("strategies", "seed"),
    ("kernels", "buffers", "deployment"),
    ("rank",),
    ("models", "arch", "workload", "provenance", "kernelspec", "placement"),
    ("labels",),
    ("routes",),
    ("engines",),
    ("paths", "_validate", "union_layout"),
]
#: Modules allowed function-local imports of the package (the CLI's lazy imports; issue 22).
LAZY_OK = {"mla_lab.cli", "mla_lab.cli_doors", "mla_lab.cli_measure", "mla_lab.cli_engines", "mla_lab.cli_report",
           "mla_lab.cli_serve", "mla_lab.cli_sweep"}
LAYER = {unit: i for i, units in enumerate(STACK) for unit in units}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return "mla_lab" if len(parts) == 1 else parts[1]


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """Absolute mla_lab module names an import statement refers to (other packages dropped)."""
    out = []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "mla_lab" or a.name.startswith("mla_lab.")]
    if node.level:
        base = module.split(".")
        if not is_pkg:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "mla_lab" or target.startswith("mla_lab.")):
        return []
    for a in node.names:  # "from . import executors" names a submodule
        sub = f"{target}.{a.name}"
        out.append(sub if _exists(sub) else target)
    return out


def _exists(module: str) -> bool:
    p = PKG.parent.joinpath(*module.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _graph():
    top_level, local = {}, []
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _resolve(module, is_pkg, node)
            edges.update(t for t in targets if t != module)
        # function-local imports: imports whose nearest enclosing scope is a function
        for fn in ast.walk(tree) if module not in LAZY_OK else ():
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and _resolve(module, is_pkg, node):
                        local.append(f"{path.relative_to(PKG.parent)}:{node.lineno} ({fn.name})")
        top_level[module] = edges
    return top_level, local


GRAPH, LOCAL_IMPORTS = _graph()


def test_every_unit_is_on_the_stack():
    units = {_unit(m) for m in GRAPH}
    assert units <= set(LAYER), sorted(units - set(LAYER))


def test_no_import_goes_up_or_sideways():
    bad = []
    for module, targets in GRAPH.items():
        src = _unit(module)
        for t in targets:
            dst = _unit(t)
            if dst == src:
                continue
            if LAYER[dst] <= LAYER[src]:
                bad.append(f"{module} -> {t} ({src} is on layer {LAYER[src]}, {dst} on layer {LAYER[dst]})")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    color: dict = {}
    cycles = []

    def visit(m, stack):
        color[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            if t not in GRAPH:
                continue
            if color.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif color.get(t) is None:
                visit(t, stack + [t])
        color[m] = 2

    for m in sorted(GRAPH):
        if color.get(m) is None:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_no_function_local_import_of_the_package():
    assert not LOCAL_IMPORTS, "function-local imports of mla_lab modules:\n" + "\n".join(LOCAL_IMPORTS)


@pytest.mark.parametrize("src,bad_line", [
    ("model", "from ..sweep import rows"),  # up the stack
    ("measure", "from ..serving import simulate"),  # sideways
])
def test_the_checks_catch_a_planted_violation(src, bad_line):
    """The layering check is not vacuous: a planted upward or sideways import is reported."""
    module = f"mla_lab.{src}.planted"
    node = ast.parse(bad_line).body[0]
    targets = _resolve(module, False, node)
    assert targets and all(LAYER[_unit(t)] <= LAYER[src] for t in targets)


# ------------------------------------------------------------------------------ the Deployment all the way down
#: Units below the door (issue 31): they take a Deployment or its rank view (``Deployment.rank``,
#: :class:`mla_lab.rank.RankView`), never loose ``(model, tp, ...)`` scalars as their first parameters. ``measure``
#: is not among them: it runs tensors of ad-hoc shapes (a benchmark's model and TP are its inputs, not a deployment).
BELOW_DOOR = ("model", "serving", "buffers")
#: What still takes ``(model, tp, ...)`` below the door (module:function; ``Class.method`` for methods). Shrink it:
#: a converted function must leave this list (the test fails on an entry that no longer matches). Empty: the cost
#: model, the workspace account and the serving half all take a Deployment or its rank view.
PENDING: set[str] = set()


def _loose_functions() -> set[str]:
    """``unit.module:function`` of every function below the door whose first parameters are ``model, tp``."""
    found = set()
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        if _unit(mod) not in BELOW_DOOR:
            continue
        rel = mod.removeprefix("mla_lab.")
        tree = ast.parse(path.read_text())
        for node in tree.body:
            fns = [(node.name, node)] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))] \
                if isinstance(node, ast.ClassDef) else []
            for name, fn in fns:
                args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                if args[:1] in (["self"], ["cls"]):
                    args = args[1:]
                if args[:2] == ["model", "tp"]:
                    found.add(f"{rel}:{name}")
    return found


def test_nothing_new_below_the_door_takes_loose_model_tp_scalars():
    found = _loose_functions()
    new = sorted(found - PENDING)
    assert not new, (f"{new} take loose (model, tp, ...) below the door; allowed: a Deployment or its rank view "
                     "(Deployment.rank, mla_lab.rank.RankView)")
    gone = sorted(PENDING - found)
    assert not gone, f"{gone} no longer take (model, tp, ...): remove them from PENDING (it only shrinks)"
    # the rule sees what it is for: the memory account's and the cost model's functions take the rank view now
    assert "model.memory:weights_bytes_per_rank" not in found and "model.memory:activation_peak_bytes" not in found
    assert not {"model.ops:layer_ops", "model.timing:step_time_ms", "buffers:shared_workspace_other_bytes"} & found


#: Deployment fields that must never be defaulted in the serving simulation (issue 31: it kept nine silent
#: weight_dtype / moe_parallel defaults); the serving half takes a Deployment or its RankView instead.
_NO_DEFAULT = ("weight_dtype", "moe_parallel", "kv_cache_dtype")


def _silent_defaults(tree: ast.AST, rel: str) -> list[str]:
    """``rel:line name`` of each parameter in ``_NO_DEFAULT`` with a default, and each ``.get(name, default)`` /
    ``.setdefault(name, default)`` call on such a name."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + \
                [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            out += [f"{rel}:{node.lineno} {k.arg}=" for k, _ in pairs if k.arg in _NO_DEFAULT]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "setdefault", "pop") and len(node.args) >= 2 and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value in _NO_DEFAULT:
            out.append(f"{rel}:{node.lineno} .{node.func.attr}({node.args[0].value!r}, ...)")
    return out


def test_the_serving_simulation_defaults_no_dtype_or_moe_layout():
    found = []
    for path in sorted((PKG / "serving").rglob("*.py")):
        found += _silent_defaults(ast.parse(path.read_text()), str(path.relative_to(PKG.parent)))
    assert not found, (f"{found} default a deployment field in mla_lab/serving; allowed: take a Deployment or its "
                       "RankView (mla_lab.rank), checked at the door")
    # the rule sees what it is for (the shapes the serving half had before issue 31)
    old = ("def f(model, tp, arch, weight_dtype='fp8', *, moe_parallel='ep', ep_size=None):\n"
           "    kw.get('kv_cache_dtype', 'bf16'); kw.setdefault('weight_dtype', 'fp8'); kw.get('ep_size', None)\n")
    assert [f.split(" ", 1)[1] for f in _silent_defaults(ast.parse(old), "x")] == [
        "weight_dtype=", "moe_parallel=", ".get('kv_cache_dtype', ...)", ".setdefault('weight_dtype', ...)"]
