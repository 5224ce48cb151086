#!/usr/bin/env python3
"""Checks the layering that docs/ARCHITECTURE.md defines.

The table between `<!-- layers:begin -->` and `<!-- layers:end -->` gives each room of src/ (a
module that src/lib.rs declares) a layer (rows like `| 2 | `kernels`, `gguf` | ... |`). Rules:

1. a room names rooms of lower layers only;
2. inside a room, modules do not import each other in a cycle;
3. no room holds more than 40 % of the library's lines;
4. no library module names `anyhow` (its errors are `crate::error::Error`, by whose fault).

How it reads Rust: a tokenizer (nested block comments, raw and byte strings, char literals
against lifetimes, raw identifiers) feeds a parser that walks the module tree from src/lib.rs the
way rustc does (`mod x;` -> x.rs or x/mod.rs, inline `mod x { }` blocks), so `self` and `super`
resolve against the module they are written in. What counts as naming another module:

- every path that starts at `crate`, `$crate`, `self`, `super` or an alias of the crate root, in
  any position (use declarations, expressions, types, patterns, attributes' arguments, macro
  bodies, visibility paths);
- use trees in full: nested groups (`use crate::{a::{B}, c::D}`), `self` in groups, globs, `as`;
- `use crate as r` / `use super as r` / `extern crate self as r` (aliases of the crate root): the
  alias resolves to the root in the file that writes it (and everywhere when src/lib.rs declares
  it); a public alias of the root is refused, since it would carry the root to other modules;
- names of the crate root (`crate::Name`) resolve through src/lib.rs's `use` re-exports and
  `#[macro_export]` macros; any other item of the root sits above every room and is refused;
- intra-doc links (`[`crate::x`]`, `[text](super::x)`) and path strings in attributes
  (`#[serde(with = "crate::x")]`), since they name a module as much as code does;
- invocations of our own `macro_rules!` macros (by name) count as naming the module that
  defines them.

Refused outright, because they would hide where code comes from: `#[path]` (also inside
`cfg_attr`), `include!`, modules declared by a macro (`mod $name;`), a glob import of the crate
root (it brings every room into scope), and .rs files under src/ that no `mod` reaches.
The binary (src/main.rs and modules it declares) sits above every room and is not checked.

It also checks that docs/ARCHITECTURE.md's list of which rooms each room uses (between
`<!-- uses:begin -->` and `<!-- uses:end -->`) is what the code names; `--write` rewrites it.

Exits 1 naming every violation. Usage (repo root): python3 scripts/check_layers.py [--root DIR]
[--write]
"""
import argparse
import bisect
import re
import sys
from pathlib import Path

