"""What both reports say, computed once so they cannot disagree: the answer in results.json's
words, the run's metadata, the steps, what was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from core.conditions import VERDICT_INFO
from diagnose.decision.model import Decision, EngineResult, RunInfo, verdict_text
from diagnose.report.hints import FIX_EXPORTER, unknown
from exporter import __version__
from loadgen.traffic.summary import Lengths

if TYPE_CHECKING:
    from diagnose.report.html.figure import Plot


@dataclass
class Answer:
    """What the report says first, in results.json's words."""

    # (engine, verdict, what the verdict means)
    verdicts: list[tuple[str, str, str]]
    recommendation: str
    action: str
    comparable: bool
    comparable_why: str
    caveats: list[str]
    # "estimate: ... ≈ N tok/s", as the terminal prints them.
    estimates: list[str]
    # The load the answer is for and where it came from (None: every load's answer).
    load: str | None = None


def answer_of(engines: list[EngineResult], decision: Decision) -> Answer:
    """The answer block, field by field from the Decision that results.json is written from."""
    verdicts = []
    for name, v in decision.verdict.items():
        info = VERDICT_INFO.get(v) if v is not None else None
        verdicts.append((name, verdict_text(v), info.summary if info else ""))
    why = next((s.answer for s in decision.steps if s.key == "comparability"), "")
    if len(engines) < 2:
        why = "one engine, nothing to compare it with"
    return Answer(
        verdicts=verdicts,
        recommendation=decision.recommendation,
        action=decision.action,
        comparable=decision.comparable,
        comparable_why=why,
        caveats=list(decision.caveats),
        estimates=[f"{e.basis} ≈ {e.tok_s:.1f} tok/s" for e in decision.estimates],
        load=decision.load_text(),
    )


@dataclass
class Metadata:
    """Who ran what, when, on which engine and GPU."""

    tool_version: str
    command: str
    started_utc: str
    finished_utc: str
    # (engine, engine version, GPU name, GPU driver), each a value or "unknown: why".
    engines: list[tuple[str, str, str, str]]
    # (engine, "log" / "model", where it came from or "not seen: ..."), as the terminal says.
    evidence: list[tuple[str, str, str]] = field(default_factory=list)
    # (engine, the step it stopped at and why) of a partial run.
    stopped: list[tuple[str, str]] = field(default_factory=list)


def _utc(ts: float | None = None) -> str:
    when = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


# Engine version and GPU driver: the exporter's llmb_engine_info / llmb_gpu_info carry them,
# but EngineResult has no field for them yet; the metadata block shows them once it does.
NOT_RECORDED = "not recorded by this version of diagnose"


def _recorded(e: EngineResult, attr: str, what: str) -> str:
    """A fact EngineResult may not have a field for yet (the exporter's info labels)."""
    if not hasattr(e, attr):
        return unknown(f"{what} {NOT_RECORDED}")
    return str(getattr(e, attr) or unknown(f"{what} not read: " + FIX_EXPORTER))


def metadata_of(engines: list[EngineResult], run: RunInfo | None = None) -> Metadata:
    """The metadata block: the run's record, the engines' facts, every gap explained."""
    starts = [p.start for e in engines for p in e.phases]
    ends = [p.end for e in engines for p in e.phases if p.end is not None]
    if run is None:
        # A library call (tests, notebooks) has no command line of its own.
        run = RunInfo(
            command=unknown("the report was written by a library call, not by llmb-loadgen"),
            tool_version=__version__,
            started_at=_utc(min(starts)) if starts else _utc(),
            finished_at=_utc(max(ends)) if ends else None,
        )
    rows = []
    for e in engines:
        if e.gpu_name:
            gpu = e.gpu_name
        elif e.memory_source == "gpu":
            gpu = unknown("the GPU's name was not read: " + FIX_EXPORTER)
        else:
            gpu = unknown("no GPU seen (no NVML on this host and no exporter): " + FIX_EXPORTER)
        rows.append(
            (
                e.name,
                _recorded(e, "engine_version", f"{e.kind} build"),
                gpu,
                _recorded(e, "gpu_driver", "driver"),
            )
        )
    return Metadata(
        tool_version=run.tool_version,
        command=run.command,
        started_utc=run.started_at,
        # A run without a finish time is being written up now.
        finished_utc=run.finished_at or _utc(),
        engines=rows,
        evidence=[(e.name, what, where) for e in engines for what, where in e.evidence.items()],
        stopped=[(e.name, e.stopped) for e in engines if e.stopped],
    )


