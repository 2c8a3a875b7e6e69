"""Where per-sequence decode and the time to first token come from: the one decision.

The client's streamed chunks when it saw them; else the engine's own timing of the same
requests (llama.cpp's per-request `timings`; SGLang's histograms over the step's window,
through the exporter's series); else not measured, never a 0. A model with random weights
can stream only empty text (its ids decode to nothing), so the client stamps no chunk while
the engine still times every token. Every surface (step answers, the terminal, the report's
tables, compare's calls, requests.jsonl's per-request rates) reads the figure and its
source from `figure` and says it with `source_note`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this module sits below the results it describes
    from diagnose.decision.model import Row

# Where a figure came from (`Row.per_seq_source`, `Row.ttft_source`).
CLIENT = "client"  # the streamed chunks' timestamps
ENGINE = "engine"  # the engine's own timing (llama.cpp `timings`, SGLang's histograms)

ENGINE_NOTE = "the engine's own timing: the streamed text was empty"
NO_TEXT = "not measured (no streamed text)"


@dataclass(frozen=True)
class Figure:
    """A figure and its source (`CLIENT`, `ENGINE`; None: not measured)."""

    value: float | None = None
    source: str | None = None


def figure(client: float | None, engine: float | None) -> Figure:
    """The client's figure when it has one, else the engine's; a 0 or None is no figure."""
    if client is not None and client > 0:
        return Figure(client, CLIENT)
    if engine is not None and engine > 0:
        return Figure(engine, ENGINE)
    return Figure()


def source_note(source: str | None) -> str:
    """` (the engine's own timing: ...)` for an engine figure, nothing for the client's."""
    return f" ({ENGINE_NOTE})" if source == ENGINE else ""


def decode_text(row: Row) -> str | None:
    """`12.3 tok/s per sequence (81.3 ms/token)`, with its source; None: not measured."""
    if not row.per_seq_tok_s:
        return None
    ms = 1000.0 / row.per_seq_tok_s
    text = f"{row.per_seq_tok_s:.1f} tok/s per sequence ({ms:.1f} ms/token)"
    return text + source_note(row.per_seq_source)


def ttft_text(row: Row) -> str:
    """`TTFT p50 0.123 s` (the client's), `TTFT mean 0.123 s (the engine's own timing: ...)`
    (SGLang's histogram gives a mean), or `TTFT not measured (no streamed text)`; never 0.000 s."""
    if not row.ttft_s:
        return "TTFT " + NO_TEXT
    if row.ttft_source == ENGINE:
        return f"TTFT mean {row.ttft_s:.3f} s{source_note(ENGINE)}"
    return f"TTFT p50 {row.ttft_s:.3f} s"
