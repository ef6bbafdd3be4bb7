"""The package's imports go one way: no cycles between its subpackages, and
none between the modules of one subpackage.

Every module under ``rljax/`` is parsed (not imported), and every import in
it counts, the ones inside functions too: a deferred import is still a
dependency. So is a string literal naming an ``rljax`` module given to
``importlib.import_module`` or ``runpy.run_module``. ``from a.b import c``
is an edge to the module ``a.b.c`` when that is a module (or package) of
``rljax``, else to ``a.b``.

A package's ``__main__.py`` is a program (what ``python -m`` runs), not a
module: nothing imports it, so its imports cannot close a circle, and it
may start any layer (``rljax/training/__main__.py`` runs the command line,
`rljax.launch`, which sits above `rljax.training`). Its imports are left
out.

Subpackages: each module counts as its ``rljax.<name>``. The root (``rljax/__init__.py`` and the modules directly in
``rljax/``) is left out: it re-exports the layers below it. Modules: the
edges between two modules of one subpackage, ``__init__.py`` files left out
(a subpackage's ``__init__`` imports all its modules).

A failure names each cycle and, for every import between its members, one
place that makes it (file:line): move what one side needs from the other
down to the lower side, or into a small module both import.
"""

import ast
from collections.abc import Iterable, Mapping
import dataclasses
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "rljax"
# Calls whose first argument, a string, names a module they import or run.
_DYNAMIC = {
  ("importlib", "import_module"),
  ("runpy", "run_module"),
}


@dataclasses.dataclass(frozen=True)
class Import:
  """One import of `target` by `source`, at ``path:line``."""

  source: str
  target: str
  path: str
  line: int
  text: str

  def where(self) -> str:
    return f"{self.path}:{self.line}: {self.text}"


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every ``.py`` under ``root/package``
  (a package's ``__init__.py`` is named like the package)."""
  out = {}
  for path in sorted((root / package).rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _resolve_relative(module: str, is_package: bool, level: int, name: str):
  base = module.split(".")
  if not is_package:
    base = base[:-1]
  base = base[: len(base) - (level - 1)] if level > 1 else base
  return ".".join(base + ([name] if name else []))


def _dynamic_target(node: ast.Call):
  """The module a call like ``importlib.import_module("rljax.x")`` names."""
  func = node.func
  if not (
    isinstance(func, ast.Attribute)
    and isinstance(func.value, ast.Name)
    and (func.value.id, func.attr) in _DYNAMIC
    and node.args
    and isinstance(node.args[0], ast.Constant)
    and isinstance(node.args[0].value, str)
  ):
    return None
  return node.args[0].value


def imports(root: pathlib.Path, package: str = PACKAGE) -> list[Import]:
  """Every import between two modules of `package`, each with its place."""
  modules = module_names(root, package)
  found = []
  for source, path in modules.items():
    if path.name == "__main__.py":  # a program, never imported
      continue
    text = path.read_text()
    lines = text.splitlines()
    rel = path.relative_to(root).as_posix()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(text, filename=rel)):
      targets = []
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = _resolve_relative(source, is_package, node.level, base)
        for alias in node.names:
          full = f"{base}.{alias.name}"
          targets.append(full if full in modules else base)
      elif isinstance(node, ast.Call):
        name = _dynamic_target(node)
        targets = [name] if name else []
      for target in targets:
        # `import rljax.a.b` of a name that is no module: its nearest one.
        while target not in modules and "." in target:
          target = target.rsplit(".", 1)[0]
        if target in modules and target != source:
          line = lines[node.lineno - 1].strip()
          found.append(Import(source, target, rel, node.lineno, line))
  return found


def subpackage(module: str) -> str:
  """``rljax.a.b.c`` -> ``rljax.a``."""
  return ".".join(module.split(".")[:2])


def package_edges(found: Iterable[Import], root: pathlib.Path, package: str):
  """(rljax.a, rljax.b) -> the imports that make rljax.a depend on rljax.b;
  the root package and the modules directly in it left out."""
  modules = module_names(root, package)
  top = {m for m, p in modules.items() if p.parent == root / package}
  edges: dict[tuple[str, str], list[Import]] = {}
  for imp in found:
    if imp.source in top or imp.target in top:
      continue
    a, b = subpackage(imp.source), subpackage(imp.target)
    if a != b:
      edges.setdefault((a, b), []).append(imp)
  return edges


def module_edges(found: Iterable[Import], root: pathlib.Path, package: str):
  """(module, module) -> its imports, for two modules of one subpackage,
  ``__init__.py`` files left out."""
  modules = module_names(root, package)
  edges: dict[tuple[str, str], list[Import]] = {}
  for imp in found:
    if "__init__.py" in (modules[imp.source].name, modules[imp.target].name):
      continue
    if subpackage(imp.source) == subpackage(imp.target):
      edges.setdefault((imp.source, imp.target), []).append(imp)
  return edges


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
  """The strongly connected components of a directed graph that have a
  cycle (two nodes or more, or one with an edge to itself), each sorted,
  in sorted order. Tarjan's algorithm, without recursion."""
  graph: dict[str, list[str]] = {}
  for a, b in edges:
    graph.setdefault(a, []).append(b)
    graph.setdefault(b, [])
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  out = []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      v, children = work[-1]
      w = next(children, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph[w]))))
        elif w in on_stack:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[v])
      if low[v] == index[v]:
        component = []
        while True:
          w = stack.pop()
          on_stack.discard(w)
          component.append(w)
          if w == v:
            break
        if len(component) > 1 or v in graph[v]:
          out.append(sorted(component))
  return sorted(out)


