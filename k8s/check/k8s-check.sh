#!/usr/bin/env bash
# `make k8s-check`: every overlay built with kustomize, then checked offline.
#   1. kubernetes-validate --strict against the Kubernetes 1.30 schemas it ships: every core
#      resource, unknown fields rejected;
#   2. the custom resources against their operators' schemas (crds.py, kafka_topics.mjs);
#   3. the prod KafkaTopics are the topology's (kafka_topics.py, regenerated and compared);
#   4. the deployment's own rules (invariants.py: stage replicas <= partitions, static
#      membership timeouts, probes, non-root, secrets by reference);
#   5. checkov's Kubernetes checks; the skipped ones are explained in checkov.yaml.
# Tools come from tools.sh (cached under ~/.cache/likes/tools).
set -euo pipefail
cd "$(dirname "$0")"
source ./tools.sh
out=${LIKES_CACHE:-$HOME/.cache/likes}/k8s-build
rm -rf "$out"; mkdir -p "$out"
k8s_version=1.30.0
step() { printf '\n== k8s-check: %s\n' "$*"; }

step "kustomize build ($("$KUSTOMIZE" version))"
for overlay in ../overlays/*/; do
  name=$(basename "$overlay")
  "$KUSTOMIZE" build --load-restrictor LoadRestrictionsNone "$overlay" >"$out/$name.yaml"
  "$PY" -c 'import json,sys,yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2],"w"))' \
    "$out/$name.yaml" "$out/$name.json"
  echo "$name: $(grep -c '^kind:' "$out/$name.yaml") resources -> $out/$name.yaml"
done

step "Kubernetes $k8s_version schemas (kubernetes-validate --strict)"
for f in "$out"/*.yaml; do
  # Custom kinds have no schema there (warned, then checked in the next step).
  "$KVALIDATE" --strict --quiet -k "$k8s_version" "$f" 2>&1 | grep -v "Couldn't find schema for kind" || true
  "$KVALIDATE" --strict --quiet --no-warn -k "$k8s_version" "$f"
  echo "$(basename "$f"): every core resource valid"
done

step "custom resources against their operators' schemas"
"$PY" crds.py "$out"/*.yaml
for f in "$out"/*.json; do node kafka_topics.mjs "$NPM_TOOLS" "$f"; done

step "KafkaTopics agree with topology/"
"$PY" kafka_topics.py | diff -u ../components/strimzi-topics/kafka-topics.yaml - \
  || { echo "k8s-check: kafka-topics.yaml is stale: run make k8s-topics"; exit 1; }
echo "kafka-topics.yaml is what topology/topology.toml gives"

step "deployment rules"
"$PY" invariants.py "$out"/*.yaml

step "checkov $("$CHECKOV" --version) (skips explained in k8s/check/checkov*.yaml)"
for f in "$out"/*.yaml; do
  config=checkov.yaml
  [[ -f "checkov-$(basename "$f" .yaml).yaml" ]] && config="checkov-$(basename "$f" .yaml).yaml"
  "$CHECKOV" --config-file "$config" -f "$f"
  echo "$(basename "$f"): no checkov finding left"
done
printf '\nk8s-check: OK\n'
