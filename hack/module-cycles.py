#!/usr/bin/env python3
"""Fails when modules of a crate import each other in a circle.

Usage: hack/module-cycles.py [CRATE_DIR ...]   (default: every crate of the
workspace that has a src/lib.rs)

For each crate, every module file (src/lib.rs is the root, src/a.rs or
src/a/mod.rs is `a`, src/a/b.rs is `a::b`) and the paths it names
(`crate::a::b::Item`, `super::b::Item`, in `use` lines and in code; comments
and doc links are left out) give edges from the module to the module that
defines what it names: the longest module path the named path starts with.

- Edges between a module and its own parent or child do not count: a
  parent declares and re-exports its children, a child may use its
  parent's items. The crate root only declares and re-exports, so names
  reached through it (`crate::Error`) do not count either.
- Every other edge is lifted to the two siblings under the modules'
  nearest common parent (`cache::informer -> manager::state` is
  `cache -> manager`): a circle among siblings is a circle of the ideas
  they hold, whatever file inside them starts it.

A circle is printed with one file and line per step, and the exit status
is 1. (cargo-modules' `dependencies --acyclic` answers the same question
from rust-analyzer's model, but needs rust-analyzer's crates built on
every CI machine, minutes of two cores; names are resolved here by their
paths, which this workspace writes in full: `use crate::module::Name`.)
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\}", re.S)


def modules(src: Path) -> dict:
    """Module path (tuple) -> file."""
    found = {}
    for file in src.rglob("*.rs"):
        parts = list(file.relative_to(src).with_suffix("").parts)
        if parts == ["lib"] or parts == ["main"]:
            parts = []
        elif parts[-1] == "mod":
            parts = parts[:-1]
        found[tuple(parts)] = file
    return found


def strip_comments(text: str) -> str:
    """The code without comments and without its unit tests (a `mod tests`
    under `#[cfg(test)]`, at the end of a file by this workspace's habit):
    tests may use any module's helpers."""
    tests = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    if tests:
        text = text[: tests.start()]
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def named_paths(text: str):
    """(line, base, segments) for every path the code names."""
    for match in USE_GROUP.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        prefix = [s for s in match.group(2).split("::") if s]
        for item in re.split(r",", match.group(3)):
            names = [s for s in re.split(r"::", item.strip().split(" as ")[0]) if s and s != "{"]
            names = [re.sub(r"[{}\s]", "", n) for n in names]
            names = [n for n in names if n]
            if names:
                yield line, match.group(1), prefix + names
    for match in PATH.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield line, match.group(1), [s for s in match.group(2).split("::") if s]


def resolve(module: tuple, base: str, segments: list, known: dict):
    if base == "crate":
        path = []
    else:
        path = list(module[:-1])
        while segments and segments[0] == "super":
            segments = segments[1:]
            path = path[:-1]
    best = tuple(path)
    for segment in segments:
        if segment == "super":
            path = path[:-1]
            best = tuple(path)
            continue
        path.append(segment)
        if tuple(path) in known:
            best = tuple(path)
        else:
            break
    return best


def check(crate: Path) -> int:
    src = crate / "src"
    known = modules(src)
    edges = {}  # (a, b) -> (file, line)
    for module, file in known.items():
        text = strip_comments(file.read_text())
        for line, base, segments in named_paths(text):
            target = resolve(module, base, segments, known)
            if not target or not module or target == module:
                continue
            shorter, longer = sorted((module, target), key=len)
            if longer[: len(shorter)] == shorter:
                continue  # parent and child
            common = 0
            while module[common] == target[common]:
                common += 1
            a, b = module[: common + 1], target[: common + 1]
            edges.setdefault((a, b), (file, line))
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    circles = 0
    for component in strongly_connected(graph):
        circles += 1
        names = ", ".join("::".join(m) for m in sorted(component))
        print(f"{crate}: modules import each other in a circle: {names}")
        circle = shortest_circle(graph, component)
        for a, b in zip(circle, circle[1:]):
            file, line = edges[(a, b)]
            print(f"  {'::'.join(a)} -> {'::'.join(b)}  ({file.relative_to(crate.parent.parent)}:{line})")
    return circles


def strongly_connected(graph: dict) -> list:
    """The components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def shortest_circle(graph: dict, component: list) -> list:
    """A shortest circle through the component's first module."""
    start = min(component)
    inside = set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                return paths[node] + [start]
            if nxt in inside and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return [start, start]


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    crates = [Path(arg) for arg in sys.argv[1:]] or sorted(
        path.parent.parent for path in root.glob("*/*/src/lib.rs")
    )
    total = sum(check(crate) for crate in crates)
    if total:
        print(f"{total} module circle(s)", file=sys.stderr)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
