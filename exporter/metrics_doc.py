"""docs/metrics.md's table of the exporter's series: the schema, and where each engine's
collector reads each series (`python -m exporter.metrics_doc` prints it).

Above both the schema and the collectors' source tables, so that neither imports the other.
"""

from __future__ import annotations

from config.kinds import engines
from core import series as llmb
from exporter.collectors.sources import source_columns
from exporter.schema import SCHEMA

_UNITS = (
    ("_bytes_per_second", "bytes/s"),
    ("_bytes", "bytes"),
    ("_seconds_total", "seconds"),
    ("_seconds", "seconds"),
    ("_hertz", "Hz"),
    ("_watts", "watts"),
    ("_celsius", "°C"),
    ("_bits", "bits"),
    ("_ratio", "ratio 0–1"),
    ("_tokens", "tokens"),
)


def _unit(name: str) -> str:
    for suffix, unit in _UNITS:
        if name.endswith(suffix):
            return unit
    if "tokens" in name:
        return "tokens"
    return "—"


def _source_columns() -> list[tuple[str, dict[str, str], dict[str, str] | None]]:
    """(header, main table, release table or None) per column, in config/kinds.py's order."""
    columns: list[tuple[str, dict[str, str], dict[str, str] | None]] = []
    for engine in engines():
        main, *releases = source_columns(engine.kind)
        columns.append((f"{engine.display} source", main.table, None))
        for column in releases:
            header = f"{engine.display} {column.release} source"
            columns.append((header, main.table, column.table))
    return columns


def markdown_table() -> str:
    """The exporter's schema as a Markdown table (docs/metrics.md embeds it).

    One source column per registered engine kind, and one per release column of a kind,
    which names only what differs from the kind's main column ("same" otherwise).
    """
    columns = _source_columns()
    rows = [
        f"| name | type | unit | labels | {' | '.join(h for h, _, _ in columns)} | meaning |",
        "|---|---|---|---|" + "---|" * len(columns) + "---|",
    ]
    for name, spec in SCHEMA.items():
        # Series no engine provides have one source on every engine.
        own = "NVML" if name.startswith(llmb.NVML_PREFIX) else ""
        own = own or ("exporter" if name in llmb.EXPORTER_OWN else "")
        cells = []
        for _, main, release in columns:
            cell = own or main.get(name, "")
            if release is not None and cell:
                cell = release.get(name, "same")
            cells.append(cell or "— (absent)")
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
        rows.append(
            f"| `{name}` | {spec.type} | {_unit(name)} | {labels} | {' | '.join(cells)} "
            f"| {spec.help} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
