#!/usr/bin/env python3
"""Validates the custom resources of built manifests against the vendored CRD schemas.

    crds.py BUILT.yaml...

PrometheusRule, PodMonitor and ScyllaCluster: the openAPIV3Schema of each operator's own CRD
(k8s/schemas/, re-derived by k8s/schemas/vendor.sh), made strict as the API server is
with a structural schema: a field the schema does not name is an error here (the server
would silently prune it). KafkaTopic is checked by kafka_topics.mjs (Strimzi's schema as the
npm package @kubernetes-models/strimzi-kafka-operator compiles it). Any other custom kind
is an error: nothing ships unchecked.
"""
import copy
import json
import pathlib
import sys

import jsonschema
import yaml

SCHEMAS = pathlib.Path(__file__).resolve().parents[1] / "schemas"
KINDS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json",
    ("scylla.scylladb.com/v1", "ScyllaCluster"): "scyllacluster-v1.json",
}
ELSEWHERE = {("kafka.strimzi.io/v1beta2", "KafkaTopic")}
CORE_GROUPS = {"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v2", "networking.k8s.io/v1"}


def strict(schema: dict) -> dict:
    """No unknown fields where the schema lists the fields and does not keep unknown ones."""
    s = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for key in ("properties", "patternProperties"):
            for child in node.get(key, {}).values():
                walk(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            for child in node.get(key, []):
                walk(child)

    walk(s)
    # The object's envelope is the API server's, not the CRD's.
    for key in ("apiVersion", "kind", "metadata"):
        s.setdefault("properties", {}).setdefault(key, {})
    s["properties"]["metadata"] = {"type": "object"}
    return s


def main(paths):
    validators = {k: jsonschema.Draft7Validator(strict(json.load(open(SCHEMAS / f))))
                  for k, f in KINDS.items()}
    failures = checked = 0
    for path in paths:
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = f"{path}: {key[1]}/{doc.get('metadata', {}).get('name')}"
            if key in validators:
                errors = sorted(validators[key].iter_errors(doc), key=lambda e: list(e.path))
                for e in errors:
                    print(f"FAIL {name}: {'/'.join(map(str, e.path)) or '.'}: {e.message}")
                failures += len(errors)
                checked += 1
                if not errors:
                    print(f"ok   {name} against k8s/schemas/{KINDS[key]}")
            elif key not in ELSEWHERE and key[0] not in CORE_GROUPS:
                print(f"FAIL {name}: no schema vendored for {key[0]} {key[1]}")
                failures += 1
    print(f"crds: {checked} custom resources checked, {failures} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
