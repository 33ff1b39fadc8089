#!/usr/bin/env python3
"""Checks that an ELF file loads on an older system than the one it was built on.

  - it needs no shared library but the C library's (and those named with --also-needed);
  - it refers to no glibc symbol version newer than --max-glibc, and to no versioned symbol of
    any other library (GLIBCXX_, CXXABI_, GCC_: the C++ runtime must be linked in);
  - with --version-script, it exports (defines in its dynamic symbol table) only the names that
    script lists as global: no kj::, capnp:: or std:: symbol that could clash with, or replace,
    an application's own.

Prints every violation and exits 1 when there is one. Uses binutils' readelf.
"""
import argparse
import re
import subprocess
import sys

C_LIBRARY = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
}


def readelf(*arguments):
    return subprocess.run(["readelf", "--wide", *arguments], check=True, capture_output=True,
                          text=True).stdout


def version_tuple(text):
    return tuple(int(part) for part in text.split("."))


def exported_names(version_script):
    """The names a linker version script lists under global: (no wildcards expected)."""
    text = re.sub(r"/\*.*?\*/", "", open(version_script).read(), flags=re.S)
    names = set()
    section = None
    for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*:|[^\s;{}]+", text):
        if token in ("global:", "local:"):
            section = token
        elif section == "global:":
            names.add(token)
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("file")
    parser.add_argument("--max-glibc", default="2.28")
    parser.add_argument("--also-needed", action="append", default=[])
    parser.add_argument("--version-script")
    options = parser.parse_args()
    problems = []

    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", options.file))
    for library in needed:
        if library not in C_LIBRARY and library not in options.also_needed:
            problems.append(f"needs {library}, which an image need not have")

    # Which symbols need which version, for the message.
    symbols_by_version = {}
    for line in readelf("--dyn-syms", options.file).splitlines():
        match = re.search(r"\sUND\s+(\S+)@(\S+?)(?:\s+\(\d+\))?$", line)
        if match:
            symbols_by_version.setdefault(match.group(2), []).append(match.group(1))

    maximum = version_tuple(options.max_glibc)
    needed_versions = re.findall(r"Name: (\S+)\s+Flags", readelf("-V", options.file))
    for version in sorted(set(needed_versions)):
        symbols = ", ".join(sorted(symbols_by_version.get(version, []))[:8])
        glibc = re.fullmatch(r"GLIBC_([0-9.]+)", version)
        if glibc:
            if version_tuple(glibc.group(1)) > maximum:
                problems.append(f"refers to {version}, newer than GLIBC_{options.max_glibc}: "
                                f"{symbols}")
        else:  # the C++ runtime's or GCC's, or GLIBC_PRIVATE
            problems.append(f"refers to {version}: {symbols}")

    if options.version_script:
        allowed = exported_names(options.version_script)
        exported = []
        for line in readelf("--dyn-syms", options.file).splitlines():
            fields = line.split()
            # Num: Value Size Type Bind Vis Ndx Name
            if len(fields) >= 8 and fields[0].endswith(":") and fields[6] != "UND":
                if fields[4] in ("GLOBAL", "WEAK", "UNIQUE") and fields[3] != "SECTION":
                    exported.append(fields[7].split("@")[0])
        stray = sorted(set(exported) - allowed)
        if stray:
            problems.append(f"exports {len(stray)} symbols the version script does not list, "
                            f"e.g. {', '.join(stray[:8])}")
        if not exported:
            problems.append("exports nothing")

    for problem in problems:
        print(f"{options.file}: {problem}")
    if not problems:
        print(f"{options.file}: needs {', '.join(needed)}; glibc versions up to "
              f"GLIBC_{options.max_glibc} at most"
              + ("; exports only the version script's names" if options.version_script else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
