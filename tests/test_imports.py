"""The import graph of orin_llm has no cycle, counting imports inside functions and modules named to
importlib (tests/import_cycles.py): settings.py sits low, the subcommands never import the CLI back."""
import pathlib, subprocess, sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

def test_no_import_cycles():
  r = subprocess.run([sys.executable, str(ROOT / "tests" / "import_cycles.py"), str(ROOT), "orin_llm"], capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "0 import cycles" in r.stdout, r.stdout

def test_the_checker_finds_a_cycle(tmp_path):
  """The checker itself: a cycle through an import inside a function and one through importlib."""
  pkg = tmp_path / "p"; pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("def f():\n  from p import b\n")
  (pkg / "b.py").write_text("import importlib\nimportlib.import_module('p.c')\n")
  (pkg / "c.py").write_text("from p.a import f\n")
  r = subprocess.run([sys.executable, str(ROOT / "tests" / "import_cycles.py"), str(tmp_path), "p"], capture_output=True, text=True)
  assert r.returncode == 1 and "p.a -> p.b -> p.c -> p.a" in r.stdout, r.stdout
