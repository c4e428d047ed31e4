"""Issue 41, point 4: a round reads in at most three files of runner/rendezvous/etcd.

A round's code is EtcdRendezvous.next_round (backend.py) with every method and function of backend.py it reaches,
and the whole of joining.py and round.py. The modules of runner/rendezvous/etcd it imports are the three round files
themselves, the infrastructure a round uses but whose code need not be read to follow it, and what comes before and
after a round; docs/architecture.md's "Reading one round" names every one of them. joining.py and round.py, the
round proper, import nothing but infrastructure and each other. A new module a round imports (a helper split out of
round.py, say) fails here until it is folded into one of the three files, or named below and in the guide.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ETCD = "runner.rendezvous.etcd"
ROUND_FILES = ("backend", "joining", "round")  # in reading order: the node's side, the way in, waiting and the result
INFRASTRUCTURE = ("client", "keys", "watch", "lease")  # what a round uses, read without opening them
AROUND = ("admission", "monitor", "fence")  # before a node's first round, and what starts once a round closed


def etcd_imports(tree: ast.AST) -> dict[str, str]:
    """Each name imported from a module of runner/rendezvous/etcd (anywhere in `tree`) -> that module's short name."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{ETCD}."):
            for alias in node.names:
                out[alias.asname or alias.name] = node.module.removeprefix(f"{ETCD}.")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(f"{ETCD}."):
                    out[alias.asname or alias.name] = alias.name.removeprefix(f"{ETCD}.")
    return out


def whole_file_imports(source: str) -> set[str]:
    return set(etcd_imports(ast.parse(source)).values())


def next_round_imports(source: str) -> set[str]:
    """The modules whose names EtcdRendezvous.next_round uses, through every method and module function it reaches."""
    tree = ast.parse(source)
    imports = etcd_imports(tree)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EtcdRendezvous")
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    seen: set[str] = set()
    todo = [methods["next_round"]]
    used: set[str] = set()
    while todo:
        fn = todo.pop()
        if fn.name in seen:
            continue
        seen.add(fn.name)
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in methods):
                todo.append(methods[node.attr])
            elif isinstance(node, ast.Name):
                used.add(node.id)
                if node.id in functions:
                    todo.append(functions[node.id])
    return {imports[name] for name in used if name in imports}


def round_imports(files: dict[str, str]) -> dict[str, set[str]]:
    """Each round file -> the modules of runner/rendezvous/etcd its round code imports (itself left out)."""
    found = {"backend": next_round_imports(files["backend"]),
             **{name: whole_file_imports(files[name]) for name in ROUND_FILES if name != "backend"}}
    return {name: modules - {name} for name, modules in found.items()}


def sources() -> dict[str, str]:
    return {name: (ROOT / "runner/rendezvous/etcd" / f"{name}.py").read_text(encoding="utf-8") for name in ROUND_FILES}


def unnamed(found: dict[str, set[str]]) -> list[str]:
    """What breaks the rule: a module outside the three files, the infrastructure and what comes around a round, or
    the round proper (joining.py, round.py) reaching past the infrastructure."""
    named = set(ROUND_FILES) | set(INFRASTRUCTURE) | set(AROUND)
    problems = [f"{f} imports {m}" for f, modules in found.items() for m in sorted(modules - named)]
    for f in ("joining", "round"):
        problems += [f"{f} imports {m} (the round proper uses infrastructure only)"
                     for m in sorted(found[f] & set(AROUND))]
    return problems


def test_a_round_reads_in_at_most_three_files() -> None:
    found = round_imports(sources())
    assert not unnamed(found)
    readers = set(found) | {m for modules in found.values() for m in modules}
    assert len(readers - set(INFRASTRUCTURE) - set(AROUND)) <= 3, sorted(readers)


def test_the_trace_sees_what_next_round_reaches() -> None:
    """next_round's own names (round, monitor, fence) and a method's two calls away (admission, via _recover)."""
    found = round_imports(sources())
    assert {"joining", "round", "monitor", "fence", "admission"} <= found["backend"]
    assert "admin" not in found["backend"]  # backend.py imports it, for leaving: not a round's code


def test_a_new_round_only_module_fails_the_rule() -> None:
    files = sources()
    files["round"] = files["round"].replace("from runner.rendezvous.etcd.watch import",
                                            "from runner.rendezvous.etcd.round_parts import parse_it\n"
                                            "from runner.rendezvous.etcd.watch import", 1)
    assert unnamed(round_imports(files)) == ["round imports round_parts"]
    files = sources()
    files["joining"] = files["joining"].replace("from runner.rendezvous.etcd.lease import",
                                                "from runner.rendezvous.etcd.monitor import RoundMonitor\n"
                                                "from runner.rendezvous.etcd.lease import", 1)
    assert unnamed(round_imports(files)) == ["joining imports monitor (the round proper uses infrastructure only)"]


def test_the_reading_guide_names_every_file_a_round_uses() -> None:
    text = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    assert "### Reading one round" in text
    guide = text.split("### Reading one round", 1)[1].split("\n#", 1)[0]
    missing = [m for m in (*ROUND_FILES, *INFRASTRUCTURE, *AROUND) if f"`{m}.py`" not in guide]
    assert not missing
    order = [guide.index(f"`{m}.py`") for m in ROUND_FILES]
    assert order == sorted(order), "the guide gives the three round files in reading order"
