// Validates every document of Kubernetes YAML files against the Kubernetes
// API schemas (npm's kubernetes-models, installed by scripts/setup.sh into
// tools/npm). Prints one line per document; exits 1 when any is invalid or of
// a kind it has no schema for.
//   node tests/deploy/validate_k8s.mjs tools/npm FILE...
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [npmDir, ...files] = process.argv.slice(2);
const modules = path.resolve(npmDir, "node_modules");
const load = (rel) => import(pathToFileURL(path.join(modules, rel)).href);
const yaml = (await load("js-yaml/dist/js-yaml.mjs")).default;

// apiVersion -> the kubernetes-models folder holding its kinds.
function folderOf(apiVersion) {
  return apiVersion.includes("/") ? apiVersion : `v1`;
}

let bad = 0;
for (const file of files) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    const where = `${path.basename(file)}: ${doc.kind} ${doc.metadata?.name ?? "?"}`;
    let models;
    try {
      models = await load(`kubernetes-models/${folderOf(doc.apiVersion)}/index.mjs`);
    } catch (e) {
      console.log(`${where}: no schema for apiVersion ${doc.apiVersion}`);
      bad++;
      continue;
    }
    const Kind = models[doc.kind];
    if (Kind === undefined) {
      console.log(`${where}: no schema for kind ${doc.kind} in ${doc.apiVersion}`);
      bad++;
      continue;
    }
    try {
      new Kind(doc).validate();
      console.log(`${where}: valid`);
    } catch (e) {
      console.log(`${where}: INVALID: ${e.message}`);
      bad++;
    }
  }
}
process.exit(bad === 0 ? 0 : 1);
