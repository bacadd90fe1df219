# The import-cycle check of the team's shared tools, kept here so that the test suite (tests/test_imports.py) runs it.
# Import cycles among a package's modules, counting imports inside functions and modules named in strings
# beside an importlib.import_module call:  python3 import_cycles.py ROOT PACKAGE  (exits 1 if any cycle)
import ast, pathlib, sys
root, pkg = pathlib.Path(sys.argv[1]), sys.argv[2]
mods = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in (root / pkg).rglob("*.py")}
def target(name):
  while name and name not in mods: name = name.rpartition(".")[0]
  return name or None
edges = {m: set() for m in mods}
for m, p in mods.items():
  base = m if p.name == "__init__.py" else m.rpartition(".")[0]
  for n in ast.walk(ast.parse(p.read_text())):
    names = []
    if isinstance(n, ast.Import): names = [a.name for a in n.names]
    elif isinstance(n, ast.ImportFrom):
      b = n.module or ""
      if n.level: b = ".".join(base.split(".")[: len(base.split(".")) - n.level + 1] + ([b] if b else []))
      names = [f"{b}.{a.name}" for a in n.names] + [b]
    elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module" and n.args and isinstance(n.args[0], ast.Constant):
      names = [n.args[0].value]
    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in mods and "import_module" in p.read_text():
      names = [n.value]  # a module named in a string beside an import_module call (a loop over names)
    for x in names:
      t = target(x)
      if t and t != m and not m.startswith(t + ".") and t != pkg: edges[m].add(t)
cycles, seen = set(), set()
def dfs(m, path):
  for t in edges[m]:
    if t in path: c = path[path.index(t):]; i = c.index(min(c)); cycles.add(tuple(c[i:] + c[:i]))
    elif t not in seen: dfs(t, path + [t])
  seen.add(m)
for m in sorted(mods): dfs(m, [m])
for c in sorted(cycles): print(" -> ".join(c + (c[0],)))
print(f"{len(cycles)} import cycles among {len(mods)} modules"); sys.exit(1 if cycles else 0)
