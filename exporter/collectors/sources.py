"""The source columns of docs/metrics.md, one table per registered engine kind.

Each kind's `sources.py` (beside its collector) maps every `llmb_*` series to where it comes
from on that engine; `exporter.metrics_doc.markdown_table` renders one column per entry here.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.llamacpp import sources as llamacpp
from exporter.collectors.sglang import sources as sglang


@dataclass(frozen=True)
class SourceColumn:
    """A column of docs/metrics.md: series name -> where it comes from ("" = absent).

    A `release` column lists only what differs on that release from the kind's main column.
    """

    table: dict[str, str]
    release: str = ""


# Per kind of config/kinds.py, the main column first.
SOURCE_COLUMNS: dict[str, tuple[SourceColumn, ...]] = {
    "llamacpp": (SourceColumn(llamacpp.SOURCES),),
    "sglang": (
        SourceColumn(sglang.SOURCES),
        SourceColumn(sglang.SOURCES_0_5_11, release="0.5.11"),
    ),
}
