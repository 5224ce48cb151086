#!/usr/bin/env python3
"""The licences of everything linked into the parakeet binary for one target, as one text file.

Walks `cargo metadata`'s resolved graph from parakeet over normal (not build or dev)
dependencies for the target, and for each crate writes its name, version, SPDX licence
expression and repository, then the licence files it ships (LICENSE*, COPYING*, NOTICE*,
UNLICENSE*). ggml's MIT licence (llama.cpp, built from source by llama-cpp-sys-2), the GCC
runtime's exception and the built-in Silero VAD weights' MIT licence come first. A crate that ships no licence file is listed with its SPDX
expression only. Usage: scripts/third_party_licenses.py TARGET [FEATURE FLAGS...] > FILE, the
feature flags as cargo takes them (`--no-default-features --features static-runtime`).
"""
import json
import subprocess
import sys
from pathlib import Path

target = sys.argv[1]
cmd = ["cargo", "metadata", "--format-version", "1", "--filter-platform", target, *sys.argv[2:]]
meta = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]

linked, stack = set(), [root]
while stack:
    pid = stack.pop()
    if pid in linked:
        continue
    linked.add(pid)
    for dep in nodes[pid]["deps"]:
        if any(k["kind"] is None for k in dep["dep_kinds"]):
            stack.append(dep["pkg"])
linked.discard(root)

RULE = "-" * 80
LICENCE_PREFIXES = ("license", "licence", "copying", "notice", "unlicense")


def licence_files(pkg):
    d = Path(pkg["manifest_path"]).parent
    return sorted(f for f in d.iterdir() if f.is_file() and f.name.lower().startswith(LICENCE_PREFIXES))


llama = next(packages[i] for i in linked if packages[i]["name"] == "llama-cpp-sys-2")
ggml_licence = Path(llama["manifest_path"]).parent / "llama.cpp" / "LICENSE"
print("Third-party licences of the parakeet binary for", target)
print()
print("ggml and llama.cpp (MIT), built from source by llama-cpp-sys-2:")
print()
print(ggml_licence.read_text().strip())
print()
print(RULE)
print("The GCC runtime libraries linked into release archives (libgomp, libstdc++) are under")
print("the GPL-3.0 with the GCC Runtime Library Exception 3.1, which allows distributing them")
print("inside a program under any licence.")
print()
if "windows" in target:
    # The mingw-w64 runtime (its C start-up code, winpthreads under libgomp) is linked into the
    # Windows exe; Debian's copyright file of the package that ships it lists every licence.
    print(RULE)
    print("The mingw-w64 runtime linked into the Windows exe (C start-up code and winpthreads;")
    print("ZPL-2.1 and permissive licences, each file's below):")
    mingw = Path("/usr/share/doc/mingw-w64-x86-64-dev/copyright")
    if mingw.is_file():
        print()
        print(mingw.read_text(errors="replace").strip())
    print()
print(RULE)
print("Silero VAD v6.2 (MIT), its weights built into the binary (assets/silero_vad_v6.2.gguf, made")
print("from the silero-vad package's model by scripts/silero_vad_gguf.py):")
print()
print((Path(__file__).resolve().parent.parent / "assets" / "silero_vad.LICENSE").read_text().strip())
print()
print(RULE)
crates = sorted((packages[i] for i in linked), key=lambda p: (p["name"], p["version"]))
print(f"Rust crates ({len(crates)}):")
for p in crates:
    print(f"  {p['name']} {p['version']}: {p['license'] or 'see its licence file'}")
for p in crates:
    print()
    print(RULE)
    repo = f" ({p['repository']})" if p.get("repository") else ""
    print(f"{p['name']} {p['version']}: {p['license'] or 'see below'}{repo}")
    files = licence_files(p)
    if not files and p.get("license_file"):
        files = [Path(p["manifest_path"]).parent / p["license_file"]]
    for f in files:
        print()
        print(f"--- {f.name}")
        print(f.read_text(errors="replace").strip())
    if not files:
        print("(the crate ships no licence file; its licence is the SPDX expression above)")
