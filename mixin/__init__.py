"""The monitoring mixin: Prometheus rules and alerts, Grafana dashboards and Kubernetes
manifests, generated from the decision core and one config (`mixin/config.yaml`).

`python -m mixin` writes every output where users expect it (prometheus/rules/,
prometheus/thresholds.md, the verdict table of docs/diagnose.md, grafana/dashboards/,
deploy/kubernetes/); `--check` exits 1 and names the stale files.
"""
