// Validates the KafkaTopic resources of built manifests with Strimzi's schema, as the npm
// package @kubernetes-models/strimzi-kafka-operator compiles it from Strimzi's released CRDs
// (no registry here serves the CRD file itself).
//   node kafka_topics.mjs NODE_PREFIX BUILT.json
import { readFileSync } from "node:fs";

const [prefix, file] = process.argv.slice(2);
const mod = `${prefix}/node_modules/@kubernetes-models/strimzi-kafka-operator/kafka.strimzi.io/v1beta2/KafkaTopic.js`;
const { KafkaTopic } = await import(mod);
let failures = 0;
let checked = 0;
for (const doc of JSON.parse(readFileSync(file, "utf8"))) {
  if (doc.kind !== "KafkaTopic") continue;
  checked++;
  try {
    new KafkaTopic(doc).validate();
    console.log(`ok   ${file}: KafkaTopic/${doc.metadata.name} against Strimzi's KafkaTopic v1beta2`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${file}: KafkaTopic/${doc.metadata.name}: ${e.message}`);
  }
}
console.log(`kafka topics: ${checked} checked, ${failures} problems`);
process.exit(failures ? 1 : 0);
