"""`llmb-loadgen decide DIR --out OUT`: re-decide a saved diagnose/compare folder with today's code.

A contract: a folder `diagnose` or `compare` wrote (`results.json`, `requests.jsonl`) is
decided again, for another `--load` or `--slo`, without measuring anything. The engines'
measurements and signals are read back as they were saved, and read with today's code: the
saved engine logs through today's log parser (expert offload), the verdict and action from
the saved signals (`--host-bandwidth-gbs` gives the expert-offload bound its host bandwidth);
the comparison, the intervals, the answer per load and the SLO are decided anew. OUT gets
results.json, report.md, report.html and a copy of requests.jsonl (so OUT can be re-decided
in turn).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
from dataclasses import dataclass, fields, replace
from pathlib import Path

from config.kinds import engine_kind, kinds
from core.signals import Signals
from diagnose.decision.model import Decision, EngineResult, Step
from diagnose.decision.one_engine import decide_single, engine_verdict
from diagnose.decision.requests import REQUESTS_FILE, load_requests
from diagnose.decision.results import engine_from_dict
from diagnose.decision.slo import with_slo
from diagnose.decision.two_engines import CompareInputs, decide_compare
from diagnose.options import add_host_bandwidth_option
from diagnose.served_load import LoadQuery, add_answer_arguments, user_load
from loadgen.exporter_series import saved_log_experts
from loadgen.options import HelpFormatter, UsageError, add_out_option
from model.host_memory import HostBandwidth

RESULTS_FILE = "results.json"


@dataclass
class Saved:
    """What a diagnose/compare folder holds: its engines (in their saved order) and steps."""

    engines: list[EngineResult]
    steps: list[Step]
    title: str | None


def read_saved(folder: Path) -> Saved:
    """results.json of `folder` (UsageError when it is missing or not a diagnose/compare one)."""
    path = folder / RESULTS_FILE
    if not path.is_file():
        raise UsageError(f"{folder} has no {RESULTS_FILE}: give a folder diagnose or compare wrote")
    not_results = f"{path} is not a results.json of diagnose or compare"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{not_results}: not JSON ({exc.msg}, line {exc.lineno})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{not_results}: it cannot be read ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("engines"), list):
        raise UsageError(f"{not_results}: it has no list of engines")
    try:
        engines = [engine_from_dict(e) for e in doc["engines"]]
        steps = [Step(**s) for s in doc.get("decision", {}).get("steps", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        # The reader's own words name the field (a missing key, an unknown one, a wrong type).
        what = f"no {exc} field" if isinstance(exc, KeyError) else str(exc)
        raise UsageError(f"{not_results}: an engine or step does not read ({what})") from exc
    if len(engines) not in (1, 2):
        raise UsageError(f"{path} holds {len(engines)} engines: diagnose has one, compare two")
    return Saved(engines, steps, doc.get("title"))


def saved_logs(folder: Path, engine: EngineResult) -> list[Path]:
    """The engine logs diagnose saved in `folder` (`NAME-cCTX-npN.log`, also `.log.xz`), in
    name order; the engine's own stdout (`.stdout.log`) is not its log."""
    logs = [
        p
        for pattern in (f"{engine.name}-c*-np*.log", f"{engine.name}-c*-np*.log.xz")
        for p in folder.glob(pattern)
        if ".stdout." not in p.name
    ]
    return sorted(logs)


