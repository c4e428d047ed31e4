"""YAML text -> plain data plus the line:column of every key and value, at a bounded cost.

We never let PyYAML build Python objects or nodes by itself. libyaml (C) turns the text into events, which
cost the same at any depth; our own loop composes the node tree from them (no recursion: libyaml's composer
recurses in C and crashes the interpreter on deep nesting), stopping at MAX_DEPTH levels and MAX_VALUES
nodes. Walking the tree into plain data counts every value again, aliases and merge keys included, so a
"billion laughs" document is refused after MAX_VALUES values instead of being expanded.

While walking, every problem gets its line, duplicate keys are caught, and YAML 1.1 surprises are defused:
`nodes: 1:4` stays the string "1:4" (PyYAML would read the sexagesimal integer 64), `on:` as a key stays "on".
Only plain scalar tags are accepted (str, int, float, bool, null; dates stay text); anything else
(`!!binary`, `!!set`, `!custom`, a tag whose value does not convert such as `!!int abc`) is a problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import cast

import yaml

from runner.config.limits import MAX_DEPTH, MAX_VALUES
from runner.errors import SpecProblem
from runner.json_types import JSON, JSONObject

Path = tuple[str | int, ...]
Mark = tuple[int, int]  # 1-based line, column

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_MAP_TAG, _SEQ_TAG, _MERGE_TAG = _TAG + "map", _TAG + "seq", _TAG + "merge"
_STR_TAG, _INT_TAG, _FLOAT_TAG = _TAG + "str", _TAG + "int", _TAG + "float"
_KEEP_TEXT_TAGS = {_TAG + "timestamp"}
_CONVERTED_TAGS = {_INT_TAG, _FLOAT_TAG, _TAG + "bool", _TAG + "null"}
_MAX_INT_CHARS = 32  # longer than any 64-bit integer in any YAML notation (0b needs 66: refused as too long)
# Not printable in YAML 1.2 (5.1), plus a byte order mark past the start and lone surrogates.
_BAD_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufeff\ufffe\uffff]")
_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


@dataclass
class Document:
    """Parsed YAML: the data, where each value and key sits, and the source text of plain scalars."""

    data: JSON = None
    values: dict[Path, Mark] = field(default_factory=dict)
    keys: dict[Path, Mark] = field(default_factory=dict)
    plain: dict[Path, str] = field(default_factory=dict)
    containers: set[Path] = field(default_factory=set)
    reported: set[Path] = field(default_factory=set)  # paths that `problem` was called for
    variables: dict[Path, tuple[str, ...]] = field(default_factory=dict)  # the ${VAR}s each string was expanded with

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
        self.reported.add(path)
        return SpecProblem(dotted(path), message, fix, line, column)


def dotted(path: Path) -> str:
    """('entrypoint', 'args', 0) -> 'entrypoint.args[0]'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def shown(text: str, limit: int = 40) -> str:
    """`text` cut to `limit` characters for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mark(node: yaml.Node | yaml.Event) -> Mark:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def resolve_plain(text: str) -> JSON:
    """The value of an unquoted scalar, as YAML would read it, but with no sexagesimal numbers or dates.

    ValueError when it does not convert (an integer too long to be one).
    """
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return _construct(yaml.ScalarNode(tag, text, style=None))


def tag_name(tag: str) -> str:
    """'tag:yaml.org,2002:binary' -> '!!binary'; other tags as written (cut for a message)."""
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else shown(tag)


def _construct(node: yaml.ScalarNode) -> JSON:
    """The Python value of a scalar; ValueError for a tag we do not take or a value that does not convert."""
    tag, text = node.tag, node.value
    if tag == _STR_TAG or tag in _KEEP_TEXT_TAGS or (":" in text and tag in (_INT_TAG, _FLOAT_TAG)):
        return str(text)
    if tag not in _CONVERTED_TAGS:
        raise ValueError(f"unsupported YAML tag {tag_name(tag)}")
    if tag == _INT_TAG and len(text) > _MAX_INT_CHARS:
        raise ValueError(f"the integer {shown(text)} does not fit in 64 bits")
    short = tag.removeprefix(_TAG)
    try:
        value: JSON = _CONSTRUCTOR.construct_object(node, deep=True)  # a scalar of a converted tag
    except (ValueError, KeyError, TypeError, yaml.YAMLError):
        raise ValueError(f"'{shown(text)}' is not a valid !!{short}") from None
    finally:
        _CONSTRUCTOR.constructed_objects.clear()
    return value


class _RefusedError(Exception):
    """The document is refused as a whole (too deep, too many values); carries the one problem."""

    def __init__(self, problem: SpecProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _too_many(mark: Mark) -> _RefusedError:
    return _RefusedError(SpecProblem(
        "", f"the document has more than {MAX_VALUES} values once aliases and merge keys are expanded",
        "a job spec needs far fewer: remove repeated aliases (*name) and '<<' merges", *mark))


def _too_deep(mark: Mark) -> _RefusedError:
    return _RefusedError(SpecProblem("", f"nested deeper than {MAX_DEPTH} levels", "flatten the document "
                                     "(a job spec is at most 4 levels deep)", *mark))


class _Composer:
    """Events -> node tree, iteratively; anchors become usable once their node is complete (no cycles)."""

    def __init__(self) -> None:
        self.anchors: dict[str, tuple[yaml.Node, int]] = {}  # name -> (node, its size with aliases expanded)
        self.stack: list[tuple[yaml.Node, list[yaml.Node], str | None]] = []
        self.sizes: list[int] = []  # expanded size of each open collection so far
        self.roots: list[yaml.Node] = []
        self.count = 0  # nodes in the text

    def compose(self, text: str) -> yaml.Node | None:
        """The single document's root node (None for an empty stream)."""
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.DocumentStartEvent) and self.roots:
                raise yaml.composer.ComposerError("expected a single document in the stream",
                                                  self.roots[0].start_mark, "but found another document",
                                                  _at(event))
            if isinstance(event, yaml.AliasEvent):
                self.alias(event)
            elif isinstance(event, yaml.ScalarEvent):
                self.scalar(event)
            elif isinstance(event, yaml.CollectionStartEvent):
                self.open(event)
            elif isinstance(event, yaml.CollectionEndEvent):
                self.close(event)
        return self.roots[0] if self.roots else None

    def alias(self, event: yaml.AliasEvent) -> None:
        """`*name`: the anchored node itself (shared, counted again when walked)."""
        found = self.anchors.get(event.anchor or "")
        if found is None:
            raise yaml.composer.ComposerError(None, None, f"found undefined alias {shown(event.anchor or '')!r}",
                                              _at(event))
        self.attach(*found, None)

    def scalar(self, event: yaml.ScalarEvent) -> None:
        """A scalar, its tag resolved as PyYAML's composer would."""
        tag = event.tag
        if tag is None or tag == "!":
            tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
        node = yaml.ScalarNode(tag, event.value, _at(event), _at(event, end=True), style=event.style)
        self.count += 1
        self.attach(node, 1, event.anchor)

    def open(self, event: yaml.CollectionStartEvent) -> None:
        """A sequence or mapping starts: refused past MAX_DEPTH levels."""
        if len(self.stack) >= MAX_DEPTH:
            raise _too_deep(_mark(event))
        kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
        tag = event.tag
        if tag is None or tag == "!":
            tag = _RESOLVER.resolve(kind, None, event.implicit)  # type: ignore[no-untyped-call]
        node = kind(tag, [], _at(event), None, flow_style=event.flow_style)
        self.stack.append((node, [], event.anchor))
        self.sizes.append(1)
        self.count += 1

    def close(self, event: yaml.CollectionEndEvent) -> None:
        """The open collection ends: pair a mapping's children into (key, value)."""
        node, children, anchor = self.stack.pop()
        node.end_mark = _at(event, end=True)
        if isinstance(node, yaml.MappingNode):
            node.value = list(zip(children[::2], children[1::2], strict=True))
        else:
            node.value = children
        self.attach(node, self.sizes.pop(), anchor)

    def attach(self, node: yaml.Node, size: int, anchor: str | None) -> None:
        """Add a finished node of `size` values (aliases expanded) to the open collection, or as the root.

        Sizes add up as the walk will count them, so a document that would expand past MAX_VALUES is refused
        here, after reading its text once, instead of being expanded.
        """
        if self.count > MAX_VALUES or size > MAX_VALUES:
            raise _too_many(_mark(node))
        if anchor is not None:
            self.anchors[anchor] = (node, size)
        if self.stack:
            self.stack[-1][1].append(node)
            self.sizes[-1] += size
            if self.sizes[-1] > MAX_VALUES:
                raise _too_many(_mark(self.stack[-1][0]))
        else:
            self.roots.append(node)


