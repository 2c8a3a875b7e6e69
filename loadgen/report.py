"""Run reports: summary.json, summary.csv, summary.md and the console table.

Each is rewritten after every step, so an interrupted or crashed run still leaves the steps
that finished. An invalid comparison is stated in every one of them.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (column, summary key, format) of the CSV/Markdown/console tables.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("engine", "engine", "s"),
    ("step", "step", "d"),
    ("conc", "concurrency", "d"),
    ("prompt_tok", "prompt_tokens", "s"),
    ("compl_tok", "completion_tokens", "s"),
    ("ok", "requests_ok", "d"),
    ("failed", "requests_failed", "d"),
    ("ttft_p50_ms", "ttft_p50_s", "ms"),
    ("ttft_p90_ms", "ttft_p90_s", "ms"),
    ("ttft_p99_ms", "ttft_p99_s", "ms"),
    ("itl_p50_ms", "itl_p50_s", "ms"),
    ("itl_p99_ms", "itl_p99_s", "ms"),
    ("tpot_ms", "tpot_mean_s", "ms"),
    ("decode_tok_s", "decode_tok_s_mean", ".1f"),
    ("out_tok_s", "output_tok_s", ".1f"),
    ("req_s", "requests_per_s", ".2f"),
    ("valid", "valid", "s"),
)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return ""
    if fmt == "ms":
        return f"{value * 1000:.1f}"
    if fmt == "s":
        if isinstance(value, list):
            return "/".join(str(v) for v in value)
        return str(value).lower() if isinstance(value, bool) else str(value)
    if fmt == "d":
        return str(value)
    return format(value, fmt)


def invalid_banner(reasons: Sequence[str]) -> str:
    """The loud one-paragraph statement that the results are not valid, with every reason."""
    lines = ["INVALID: failed requests, an aborted run or unequal token counts."]
    lines += [f"  - {reason}" for reason in reasons]
    return "\n".join(lines)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def to_csv(summary: dict[str, Any]) -> str:
    """CSV of the step table; the validity is a column and a leading comment line."""
    buf = io.StringIO()
    if not summary["valid"]:
        buf.write("# INVALID: " + " | ".join(summary["invalid_reasons"]) + "\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c for c, _, _ in COLUMNS] + ["invalid_reason"])
    reason = "; ".join(summary["invalid_reasons"])
    for row in summary["steps"]:
        writer.writerow([_fmt(row.get(k), f) for _, k, f in COLUMNS] + [reason])
    return buf.getvalue()


def _server_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key.startswith("gpu_memory"):
        return f"{value / 2**30:.2f} GiB"
    return f"{value:.4g}"


def to_markdown(summary: dict[str, Any]) -> str:
    """Markdown report: validity (once), the step table, then server-side figures."""
    out: list[str] = ["# Load generator summary", ""]
    if summary.get("aborted"):
        out += [f"> **ABORTED**: {summary.get('abort_reason')}", ""]
    if not summary["valid"]:
        out += ["> **INVALID**: failed requests, an aborted run or unequal token counts.", ">"]
        out += [f"> - {r}" for r in summary["invalid_reasons"]]
        out.append("")
    else:
        out += ["**Valid**: every request succeeded and token counts are equal.", ""]
    if summary.get("interrupted"):
        out += ["_Run interrupted: the table holds what finished before the stop._", ""]
    out.append("| " + " | ".join(c for c, _, _ in COLUMNS) + " |")
    out.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    for row in summary["steps"]:
        out.append("| " + " | ".join(_fmt(row.get(k), f) for _, k, f in COLUMNS) + " |")
    servers = [r for r in summary["steps"] if r.get("server")]
    if servers:
        out += ["", "Server side during each step:", ""]
        for row in servers:
            figures = ", ".join(
                f"{key} {_server_value(key, value)}"
                for key, value in sorted(row["server"].items())
                if key != "errors"
            )
            out.append(f"- {row['engine']} step {row['step']}: {figures}")
    return "\n".join(out) + "\n"


def _latency(section: str, short: str, key: str) -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """A latency section of the block: mean, median and p99 of `<key>_*_s`, in ms."""
    return (
        section,
        tuple(
            (f"{stat} {short} (ms)", f"{key}_{suffix}_s", "ms")
            for stat, suffix in (("Mean", "mean"), ("Median", "p50"), ("P99", "p99"))
        ),
    )


# The per-step block on the terminal: (section, [(label, summary key, format)]), in the
# manner of `vllm bench serve` (mean, median and p99 of each latency).
BLOCK: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "",
        (
            ("Successful requests", "requests_ok", "d"),
            ("Failed requests", "requests_failed", "d"),
            ("Duration (s)", "wall_s", ".2f"),
            ("Prompt tokens per request", "prompt_tokens", "s"),
            ("Output tokens per request", "completion_tokens", "s"),
            ("Request throughput (req/s)", "requests_per_s", ".2f"),
            ("Output token throughput (tok/s)", "output_tok_s", ".1f"),
        ),
    ),
    _latency("Time to First Token", "TTFT", "ttft"),
    _latency("Time per Output Token (excl. 1st token)", "TPOT", "tpot"),
    _latency("Inter-token Latency", "ITL", "itl"),
    _latency("End-to-end Latency", "E2E", "e2e"),
    (
        "Decode per sequence",
        (
            ("Client decode (tok/s, mean)", "decode_tok_s_mean", ".1f"),
            ("Server decode (tok/s, mean)", "server_decode_tok_s_mean", ".1f"),
        ),
    ),
)
BLOCK_WIDTH = 56
# The server block's bookkeeping, not figures of the engine.
SERVER_COUNTS = frozenset({"window_s", "scrapes", "scrape_errors"})


# --traffic: how the replay kept its schedule and the traffic's lengths (rows that have them).
TRAFFIC_ITEMS = (
    ("Send error p99 (ms)", "send_error_p99_s", "ms"),
    ("Send error worst (ms)", "send_error_max_s", "ms"),
    ("Late sends (> 5 ms)", "late_sends", "d"),
    ("Prompts off the traffic's length", "prompt_tokens_off", "d"),
)
# A list of distinct lengths longer than this is shown as its range.
LENGTHS_SHOWN = 6


def _lengths(value: Any) -> Any:
    """Distinct token counts: all of a few, else `min..max (N distinct)`."""
    if isinstance(value, list) and len(value) > LENGTHS_SHOWN:
        return f"{value[0]}..{value[-1]} ({len(value)} distinct)"
    return value


def _load_label(row: dict[str, Any]) -> str:
    if row.get("send_error_p99_s") is not None:
        return "traffic replayed on its schedule"
    if row.get("rate") is not None:
        cap = row.get("concurrency")
        return f"rate {row['rate']:g} req/s" + (f", at most {cap} in flight" if cap else "")
    return f"concurrency {row.get('concurrency')}"


def step_block(row: dict[str, Any]) -> list[str]:
    """The vertical summary of one engine in one step (no verdict: that is said once)."""
    title = f" {row.get('engine')} · step {row.get('step')} · {_load_label(row)} "
    lines = [title.center(BLOCK_WIDTH, "=")]
    for section, items in BLOCK:
        if section:
            lines.append(f" {section} ".center(BLOCK_WIDTH, "-"))
        for label, key, fmt in items:
            value = _fmt(_lengths(row.get(key)), fmt) or "n/a"
            lines.append(f"{label + ':':<{BLOCK_WIDTH - 14}}{value:>14}")
    if any(row.get(key) is not None for _, key, _ in TRAFFIC_ITEMS):
        lines.append(" Traffic ".center(BLOCK_WIDTH, "-"))
        for label, key, fmt in TRAFFIC_ITEMS:
            value = _fmt(row.get(key), fmt) or "n/a"
            lines.append(f"{label + ':':<{BLOCK_WIDTH - 14}}{value:>14}")
    errors = row.get("errors") or {}
    if errors:
        lines.append(" Errors ".center(BLOCK_WIDTH, "-"))
        for kind, count in sorted(errors.items()):
            lines.append(f"{kind + ':':<{BLOCK_WIDTH - 14}}{count:>14}")
    server = row.get("server")
    if server:
        lines.append(" Server side (exporter / Prometheus) ".center(BLOCK_WIDTH, "-"))
        figures = 0
        for key, value in sorted(server.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"{key + ':':<{BLOCK_WIDTH - 14}}{value:>14.4g}")
                figures += key not in SERVER_COUNTS
        # A source that failed, or answered nothing, says so here, not only in summary.json.
        for error in server.get("errors") or []:
            lines.append(f"error: {error}")
        if not figures and not server.get("errors") and not server.get("scrape_errors"):
            lines.append("no figures: no samples in the step's window (shorter than a scrape?)")
    lines.append("=" * BLOCK_WIDTH)
    return lines


def to_console(summary: dict[str, Any]) -> str:
    """One vertical block per engine and step, then the run's validity, said once."""
    lines: list[str] = []
    for row in summary["steps"]:
        lines += step_block(row)
        lines.append("")
    if summary.get("aborted"):
        lines.append(f"ABORTED: {summary.get('abort_reason')}")
    if summary["valid"]:
        lines.append("Result: VALID (every request succeeded; equal token counts)")
    else:
        lines.append(invalid_banner(summary["invalid_reasons"]))
    return "\n".join(lines)


def write_reports(out_dir: Path, summary: dict[str, Any]) -> None:
    """Write summary.json, summary.csv and summary.md (atomically, each rewritten)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    _atomic_write(out_dir / "summary.csv", to_csv(summary))
    _atomic_write(out_dir / "summary.md", to_markdown(summary))