def _one_cycle(component: list[str], edges) -> list[str]:
  """A shortest cycle through the component's first node."""
  members = set(component)
  first = component[0]
  paths = {first: [first]}
  frontier = [first]
  while frontier:
    following = []
    for v in frontier:
      for a, b in sorted(edges):
        if a != v or b not in members:
          continue
        if b == first:
          return paths[v] + [first]
        if b not in paths:
          paths[b] = paths[v] + [b]
          following.append(b)
    frontier = following
  return component


def describe(
  components: list[list[str]], edges: Mapping[tuple[str, str], list[Import]]
) -> str:
  """Each cycle, then every import between its members with one place."""
  out = []
  for component in components:
    members = set(component)
    out.append("cycle: " + " -> ".join(_one_cycle(component, edges)))
    for (a, b), found in sorted(edges.items()):
      if a in members and b in members:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        out.append(f"  {a} -> {b}: {found[0].where()}{more}")
  return "\n".join(out)


def test_cycles_finds_a_cycle_and_only_a_cycle():
  assert cycles([("a", "b"), ("b", "c"), ("a", "c")]) == []
  assert cycles([]) == []
  assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [
    ["a", "b", "c"]
  ]
  assert cycles([("a", "a"), ("b", "c")]) == [["a"]]
  two = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "c")]
  assert cycles(two) == [["a", "b"], ["c", "d"]]
  # A long chain: no recursion limit.
  chain = [(f"n{i:05}", f"n{i + 1:05}") for i in range(5000)]
  assert cycles(chain) == []
  assert cycles(chain + [("n05000", "n00000")]) == [
    sorted({a for a, _ in chain} | {"n05000"})
  ]


def test_describe_names_a_place_for_every_edge_of_a_cycle(tmp_path):
  pkg = tmp_path / "pkg"
  for sub in ("a", "b", "c"):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("from pkg import a\nfrom pkg import b\n")
  (pkg / "a" / "_x.py").write_text("from pkg.b import _y\n")
  (pkg / "b" / "_y.py").write_text(
    "import runpy\n\ndef f():\n  runpy.run_module('pkg.a._x')\n"
  )
  (pkg / "c" / "_z.py").write_text("from pkg.a import _x\n")
  # A program may import any layer: c -> a, and a's program -> c.
  (pkg / "a" / "__main__.py").write_text("from pkg.c import _z\n")
  found = imports(tmp_path, "pkg")
  edges = package_edges(found, tmp_path, "pkg")
  assert cycles(edges) == [["pkg.a", "pkg.b"]]
  text = describe(cycles(edges), edges)
  assert "cycle: pkg.a -> pkg.b -> pkg.a" in text
  assert "pkg.a -> pkg.b: pkg/a/_x.py:1: from pkg.b import _y" in text
  assert "pkg.b -> pkg.a: pkg/b/_y.py:4: runpy.run_module('pkg.a._x')" in text
  assert "pkg.c" not in text


def test_no_cycle_between_subpackages():
  found = imports(ROOT)
  edges = package_edges(found, ROOT, PACKAGE)
  components = cycles(edges)
  assert not components, "subpackages import each other:\n" + describe(
    components, edges
  )


def test_no_cycle_between_modules_of_a_subpackage():
  found = imports(ROOT)
  edges = module_edges(found, ROOT, PACKAGE)
  components = cycles(edges)
  assert not components, "modules import each other:\n" + describe(
    components, edges
  )