def _at(event: yaml.Event, *, end: bool = False) -> yaml.Mark:
    """An event's start (or end) mark, as the node types want it (libyaml's marks have the same fields)."""
    return cast("yaml.Mark", event.end_mark if end else event.start_mark)


class _Walker:
    """Turns a composed node tree into plain data, recording positions and problems, within MAX_VALUES values."""

    def __init__(self) -> None:
        self.doc = Document()
        self.problems: list[SpecProblem] = []
        self.budget = MAX_VALUES

    def walk(self, node: yaml.Node, path: Path) -> JSON:
        self.budget -= 1
        if self.budget < 0:
            raise _too_many(_mark(node))
        if len(path) > MAX_DEPTH:  # aliases can nest deeper than the text does
            raise _too_deep(_mark(node))
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
            self.problems.append(self.doc.problem(path, f"unsupported YAML tag {tag_name(node.tag)}", "remove the tag"))

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> JSON:
        if not node.style:  # plain (the C parser says "", the Python one None)
            self.doc.plain[path] = node.value
        try:
            return _construct(node)
        except ValueError as err:
            self.problems.append(self.doc.problem(path, str(err), "remove the tag or quote the value"))
            return str(node.value)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> JSONObject:
        self._check_tag(node, _MAP_TAG, path)
        out: JSONObject = {}
        merged: JSONObject = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged = {**self._merge(value_node, path), **merged}
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(SpecProblem(dotted(path), "keys must be plain strings",
                                                 "write `key: value` with a plain word as the key", *_mark(key_node)))
                continue
            key = key_node.value
            sub = (*path, key)
            if key in out:
                first = self.doc.keys[sub][0]
                self.problems.append(
                    SpecProblem(dotted(sub), f"duplicate key '{shown(key)}' (first at line {first})",
                                "remove one of them", *_mark(key_node))
                )
                continue
            self.doc.keys[sub] = _mark(key_node)
            out[key] = self.walk(value_node, sub)
        return {**merged, **out}

    def _merge(self, node: yaml.Node, path: Path) -> JSONObject:
        """`<<: *anchor` (or a list of anchors): earlier entries win, explicit keys win over all."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        result: JSONObject = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                self.problems.append(SpecProblem(dotted(path), "'<<' needs a mapping (or a list of mappings)",
                                                 "merge an anchored mapping: <<: *defaults", *_mark(source)))
                continue
            self.budget -= 1
            result.update(self._mapping(source, path))
        return result


def parse_yaml(text: str) -> tuple[Document, list[SpecProblem]]:
    """Parse one YAML document. Every problem comes back as a SpecProblem, never as an exception."""
    walker = _Walker()
    try:
        root = _compose(text.removeprefix("\ufeff"))
        walker.doc.data = walker.walk(root, ())
    except _RefusedError as err:
        return Document(), [err.problem]
    if not isinstance(walker.doc.data, dict):
        found = "a list" if isinstance(walker.doc.data, list) else f"{shown(repr(walker.doc.data))}"
        return walker.doc, [SpecProblem("", f"the top level must be a mapping of keys, found {found}", _STARTER,
                                        *_mark(root))]
    return walker.doc, walker.problems


def _compose(text: str) -> yaml.Node:
    """The root node; _RefusedError for anything that keeps the text from being one YAML document."""
    bad = _BAD_CHAR.search(text)
    if bad is not None:
        raise _RefusedError(_bad_character(text, bad.start()))
    try:
        root = _Composer().compose(text)
    except yaml.MarkedYAMLError as err:
        raise _RefusedError(_syntax_problem(err, text)) from None
    except yaml.YAMLError as err:
        raise _RefusedError(SpecProblem("", f"YAML error: {shown(str(err), 200)}", "check it is valid YAML")) from None
    if root is None:
        raise _RefusedError(SpecProblem("", "the file is empty", _STARTER, 1, 1))
    return root


_STARTER = "start with `name: my-job` and `entrypoint: train.py` (one key per line)"


def _bad_character(text: str, index: int) -> SpecProblem:
    line = text.count("\n", 0, index) + 1
    column = index - text.rfind("\n", 0, index)
    char = ord(text[index])
    if char == 0:
        what, fix = "a NUL character", "remove it: no value in a spec can contain a NUL byte"
    elif char == 0xFEFF:
        what, fix = "a byte order mark (U+FEFF) past the start of the file", "remove it"
    elif 0xD800 <= char <= 0xDFFF:
        what, fix = f"a lone surrogate (U+{char:04X})", "remove it"
    else:
        what, fix = f"the control character U+{char:04X}", "remove it (inside double quotes, write an escape: \\t)"
    return SpecProblem("", f"{what} is not allowed in YAML", fix, line, column)


def _syntax_problem(err: yaml.MarkedYAMLError, text: str) -> SpecProblem:
    mark = err.problem_mark or err.context_mark
    what = shown(" ".join(part for part in (err.context, err.problem) if part), 200)
    fix = "check indentation, colons and quotes on this line and the one before"
    lines = text.splitlines()
    if mark and mark.line < len(lines) and "\t" in lines[mark.line]:
        fix = "indent with spaces, not tabs"
    elif mark and mark.line < len(lines) and "${" in lines[mark.line]:
        fix = "quote a value that uses ${...} inside { } or [ ]: key: '${VAR}'"
    elif "undefined alias" in what:
        fix = "define the anchor (&name) before its alias (*name); an alias cannot sit inside its own anchor"
    elif "expected a single document" in what:
        fix = "keep one document per file (remove the extra '---')"
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    return SpecProblem("", f"YAML syntax error: {what}", fix, line, column)
