"""The patch series of pkgs/tinygrad/patches: each patch applies cleanly, in order, to a fresh copy of the
pinned sdist (the one scripts/setup_venv.py downloads to .cache), and the tinygrad imported here carries
the marker apply-patches.sh writes, naming exactly that series."""
import hashlib, pathlib, subprocess, tarfile
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "pkgs" / "tinygrad"
PATCHES = sorted((PKG / "patches").glob("*.patch"))
ENV = dict(l.split("=", 1) for l in (PKG / "source.env").read_text().splitlines() if l and not l.startswith("#"))
VERSION, SHA256 = ENV["TINYGRAD_VERSION"].strip(), ENV["TINYGRAD_SHA256"].strip()
SDIST = ROOT / ".cache" / f"tinygrad-{VERSION}.tar.gz"

@pytest.fixture
def fresh_src(tmp_path) -> pathlib.Path:
  if not SDIST.exists(): pytest.skip(f"{SDIST.relative_to(ROOT)} absent (scripts/setup_venv.py downloads it)")
  assert hashlib.sha256(SDIST.read_bytes()).hexdigest() == SHA256, f"{SDIST.name} is not the pinned sdist"
  with tarfile.open(SDIST) as tf: tf.extractall(tmp_path, filter="data")
  return tmp_path / f"tinygrad-{VERSION}"

def test_series_is_numbered():
  assert PATCHES and [p.name[:5] for p in PATCHES] == [f"{i:04d}-" for i in range(1, len(PATCHES) + 1)]

def test_each_patch_applies_cleanly(fresh_src):
  for p in PATCHES:
    dry = subprocess.run(["patch", "-p1", "--dry-run", "--forward", "--batch", "-d", fresh_src, "-i", p], capture_output=True, text=True)
    assert dry.returncode == 0 and "fuzz" not in dry.stdout and "offset" not in dry.stdout, f"{p.name}:\n{dry.stdout}{dry.stderr}"
    subprocess.run(["patch", "-p1", "--forward", "--batch", "--quiet", "-d", fresh_src, "-i", p], check=True)

def test_apply_patches_writes_marker(fresh_src):
  subprocess.run(["sh", PKG / "apply-patches.sh", fresh_src], check=True)
  ns: dict = {}
  exec((fresh_src / "tinygrad" / "orin_llm_patches.py").read_text(), ns)
  assert ns["PATCHES"] == tuple(p.name for p in PATCHES)

def test_installed_tinygrad_is_patched():
  try: from tinygrad.orin_llm_patches import PATCHES as installed
  except ImportError: pytest.fail("the imported tinygrad has no orin_llm_patches marker: it is not built by apply-patches.sh")
  assert installed == tuple(p.name for p in PATCHES)
