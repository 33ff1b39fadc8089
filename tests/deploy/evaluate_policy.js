// Evaluates the CEL of ValidatingAdmissionPolicies against pods, as the API server would at pod
// creation: `object` is the pod, `variables` the policy's variables in their order; a pod is
// denied by the first validation that is false. Uses the npm package @marcbachmann/cel-js
// (standard CEL; Kubernetes' CEL libraries beyond it are not available, and the policies here
// need none). Reads {"policies": [...], "pods": [{"where", "object"}]} on stdin and prints
// [{"where", "policy", "denied": null | message}]. `--probe` prints the package's version, or
// exits 3 when it cannot be found (NODE_PATH is searched).
"use strict";
const fs = require("fs");
const path = require("path");
const { pathToFileURL } = require("url");

function resolvePackage() {
  try {
    // Its package.json is not among its exports: read it from the directory above lib/.
    const entry = require.resolve("@marcbachmann/cel-js");
    const manifest = path.join(path.dirname(path.dirname(entry)), "package.json");
    return { entry, version: JSON.parse(fs.readFileSync(manifest, "utf8")).version };
  } catch (error) {
    return null;
  }
}

function matchesPods(policy) {
  const rules = ((policy.spec || {}).matchConstraints || {}).resourceRules || [];
  return rules.some((rule) => (rule.resources || []).includes("pods") &&
    (rule.operations || []).some((op) => op === "CREATE" || op === "*"));
}

async function main() {
  const found = resolvePackage();
  if (process.argv.includes("--probe")) {
    if (found === null) process.exit(3);
    console.log(found.version);
    return;
  }
  if (found === null) {
    console.error("@marcbachmann/cel-js is not installed");
    process.exit(3);
  }
  const { evaluate } = await import(pathToFileURL(found.entry).href);
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const { policies, pods } = JSON.parse(input);
  const results = [];
  for (const { where, object } of pods) {
    for (const policy of policies) {
      if (!matchesPods(policy)) continue;
      const name = policy.metadata.name;
      let denied = null;
      try {
        const variables = {};
        for (const variable of policy.spec.variables || []) {
          variables[variable.name] = evaluate(variable.expression, { object, variables });
        }
        for (const validation of policy.spec.validations || []) {
          const allowed = evaluate(validation.expression, { object, variables });
          if (allowed !== true) {
            denied = validation.message || validation.expression;
            break;
          }
        }
      } catch (error) {
        denied = `CEL error: ${error.message}`;
      }
      results.push({ where, policy: name, denied });
    }
  }
  console.log(JSON.stringify(results));
}

main().catch((error) => {
  console.error(String(error && error.stack || error));
  process.exit(1);
});