def comparable_text(a: Answer) -> str:
    return ("yes" if a.comparable else "no") + (
        f" — {a.comparable_why}" if a.comparable_why else ""
    )


def metadata_rows(m: Metadata) -> list[tuple[str, str]]:
    """(field, value) pairs of the metadata block, shared by report.md and report.html."""
    rows = [
        ("tool version", m.tool_version),
        ("command", m.command),
        ("started (UTC)", m.started_utc),
        ("finished (UTC)", m.finished_utc),
    ]
    for name, version, gpu, driver in m.engines:
        rows += [
            (f"{name}: engine version", version),
            (f"{name}: GPU", gpu),
            (f"{name}: GPU driver", driver),
        ]
        rows += [(f"{name}: {what}", where) for e, what, where in m.evidence if e == name]
    rows += [(f"{name}: partial", f"stopped at {why}") for name, why in m.stopped]
    return rows


def not_measured(engines: list[EngineResult], plots: list[Plot]) -> list[str]:
    """Every step and plot that did not run, each with its reason."""
    out = [f"{e.name}: {m}" for e in engines for m in e.missing]
    # A plot left out for a reason already listed is not listed again.
    out += [
        f"{p.caption}: {p.missing}"
        for p in plots
        if p.svg is None and not any(p.missing.removeprefix("not measured: ") in m for m in out)
    ]
    return out


PHASE_HEAD = ("engine", "phase", "start (UTC)", "seconds", "memory GiB", "note")

NO_ROWS = "No step produced a measurement (see Not measured)."

NO_PHASES = "No phase ran."


@dataclass
class Report:
    """Everything both reports show, computed once so they cannot disagree."""

    title: str
    answer: Answer
    meta: Metadata
    steps: list[tuple[str, str, bool]]
    facts: tuple[tuple[str, ...], list[list[str]]]
    table: tuple[tuple[str, ...], list[list[str]], list[str]]
    phases: list[list[str]]
    plots: list[Plot]
    missing: list[str]
    # --traffic: (what, value) of the mix sent (empty: the fixed prompts).
    traffic: list[tuple[str, str]] = field(default_factory=list)


def _histogram_text(lengths: Lengths) -> str:
    return ", ".join(f"≤{bound}: {n}" for bound, n in lengths.histogram)


def traffic_rows(engines: list[EngineResult]) -> list[tuple[str, str]]:
    """The mix of a --traffic run (compare sends both engines the same: shown once)."""
    mix = next((e.traffic for e in engines if e.traffic is not None), None)
    if mix is None:
        return []
    rate = mix.rate_text() or "no schedule (closed loop)"
    how = "scheduled, in-flight cap" if mix.scheduled else "closed loop"
    return [
        ("source", mix.source),
        ("requests", f"{mix.requests} over {mix.span_s:.3g} s of schedule"),
        ("arrival rate", rate + (f" (time scale {mix.time_scale:g})" if mix.scheduled else "")),
        ("concurrency", f"{mix.concurrency} ({how})"),
        ("sessions", str(mix.sessions)),
        ("shared prefix", f"{mix.shared_prefix_share:.1%} of prompt tokens"),
        ("prompt tokens", f"{mix.prompt_tokens.text()}, mean {mix.prompt_tokens.mean:.1f}"),
        ("prompt histogram", _histogram_text(mix.prompt_tokens)),
        ("output tokens", f"{mix.output_tokens.text()}, mean {mix.output_tokens.mean:.1f}"),
        ("output histogram", _histogram_text(mix.output_tokens)),
    ]
