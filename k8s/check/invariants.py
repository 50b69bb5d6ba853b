#!/usr/bin/env python3
"""The deployment's own rules, checked on each overlay's built manifests.

    invariants.py BUILT.yaml...

What a schema cannot know: stage replicas within the partitions of topology/, static
membership that survives a restart (grace < kafka.session_timeout), the API's grace covering
its drain, probes on the endpoints the processes serve, non-root read-only containers with
requests and limits, and secrets by reference only.
"""
import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPOLOGY = tomllib.loads((ROOT / "topology" / "topology.toml").read_text())
CLUSTER = tomllib.loads((ROOT / "config" / "kubernetes.toml").read_text())
DEFAULTS = tomllib.loads((ROOT / "config" / "default.toml").read_text())
SECRET_VARS = {"LIKES__API__SESSION_KEY", "LIKES__API__ADMIN_TOKEN"}


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    assert m, text
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60}[m[2]]


def pod_spec(doc):
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def overlay_images(kustomization):
    """The overlay's `images:` for likes, or its parent overlay's (a region overlay is prod's)."""
    k = yaml.safe_load(kustomization.read_text())
    named = [i for i in k.get("images", []) if i["name"] == "likes"]
    if named:
        return named
    for r in k.get("resources", []):
        parent = (kustomization.parent / r / "kustomization.yaml").resolve()
        if parent.parent.parent.name == "overlays" and parent.exists():
            return overlay_images(parent)
    return []


