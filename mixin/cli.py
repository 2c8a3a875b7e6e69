"""`python -m mixin`: write every output of the monitoring mixin, or `--check` them.

The outputs, relative to the output root (the repository by default):
prometheus/rules/{recording,verdict,alerts}.yml, prometheus/thresholds.md, the verdict
table of docs/diagnose.md (between its `verdicts` markers), grafana/dashboards/*.json and
deploy/kubernetes/{prometheusrule,grafana-dashboards}.yaml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mixin import config, docs
from mixin.dashboards import DASHBOARDS_DIR, dashboard_files
from mixin.kubernetes import manifest_files
from mixin.rules import rule_files

# The checkout this package lives in: where the outputs are committed. An installed wheel
# has no checkout around it; there --out is required.
REPO = Path(__file__).resolve().parent.parent
IN_CHECKOUT = (REPO / "pyproject.toml").is_file() and (REPO / "mixin").is_dir()


def outputs(cfg: config.MixinConfig, root: Path = REPO) -> dict[str, str]:
    """Path relative to `root` -> content of every generated file.

    docs/diagnose.md is hand-written around its generated block: the copy under `root`
    is the base, else the repository's; with neither (an installed wheel writing into an
    empty folder) it is not an output.
    """
    rules = rule_files(cfg)
    dashboards = dashboard_files(cfg)
    files = {**rules, docs.THRESHOLDS_DOC: docs.render_thresholds()}
    for base in (root / docs.DIAGNOSE_DOC, REPO / docs.DIAGNOSE_DOC):
        if base.is_file():
            current = base.read_text(encoding="utf-8")
            files[docs.DIAGNOSE_DOC] = docs.render_diagnose_doc(current)
            break
    return {**files, **dashboards, **manifest_files(cfg, rules, dashboards)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mixin",
        description="Generate the Prometheus rules, alerts, threshold docs, Grafana dashboards "
        "and Kubernetes manifests from the decision core and the mixin config.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name every output that is missing or differs",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML settings merged over mixin/config.yaml (only the keys you change; "
        "see mixin/config.py)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        default=REPO if IN_CHECKOUT else None,
        help="root the outputs are written to or checked in (default: the repository "
        "checkout this package is in; required outside one)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Write (or check) every output; 0 when all are fresh or written, 1 when stale, 2 on
    a bad config."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("not run from a checkout of llm-bottleneck: give --out DIR")
    try:
        cfg = config.load(args.config)
        files = outputs(cfg, args.out)
    except (config.ConfigError, docs.DocError) as exc:
        print(f"python -m mixin: {exc}", file=sys.stderr)
        return 2
    stale = []
    for rel, content in files.items():
        path = args.out / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == content:
            continue
        if args.check:
            stale.append(rel)
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content, encoding="utf-8")
            except OSError as exc:
                print(f"python -m mixin: cannot write {path}: {exc.strerror}", file=sys.stderr)
                return 2
            print(f"wrote {rel}")
    extra = sorted(
        f"{DASHBOARDS_DIR}/{p.name}"
        for p in (args.out / DASHBOARDS_DIR).glob("*.json")
        if f"{DASHBOARDS_DIR}/{p.name}" not in files
    )
    if extra:
        print("dashboards not made by the mixin:", *extra, sep="\n  ", file=sys.stderr)
    if stale:
        print("stale (run python -m mixin):", *stale, sep="\n  ", file=sys.stderr)
    return 1 if stale or extra else 0
