#!/usr/bin/env bash
# Prints Strimzi's KafkaTopic CustomResourceDefinition (apiextensions.k8s.io/v1, kafka.strimzi.io,
# versions v1beta2 [storage], v1beta1, v1alpha1) on stdout, for the e2e control plane.
# Strimzi publishes the CRD file only on GitHub release pages, which this machine cannot reach, so it
# is generated the way Strimzi's own build does (api/pom.xml, exec-maven-plugin, same arguments): by
# running io.strimzi:crd-generator's CrdGenerator over io.strimzi:api's KafkaTopic model class, both
# resolved from Maven Central by ./pom.xml. The result is cached; later runs are instant and offline.
#   k8s/e2e/strimzi/crd.sh > kafkatopic-crd.yaml   (needs mvn + java on a cold cache)
set -euo pipefail
cd "$(dirname "$0")"
VERSION=0.45.0 # crd-generator and api, same release
TOOLS=${LIKES_CACHE:-$HOME/.cache/likes}/tools
OUT=$TOOLS/strimzi-crd-$VERSION.yaml
if [[ ! -s $OUT ]]; then
  mkdir -p "$TOOLS" && tmp=$(mktemp -d "$TOOLS/.strimzi-crd.XXXXXX") && trap 'rm -rf "$tmp"' EXIT
  echo "strimzi-crd: generating KafkaTopic CRD with io.strimzi:crd-generator:$VERSION ..." >&2
  mvn -q -B -f pom.xml -Dstrimzi.version="$VERSION" -Dmaven.repo.local="$TOOLS/m2" \
    dependency:build-classpath -Dmdep.outputFile="$tmp/cp" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  # slf4j's "no binding" warning is noise: show the generator's stderr only if it fails.
  java -cp "$(cat "$tmp/cp")" io.strimzi.crdgenerator.CrdGenerator \
    --label app:strimzi --label strimzi.io/crd-install:true --target-kube 1.16+ \
    --crd-api-version v1 --api-versions v1alpha1,v1beta1,v1beta2 --storage-version v1beta2 \
    --yaml "io.strimzi.api.kafka.model.topic.KafkaTopic=$tmp/crd.yaml" 2>"$tmp/log" ||
    { cat "$tmp/log" >&2; exit 1; }
  mv "$tmp/crd.yaml" "$OUT"
fi
cat "$OUT"