def refresh(engine: EngineResult, folder: Path, host: HostBandwidth | None) -> EngineResult:
    """The saved engine read with today's code: its saved logs through today's log parser
    (expert offload), the host bandwidth given (--host-bandwidth-gbs), and the verdict and
    action decided again from the saved signals (the action diagnose prints today)."""
    # Kinds whose log's load lines diagnose reads (llama.cpp): their log says expert offload.
    if engine.kind in kinds() and engine_kind(engine.kind).log_load_lines:
        model = Path(engine.model) if engine.model else None
        for log in saved_logs(folder, engine):
            found = saved_log_experts(log, model)
            if found is None:
                continue
            layers, host_bytes = found
            # The GGUF's exact bytes saved by the run stand when the layers agree.
            host_bytes_known = engine.experts_host_bytes
            if engine.experts_host_layers != layers or not host_bytes_known:
                host_bytes_known = host_bytes or None
            saved_signals = engine.signals
            if saved_signals:
                saved_signals = {**saved_signals, "experts_host_layers": float(layers)}
            engine = replace(
                engine,
                experts_host_bytes=host_bytes_known,
                experts_host_layers=float(layers),
                signals=saved_signals,
            )
            break
    if host is not None:
        engine = replace(
            engine,
            host_bandwidth_bytes_per_s=host.bytes_per_second,
            host_bandwidth_source=host.source,
        )
    if engine.signals and engine.verdict is not None:
        known = {f.name for f in fields(Signals)}
        signals = Signals(**{k: v for k, v in engine.signals.items() if k in known})  # type: ignore[arg-type]
        verdict, action = engine_verdict(engine, signals)
        engine = replace(engine, verdict=verdict, action=action)
    return engine


def redecide(
    folder: Path,
    in_use: str | None,
    inputs: CompareInputs,
    query: LoadQuery | None = None,
    host: HostBandwidth | None = None,
) -> tuple[list[EngineResult], Decision]:
    """The saved run decided again: compare's answer (A in use) or diagnose's; the load is
    `inputs.load`, else `query`'s for the engine in use (before anything is decided). Each
    engine is first `refresh`ed: today's log parser and today's verdict and action."""
    saved = read_saved(folder)
    engines = [refresh(engine, folder, host) for engine in saved.engines]
    names = [e.name for e in engines]
    if in_use is not None:
        if in_use not in names:
            raise UsageError(f"--in-use {in_use}: the run measured {', '.join(names)}")
        engines = sorted(engines, key=lambda e: e.name != in_use)
    try:
        inputs.requests = load_requests(folder, engines)
    except (ValueError, TypeError, lzma.LZMAError) as exc:
        raise UsageError(
            f"{folder / REQUESTS_FILE}(.xz) is not the requests diagnose wrote: {exc}"
        ) from exc
    if len(engines) == 2:
        served = user_load(inputs.load, query, engines[0].name)
        if served is not None:
            inputs.load, inputs.load_source = served.concurrency, served.source
        return engines, decide_compare(engines[0], engines[1], inputs)
    (engine,) = engines
    # diagnose's steps are what the procedure saw; only the SLO is decided anew.
    decision = decide_single(engine, [s for s in saved.steps if s.key != "slo"])
    if inputs.slo is not None:
        decision = with_slo(decision, engine, inputs.requests, inputs.slo)
    return engines, decision


def configure(parser: argparse.ArgumentParser) -> None:
    """decide's arguments."""
    parser.formatter_class = HelpFormatter
    parser.add_argument("dir", type=Path, metavar="DIR", help="a folder diagnose or compare wrote")
    add_out_option(parser, required=True)
    g = parser.add_argument_group("answer")
    g.add_argument(
        "--in-use",
        metavar="NAME",
        help="the engine you run now (default: the first engine of the run, compare's A)",
    )
    add_answer_arguments(g, find_max=False, load_from=True)
    add_host_bandwidth_option(g)


def copy_requests(src_dir: Path, out: Path) -> None:
    """OUT keeps the requests it was decided from (OUT can be re-decided in turn)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (REQUESTS_FILE, REQUESTS_FILE + ".xz"):  # as saved, or xz-compressed
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out / name)
            return


def title_of(engines: list[EngineResult]) -> str:
    names = " vs ".join(e.name for e in engines)
    return f"{'compare' if len(engines) == 2 else 'diagnose'} {names} (re-decided)"


HELP = (
    "re-decide a saved diagnose/compare folder (results.json, requests.jsonl) with today's "
    "code, for another --load or --slo"
)
