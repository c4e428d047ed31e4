"""The package's layers: each folder of runner/ imports only folders below it, and the top level stays small.

Every `import`/`from ... import` of a runner module counts (at module level, inside functions, and under
TYPE_CHECKING alike): an import that only a type checker sees still ties the two layers together. The order is
docs/architecture.md's "Layers"; a module at the top of runner/ is in the foundation layer, except the program's
entry point (`runner/__main__.py`), which is the top of its own process and imports the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "runner"
ENTRY_POINTS = {"runner.__main__"}
MAX_TOP_LEVEL_MODULES = 10

# Lowest first: a layer may import itself and any layer before it, never one after it.
LAYERS = (
    "runner",  # foundation: errors, events, outcomes, the worker contract's names, the version
    "runner.system",  # process primitives: pidfds, the guard, cgroups, private files, signals
    "runner.rundir",  # the run dir's layout (every path) and its records (report, status), one codec each
    "runner.diagnosis",  # evidence (exits, tracebacks, the recorder's verdict, OOM) into one Failure record
    "runner.config",  # the spec: load, validate, resolve
    "runner.config.clusters",  # Slurm and Kubernetes templates of a spec
    "runner.observe",  # console, live line, progress, logs, metrics, time to recover
    "runner.health",  # checks before a node joins a round: disk, memory, GPUs, the user's commands
    "runner.rendezvous",  # the backend interface, ports, ranks, the local backend
    "runner.rendezvous.etcd",  # the etcd v3 backend, hosted etcd, lease revoke at death, admin
    "runner.workers",  # launch plan, group, standbys, tee, failures
    "runner.watchdog",  # file timers, heartbeats, stacks of a hung worker
    "runner.runs",  # the runs index, `runner status`, `runner stop`/`reset`
    "runner.core",  # the state machine, the context handlers share, the restart policy
    "runner.states",  # one handler per state
    "runner.agent",  # wires it all and runs one job on a node
    "runner.report",  # `runner report`'s page
    "runner.cli",  # the command line
    "runner.testing",  # helpers for tests and benchmarks (a real etcd); nothing of the runner imports them
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The folder a module lives in (a package's __init__ is in its own folder)."""
    path = ROOT.parent.joinpath(*module.split("."))
    if path.is_dir():
        return module
    return module.rsplit(".", 1)[0]


def imported(path: Path) -> set[str]:
    """Every runner module `path` imports, wherever the import statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "runner"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "runner":
            for alias in node.names:  # `from runner.x import y`: y may be a module of its own
                sub = f"{node.module}.{alias.name}"
                is_module = ROOT.parent.joinpath(*sub.split(".")).with_suffix(".py").exists()
                out.add(sub if is_module else node.module)
    return out


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}


def test_every_folder_of_runner_is_a_declared_layer():
    folders = {layer_of(m) for m in modules()}
    assert folders == set(LAYERS), f"undeclared: {folders - set(LAYERS)}; gone: {set(LAYERS) - folders}"


@pytest.mark.parametrize("module", sorted(modules()))
def test_a_module_imports_no_layer_above_its_own(module):
    if module in ENTRY_POINTS:
        return
    rank = LAYERS.index(layer_of(module))
    above = sorted(
        f"{target} ({layer_of(target)})"
        for target in imported(modules()[module])
        if LAYERS.index(layer_of(target)) > rank
    )
    assert not above, f"{module} ({layer_of(module)}) imports a higher layer: {above}"


def test_no_two_folders_import_each_other():
    """The layering implies it; this says it in the issue's own terms, over the whole graph."""
    graph: dict[str, set[str]] = {}
    for module, path in modules().items():
        if module not in ENTRY_POINTS:
            graph.setdefault(layer_of(module), set()).update(layer_of(t) for t in imported(path))
    pairs = sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, set()))
    assert not pairs


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module in `graph` (module -> modules it imports)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                cycles.append(sorted(part))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return cycles


def test_no_import_cycle_between_modules_type_checking_imports_included() -> None:
    """Issue 41: no file imports, however indirectly, a file that imports it, not even for a type checker."""
    found = modules()
    graph = {m: {t for t in imported(p) if t in found and t != m} for m, p in found.items()}
    assert not import_cycles(graph)


def test_the_cycle_finder_sees_a_cycle_of_three_and_none_in_a_chain() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_top_level_keeps_at_most_ten_modules():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


MAX_METHODS = 20  # issue 32: a class over this many methods says in its docstring why it is one concern


def test_a_class_over_twenty_methods_says_why_it_is_one_concern() -> None:
    """Every class of runner/ with more than MAX_METHODS methods explains itself ("One concern ...")."""
    silent = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [x for x in node.body if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > MAX_METHODS and "One concern" not in (ast.get_docstring(node) or ""):
                    silent.append(f"{path.relative_to(ROOT.parent)}:{node.name} ({len(methods)} methods)")
    assert not silent, silent


def test_no_process_is_started_with_a_preexec_fn() -> None:
    """Neither the agent nor a test runs Python between fork and exec: where grpc is loaded (the etcd client, in the
    agent or in a pytest process that ran an etcd test), its fork handlers start a poller in the child that the
    child's closing of descriptors breaks, and the child aborts (-6) before it execs (CI, stop 44). Set a limit in the
    child itself (a small Python that then execs), or with start_new_session / pass_fds."""
    found = [f"{path.relative_to(ROOT.parent)}:{node.value.lineno}"
             for path in sorted([*ROOT.rglob("*.py"), *ROOT.parent.joinpath("tests").rglob("*.py")])
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.keyword) and node.arg == "preexec_fn"]
    assert not found, found


def test_every_thread_of_the_agent_is_started_keeping_the_stop_signals_off_it() -> None:
    """A thread of the agent that can take a stop signal lets the main thread see the workers' exits the signal
    caused before the stop is recorded (a stopped job read as succeeded: CI, stop 45). Threads are started through
    runner/system/thread_signals.py: `start(thread)`, or the agent's default executor; never `.start()` directly,
    never a pool of their own."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "thread_signals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            direct_start = name == "start" and not node.args and isinstance(func, ast.Attribute) and (
                "thread" in ast.unparse(func.value).lower())
            if direct_start or name in {"ThreadPoolExecutor", "Timer"}:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


TESTS = ROOT.parent / "tests"
# The tests' folders that are not a layer of runner/: the house itself (docs, CI, the layers, the examples), the chaos
# soaks, whole jobs over several hosts; and fixtures, which holds no test (worker scripts, specs, seeds).
OWN_TEST_FOLDERS = {"house", "soak", "multinode", "fixtures"}


def test_the_tests_mirror_the_house():
    """Every test module lies one folder deep, in the folder of the layer it tests (tests/<the layer's last name>/)
    or in one of the tests' own; none is loose in tests/ (where the harness lives: conftest.py and the helpers), and
    fixtures/ holds none."""
    layers = {layer.rsplit(".", 1)[-1] for layer in LAYERS if layer != "runner"}
    misplaced = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                       if len(p.relative_to(TESTS).parts) != 2 or p.parent.name not in (layers | OWN_TEST_FOLDERS) - {"fixtures"})
    assert not misplaced, f"test modules outside a layer's folder of tests/: {misplaced}"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders <= layers | OWN_TEST_FOLDERS, f"folders of tests/ that are no layer: {folders - layers - OWN_TEST_FOLDERS}"
