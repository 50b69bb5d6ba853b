#!/usr/bin/env python3
"""What `make k8s-e2e` asks the control plane once an overlay is applied (k8s/e2e/e2e.sh).

    checks.py NAMESPACE BUILT.json workloads|policies|rbac

Reads the live objects with kubectl (KUBECTL, KUBECONFIG from the environment) and compares
them with the built manifest. Every failure names the object and why; the exit code is the
number of failures (0: all held).

- workloads: every Deployment and StatefulSet has all its pods scheduled on kwok nodes and
  Ready; each StatefulSet's claims exist and are Bound; the HPA found its target and holds it
  at minReplicas or more; each PDB's selector matches the pods of the workload it guards and
  nothing else; each Service has a ready endpoint per pod it selects.
- policies: each NetworkPolicy selects the pods it says it does (CLAIMS below), every port a
  pod serves is let in by some policy, and the peers the prod egress names are the labels
  the operators give the pods of the ScyllaCluster and the Kafka of the KafkaTopics.
- rbac: the ServiceAccount can do nothing with the Kubernetes API (no likes process talks
  to it; k8s/base/serviceaccount.yaml), and mounts no token.
"""
import json
import os
import subprocess
import sys

KUBECTL = os.environ.get("KUBECTL", "kubectl")
failures = []


def fail(obj, why):
    failures.append(f"{obj}: {why}")
    print(f"FAIL {obj}: {why}")


def ok(obj, what):
    print(f"ok   {obj}: {what}")


