#!/usr/bin/env bash
# `make alerts-check`: the PrometheusRule's spec as a Prometheus rule file, then
# `promtool check rules` (syntax, PromQL; the Grafana dashboard's queries too) and
# `promtool test rules` (alerts-test.yaml: each alert fires on the series it is for, and the
# SLO alerts stay quiet within budget).
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
# The dashboard's queries, parsed by promtool as recording rules (a typo in a panel fails).
"$python" - ../components/monitoring/dashboard.json "$work/dashboard.rules.yaml" <<'PY'
import json, sys, yaml
dash = json.load(open(sys.argv[1]))
rules = [{"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": t["expr"]}
         for p in dash["panels"] for t in p["targets"]]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
PY
cp alerts-test.yaml "$work/"
"$promtool" check rules "$work/likes.rules.yaml" "$work/dashboard.rules.yaml"
"$promtool" test rules "$work/alerts-test.yaml"
