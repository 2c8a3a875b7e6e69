"""Turn a `bench/gpu_validation.py` run into checks, a promtool test and report tables.

    python -m tools.gpu_report RUN_DIR \\
        [--promtool-test prometheus/rules/tests/h200-captured-test.yml]

RUN_DIR is the `gv` folder the GPU run wrote (or its copy under tests/fixtures). For every
scenario it compares, at the same moments:

* exporter GPU memory (`llmb_gpu_memory_used_bytes`, `llmb_gpu_process_memory_used_bytes`)
  with `nvidia-smi --query-gpu` / `--query-compute-apps` (target: within 2 %);
* the exporter's per-sequence decode speed (Δ`llmb_engine_decode_tokens_total` /
  Δ`llmb_engine_decode_seconds_total`) with the engine's own `timings` of the same requests
  (target: within 5 %);
* the KV estimate (`llmb_model_kv_cache_bytes_estimated`) with the `KV buffer size` the engine
  logged (`llmb_engine_kv_cache_bytes`) (target: within 5 %).

It also writes a promtool unit test whose input series are the exporter's real scrapes
(resampled to 1 s), so `promtool test rules` evaluates the verdict rules on the GPU's data.
The expected verdict, conditions and recorded inputs come from the Python decision core
(`core/`) on the same samples, never by hand; `parity_case` builds such a test
from any scrapes (tests/system/test_verdict_parity.py uses it for the simulators too).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from core import series as llmb
from core.conditions import VERDICTS, evaluate
from core.promql import EngineKey
from core.rules import RuleValues, rule_values_at
from core.signals import SIGNAL_RECORDS
from core.thresholds import threshold_promql

ROOT = Path(__file__).resolve().parent.parent

RULE_FILES = ("recording.yml", "verdict.yml")
MIB = 1024 * 1024
EXPECTED = {
    "resident_c1": "decode_below_card_limit",
    "sched_np4_c8": "scheduling_bound",
    "ngl30": "weights_not_resident",
    "kvslot": "kv_saturated",
    # Two GPUs, one engine split by layers: all layers on the GPUs, and 30 of 63.
    "split2_layer": "decode_below_card_limit",
    "split2_ngl30": "weights_not_resident",
}

Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(samples: dict[Key, float], name: str, **labels: str) -> float | None:
    for (n, lab), v in samples.items():
        if n == name and all(dict(lab).get(k) == val for k, val in labels.items()):
            return v
    return None


def total(samples: dict[Key, float], name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == val for k, val in labels.items())
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def find(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / (name + ".gz")):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(folder / name)


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def memory_checks(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Exporter vs nvidia-smi at the same moments: per GPU, and the engine's processes summed."""
    rows = []
    for moment in ("loaded", "during", "after"):
        snap = record.get(moment)
        if not snap or not snap.get("smi"):
            continue
        s = parse(snap["scrape"])
        smi_gpus = snap["smi"].get("gpus") or [
            {"index": 0, "used_mib": snap["smi"]["memory_used_mib"]}
        ]
        exp_proc = get(s, llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES, engine="llama")
        smi_proc = sum(a["used_mib"] for a in snap["smi"]["apps"]) * MIB
        for gpu in smi_gpus:
            exp_used = get(s, llmb.GPU_MEMORY_USED_BYTES, gpu=str(gpu["index"]))
            smi_used = gpu["used_mib"] * MIB
            # The engine's process memory on this GPU (several GPUs: one split model).
            exp_gpu_proc = total(
                s, llmb.GPU_PROCESS_MEMORY_USED_BYTES, engine="llama", gpu=str(gpu["index"])
            )
            smi_gpu_proc = MIB * sum(
                a["used_mib"] for a in snap["smi"]["apps"] if a.get("gpu", 0) == gpu["index"]
            )
            rows.append(
                {
                    "moment": moment,
                    "gpu": gpu["index"],
                    "exporter_used_mib": exp_used / MIB if exp_used else None,
                    "smi_used_mib": smi_used / MIB,
                    "used_diff_pct": pct(exp_used, smi_used) if exp_used else None,
                    "exporter_gpu_process_mib": exp_gpu_proc / MIB,
                    "smi_gpu_process_mib": smi_gpu_proc / MIB,
                    "gpu_process_diff_pct": pct(exp_gpu_proc, smi_gpu_proc)
                    if smi_gpu_proc
                    else None,
                    "exporter_process_mib": exp_proc / MIB if exp_proc is not None else None,
                    "smi_process_mib": smi_proc / MIB,
                    "process_diff_pct": pct(exp_proc, smi_proc) if exp_proc and smi_proc else None,
                }
            )
    return rows


