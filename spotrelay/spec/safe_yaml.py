"""A bounded YAML loader for untrusted specs: what a 256 KiB file may cost is capped up front.

PyYAML's ``safe_load`` refuses code, but not work: aliases expand into exponentially many values
(a 522-byte file took a handler past 1.4 GB), 20,000 nested brackets overflow the recursion limit,
and a repeated key silently wins. This loader composes the node graph itself and stops early:

- nesting deeper than ``MAX_DEPTH`` and more than ``MAX_VALUES`` values are refused while composing,
  so neither time nor memory grows with a hostile file;
- aliases are allowed (``<<: *defaults`` is common) but the graph they make is measured without
  expanding it; more than ``MAX_VALUES`` values or ``MAX_EXPANDED_CHARS`` characters is refused;
- a key given twice in one mapping, a tag other than the core schema's, and bytes that are not
  UTF-8 are refused, each with its own message and the field path where one is known;
- timestamps stay strings (JSON has none), so what validates is what gets stored.

Every refusal is a ``SpecError`` with (field path, message) pairs, as pydantic's errors are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from spotrelay.errors import SpecError, SpecFileError

MAX_DEPTH = 64
MAX_VALUES = 5_000
MAX_EXPANDED_CHARS = 1_000_000
_CORE = "tag:yaml.org,2002:"
_TOO_DEEP = f"nests deeper than {MAX_DEPTH} levels"
ALLOWED_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge"))


class _Refused(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _where(node_or_event: Any) -> str:
    mark = getattr(node_or_event, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _show_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


class _BoundedComposer(Composer):
    """Composer with a depth limit, a value count, a path for messages and a duplicate-key check."""

    check_event: Callable[..., bool]  # from the parser it is mixed with (Python's or libyaml's)
    peek_event: Callable[[], Any]

    def __init__(self) -> None:
        super().__init__()
        self._path: list[str] = []
        self._values = 0
        self.aliases = 0

    def path(self, extra: str | None = None) -> str:
        parts = [*self._path, extra] if extra is not None else self._path
        if len(parts) > 8:  # a path into a hostile nest says nothing past its start
            parts = [*parts[:4], "..."]
        out = ""
        for part in parts:
            out += part if part.startswith("[") or part == "..." or not out else f".{part}"
        return out or "(root)"

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        seg: str | None = None
        if isinstance(index, ScalarNode):
            seg = str(index.value)
        elif isinstance(index, int):
            seg = f"[{index}]"
        elif isinstance(parent, MappingNode):
            seg = "(key)"
        if seg is not None:
            self._path.append(seg)
        try:
            if self.check_event(AliasEvent):
                self.aliases += 1
                return super().compose_node(parent, index)
            event = self.peek_event()
            if isinstance(event, (ScalarEvent, CollectionStartEvent)):
                tag = event.tag
                if tag is not None and tag != "!" and tag not in ALLOWED_TAGS:
                    raise _Refused(self.path(), f"tags are not allowed (found {_show_tag(tag)}{_where(event)})")
            if isinstance(event, CollectionStartEvent) and len(self._path) >= MAX_DEPTH:
                raise _Refused(self.path(), _TOO_DEEP + _where(event))
            self._values += 1
            if self._values > MAX_VALUES:
                raise _Refused("(file)", f"has more than {MAX_VALUES} values; a job spec needs far fewer")
            node = super().compose_node(parent, index)
            if isinstance(node, MappingNode):
                self._check_keys(node)
            return node
        finally:
            if seg is not None:
                self._path.pop()

    def _check_keys(self, node: MappingNode) -> None:
        seen: dict[tuple[str, str], Node] = {}
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _CORE + "merge":
                continue
            first = seen.setdefault((key.tag, key.value), key)
            if first is not key:
                lines = sorted({first.start_mark.line + 1, key.start_mark.line + 1})
                where = " and ".join(str(n) for n in lines)
                raise _Refused(self.path(str(key.value)), f"is given twice (line{'s' * (len(lines) > 1)} {where}); "
                               "keep one")


class _Constructor(SafeConstructor):
    pass


def _as_str(loader: _Constructor, node: Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


_Constructor.add_constructor(_CORE + "timestamp", _as_str)  # type: ignore[type-var]


class _PyLoader(Reader, Scanner, Parser, _BoundedComposer, _Constructor, Resolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _Constructor.__init__(self)
        Resolver.__init__(self)

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # the pure-Python scanner looks ahead over every open bracket: quadratic in the nesting
        if self.flow_level >= MAX_DEPTH:
            raise _Refused("(file)", f"{_TOO_DEEP} (line {self.line + 1})")
        super().fetch_flow_collection_start(token_class)


try:  # libyaml scans and parses in C (pure Python is ~50x slower); our composer still builds the nodes
    from yaml.cyaml import CParser  # type: ignore[attr-defined]

    class _CLoader(CParser, _BoundedComposer, _Constructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _Constructor.__init__(self)
            Resolver.__init__(self)

    _Loader: type = _CLoader
except ImportError:  # pragma: no cover - wheels without libyaml
    _Loader = _PyLoader


def _measure(root: Node) -> None:
    """Values and characters the graph holds once aliases are expanded, without expanding it."""
    memo: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def size(node: Node) -> tuple[int, int]:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in open_:
            raise _Refused("(file)", f"an alias refers to a value that contains it{_where(node)}")
        if isinstance(node, ScalarNode):
            memo[key] = (1, len(node.value))
            return memo[key]
        open_.add(key)
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        values, chars = 1, 0
        for child in children:
            v, c = size(child)
            values, chars = values + v, chars + c
            if values > MAX_VALUES:
                raise _Refused("(file)", f"aliases expand to more than {MAX_VALUES} values")
            if chars > MAX_EXPANDED_CHARS:
                raise _Refused("(file)", f"aliases expand to more than {MAX_EXPANDED_CHARS} characters")
        open_.discard(key)
        memo[key] = (values, chars)
        return memo[key]

    size(root)


def decode(data: str | bytes, source: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise SpecFileError(source, f"is not UTF-8 text (byte 0x{bad} at offset {exc.start}); "
                                    "save it as UTF-8") from exc


def load_yaml(data: str | bytes, source: str = "<spec>") -> Any:
    """Parse one YAML (or JSON) document within the limits above; ``SpecError`` when refused."""
    text = decode(data, source)
    if not text.strip():
        raise SpecError(source, [("(file)", "is empty; a job spec is a mapping of fields")])
    try:
        loader = _Loader(text)  # the reader checks for control characters here
    except yaml.reader.ReaderError as exc:
        raise SpecError(source, [("(file)", _control(exc))]) from None
    try:
        node = _BoundedComposer.get_single_node(loader)  # ours, not CParser's C composer
        if node is None:
            raise SpecError(source, [("(file)", "holds only comments; a job spec is a mapping of fields")])
        if loader.aliases:
            _measure(node)
        return loader.construct_document(node)
    except _Refused as exc:
        raise SpecError(source, [(exc.path, exc.message)]) from None
    except yaml.reader.ReaderError as exc:
        raise SpecError(source, [("(file)", _control(exc))]) from None
    except yaml.MarkedYAMLError as exc:
        raise SpecError(source, [("(file)", _yaml_message(exc))]) from None
    except yaml.YAMLError as exc:
        raise SpecError(source, [("(file)", f"is not valid YAML or JSON: {exc}")]) from None
    finally:
        loader.dispose()


def _control(exc: yaml.reader.ReaderError) -> str:
    return f"contains the control character {chr(exc.character)!r} at offset {exc.position}; is it a binary file?"


def _yaml_message(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = exc.problem or exc.context or "unreadable"
    if "maximum nesting depth" in problem:  # libyaml's own limit (1000) can come before ours
        return f"{_TOO_DEEP}{where}"
    if "expected a single document" in str(exc.context) or "but found another document" in problem:
        return f"holds more than one YAML document{where}; keep one"
    if "could not determine a constructor" in problem:
        return f"tags are not allowed{where}"
    return f"is not valid YAML or JSON{where}: {problem}"
