"""YAML text of the generated files: multi-line strings as `|` blocks, so PromQL and the
dashboards' JSON stay readable (and diffs small) in the rule files and manifests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.nodes.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_LiteralDumper.add_representer(str, _str)


def dump(doc: Any, width: int) -> str:
    """One YAML document, keys in insertion order."""
    return yaml.dump(doc, Dumper=_LiteralDumper, sort_keys=False, width=width)


def dump_all(docs: Iterable[Any], width: int) -> str:
    """Several YAML documents separated by `---`."""
    return yaml.dump_all(docs, Dumper=_LiteralDumper, sort_keys=False, width=width)
