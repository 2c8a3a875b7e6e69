"""The real H200 run (issue 7), kept as a fixture: its numbers must stay within the targets
and the promtool test generated from its scrapes must be the one in prometheus/tests/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.gpu_report import EXPECTED, analyse, promtool_document

ROOT = Path(__file__).parent.parent
RUN = Path(__file__).parent / "fixtures" / "h200-validation-2026-11-30"
PROMTOOL_TEST = ROOT / "prometheus" / "tests" / "h200-captured-test.yml"


def test_h200_numbers_meet_the_targets() -> None:
    report, _ = analyse(RUN)
    assert set(report) == set(EXPECTED)
    for name, checks in report.items():
        for row in checks["memory"]:
            # Exporter GPU memory vs nvidia-smi at the same moment: within 2 %.
            assert abs(row["used_diff_pct"]) < 2, (name, row)
            assert abs(row["process_diff_pct"]) < 2, (name, row)
        # Per-sequence decode from the engine's log vs its own timings: within 5 %.
        assert abs(checks["decode"]["log_diff_pct"]) < 5, (name, checks["decode"])
        # KV estimate from the GGUF header vs the KV buffers the engine logged: within 5 %.
        assert abs(checks["kv"]["diff_pct"]) < 5, (name, checks["kv"])
    # The partially offloaded model decodes at a fraction of the resident one.
    assert (
        report["ngl30"]["decode"]["timings_tok_s"]
        < report["resident_c1"]["decode"]["timings_tok_s"] / 10
    )


def test_promtool_test_is_generated_from_the_fixture(tmp_path: Path) -> None:
    _, cases = analyse(RUN)
    assert PROMTOOL_TEST.read_text() == promtool_document(cases), (
        "regenerate: python bench/gpu_report.py "
        + str(RUN.relative_to(ROOT))
        + " --promtool-test prometheus/tests/h200-captured-test.yml"
    )
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/install.sh"
    proc = subprocess.run(
        [promtool, "test", "rules", str(PROMTOOL_TEST)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
