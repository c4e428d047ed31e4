"""YAML text -> plain data plus the line:column of every key and value.

We compose the node tree (safe: no Python objects are ever built) and walk it ourselves, so that every
problem found later can name its line, duplicate keys are caught, and YAML 1.1 surprises are defused:
`nodes: 1:4` stays the string "1:4" (PyYAML would read the sexagesimal integer 64), `on:` as a key stays "on".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import yaml

from runner.errors import SpecProblem

Path = tuple[str | int, ...]
Mark = tuple[int, int]  # 1-based line, column

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_KEEP_TEXT_TAGS = {"tag:yaml.org,2002:timestamp"}


@dataclass
class Document:
    """Parsed YAML: the data, where each value and key sits, and the source text of plain scalars."""

    data: Any = None
    values: dict[Path, Mark] = field(default_factory=dict)
    keys: dict[Path, Mark] = field(default_factory=dict)
    plain: dict[Path, str] = field(default_factory=dict)
    containers: set[Path] = field(default_factory=set)

    def where(self, path: Path, *, key: bool = False) -> Mark | tuple[None, None]:
        """Line/column of `path`, else of its nearest ancestor that exists.

        Scalars point at the value; mappings, lists, missing children and `key=True` point at the key
        (`rendezvous:`), which is where a reader looks, rather than at the first line inside.
        """
        for end in range(len(path), -1, -1):
            here = path[:end]
            if here not in self.values:
                continue
            at_key = key or end < len(path) or here in self.containers
            return self.keys[here] if at_key and here in self.keys else self.values[here]
        return (None, None)

    def problem(self, path: Path, message: str, fix: str = "", *, key: bool = False) -> SpecProblem:
        """A SpecProblem located at `path`."""
        line, column = self.where(path, key=key)
        return SpecProblem(dotted(path), message, fix, line, column)


def dotted(path: Path) -> str:
    """('entrypoint', 'args', 0) -> 'entrypoint.args[0]'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _mark(node: yaml.Node) -> Mark:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def resolve_plain(text: str) -> Any:
    """The value of an unquoted scalar, as YAML would read it, but with no sexagesimal numbers or dates."""
    tag: str = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return _construct(yaml.ScalarNode(tag, text, style=None))


def _construct(node: yaml.ScalarNode) -> Any:
    if node.tag in _KEEP_TEXT_TAGS or (":" in node.value and node.tag.endswith((":int", ":float"))):
        return node.value
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


class _Walker:
    """Turns a composed node tree into plain data, recording positions and problems."""

    def __init__(self) -> None:
        self.doc = Document()
        self.problems: list[SpecProblem] = []

    def walk(self, node: yaml.Node, path: Path) -> Any:
        self.doc.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            self.doc.containers.add(path)
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            self.doc.containers.add(path)
            self._check_tag(node, _SEQ_TAG, path)
            return [self.walk(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(cast("yaml.ScalarNode", node), path)

    def _check_tag(self, node: yaml.Node, tag: str, path: Path) -> None:
        if node.tag != tag:
            self.problems.append(self.doc.problem(path, f"unsupported YAML tag {node.tag}", "remove the tag"))

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        if not node.style:  # plain (the C parser says "", the Python one None)
            self.doc.plain[path] = node.value
        try:
            return _construct(node)
        except yaml.YAMLError:
            self.problems.append(self.doc.problem(path, f"unsupported YAML tag {node.tag}", "remove the tag"))
            return node.value

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        self._check_tag(node, _MAP_TAG, path)
        out: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged = {**self._merge(value_node, path), **merged}
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(SpecProblem(dotted(path), "keys must be plain strings", "", *_mark(key_node)))
                continue
            key = key_node.value
            sub = (*path, key)
            if key in out:
                first = self.doc.keys[sub][0]
                self.problems.append(
                    SpecProblem(dotted(sub), f"duplicate key '{key}' (first at line {first})",
                                "remove one of them", *_mark(key_node))
                )
                continue
            self.doc.keys[sub] = _mark(key_node)
            out[key] = self.walk(value_node, sub)
        return {**merged, **out}

    def _merge(self, node: yaml.Node, path: Path) -> dict[str, Any]:
        """`<<: *anchor` (or a list of anchors): earlier entries win, explicit keys win over all."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        result: dict[str, Any] = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                self.problems.append(SpecProblem(dotted(path), "'<<' needs a mapping", "", *_mark(source)))
                continue
            result.update(self._mapping(source, path))
        return result


def parse_yaml(text: str) -> tuple[Document, list[SpecProblem]]:
    """Parse one YAML document. Syntax errors come back as problems, never as exceptions."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as err:
        return Document(), [_syntax_problem(err, text)]
    except yaml.YAMLError as err:
        return Document(), [SpecProblem("", f"YAML error: {err}", "check the file is valid YAML")]
    if root is None:
        return Document(), [SpecProblem("", "the file is empty", _STARTER, 1, 1)]
    walker = _Walker()
    walker.doc.data = walker.walk(root, ())
    if not isinstance(walker.doc.data, dict):
        found = "a list" if isinstance(walker.doc.data, list) else f"{walker.doc.data!r}"
        return walker.doc, [SpecProblem("", f"the top level must be a mapping of keys, found {found}", _STARTER,
                                        *_mark(root))]
    return walker.doc, walker.problems


_STARTER = "start with `name: my-job` and `entrypoint: train.py` (one key per line)"


def _syntax_problem(err: yaml.MarkedYAMLError, text: str) -> SpecProblem:
    mark = err.problem_mark or err.context_mark
    what = " ".join(part for part in (err.context, err.problem) if part)
    fix = "check indentation, colons and quotes on this line and the one before"
    lines = text.splitlines()
    if mark and mark.line < len(lines) and "\t" in lines[mark.line]:
        fix = "indent with spaces, not tabs"
    elif mark and mark.line < len(lines) and "${" in lines[mark.line]:
        fix = "quote a value that uses ${...} inside { } or [ ]: key: '${VAR}'"
    elif "expected a single document" in what:
        fix = "keep one document per file (remove the extra '---')"
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    return SpecProblem("", f"YAML syntax error: {what}", fix, line, column)
