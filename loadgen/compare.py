"""`llmb-loadgen compare --engines A,B`: the same requests against two engines, then the decision.

The engines are measured one after the other (on one GPU they cannot both hold their
weights), with the same prompt text (calibrated once, on the first engine), the same
max tokens, temperature 0, ignore_eos and the same concurrencies. Token counts are
checked, and a difference in quantization/precision is printed as a caveat because
decode speed then needs a discount. A is the engine in use: the verdict says whether
to stay on it and tune, switch to B, or fix memory first.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from exporter.config import EngineConfig
from loadgen.client import TargetUnreachable
from loadgen.decision import Decision, EngineResult, Row, decide_compare
from loadgen.diagnose import (
    Diagnoser,
    Options,
    PhasePublisher,
    add_common_arguments,
    load_or_exit,
    options_from_args,
    serve_metrics,
)


def token_caveats(a: EngineResult, b: EngineResult) -> list[str]:
    """Differences in prompt/completion token counts between rows of the same step."""
    out = []

    def key(r: Row) -> tuple[str, int, int | None]:
        # Only the context sweep is matched on context: elsewhere it is each engine's default.
        return (r.step, r.concurrency, r.context if r.step == "context" else None)

    rows_b = {key(r): r for r in b.ok_rows()}
    for ra in a.ok_rows():
        rb = rows_b.get(key(ra))
        if rb is None:
            continue
        if ra.completion_tokens != rb.completion_tokens:
            out.append(
                f"{ra.step} c={ra.concurrency}: generated tokens differ "
                f"({a.name} {ra.completion_tokens}, {b.name} {rb.completion_tokens})"
            )
        if ra.prompt_tokens and rb.prompt_tokens and abs(ra.prompt_tokens - rb.prompt_tokens) > 0.5:
            out.append(
                f"{ra.step} c={ra.concurrency}: the same prompt is {ra.prompt_tokens:.0f} tokens "
                f"on {a.name} and {rb.prompt_tokens:.0f} on {b.name} (different tokenizers)"
            )
    return out


async def compare(
    engines: tuple[EngineConfig, EngineConfig],
    opts: Options,
    out: Path,
    pub: PhasePublisher | None = None,
) -> tuple[list[EngineResult], Decision]:
    """Measure both engines with identical requests and decide."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    pub = pub or PhasePublisher()
    first = Diagnoser(engines[0], opts, out, pub)
    ra = await first.run()
    # Reuse A's calibrated prompts so B gets byte-identical request bodies.
    second = Diagnoser(engines[1], opts, out, pub, prompts=first.prompts)
    rb = await second.run()
    decision = decide_compare(ra, rb)
    decision.caveats += token_caveats(ra, rb)
    return [ra, rb], decision


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Arguments of `llmb-loadgen compare`."""
    parser = parser or argparse.ArgumentParser(prog="llmb-loadgen compare")
    parser.description = "Send the same requests to two engines and say whether to switch."
    parser.add_argument("--engines", required=True, help="A,B: the engine in use first")
    add_common_arguments(parser)
    return parser


def run_compare(args: argparse.Namespace) -> int:
    """Run compare from parsed arguments and write the report; return the exit status."""
    from loadgen.htmlreport import write_report

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    if len(names) != 2 or names[0] == names[1]:
        sys.stderr.write("--engines needs two different engine names: A,B\n")
        return 2
    config = load_or_exit(args.config)
    try:
        pair = (config.engine(names[0]), config.engine(names[1]))
    except KeyError as exc:
        sys.stderr.write(f"{exc.args[0]}\n")
        return 2
    opts = options_from_args(args, config)
    pub = PhasePublisher()
    stop_metrics = serve_metrics(pub, args.metrics_listen)
    try:
        results, decision = asyncio.run(compare(pair, opts, args.out, pub))
    except TargetUnreachable as exc:
        sys.stderr.write(f"llmb-loadgen compare: {exc}\n")
        return 1
    finally:
        stop_metrics()
    write_report(args.out, results, decision, title=f"compare {names[0]} vs {names[1]}")
    for c in decision.caveats:
        print(f"caveat: {c}")
    print(f"verdict: {decision.verdict}\n{decision.recommendation}")
    print(f"report: {args.out / 'report.html'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `llmb-loadgen compare`."""
    return run_compare(build_parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())


def _configure(parser: argparse.ArgumentParser) -> None:
    build_parser(parser)


def command() -> Any:
    """The `compare` subcommand for `llmb-loadgen` (picked up by loadgen.__main__)."""
    from loadgen.__main__ import Command

    return Command(
        "compare",
        "same requests against two engines; stay and tune, switch, or fix memory first",
        _configure,
        run_compare,
    )
