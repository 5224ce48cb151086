#!/usr/bin/env python3
"""Whether two JSON documents (or JSON-lines files) are the same up to a tolerance on numbers.

usage: same_json.py A B [TOL]   (TOL default 1e-5, absolute). Keys, strings, lists' lengths and
the type of every value must match exactly; floats within TOL. Two things may differ: `timings`
(wall-clock seconds of each run: only their keys must match) and the input's path in `audio`
(Windows writes its own separator). Exit 0 if they match, else 1 with the first difference on
stderr."""
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def diff(a, b, tol, where="$"):
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        if type(a) is not type(b):
            return f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        if sorted(a) != sorted(b):
            return f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            if k == "timings" and isinstance(a[k], dict) and isinstance(b[k], dict):
                if sorted(a[k]) != sorted(b[k]):
                    return f"{where}.{k}: keys {sorted(a[k])} vs {sorted(b[k])}"
                continue
            if k == "audio" and isinstance(a[k], str) and isinstance(b[k], str):
                if a[k].replace("\\", "/") != b[k].replace("\\", "/"):
                    return f"{where}.{k}: {a[k]!r} vs {b[k]!r}"
                continue
            d = diff(a[k], b[k], tol, f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, tol, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return None if abs(a - b) <= tol else f"{where}: {a!r} vs {b!r} (tolerance {tol})"
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def main():
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    d = diff(load(sys.argv[1]), load(sys.argv[2]), tol)
    if d:
        print(d, file=sys.stderr)
        sys.exit(1)


main()