def decode_check(folder: Path, scrapes: list[dict[str, Any]]) -> dict[str, Any]:
    first, last = parse(scrapes[0]["text"]), parse(scrapes[-1]["text"])
    dt = total(last, llmb.ENGINE_DECODE_TOKENS_TOTAL, engine="llama") - total(
        first, llmb.ENGINE_DECODE_TOKENS_TOTAL, engine="llama"
    )
    ds = total(last, llmb.ENGINE_DECODE_SECONDS_TOTAL, engine="llama") - total(
        first, llmb.ENGINE_DECODE_SECONDS_TOTAL, engine="llama"
    )
    n = ms = 0.0
    client = []
    for req in read_jsonl(find(folder / "loadgen", "requests.jsonl")):
        # The engine's own timings of the same requests (predicted_per_second excludes the
        # first token, which comes from the prompt pass).
        pps = req.get("server_predicted_per_second")
        if pps:
            count = (req.get("completion_tokens") or 0) - 1
            n += count
            ms += count / pps
        if req.get("decode_tok_s"):
            client.append(req["decode_tok_s"])
    exporter = dt / ds if ds else None
    timings = n / ms if ms else None
    # What the current exporter derives from the same real log (decode intervals / decode
    # time): the scrapes above were taken by the exporter of the run's commit.
    from exporter.collectors.llamacpp.log import LogState

    state = LogState()
    log = find(folder, "server.log")
    with gzip.open(log, "rt") if log.suffix == ".gz" else log.open() as fh:
        for line in fh:
            state.feed(line)
    from_log = state.eval_intervals / state.eval_seconds if state.eval_seconds else None
    return {
        "exporter_tok_s": exporter,
        "timings_tok_s": timings,
        "diff_pct": pct(exporter, timings) if exporter and timings else None,
        "exporter_log_tok_s": from_log,
        "log_diff_pct": pct(from_log, timings) if from_log and timings else None,
        "client_tok_s": sum(client) / len(client) if client else None,
    }


def kv_check(scrapes: list[dict[str, Any]]) -> dict[str, Any]:
    s = parse(scrapes[-1]["text"])
    est = get(s, llmb.MODEL_KV_CACHE_BYTES_ESTIMATED, engine="llama")
    logged = total(s, llmb.ENGINE_KV_CACHE_BYTES, engine="llama")
    return {
        "estimated_mib": est / MIB if est else None,
        "logged_mib": logged / MIB if logged else None,
        "diff_pct": pct(est, logged) if est and logged else None,
    }


def rule_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "prometheus" / "rules").glob("*.yml"):
        names |= set(re.findall(r"\bllmb_[a-z0-9_]+", path.read_text()))
    return names


def group_order() -> list[str]:
    """Rule groups in file order: promtool evaluates groups in an unspecified order unless
    told, so a later group could read an earlier one's result from the previous step."""
    import yaml

    names = []
    for f in RULE_FILES:
        doc = yaml.safe_load((ROOT / "prometheus" / "rules" / f).read_text(encoding="utf-8"))
        names += [g["name"] for g in doc["groups"]]
    return names


# The recorded series the parity checks compare: every verdict and every condition.
PARITY_EXPR = (
    '{__name__=~"llmb:engine_bottleneck:verdict|engine:llmb_[a-z_]+:bool'
    '|llmb:engine_roofline:misfit"}'
)
# The recorded inputs of the verdict and the roofline, compared value for value.
VALUE_RECORDS: dict[str, str] = {
    **SIGNAL_RECORDS,
    "decode_tokens_per_second": (
        f"engine:llmb_decode_tokens_per_second:rate{threshold_promql('rate_window')}"
    ),
    "bandwidth_bytes_per_second": "engine:llmb_gpu_memory_bandwidth_bytes_per_second:max",
    "decode_bytes_per_step": (
        f"engine:llmb_decode_bytes_per_step:avg{threshold_promql('rate_window')}"
    ),
    "roofline_tokens_per_second": (
        f"engine:llmb_decode_roofline_tokens_per_second:avg{threshold_promql('rate_window')}"
    ),
    "decode_batch": f"engine:llmb_decode_batch:avg{threshold_promql('rate_window')}",
    "active_weights_bytes": (
        f"engine:llmb_decode_weights_bytes_per_step:avg{threshold_promql('rate_window')}"
    ),
    "accepted_tokens_per_step": "engine:llmb_decode_accepted_tokens_per_step:max",
    "experts_host_bound_tokens_per_second": (
        f"engine:llmb_experts_host_bound_tokens_per_second:avg{threshold_promql('rate_window')}"
    ),
}
VALUES_EXPR = '{__name__=~"' + "|".join(sorted(VALUE_RECORDS.values())) + '"}'


