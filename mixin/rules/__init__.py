"""The Prometheus rule files, generated from the decision core and the mixin config.

recording.py and roofline.py hold the signals, verdict.py the conditions and the verdict,
alerts.py the alerts; `rule_files` renders the three files of prometheus/rules/.
"""

from __future__ import annotations

from mixin.config import MixinConfig
from mixin.rules.alerts import alert_rules
from mixin.rules.common import render_rules
from mixin.rules.recording import recording_rules
from mixin.rules.verdict import verdict_rules

RULES_DIR = "prometheus/rules"


def rule_files(cfg: MixinConfig) -> dict[str, str]:
    """Repository path -> text of every rule file, in evaluation order."""
    return {
        f"{RULES_DIR}/recording.yml": render_rules(recording_rules()),
        f"{RULES_DIR}/verdict.yml": render_rules(verdict_rules()),
        f"{RULES_DIR}/alerts.yml": render_rules(alert_rules(cfg)),
    }