def kubectl(*args, check=True):
    out = subprocess.run([KUBECTL, *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out


def get(ns, kind):
    return json.loads(kubectl("-n", ns, "get", kind, "-o", "json").stdout)["items"]


def matches(selector, labels):
    """A LabelSelector (matchLabels and matchExpressions) against a label map."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def live_pods(ns):
    """Pods of the workloads (Job pods that finished are not what a policy guards)."""
    return [p for p in get(ns, "pods") if p["status"].get("phase") == "Running"]


def name_of(pod):
    return pod["metadata"]["labels"].get("app.kubernetes.io/name", pod["metadata"]["name"])


def ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def workloads(ns, built):
    pods = live_pods(ns)
    nodes = {n["metadata"]["name"] for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
             if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"}
    for kind in ("deployments", "statefulsets"):
        for w in get(ns, kind):
            obj = f"{kind[:-1]}/{w['metadata']['name']}"
            want = w["spec"].get("replicas", 1)
            mine = [p for p in pods if matches(w["spec"]["selector"], p["metadata"]["labels"])]
            unscheduled = [p["metadata"]["name"] for p in mine if p["spec"].get("nodeName") not in nodes]
            not_ready = [p["metadata"]["name"] for p in mine if not ready(p)]
            if len(mine) != want or unscheduled or not_ready or w["status"].get("readyReplicas", 0) != want:
                fail(obj, f"{len(mine)} pods of {want} (not on a kwok node: {unscheduled}, not Ready: "
                          f"{not_ready}, readyReplicas {w['status'].get('readyReplicas', 0)})")
            else:
                ok(obj, f"{want} pods scheduled on kwok nodes and Ready")
            for tmpl in w["spec"].get("volumeClaimTemplates", []):
                pvcs = {c["metadata"]["name"]: c for c in get(ns, "pvc")}
                for i in range(want):
                    claim = f"{tmpl['metadata']['name']}-{w['metadata']['name']}-{i}"
                    c = pvcs.get(claim)
                    if c is None or c["status"].get("phase") != "Bound":
                        fail(obj, f"claim {claim} is {'missing' if c is None else c['status'].get('phase')}")
                if all(pvcs.get(f"{tmpl['metadata']['name']}-{w['metadata']['name']}-{i}", {})
                       .get("status", {}).get("phase") == "Bound" for i in range(want)):
                    ok(obj, f"{want} claims '{tmpl['metadata']['name']}' Bound "
                            f"({tmpl['spec']['resources']['requests']['storage']} each)")

    deployments = {d["metadata"]["name"]: d for d in get(ns, "deployments")}
    for h in get(ns, "hpa"):
        obj = f"hpa/{h['metadata']['name']}"
        target = h["spec"]["scaleTargetRef"]
        conds = {c["type"]: c for c in h["status"].get("conditions", [])}
        able = conds.get("AbleToScale", {})
        d = deployments.get(target["name"]) if target["kind"] == "Deployment" else None
        if d is None:
            fail(obj, f"its target {target['kind']}/{target['name']} does not exist")
        elif able.get("status") != "True":
            fail(obj, f"cannot scale {target['name']}: {able.get('reason')}: {able.get('message')}")
        elif not (h["spec"]["minReplicas"] <= d["spec"]["replicas"] <= h["spec"]["maxReplicas"]):
            fail(obj, f"{target['name']} has {d['spec']['replicas']} replicas, outside "
                      f"[{h['spec']['minReplicas']}, {h['spec']['maxReplicas']}]")
        else:
            ok(obj, f"scales deployment/{target['name']} (now {d['spec']['replicas']}, "
                    f"min {h['spec']['minReplicas']}, max {h['spec']['maxReplicas']}); "
                    f"no metrics server here, so ScalingActive is {conds.get('ScalingActive', {}).get('status')}")

    owners = {w["metadata"]["name"]: w for k in ("deployments", "statefulsets") for w in get(ns, k)}
    for pdb in get(ns, "pdb"):
        obj = f"pdb/{pdb['metadata']['name']}"
        guarded = owners.get(pdb["metadata"]["name"])
        selected = {p["metadata"]["name"] for p in pods if matches(pdb["spec"]["selector"], p["metadata"]["labels"])}
        theirs = {p["metadata"]["name"] for p in pods
                  if guarded and matches(guarded["spec"]["selector"], p["metadata"]["labels"])}
        expected = pdb["status"].get("expectedPods", 0)
        if guarded is None:
            fail(obj, "no Deployment or StatefulSet of the same name to guard")
        elif not selected or selected != theirs or expected != len(theirs):
            fail(obj, f"selects {sorted(selected)}, the workload's pods are {sorted(theirs)}, "
                      f"the disruption controller expects {expected}")
        else:
            ok(obj, f"guards the {len(theirs)} pods of {guarded['kind'].lower()}/{guarded['metadata']['name']} "
                    f"(disruptionsAllowed {pdb['status'].get('disruptionsAllowed')})")

    slices = get(ns, "endpointslices")
    for svc in get(ns, "services"):
        obj = f"service/{svc['metadata']['name']}"
        sel = svc["spec"].get("selector")
        if not sel:
            continue
        selected = [p for p in pods if all(p["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        endpoints = [e for s in slices if s["metadata"]["labels"].get("kubernetes.io/service-name") == svc["metadata"]["name"]
                     for e in s.get("endpoints") or [] if e.get("conditions", {}).get("ready")]
        if not selected or len(endpoints) != len(selected):
            fail(obj, f"selects {len(selected)} pods, {len(endpoints)} ready endpoints")
        else:
            ok(obj, f"{len(endpoints)} ready endpoints, one per selected pod")


# What each NetworkPolicy says it selects (its comment in k8s/overlays/*/networkpolicies.yaml),
# as the app.kubernetes.io/name of the running pods.
EVERY = {"likes-api", "likes-relay", "likes-dedupe", "likes-count"}
CLAIMS = {
    "likes-default-deny": EVERY,
    "likes-api-ingress": {"likes-api"},
    "likes-metrics-ingress": EVERY,
    "likes-egress": EVERY,
    "likes-ingress": EVERY,
    # The region overlays: the API forwards writes of the other region's items.
    "likes-api-forward-egress": {"likes-api"},
}


def allows(policy, port):
    if "Ingress" not in policy["spec"].get("policyTypes", ["Ingress"]):
        return False
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if not ports or any(p.get("port") in (port["containerPort"], port.get("name")) for p in ports):
            return True
    return False


def policies(ns, built):
    pods = live_pods(ns)
    pols = get(ns, "networkpolicies")
    for pol in pols:
        obj = f"networkpolicy/{pol['metadata']['name']}"
        got = {name_of(p) for p in pods if matches(pol["spec"]["podSelector"], p["metadata"]["labels"])}
        claim = CLAIMS.get(pol["metadata"]["name"])
        if claim is None:
            fail(obj, "has no claim in k8s/e2e/checks.py CLAIMS: say which pods it is for")
        elif got != claim:
            fail(obj, f"selects {sorted(got)}, says it is for {sorted(claim)}")
        else:
            ok(obj, f"selects {sorted(got)}")
    for p in pods:
        for c in p["spec"]["containers"]:
            for port in c.get("ports", []):
                letting = [pol["metadata"]["name"] for pol in pols
                           if matches(pol["spec"]["podSelector"], p["metadata"]["labels"]) and allows(pol, port)]
                if not letting:
                    fail(f"pod/{p['metadata']['name']}", f"serves {port.get('name')}/{port['containerPort']}, "
                                                         f"which no NetworkPolicy lets in")
    # The egress peers are pods the operators label: they must be the clusters this overlay names.
    scylla = {d["metadata"]["name"] for d in built if d.get("kind") == "ScyllaCluster"}
    kafka = {d["metadata"]["labels"]["strimzi.io/cluster"] for d in built if d.get("kind") == "KafkaTopic"}
    for pol in pols:
        for rule in pol["spec"].get("egress") or []:
            for peer in rule.get("to") or []:
                labels = (peer.get("podSelector") or {}).get("matchLabels") or {}
                for key, known in (("scylla/cluster", scylla), ("strimzi.io/cluster", kafka)):
                    if key in labels:
                        obj = f"networkpolicy/{pol['metadata']['name']}"
                        if labels[key] not in known:
                            fail(obj, f"egress to {key}={labels[key]}, but the overlay's cluster is {sorted(known)}")
                        else:
                            ok(obj, f"egress to {key}={labels[key]}, the overlay's own cluster")


def rbac(ns, built):
    sa = f"system:serviceaccount:{ns}:likes"
    asks = [("get", "pods"), ("list", "secrets"), ("get", "configmaps"), ("create", "jobs"),
            ("patch", "statefulsets"), ("get", "leases"), ("list", "nodes"), ("create", "pods/exec")]
    for verb, res in asks:
        out = kubectl("auth", "can-i", verb, res, "-n", ns, "--as", sa, check=False)
        if out.stdout.strip() != "no":
            fail(f"serviceaccount/likes", f"can {verb} {res}: no likes process talks to the Kubernetes API")
    if not failures:
        ok("serviceaccount/likes", f"can do none of {len(asks)} asks ({', '.join(v + ' ' + r for v, r in asks)})")
    for d in get(ns, "serviceaccounts"):
        if d["metadata"]["name"] == "likes" and d.get("automountServiceAccountToken") is not False:
            fail("serviceaccount/likes", "mounts a token into every pod")
    for p in get(ns, "pods"):
        mounted = [v["name"] for v in p["spec"].get("volumes", []) if "projected" in v]
        if mounted:
            fail(f"pod/{p['metadata']['name']}", f"has a token volume {mounted}")


if __name__ == "__main__":
    namespace, built_file, what = sys.argv[1:4]
    built = json.load(open(built_file))
    {"workloads": workloads, "policies": policies, "rbac": rbac}[what](namespace, built)
    sys.exit(min(len(failures), 100))
