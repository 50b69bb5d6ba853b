#!/usr/bin/env bash
# `make alerts-check`: the PrometheusRule's spec as a Prometheus rule file, then
# `promtool check rules` (syntax, PromQL) and `promtool test rules` (alerts-test.yaml: each
# alert fires on the series it is for, and the SLO alerts stay quiet within budget).
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
promtool=${PROMTOOL:-promtool}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - ../components/monitoring/prometheusrule.yaml "$work/likes.rules.yaml" <<'PY'
import sys, yaml
rule = yaml.safe_load(open(sys.argv[1]))
assert rule["kind"] == "PrometheusRule", rule["kind"]
yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(sys.argv[2], "w"), sort_keys=False)
PY
cp alerts-test.yaml "$work/"
"$promtool" check rules "$work/likes.rules.yaml"
"$promtool" test rules "$work/alerts-test.yaml"