def resample(
    scrapes: Sequence[tuple[float, Mapping[Key, float]]], interval: float
) -> tuple[int, dict[Key, list[float | None]]]:
    """Scrapes at any times -> one value (or None) per series and `interval` step.

    Step k holds the last scrape at or before `t0 + k * interval` (what Prometheus would
    have scraped), only for series the rules read.
    """
    wanted = rule_names()
    t0 = scrapes[0][0]
    parsed = [(t - t0, s) for t, s in scrapes]
    steps = int(parsed[-1][0] / interval + 1e-9) + 1
    keys = sorted({k for _, p in parsed for k in p if k[0] in wanted})
    out: dict[Key, list[float | None]] = {k: [] for k in keys}
    j = 0
    for step in range(steps):
        at = step * interval + 1e-9
        while j + 1 < len(parsed) and parsed[j + 1][0] <= at:
            j += 1
        current = parsed[j][1] if parsed[j][0] <= at else {}
        for key in keys:
            v = current.get(key)
            out[key].append(None if v is None else float(v))
    return steps, out


def _labels(name: str, labels: Mapping[str, str]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v)
    return f"{name}{{{body}}}"


def expected_values(values: Mapping[EngineKey, RuleValues]) -> list[dict[str, Any]]:
    """What VALUES_EXPR must return: every recorded input Python computed, exactly."""
    out = []
    for key, rv in sorted(values.items()):
        base = {"host": key.host, "engine": key.engine, "kind": key.kind}
        for attr, record in VALUE_RECORDS.items():
            v = getattr(rv.signals, attr) if attr in SIGNAL_RECORDS else getattr(rv, attr)
            if v is not None:
                out.append({"labels": _labels(record, base), "value": v})
    return out


def expected_samples(values: Mapping[EngineKey, RuleValues]) -> list[dict[str, Any]]:
    """What PARITY_EXPR must return: the Python evaluator's conditions and verdict."""
    out = []
    for key, rv in sorted(values.items()):
        base = {"host": key.host, "engine": key.engine, "kind": key.kind}
        verdict = evaluate(rv.signals)
        for cond in verdict.conditions:
            record = cond.record
            out.append({"labels": _labels(record, base), "value": int(cond.held)})
        for v in VERDICTS:
            labels = _labels("llmb:engine_bottleneck:verdict", {**base, "verdict": v})
            out.append({"labels": labels, "value": int(v == verdict.name)})
        if rv.misfit is not None:
            # The physics gate: the unphysical efficiency, labelled with its reason.
            labels = _labels("llmb:engine_roofline:misfit", {**base, "reason": rv.misfit})
            out.append({"labels": labels, "value": rv.signals.decode_efficiency})
    return out


@dataclass
class ParityCase:
    """A promtool test case and the Python verdict per engine at each evaluated step."""

    case: dict[str, Any]
    verdicts: dict[int, dict[EngineKey, str]]

    @property
    def final(self) -> dict[EngineKey, str]:
        """The verdicts at the last evaluated step."""
        return self.verdicts[max(self.verdicts)]


