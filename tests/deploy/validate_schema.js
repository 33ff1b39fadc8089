// Validates Kubernetes objects against the JSON schemas of the npm package kubernetes-models
// (4.5.1 runs on Node 20): required fields, types, enums. It does not reject unknown fields; the
// Python walker does. Reads [{"where": ..., "object": {...}}] on stdin and prints
// [{"where": ..., "error": ...}] on stdout. `--probe` prints the package's version, or exits 3
// when the package cannot be found (NODE_PATH is searched).
"use strict";

function findPackage() {
  try {
    return require("kubernetes-models/package.json").version;
  } catch (error) {
    return null;
  }
}

function modelFor(apiVersion, kind) {
  const slash = apiVersion.indexOf("/");
  const module = slash < 0 ? `kubernetes-models/${apiVersion}`
                           : `kubernetes-models/${apiVersion.slice(0, slash)}/${apiVersion.slice(slash + 1)}`;
  try {
    return require(module)[kind] || null;
  } catch (error) {
    return null;
  }
}

const version = findPackage();
if (process.argv.includes("--probe")) {
  if (version === null) process.exit(3);
  console.log(version);
  process.exit(0);
}
if (version === null) {
  console.error("kubernetes-models is not installed");
  process.exit(3);
}

let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const errors = [];
  for (const { where, object } of JSON.parse(input)) {
    const Model = modelFor(String(object.apiVersion), String(object.kind));
    if (Model === null) {
      errors.push({ where, error: `kubernetes-models ${version} has no schema for ${object.apiVersion} ${object.kind}` });
      continue;
    }
    try {
      new Model(object).validate();
    } catch (error) {
      const details = (error.errors || []).map((e) => `${e.instancePath || "/"} ${e.message}` +
        (e.params && e.params.missingProperty ? ` (${e.params.missingProperty})` : ""));
      errors.push({ where, error: details.length ? details.join("; ") : String(error.message) });
    }
  }
  console.log(JSON.stringify(errors));
});