def check(path):
    problems = []
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    fail = lambda what: problems.append(f"{path.name}: {what}")
    session = seconds(CLUSTER["kafka"]["session_timeout"])

    # Every container runs the image its overlay names (an `images:` entry anywhere else,
    # the base's once, renames it first and the overlay's then matches nothing).
    overlay = ROOT / "k8s" / "overlays" / path.stem / "kustomization.yaml"
    if overlay.exists():
        named = overlay_images(overlay)
        if not named:
            fail("the overlay names no image for `likes`")
        else:
            want = named[0]["newName"] + (f"@{named[0]['digest']}" if "digest" in named[0] else f":{named[0]['newTag']}")
            for d in docs:
                spec = pod_spec(d)
                for c in (spec or {}).get("containers", []):
                    if c["image"] != want:
                        fail(f"{d['kind']}/{d['metadata']['name']}/{c['name']}: runs {c['image']}, the overlay names {want}")

    # With home regions, the API forwards writes to the other regions' APIs: a default-deny
    # egress must let it reach their ports, or every forward is dropped.
    env = next((d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].startswith("likes-env")), {})
    peers = env.get("LIKES__REGION__PEERS")
    # Forwards carry users' session tokens: between regions they go over TLS, in every
    # overlay built on prod (issue 44).
    if peers and path.stem != "dev" and "http://" in peers:
        fail(f"LIKES__REGION__PEERS names an http:// peer ({peers}): forwards carry session "
             "tokens; use https:// with the region-tls component")
    if peers and path.stem != "dev" and "https://" in peers:
        api = by.get(("Deployment", "likes-api"))
        names = {e["name"] for e in (pod_spec(api) or {}).get("containers", [{}])[0].get("env", [])} if api else set()
        if "LIKES__REGION__PEER_CA" not in names and "LIKES__REGION__PEER_CA" not in env:
            fail("https:// peers without LIKES__REGION__PEER_CA: the forward would trust no CA")
    if peers:
        ports = {int(m) for m in re.findall(r"https?://[^\"/]+:(\d+)", peers)}
        egress = [d for d in docs if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"].get("policyTypes", [])]
        api_labels = {"app.kubernetes.io/name": "likes-api", "app.kubernetes.io/part-of": "likes"}
        for port in ports:
            let_out = any(
                all(api_labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())
                and any(not rule.get("ports") or any(x.get("port") == port for x in rule["ports"])
                        for rule in p["spec"].get("egress", []))
                for p in egress)
            if egress and not let_out:
                fail(f"likes-api forwards to region peers on port {port} (LIKES__REGION__PEERS), "
                     "and no NetworkPolicy lets it out")

    for stage, topic in (("likes-dedupe", "events"), ("likes-count", "deltas")):
        sts = by.get(("StatefulSet", stage))
        if not sts:
            fail(f"no StatefulSet {stage}")
            continue
        parts = TOPOLOGY["topics"][topic]["partitions"]
        if sts["spec"]["replicas"] > parts:
            fail(f"{stage}: {sts['spec']['replicas']} replicas > {parts} partitions of {topic}")
        spec = pod_spec(sts)
        if spec["terminationGracePeriodSeconds"] >= session:
            fail(f"{stage}: grace {spec['terminationGracePeriodSeconds']} s >= session_timeout {session} s"
                 " (a restart would rebalance)")
        env = {e["name"]: e for e in spec["containers"][0].get("env", [])}
        ref = env.get("LIKES__DEDUPE__INSTANCE_ID", {}).get("valueFrom", {}).get("fieldRef", {})
        if ref.get("fieldPath") != "metadata.name":
            fail(f"{stage}: instance id is not the pod's stable name")
    if ("StatefulSet", "likes-dedupe") in by and not by[("StatefulSet", "likes-dedupe")]["spec"].get("volumeClaimTemplates"):
        fail("likes-dedupe: no volume for RocksDB")

    api = by.get(("Deployment", "likes-api"))
    if api:
        spec = pod_spec(api)
        c = spec["containers"][0]
        drain = (c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
                 + seconds(DEFAULTS["api"]["write_deadline"]) + seconds(DEFAULTS["cql"]["request_timeout"]))
        if spec["terminationGracePeriodSeconds"] < drain:
            fail(f"likes-api: grace {spec['terminationGracePeriodSeconds']} s < drain {drain} s")
        if c["readinessProbe"]["httpGet"]["path"] != "/readyz" or c["livenessProbe"]["httpGet"]["path"] != "/healthz":
            fail("likes-api: readiness must be /readyz and liveness /healthz")
        hpa = by.get(("HorizontalPodAutoscaler", "likes-api"))
        if not hpa or hpa["spec"]["scaleTargetRef"]["name"] != "likes-api":
            fail("likes-api: no HPA")
        if ("PodDisruptionBudget", "likes-api") not in by:
            fail("likes-api: no PodDisruptionBudget")

    for d in docs:
        if d["kind"] == "Secret":
            fail(f"Secret/{d['metadata']['name']} is in the manifests: reference secrets, never ship them")
        spec = pod_spec(d)
        if spec is None:
            continue
        name = f"{d['kind']}/{d['metadata']['name']}"
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            fail(f"{name}: runAsNonRoot is not set")
        if spec.get("automountServiceAccountToken") is not False:
            fail(f"{name}: mounts a service account token it does not use")
        for c in spec["containers"]:
            sc = c.get("securityContext", {})
            if not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation") is not False:
                fail(f"{name}/{c['name']}: root filesystem writable or privilege escalation allowed")
            res = c.get("resources", {})
            if not all(k in res.get(w, {}) for w in ("requests", "limits") for k in ("cpu", "memory")):
                fail(f"{name}/{c['name']}: cpu and memory requests and limits are required")
            args = c.get("args", [])
            if "/etc/likes/likes.toml" not in args:
                fail(f"{name}/{c['name']}: does not load the likes-config layer")
            mounts = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts", [])]
            for flag in ("--config", "--topology"):
                if flag in args:
                    file = args[args.index(flag) + 1]
                    if not any(file.startswith(m) for m in mounts):
                        fail(f"{name}/{c['name']}: {flag} {file} is on no mounted volume")
            # A volume mounted inside a read-only ConfigMap volume may fail to mount.
            for a in mounts:
                for b in mounts:
                    if a != b and b.startswith(a):
                        fail(f"{name}/{c['name']}: {b} is mounted inside {a}")
            for e in c.get("env", []):
                if e["name"] in SECRET_VARS and "secretKeyRef" not in e.get("valueFrom", {}):
                    fail(f"{name}/{c['name']}: {e['name']} is not from a Secret")
    return problems


def main(paths):
    problems = [p for path in paths for p in check(pathlib.Path(path))]
    for p in problems:
        print(f"FAIL {p}")
    print(f"deployment rules: {len(paths)} overlays, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
