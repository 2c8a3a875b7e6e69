"""Parse time of one busy SGLang /metrics answer: our line reader against prometheus_client.

All variants run in the same process, interleaved, on the same text (the real SGLang 0.5.23
busy exposition, ~590 samples, tests/fixtures/sglang-0.5.23/metrics-busy.txt):

* `prometheus_client`: client_python's text parser over the whole answer (the reference);
* `prometheus_client, mapped families`: the previous exporter (lines of mapped families
  selected first, then client_python's parser);
* `line reader`: exporter.promtext over the whole answer;
* `line reader, mapped families`: what the SGLang collector runs per scrape.

    python -m bench.promtext_parse --rounds 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.sglang.metrics import FAMILIES, PREFIX
from exporter.promtext import _base_name, _line_name, parse_exposition

BUSY = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "fixtures"
    / "sglang-0.5.23"
    / "metrics-busy.txt"
)


def _client_python(text: str) -> int:
    return sum(len(fam.samples) for fam in text_string_to_metric_families(text))


def _client_python_mapped(text: str) -> int:
    keep = {PREFIX + f for f in FAMILIES}
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    selected = [ln for ln in lines if _base_name(_line_name(ln)) in keep]
    return _client_python("\n".join(selected) + "\n")


def _reader(text: str) -> int:
    return sum(len(v) for v in parse_exposition(text, PREFIX).samples.values())


def _reader_mapped(text: str) -> int:
    return sum(len(v) for v in parse_exposition(text, PREFIX, FAMILIES).samples.values())


VARIANTS: dict[str, Callable[[str], int]] = {
    "prometheus_client": _client_python,
    "prometheus_client, mapped families": _client_python_mapped,
    "line reader": _reader,
    "line reader, mapped families": _reader_mapped,
}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=300, help="parses per variant")
    parser.add_argument("--file", type=Path, default=BUSY, help="exposition to parse")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    samples = {name: fn(text) for name, fn in VARIANTS.items()}  # warm up, count samples
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, fn in VARIANTS.items():  # interleaved: machine noise hits all alike
            start = time.perf_counter()
            fn(text)
            times[name].append((time.perf_counter() - start) * 1e3)
    ref = statistics.median(times["prometheus_client"])
    report = {
        name: {
            "samples": samples[name],
            "p50_ms": round(statistics.median(t), 3),
            "p99_ms": round(_quantile(t, 0.99), 3),
            "speedup_p50_vs_prometheus_client": round(ref / statistics.median(t), 1),
        }
        for name, t in times.items()
    }
    print(json.dumps({"file": args.file.name, "rounds": args.rounds, "variants": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
