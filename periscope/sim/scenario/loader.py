"""Reading a scenario file's YAML strictly, and within bounds a hostile or broken file cannot break.

`StrictLoader` is PyYAML's safe loader without YAML 1.1 base-60 numbers (so `0:1` stays a string) and
with duplicate keys rejected instead of silently overwritten. `load_yaml` first walks the file's event
stream (PyYAML's parser is iterative; its composer and the JSON encoding after it are recursive) and
refuses, by name, what would otherwise end in a RecursionError, a self-referencing value or an alias
"billion laughs" expansion: nesting deeper than MAX_DEPTH, more than MAX_NODES values once aliases are
expanded, an alias inside the very value it names. Bytes beyond MAX_BYTES are never read.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml

MAX_BYTES = 2 * 1024 * 1024  # the built-in scenarios are 2-5 KiB; a thousand pods are about 200 KiB
MAX_DEPTH = 32  # the format itself nests 7 deep (pods[].containers[].util_pct[][])
MAX_NODES = 500_000  # values, aliases expanded: what the validator then walks


class YamlLimit(ValueError):
    """The YAML is beyond one of this module's limits; the message says which, and where."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 base-60 numbers and with duplicate keys rejected."""


StrictLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789")
)
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+)$"),
    list("-+0123456789."),
)


def _mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):  # a list or a mapping used as a key, worded as PyYAML does
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
            )
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def check_shape(text: str) -> None:
    """Walk the events of `text`; YamlLimit when it nests or expands beyond the limits. Syntax errors
    are left to the loader, which words them with their line."""
    depth, nodes = 0, 0
    open_anchors: list[tuple[str | None, int]] = []  # (anchor, node count at its start) per open collection
    sizes: dict[str, int] = {}  # anchor -> how many values it stands for
    try:
        for event in yaml.parse(text, Loader=StrictLoader):
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes:
                    raise YamlLimit(f"line {line}: alias *{event.anchor} refers to a value that contains it"
                                    if any(a == event.anchor for a, _ in open_anchors)
                                    else f"line {line}: alias *{event.anchor} names no earlier anchor")
                nodes += sizes[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                nodes += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlLimit(f"line {line}: nested more than {MAX_DEPTH} levels deep")
                nodes += 1
                open_anchors.append((event.anchor, nodes))
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_anchors.pop()
                if anchor is not None:
                    sizes[anchor] = nodes - start + 1
            if nodes > MAX_NODES:
                raise YamlLimit(f"line {line}: more than {MAX_NODES:,} values (aliases expanded)")
    except yaml.YAMLError:
        return


def load_yaml(text: str) -> Any:
    """The document `text` holds: YamlLimit beyond the limits, yaml.YAMLError or ValueError (a number
    or date that does not convert) when it is not YAML the loader takes."""
    if len(text) > MAX_BYTES:
        raise YamlLimit(f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    check_shape(text)
    return yaml.load(text, Loader=StrictLoader)
