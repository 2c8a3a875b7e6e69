"""The source columns of docs/metrics.md, one tuple per registered engine kind.

Each kind's `sources.py` (beside its collector) maps every `llmb_*` series to where it comes
from on that engine, as the `COLUMNS` its row names (config/kinds.py `sources`);
`exporter.metrics_doc.markdown_table` renders one column per entry.
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass

from config.kinds import engine_kind


@dataclass(frozen=True)
class SourceColumn:
    """A column of docs/metrics.md: series name -> where it comes from ("" = absent).

    A `release` column lists only what differs on that release from the kind's main column.
    """

    table: dict[str, str]
    release: str = ""


def source_columns(kind: str) -> tuple[SourceColumn, ...]:
    """The source columns a kind's row names, the main column first."""
    columns = pkgutil.resolve_name(engine_kind(kind).sources)
    if not (
        isinstance(columns, tuple) and columns and all(isinstance(c, SourceColumn) for c in columns)
    ):
        raise TypeError(f"{kind}: {engine_kind(kind).sources} is not a tuple of SourceColumn")
    return columns
