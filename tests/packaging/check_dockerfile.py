#!/usr/bin/env python3
"""Checks deploy/image/Dockerfile against what the tests check, without building it (no container
runtime or image registry is reachable where the tests run):

  - its final stage starts from this machine's Debian release: packaging_contents checks the
    runtime package list against this machine's packages, so that is the release it holds for;
  - the final stage installs that list and unpacks the tarball that scripts/package made in the
    build stage, at /;
  - what it copies from the build context exists, and .dockerignore keeps the build trees out.

Prints every violation and exits 1 when there is one.
"""
import argparse
import os
import re
import sys


def instructions(path):
    """(keyword, arguments) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", open(path).read())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the repository's root")
    arguments = parser.parse_args()
    root = arguments.source
    dockerfile = os.path.join(root, "deploy/image/Dockerfile")
    steps = instructions(dockerfile)
    violations = []

    defaults = {}
    for keyword, rest in steps:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults.setdefault(name, value)
    release = dict(
        line.strip().split("=", 1) for line in open("/etc/os-release") if "=" in line
    ).get("VERSION_CODENAME", "").strip('"')
    stages = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    final = steps[stages[-1]:]
    base = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), final[0][1])
    if base != f"debian:{release}-slim":
        violations.append(f"the final stage starts from {base}, not debian:{release}-slim")

    package_output = None
    for keyword, rest in steps[:stages[-1]]:
        match = re.search(r"scripts/package --output (\S+)", rest)
        if keyword == "RUN" and match:
            package_output = match.group(1)
    if package_output is None:
        violations.append("no build stage runs scripts/package --output FILE")

    final_text = "\n".join(f"{keyword} {rest}" for keyword, rest in final)
    if "COPY deploy/image/runtime-packages" not in final_text or "--arg-file=" not in final_text:
        violations.append("the final stage does not install deploy/image/runtime-packages")
    copied = re.search(r"COPY --from=build (\S+) (\S+)", final_text)
    if not copied or copied.group(1) != package_output:
        violations.append(f"the final stage does not copy the build stage's {package_output}")
    elif not re.search(r"tar -xzf " + re.escape(copied.group(2)) + r" -C / ", final_text):
        violations.append(f"the final stage does not unpack {copied.group(2)} at /")

    for keyword, rest in steps:
        if keyword == "COPY" and not rest.startswith("--from"):
            source = rest.split()[0]
            if not os.path.exists(os.path.join(root, source)):
                violations.append(f"COPY {source}: no such file in the repository")

    ignored = {line.strip() for line in open(os.path.join(root, ".dockerignore"))}
    for tree in ("/build/", "/build-*/"):
        if tree not in ignored:
            violations.append(f".dockerignore does not keep {tree} out of the build context")

    for violation in violations:
        print(f"check_dockerfile: {violation}", file=sys.stderr)
    if not violations:
        print(f"check_dockerfile: {dockerfile} agrees with the tested package (debian:{release})")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
