#!/usr/bin/env python3
"""Checks the file tree scripts/package ships (its tarball unpacked at ROOT) as a node would get it.

  - everything lies under usr/local, and the programs, the stub and the package list are there;
  - no ELF file carries a run path (it would point into the build tree) or debug sections;
  - every shared library a shipped ELF file names as NEEDED (found where ldd resolves it on this
    Debian 12 machine, the image's base) belongs to a Debian package the list names, so the image
    that installs those packages (and, through apt, what they depend on) can run what it holds.
    A library ldd cannot find is a violation too.

Prints every violation and exits 1 when there is one. Uses binutils' readelf, ldd and dpkg-query.
"""
import argparse
import os
import re
import subprocess
import sys

PREFIX = "usr/local"
REQUIRED = [
    "usr/local/bin/gpuproxyd",
    "usr/local/bin/gpuproxyctl",
    "usr/local/lib/gpuproxy/libcuda.so.1",
    "usr/local/share/gpuproxy/runtime-packages",
]


def is_elf(path):
    with open(path, "rb") as file:
        return file.read(4) == b"\x7fELF"


def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True)


def owning_package(library):
    """The Debian package that installed `library`, trying the paths usrmerge may register."""
    real = os.path.realpath(library)
    candidates = [library, real]
    for path in (library, real):
        if path.startswith("/usr/"):
            candidates.append(path[len("/usr"):])
        else:
            candidates.append("/usr" + path)
    for candidate in candidates:
        found = run("dpkg-query", "--search", candidate)
        if found.returncode == 0:
            return found.stdout.split(":")[0].strip()
    return None


def needed_libraries(path):
    """(name, resolved path or None) for every library `path` itself names as NEEDED: the
    packages of those depend on the packages of the rest."""
    resolved = {}
    for line in run("ldd", path).stdout.splitlines():
        line = line.strip()
        if "=>" not in line:
            continue  # the vDSO and the dynamic loader itself
        name, _, rest = line.partition("=>")
        where = rest.split("(")[0].strip()
        resolved[name.strip()] = None if where in ("", "not found") else where
    dynamic = run("readelf", "--wide", "--dynamic", path).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    return [(name, resolved.get(name)) for name in needed if not name.startswith("ld-linux")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="where the tarball was unpacked")
    parser.add_argument("packages", help="deploy/image/runtime-packages")
    arguments = parser.parse_args()

    violations = []
    listed = {line.strip() for line in open(arguments.packages) if line.strip()}
    root = os.path.abspath(arguments.root)
    for required in REQUIRED:
        if not os.path.lexists(os.path.join(root, required)):
            violations.append(f"{required} is missing")

    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if not relative.startswith(PREFIX + "/"):
                violations.append(f"{relative} lies outside {PREFIX}")
            if os.path.islink(path) or not is_elf(path):
                continue
            dynamic = run("readelf", "--wide", "--dynamic", path).stdout
            if "(RPATH)" in dynamic or "(RUNPATH)" in dynamic:
                violations.append(f"{relative} has a run path")
            sections = run("readelf", "--wide", "--section-headers", path).stdout
            if ".debug_info" in sections:
                violations.append(f"{relative} is not stripped")
            for library, resolved in needed_libraries(path):
                if resolved is None:
                    violations.append(f"{relative} needs {library}, which is nowhere")
                    continue
                if os.path.realpath(resolved).startswith(root + "/"):
                    continue
                package = owning_package(resolved)
                if package is None:
                    violations.append(f"{relative} needs {resolved}, which no package installed")
                elif package not in listed:
                    violations.append(f"{relative} needs {library} from {package}, which "
                                      f"{arguments.packages} does not list")

    for violation in violations:
        print(f"check_package: {violation}", file=sys.stderr)
    if not violations:
        print(f"check_package: {root} holds what a node needs; its libraries come from "
              f"{', '.join(sorted(listed))}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