MAX_SHARE = 0.40

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
   |(?P<line>//[^\n]*)
   |(?P<block>/\*)
   |(?P<raw>(?:br|cr|r)(?P<hashes>\#*)")
   |(?P<str>[bc]?"(?:\\.|[^"\\])*")
   |(?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|[^\n])|[^'\\\n])')
   |(?P<life>'(?:r\#)?[^\W\d]\w*)
   |(?P<ident>(?:r\#)?[^\W\d]\w*)
   |(?P<num>\d\w*(?:\.\d\w*)?)
   |(?P<colons>::)
   |(?P<punct>.)
    """,
    re.S | re.X,
)

# A path as an intra-doc link target: [`crate::x`], [crate::x], [text](crate::x), [text]: crate::x
DOC_LINK = re.compile(
    r"(?:\[`?|\]\(|\]:[ \t]*)((?:crate|super|self)(?:::(?:r#)?[^\W\d]\w*)+)"
)
# A string that is a whole path from a module-relative start (as serde's `with = "..."` takes).
PATH_STRING = re.compile(r"\s*(?:crate|super|self)(?:::(?:r#)?[^\W\d]\w*)+\s*")


class RustError(Exception):
    pass


def lex(src):
    """Tokens as (kind, text, offset); kinds: ident, str, char, life, num, doc, punct (`::` is one
    punct). Comments vanish except doc comments, whose text is kept for their links."""
    toks = []
    pos, n = 0, len(src)
    while pos < n:
        m = TOKEN.match(src, pos)
        kind = m.lastgroup
        if kind == "hashes":  # the inner group of `raw` can be lastgroup
            kind = "raw"
        if kind == "ws":
            pos = m.end()
        elif kind == "line":
            text = m.group()
            if (text.startswith("///") and not text.startswith("////")) or text.startswith("//!"):
                toks.append(("doc", text[3:], pos))
            pos = m.end()
        elif kind == "block":
            depth, j = 1, pos + 2
            while depth:
                a, b = src.find("/*", j), src.find("*/", j)
                if b < 0:
                    raise RustError((pos, "unterminated block comment"))
                if 0 <= a < b:
                    depth, j = depth + 1, a + 2
                else:
                    depth, j = depth - 1, b + 2
            text = src[pos:j]
            doc = (text.startswith("/**") and not text.startswith("/***") and text != "/**/")
            if doc or text.startswith("/*!"):
                toks.append(("doc", text[3:-2], pos))
            pos = j
        elif kind == "raw":
            close = '"' + m.group("hashes")
            j = src.find(close, m.end())
            if j < 0:
                raise RustError((pos, "unterminated raw string"))
            toks.append(("str", src[m.end():j], pos))
            pos = j + len(close)
        elif kind == "str":
            text = m.group()
            toks.append(("str", text[text.index('"') + 1:-1], pos))
            pos = m.end()
        elif kind == "ident":
            text = m.group()
            toks.append(("ident", text[2:] if text.startswith("r#") else text, pos))
            pos = m.end()
        elif kind == "colons":
            toks.append(("punct", "::", pos))
            pos = m.end()
        else:
            toks.append((kind, m.group(), pos))
            pos = m.end()
    return toks


class File:
    """One .rs file of the library: its module path, and what it names."""

    def __init__(self, path, module, src):
        self.path, self.module, self.src = path, module, src
        self.lines = [i for i, c in enumerate(src) if c == "\n"]
        self.refs = []  # (offset, scope module, path segments, how)
        self.uses = []  # (offset, scope module, leaves [(segments, glob, alias)], public)
        self.children = []  # (offset, module path of a `mod x;`)
        self.macro_defs = set()
        self.macro_exports = set()
        self.macro_calls = []  # (offset, name)
        self.aliases = set()  # names of the crate root in this file (`use crate as r`)
        self.refused = []  # (offset, message)

    def line(self, offset):
        return bisect.bisect_right(self.lines, offset - 1) + 1

    def where(self, offset):
        return f"{self.path}:{self.line(offset)}"


def parse(file):
    toks = lex(file.src)
    n = len(toks)

    def text(i):
        return toks[i][1] if i < n else ""

    def kind(i):
        return toks[i][0] if i < n else ""

    scope = []  # inline modules: (name, brace depth that closes it)
    depth = 0
    exported = False  # the attributes before the current item hold #[macro_export]

    def module():
        return file.module + [s[0] for s in scope]

    def use_tree(i, prefix, leaves):
        path = list(prefix)
        if text(i) == "::":
            if not prefix:
                path = ["::"]
            i += 1
        while True:
            t = text(i)
            if t == "*":
                leaves.append((path, True, None))
                return i + 1
            if t == "{":
                i += 1
                while text(i) != "}":
                    i = use_tree(i, path, leaves)
                    if text(i) == ",":
                        i += 1
                    elif text(i) != "}":
                        raise RustError((toks[i][2] if i < n else len(file.src), "bad use tree"))
                return i + 1
            if kind(i) == "ident":
                path = path + [t]
                i += 1
                if text(i) == "::":
                    i += 1
                    continue
                alias = None
                if text(i) == "as":
                    alias = text(i + 1)
                    i += 2
                leaves.append((path, False, alias))
                return i
            raise RustError((toks[i][2] if i < n else len(file.src), "bad use tree"))

    def public(i):
        """Whether the item whose keyword is at i has a `pub` visibility."""
        j = i - 1
        if text(j) == ")":
            while j > 0 and text(j) != "(":
                j -= 1
            j -= 1
        return text(j) == "pub"

    def path_start(i):
        if i == 0 or text(i - 1) != "::":
            return True
        return not (kind(i - 2) == "ident" or text(i - 2) == ">")

    i = 0
    while i < n:
        k, t, off = toks[i]
        if k == "doc":
            for m in DOC_LINK.finditer(t):
                file.refs.append((off, module(), m.group(1).split("::"), "doc link"))
            i += 1
            continue
        if k == "punct":
            if t == "#" and (text(i + 1) == "[" or (text(i + 1) == "!" and text(i + 2) == "[")):
                # What only an attribute can say; the paths inside it are read below as anywhere.
                j = i + (2 if text(i + 1) == "[" else 3)
                level = 1
                while j < n and level:
                    tj = text(j)
                    if kind(j) == "punct" and tj in "([{":
                        level += 1
                    elif kind(j) == "punct" and tj in ")]}":
                        level -= 1
                    elif kind(j) == "ident" and tj == "path" and text(j + 1) == "=" \
                            and text(j - 1) in ("[", "(", ","):
                        file.refused.append((toks[j][2], "a #[path] attribute (a module's file "
                                             "must be the one its name gives)"))
                    elif kind(j) == "ident" and tj == "macro_export":
                        exported = True
                    elif kind(j) == "str":
                        if PATH_STRING.fullmatch(tj):
                            file.refs.append((toks[j][2], module(), tj.strip().split("::"),
                                              "attribute string"))
                        for m in DOC_LINK.finditer(tj):
                            file.refs.append((toks[j][2], module(), m.group(1).split("::"),
                                              "doc link"))
                    j += 1
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if scope and scope[-1][1] == depth:
                    scope.pop()
            elif t == ";":
                exported = False
            i += 1
            continue
        if k != "ident":
            i += 1
            continue
        if t == "mod" and text(i - 1) != "$":
            if text(i + 1) == "$":
                file.refused.append((off, "a module declared by a macro (`mod $name`)"))
            elif kind(i + 1) == "ident" and text(i + 2) == "{":
                scope.append((text(i + 1), depth))
                depth += 1
                i += 3
                continue
            elif kind(i + 1) == "ident" and text(i + 2) == ";":
                file.children.append((off, module() + [text(i + 1)]))
                i += 3
                continue
        elif t == "use" and text(i + 1) != "<" and text(i - 1) not in ("+", ":"):
            leaves = []
            j = use_tree(i + 1, [], leaves)
            if text(j) != ";":
                raise RustError((off, "a use declaration without its `;`"))
            file.uses.append((off, module(), leaves, public(i)))
            i = j + 1
            continue
        elif t == "extern" and text(i + 1) == "crate":
            if text(i + 2) == "self" and text(i + 3) == "as":
                alias = text(i + 4)
                if public(i):
                    file.refused.append((off, f"`pub extern crate self as {alias}`: a public alias"
                                         " of the crate root hides which room a path names"))
                file.aliases.add(alias)
            elif kind(i + 2) == "ident" and text(i + 3) == "as" and text(i + 4) == "self":
                pass  # `extern crate x as self` is refused by rustc
            i += 2
            continue
        elif t == "macro_rules" and text(i + 1) == "!" and kind(i + 2) == "ident":
            file.macro_defs.add(text(i + 2))
            if exported:
                file.macro_exports.add(text(i + 2))
            exported = False
            i += 3
            continue
        elif text(i + 1) == "!" and text(i + 2) in ("(", "[", "{") and text(i - 1) != "$":
            if t == "include":
                file.refused.append((off, "`include!` (the included code would belong to no module)"))
            file.macro_calls.append((off, t))
        # Every path that starts here; which of them name our modules is known once the file's
        # aliases of the crate root are (an alias may be declared after its first use).
        if text(i + 1) == "::" and path_start(i):
            segs = [t]
            j = i + 1
            while text(j) == "::" and kind(j + 1) == "ident":
                segs.append(text(j + 1))
                j += 2
            file.refs.append((off, module(), segs, "path"))
            i = j
            continue
        i += 1
    if scope:
        raise RustError((len(file.src), "unbalanced braces"))


def resolve(segs, module, aliases):
    """The absolute module path (from the crate root) that `segs`, written in `module`, names;
    None for paths outside the crate (std, dependencies) or relative to the current module's own
    names (children, imports: those are counted where they are imported)."""
    first = segs[0]
    if first == "crate":
        base, rest = [], segs[1:]
    elif first in ("self", "super"):
        base, rest = list(module), segs
    elif first == "::" and len(segs) > 1 and segs[1] in aliases:
        base, rest = [], segs[2:]
    elif first in aliases:
        base, rest = [], segs[1:]
    else:
        return None
    for s in rest:
        if s == "super":
            if not base:
                return None  # above the root: rustc refuses it
            base.pop()
        elif s != "self":
            base.append(s)
    return base


def root_aliases(file, inherited):
    """The names that stand for the crate root in `file`: `extern crate self as r`, and
    `use crate as r` / `use super as r` / `use crate::{self as r}` (to a fixed point, since one
    alias may be written through another)."""
    aliases = set(file.aliases) | inherited
    changed = True
    while changed:
        changed = False
        for _, scope, leaves, _ in file.uses:
            for segs, glob, alias in leaves:
                if alias and not glob and alias not in aliases \
                        and resolve(segs, scope, aliases) == []:
                    aliases.add(alias)
                    changed = True
    return aliases


def layers(doc):
    text = doc.read_text()
    m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", text, re.S)
    if not m:
        sys.exit(f"{doc}: no layers table (<!-- layers:begin --> ... <!-- layers:end -->)")
    table = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for room in re.findall(r"`([a-z_][a-z0-9_]*)`", cells[1]):
            table[room] = int(cells[0])
    return table


def child_file(src, module):
    """The file of `mod x;` declared in module path `module + [x]` (as rustc finds it)."""
    a = src.joinpath(*module).with_suffix(".rs")
    b = src.joinpath(*module, "mod.rs")
    if a.exists() and b.exists():
        return None, f"both {a.name} and {b.relative_to(src)} exist"
    if a.exists():
        return a, None
    if b.exists():
        return b, None
    return None, "no file"


def check(root, uses=None):
    """Every violation under `root` as text, and a summary line; with a dict `uses`, also fills
    it with the rooms each room names (room -> set of rooms)."""
    root = Path(root)
    src, doc = root / "src", root / "docs" / "ARCHITECTURE.md"
    table = layers(doc)
    errors = []

    def rel(p):
        return str(p.relative_to(root))

    # The crate root: its rooms, its re-exports, its global aliases.
    lib = File(rel(src / "lib.rs"), [], (src / "lib.rs").read_text())
    pending = []
    try:
        parse(lib)
    except RustError as e:
        off, msg = e.args[0]
        return [f"{lib.where(off)}: cannot parse: {msg}"], ""
    for off, msg in lib.refused:
        errors.append(f"{lib.where(off)}: {msg}")
    global_aliases = root_aliases(lib, set())
    rooms = []
    for off, module in lib.children:
        rooms.append(module[0])
        pending.append((lib, off, module))
    root_names, root_globs = {}, []
    for off, _, leaves, _ in lib.uses:
        for segs, glob, alias in leaves:
            path = resolve(segs, [], global_aliases)
            if path is None and segs[0] in rooms:
                path = list(segs)
            if path is None:
                continue
            if glob:
                root_globs.append(path)
            elif path:
                root_names[alias or path[-1]] = path

    files = {}
    while pending:
        parent, off, module = pending.pop()
        path, why = child_file(src, module)
        if path is None:
            errors.append(f"{parent.where(off)}: `mod {module[-1]};`: {why}")
            continue
        f = File(rel(path), module, path.read_text())
        try:
            parse(f)
        except RustError as e:
            o, msg = e.args[0]
            errors.append(f"{f.where(o)}: cannot parse: {msg}")
            continue
        files[tuple(module)] = f
        for o, child in f.children:
            pending.append((f, o, child))

    # Every .rs file under src/ belongs to the library's tree or to the binary's.
    reached = {src / "lib.rs", src / "main.rs"} | {root / f.path for f in files.values()}
    binary = set()
    try:
        main = File(rel(src / "main.rs"), [], (src / "main.rs").read_text())
        parse(main)
        todo = [m for _, m in main.children]
        while todo:
            m = todo.pop()
            p, _ = child_file(src, m)
            if p is not None and p not in binary:
                binary.add(p)
                b = File(rel(p), m, p.read_text())
                parse(b)
                todo += [c for _, c in b.children]
    except (OSError, RustError):
        pass
    for p in sorted(src.rglob("*.rs")):
        if p not in reached and p not in binary and "bin" not in p.relative_to(src).parts:
            errors.append(f"{rel(p)}: no `mod` declaration reaches this file, so the check "
                          "cannot place it")

    for room in rooms:
        if room not in table:
            errors.append(f"src/{room}: not in the layers table of {rel(doc)}")

    macro_homes = {}
    for mod, f in files.items():
        for name in f.macro_defs:
            macro_homes.setdefault(name, []).append(mod)
        for name in f.macro_exports:
            root_names.setdefault(name, list(mod))

    def targets(segs, scope, aliases, f, off, how):
        """Absolute module paths `segs` names, root names resolved; appends refusals."""
        path = resolve(segs, scope, aliases)
        if path is None or not path:
            return []
        seen = 0
        while path and path[0] not in rooms:
            seen += 1
            if path[0] in root_names and seen < 20:
                path = root_names[path[0]] + path[1:]
            elif root_globs:
                return [list(g) for g in root_globs]
            else:
                errors.append(f"{f.where(off)}: `{'::'.join(segs)}` ({how}) names `{path[0]}`, "
                              "an item of the crate root, which sits above every room")
                return []
        return [path] if path else []

    # Every reference of every file, resolved to absolute module paths.
    deps = []  # (file, offset, from module, absolute path, how it was written)
    for mod, f in files.items():
        aliases = root_aliases(f, global_aliases)
        for off, msg in f.refused:
            errors.append(f"{f.where(off)}: {msg}")
        for off, scope, segs, how in f.refs:
            for path in targets(segs, scope, aliases, f, off, how):
                deps.append((f, off, mod, path, "::".join(segs)))
        for off, scope, leaves, public in f.uses:
            for segs, glob, alias in leaves:
                path = resolve(segs, scope, aliases)
                if path == [] and glob:
                    errors.append(f"{f.where(off)}: `use {'::'.join(segs)}::*` is a glob import "
                                  "of the crate root, which brings every room into scope")
                    continue
                if path == [] and alias and public:
                    errors.append(f"{f.where(off)}: `{'::'.join(segs)} as {alias}` is a public "
                                  "alias of the crate root, which hides which room a path names")
                    continue
                for p in targets(segs, scope, aliases, f, off, "use"):
                    deps.append((f, off, mod, p, "use " + "::".join(segs)))
        for off, name in f.macro_calls:
            if name in f.macro_defs:
                continue
            for home in macro_homes.get(name, []):
                deps.append((f, off, mod, list(home), f"{name}! (a macro of ours)"))

    if uses is not None:
        for room in rooms:
            uses.setdefault(room, set())
        for _, _, mod, path, _ in deps:
            if path[0] != mod[0] and path[0] in rooms:
                uses[mod[0]].add(path[0])

    # Rule 1: a room names only rooms of lower layers.
    for f, off, mod, path, how in deps:
        room, target = mod[0], path[0]
        if target == room or target not in table or room not in table:
            continue
        if table[target] >= table[room]:
            errors.append(
                f"{f.where(off)}: `{room}` (layer {table[room]}) names `{target}` "
                f"(layer {table[target]}) by `{how}`; a room may use lower layers only")

    # Rule 2: no import cycle between modules inside a room.
    modules = set(files)
    edges = {m: set() for m in modules}
    for f, off, mod, path, how in deps:
        if path[0] != mod[0]:
            continue
        t = tuple(path)
        while t and t not in modules:
            t = t[:-1]
        if not t or t == mod:
            continue
        # parent/child edges are structure, not imports
        if mod[: len(t)] == t or t[: len(mod)] == mod:
            continue
        edges[mod].add(t)
    for comp in strongly_connected(edges):
        names = " <-> ".join("::".join(m) for m in sorted(comp))
        errors.append(f"import cycle: {names}")

    # Rule 4: the library reports with its own Error (src/error.rs), classified by whose fault a
    # failure is; `anyhow` erases that, so only the binary and tools may use it.
    for f in [lib] + list(files.values()):
        for kind, text, off in lex(f.src):
            if kind == "ident" and text in ("anyhow", "r#anyhow"):
                errors.append(f"{f.where(off)}: `anyhow` in the library: return "
                              "crate::error::Error, of the kind whose fault the failure is")

    # Rule 3: no room over MAX_SHARE of the library's lines.
    lines = {}
    for mod, f in files.items():
        lines[mod[0]] = lines.get(mod[0], 0) + f.src.count("\n")
    total = sum(lines.values()) + lib.src.count("\n")
    largest = max(lines, key=lines.get) if lines else None
    for room, count in sorted(lines.items()):
        if count > MAX_SHARE * total:
            errors.append(f"src/{room}: {count} of the library's {total} lines "
                          f"({100 * count / total:.0f} %), more than {MAX_SHARE:.0%}")
    summary = f"{len(files)} modules in {len(rooms)} rooms"
    if largest:
        summary += (f", the largest `{largest}` {100 * lines[largest] / total:.0f} % of "
                    f"{total} lines")
    return errors, summary


def strongly_connected(edges):
    """Tarjan's components of more than one node, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


USES = re.compile(r"(<!-- uses:begin -->\n```\n)(.*?)(```\n<!-- uses:end -->)", re.S)


def uses_block(table, uses):
    """The "which rooms each room uses" lines of docs/ARCHITECTURE.md: rooms from the highest
    layer down, each with the rooms it names, highest first."""
    order = lambda r: (-table.get(r, -1), r)  # noqa: E731
    width = max(len(r) for r in uses)
    lines = []
    for room in sorted(uses, key=order):
        used = sorted(uses[room], key=order)
        what = "-> " + ", ".join(used) if used else "(uses no other room)"
        lines.append(f"{table.get(room, '?'):>2} {room:<{width}} {what}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent,
                    help="the repository (default: this script's)")
    ap.add_argument("--write", action="store_true",
                    help="rewrite the uses block of docs/ARCHITECTURE.md from the code")
    args = ap.parse_args(argv)
    uses = {}
    errors, summary = check(args.root, uses)
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layering violation(s); the layers are defined in "
              "docs/ARCHITECTURE.md")
        return 1
    # The doc's list of which rooms each room uses is the code's, never a hand-kept copy.
    doc = Path(args.root) / "docs" / "ARCHITECTURE.md"
    text = doc.read_text()
    m = USES.search(text)
    if not m:
        print(f"{doc}: no uses block (<!-- uses:begin --> ... <!-- uses:end -->)")
        return 1
    want = uses_block(layers(doc), uses)
    if m.group(2) != want:
        if not args.write:
            print(f"{doc}: the list of which rooms each room uses differs from the code; "
                  "python3 scripts/check_layers.py --write rewrites it:")
            print(want, end="")
            return 1
        doc.write_text(text[:m.start(2)] + want + text[m.end(2):])
        print(f"rewrote the uses block of {doc}")
    print(f"layering ok: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
