#!/usr/bin/env python3
"""Checks the layering that docs/ARCHITECTURE.md defines.

The table between `<!-- layers:begin -->` and `<!-- layers:end -->` gives each room of src/ a
layer (rows like `| 2 | `kernels`, `gguf` | ... |`). A room may use rooms of lower layers only;
inside a room, sibling modules may not import each other in a cycle. Exits 1 naming every
violation. Usage (repo root): python3 scripts/check_layers.py
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def layers():
    text = DOC.read_text()
    m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", text, re.S)
    if not m:
        sys.exit(f"{DOC}: no layers table (<!-- layers:begin --> ... <!-- layers:end -->)")
    table = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for room in re.findall(r"`([a-z_]+)`", cells[1]):
            table[room] = int(cells[0])
    return table


def strip(code):
    """Rust source without comments, string and char literals (so paths in them don't count),
    except the paths of intra-doc links (`[`super::x::f`]`, `[text](crate::x)`): a doc that links
    to a module depends on it as much as code does."""
    links = re.findall(r"\[`?((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", code)
    links += re.findall(r"\]\(((?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+)\)", code)
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r'r#*"(?:.|\n)*?"#*', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    code = re.sub(r"'(?:\\.|[^'\\])'", "' '", code)
    return code + "\n" + "\n".join(f"use {path};" for path in links)


def module_of(path):
    """src/kernels/qgemm/amx.rs -> ['kernels', 'qgemm', 'amx']"""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return parts


def uses(code):
    """Every `crate::a::b::...` path as its list of module segments, with `use crate::{a, b::c}`
    groups expanded."""
    found = []
    for m in re.finditer(r"\bcrate((?:::[a-z_][a-z0-9_]*)+)", code):
        found.append(m.group(1).strip(":").split("::"))
    for m in re.finditer(r"\bcrate::\{([^}]*)\}", code):
        for item in m.group(1).split(","):
            seg = re.findall(r"[a-z_][a-z0-9_]*", item.split(" as ")[0])
            if seg:
                found.append(seg)
    return found


def super_uses(code, mod):
    """Sibling modules named through `super::x` from module path `mod`."""
    out = []
    parent = mod[:-1]
    for m in re.finditer(r"\bsuper((?:::[a-z_][a-z0-9_]*)+)", code):
        out.append(parent + m.group(1).strip(":").split("::"))
    for m in re.finditer(r"\bsuper::\{([^}]*)\}", code):
        for item in m.group(1).split(","):
            seg = re.findall(r"[a-z_]+", item)
            if seg:
                out.append(parent + [seg[0]])
    return out


def main():
    table = layers()
    errors = []
    files = {}
    for path in sorted(SRC.rglob("*.rs")):
        mod = module_of(path)
        if mod in (["lib"], ["main"]):
            continue
        files[tuple(mod)] = strip(path.read_text())
    modules = set(files)
    for mod in modules:
        if mod[0] not in table:
            errors.append(f"src/{mod[0]}: not in the layers table of {DOC.relative_to(ROOT)}")
    # Rule 1: a room uses only rooms of lower layers.
    for mod, code in files.items():
        room = mod[0]
        for path in uses(code):
            target = path[0]
            if target == room or target not in table or room not in table:
                continue
            if table[target] >= table[room]:
                errors.append(
                    f"src/{'/'.join(mod)}: `{room}` (layer {table[room]}) uses `{target}` "
                    f"(layer {table[target]}); a room may use lower layers only")
    # Rule 2: no import cycle between sibling modules inside a room.
    edges = {m: set() for m in modules}
    for mod, code in files.items():
        targets = []
        for path in uses(code):
            if path[0] == mod[0] and len(path) > 1:
                targets.append(path)
        targets += super_uses(code, list(mod))
        for t in targets:
            # the longest known module that t names (siblings at any depth)
            t = tuple(t)
            while t and t not in modules:
                t = t[:-1]
            if not t or t == mod:
                continue
            # parent/child edges are structure, not imports
            if mod[: len(t)] == t or t[: len(mod)] == mod:
                continue
            edges[mod].add(t)
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        names = " <-> ".join("::".join(m) for m in sorted(comp))
        errors.append(f"import cycle: {names}")
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layering violation(s); the layers are defined in {DOC.relative_to(ROOT)}")
        return 1
    print(f"layering ok: {len(files)} modules in {len(set(m[0] for m in files))} rooms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