def parity_case(
    name: str,
    scrapes: Sequence[tuple[float, Mapping[Key, float]]],
    interval: float = 1.0,
    every_step: bool = False,
    exact_values: bool = False,
) -> ParityCase:
    """A promtool test of `scrapes` whose expected verdicts come from `core`.

    The input series are the scrapes resampled to `interval`; the expectation (every
    condition and verdict series of every engine up) is what the Python evaluator gives on
    exactly those samples, at the last step or, with `every_step`, at every step. With
    `exact_values` every recorded input of the verdict and the roofline must also equal
    Python's value exactly (promtool compares floats for equality).
    """
    steps, values = resample(scrapes, interval)
    series = []
    for key, vals in values.items():
        text = " ".join("_" if v is None else repr(v) for v in vals)
        series.append({"series": _labels(key[0], dict(key[1])), "values": text})
    points = {
        key: [(i * interval, v) for i, v in enumerate(vals) if v is not None]
        for key, vals in values.items()
    }
    tests = []
    verdicts = {}
    for step in range(steps) if every_step else [steps - 1]:
        rule_values = rule_values_at(points, step * interval)
        verdicts[step] = {k: evaluate(rv.signals).name for k, rv in rule_values.items()}
        tests.append(
            {
                "expr": PARITY_EXPR,
                "eval_time": _duration(step * interval),
                "exp_samples": expected_samples(rule_values),
            }
        )
        if exact_values:
            tests.append(
                {
                    "expr": VALUES_EXPR,
                    "eval_time": _duration(step * interval),
                    "exp_samples": expected_values(rule_values),
                }
            )
    case = {
        "name": name,
        "interval": _duration(interval),
        "input_series": series,
        "promql_expr_test": tests,
    }
    return ParityCase(case, verdicts)


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scrape_series(scrapes: list[dict[str, Any]]) -> list[tuple[float, dict[Key, float]]]:
    """`scrapes.jsonl` rows -> (time, parsed samples)."""
    return [(s["t"], parse(s["text"])) for s in scrapes]


def promtool_case(name: str, scrapes: list[dict[str, Any]]) -> ParityCase:
    """One captured scenario: its scrapes at 1 s, the Python verdict at the end."""
    pc = parity_case(f"H200 capture {name}", scrape_series(scrapes), 1.0, exact_values=True)
    (verdict,) = pc.final.values()
    pc.case["name"] += f": verdict {verdict}"
    return pc


def analyse(run: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per-scenario checks and the promtool test cases of one GPU run."""
    summary_path = find(run, "summary.json")
    opener = gzip.open if summary_path.suffix == ".gz" else open
    with opener(summary_path, "rt") as fh:
        summary = json.load(fh)
    report: dict[str, Any] = {}
    cases = []
    for record in summary:
        name = record["scenario"]
        if record.get("error"):
            report[name] = {"error": record["error"].splitlines()[-1]}
            continue
        folder = run / name
        scrapes = read_jsonl(find(folder, "scrapes.jsonl"))
        report[name] = {
            "load_seconds": record.get("load_seconds_measured"),
            "memory": memory_checks(record),
            "decode": decode_check(folder, scrapes),
            "kv": kv_check(scrapes),
        }
        if name in EXPECTED:
            pc = promtool_case(name, scrapes)
            (verdict,) = pc.final.values()
            report[name]["verdict"] = {"rules": verdict, "intended": EXPECTED[name]}
            cases.append(pc.case)
    return report, cases


def promtool_document(cases: list[dict[str, Any]], run: str = "h200-validation-2026-11-30") -> str:
    """The promtool test file text for `cases`."""
    import yaml

    doc = {
        # The test lives beside the rules it tests: prometheus/rules/tests/.
        "rule_files": [f"../{f}" for f in RULE_FILES],
        "evaluation_interval": "1s",
        "group_eval_order": group_order(),
        "tests": cases,
    }
    header = (
        "# Generated by tools/gpu_report.py from the exporter's real scrapes on an H200\n"
        f"# (tests/fixtures/{run}/, docs/results/h200-gemma3-27b.md): the\n"
        "# verdict rules evaluated on real GPU data, expected verdicts from core/.\n"
        "# Do not edit; regenerate.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=1 << 20)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path)
    parser.add_argument(
        "--promtool-test",
        type=Path,
        metavar="FILE",
        help="also write the promtool test of the run's scrapes to FILE; it names the rules "
        "as ../*.yml, so FILE belongs in prometheus/rules/tests/",
    )
    args = parser.parse_args()
    report, cases = analyse(args.run)
    print(json.dumps(report, indent=1))
    if args.promtool_test:
        args.promtool_test.write_text(promtool_document(cases, args.run.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
