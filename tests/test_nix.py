"""Checks of the Nix side (flake.nix, pkgs/*/default.nix, nixos/module.nix) that run without a
Nix daemon, a binary cache or the network.

- Every .nix file parses (`nix-instantiate --parse`).
- flake.lock is consistent with flake.nix, and the tinygrad pin in SRI form matches source.env.
- With ORIN_LLM_NIXPKGS_LIB pointing at a nixpkgs `lib` directory (for example `lib/` of
  github.com/nix-community/nixpkgs.lib): nixos/module.nix evaluated by the NixOS module system
  (lib.evalModules, tests/nix/eval-module.nix), and the package expressions called with stand-in
  builders (tests/nix/eval-packages.nix).

nix-instantiate runs against a throw-away store and state directory under pytest's tmp_path, with
no substituters and no user or system nix.conf.
"""
import base64, hashlib, json, os, pathlib, py_compile, re, shlex, shutil, subprocess, tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NIX = shutil.which("nix-instantiate")
NIXPKGS_LIB = os.environ.get("ORIN_LLM_NIXPKGS_LIB", "")

needs_nix = pytest.mark.skipif(NIX is None, reason="nix-instantiate not installed (Debian: apt-get install nix-bin)")
needs_lib = pytest.mark.skipif(
  not (NIXPKGS_LIB and (pathlib.Path(NIXPKGS_LIB) / "default.nix").is_file()),
  reason="ORIN_LLM_NIXPKGS_LIB is not set to a nixpkgs `lib` directory (e.g. a checkout of nix-community/nixpkgs.lib + /lib)")

def nix_files():
  skip = {".git", ".venv", ".cache", "build", "node_modules"}
  return sorted(p for p in ROOT.rglob("*.nix") if not skip & set(p.relative_to(ROOT).parts))

@pytest.fixture(scope="module")
def nix_env(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("nix")
  (tmp / "conf").mkdir()
  env = {k: v for k, v in os.environ.items() if not k.startswith("NIX_")}
  env.update(NIX_STATE_DIR=str(tmp / "state"), NIX_CONF_DIR=str(tmp / "conf"), NIX_USER_CONF_FILES="",
             HOME=str(tmp), XDG_CACHE_HOME=str(tmp / "cache"))
  return env, tmp / "root"

def nix_eval(nix_env, file, **args) -> dict:
  env, store = nix_env
  cmd = [NIX, "--eval", "--strict", "--json", "--read-write-mode", "--store", str(store),
         "--option", "substituters", "", "--option", "allow-import-from-derivation", "false", str(ROOT / file)]
  for name, expr in args.items(): cmd += ["--arg", name, expr]
  r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
  return json.loads(r.stdout)

# ---- everything parses --------------------------------------------------------------------------

def test_nix_files_exist():
  names = {str(p.relative_to(ROOT)) for p in nix_files()}
  assert {"flake.nix", "nixos/module.nix", "pkgs/tinygrad/default.nix", "pkgs/orin-llm/default.nix",
          "pkgs/llama-cpp/default.nix"} <= names

@needs_nix
@pytest.mark.parametrize("path", nix_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_parses(path, nix_env):
  r = subprocess.run([NIX, "--parse", str(path)], env=nix_env[0], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr

# ---- pins ---------------------------------------------------------------------------------------

def test_tinygrad_sri_matches_source_env():
  env = dict(l.split("=", 1) for l in (ROOT / "pkgs/tinygrad/source.env").read_text().splitlines() if l and not l.startswith("#"))
  sri = "sha256-" + base64.b64encode(bytes.fromhex(env["TINYGRAD_SHA256"])).decode()
  assert f'hash = "{sri}";' in (ROOT / "pkgs/tinygrad/default.nix").read_text()

def test_flake_lock_consistent():
  lock = json.loads((ROOT / "flake.lock").read_text())
  assert lock["version"] == 7
  nodes = lock["nodes"]
  def resolve(ref, depth=0):  # a node name, or a follows path from the root
    assert depth < 10, "follows cycle"
    if isinstance(ref, str): return ref
    node = lock["root"]
    for name in ref:
      node = resolve(nodes[node]["inputs"][name], depth + 1)
    return node
  for name, node in nodes.items():
    for ref in node.get("inputs", {}).values(): assert resolve(ref) in nodes, (name, ref)
    if name != lock["root"]:
      locked = node["locked"]
      assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]) and locked["narHash"].startswith("sha256-"), name
  assert set(nodes["root"]["inputs"]) == {"nixpkgs", "jetpack-nixos"}
  # jetpack-nixos follows our nixpkgs, and is pinned to the revision flake.nix names.
  assert resolve(nodes["jetpack-nixos"]["inputs"]["nixpkgs"]) == "nixpkgs"
  rev = nodes["jetpack-nixos"]["locked"]["rev"]
  assert f"github:anduril/jetpack-nixos/{rev}" in (ROOT / "flake.nix").read_text()

@needs_nix
def test_flake_inputs_match_lock(nix_env):
  env, _ = nix_env
  r = subprocess.run([NIX, "--eval", "--strict", "--json", "-E", f"(import {ROOT}/flake.nix).inputs"],
                     env=env, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  inputs = json.loads(r.stdout)
  lock = json.loads((ROOT / "flake.lock").read_text())["nodes"]
  assert inputs["jetpack-nixos"]["inputs"]["nixpkgs"]["follows"] == "nixpkgs"
  assert inputs["nixpkgs"]["url"].endswith("/" + lock["nixpkgs"]["original"]["ref"])

# ---- package expressions ------------------------------------------------------------------------

def eval_packages(nix_env) -> dict: return nix_eval(nix_env, "tests/nix/eval-packages.nix", lib=f"import {NIXPKGS_LIB}")

STORE = "/nix/store/00000000000000000000000000000000-"

@needs_nix
@needs_lib
def test_package_expressions(nix_env):
  out = eval_packages(nix_env)
  tg, cpu = out["tinygradCuda"], out["tinygradCpu"]
  assert tg["version"] == "0.14.0" and tg["src"]["pname"] == "tinygrad"
  assert {"tinygrad.orin_llm_patches", "tinygrad.runtime.ops_cpu", "tinygrad.runtime.ops_cuda"} <= set(tg["pythonImportsCheck"])
  if out["hasFileset"]:  # Nix >= 2.14
    assert re.match(r"sh /nix/store/[a-z0-9]{32}-source/apply-patches.sh \.\n", tg["postPatch"])
    assert tg["postPatch"].count("substituteInPlace ") == len(tg["substitutions"])
  # every library and tool tinygrad would look for in /usr/lib, /lib or PATH, as a store path
  new = {s["file"].removeprefix("tinygrad/runtime/"): s["new"] for s in tg["substitutions"]}
  assert f"'{STORE}glibc-lib/lib/libc.so.6'" in new["autogen/libc.py"]
  assert f"'{STORE}gcc-lib/lib/libgcc_s.so.1'" in new["ops_cpu.py"] and f"'{STORE}glibc-lib/lib/libm.so.6'" in new["ops_cpu.py"]
  assert new["support/compiler_cpu.py"] == f"'{STORE}clang/bin/clang'"
  assert "'/run/opengl-driver/lib/libcuda.so.1'" in new["autogen/cuda.py"]
  assert f"'{STORE}cuda_nvrtc-lib/lib/libnvrtc.so'" in new["autogen/nvrtc.py"]
  assert f"'{STORE}libnvjitlink-lib/lib/libnvJitLink.so'" in new["autogen/nvjitlink.py"]
  assert f'"{STORE}cuda_cudart-include/include:{STORE}cuda_cccl-include/include"' in new["support/compiler_cuda.py"]
  # without CUDA: the same, less the CUDA libraries
  assert cpu["substitutions"] == [s for s in tg["substitutions"] if "cuda" not in s["file"] and "nv" not in s["file"]]
  assert len(cpu["substitutions"]) == 3
  app = out["orinLlmCuda"]
  assert app["pname"] == "orin-llm" and app["version"] == "0.1.0"
  assert {"numpy", "gguf", "tokenizers", "jinja2", "aiohttp", "prometheus-client", "tinygrad"} <= set(app["dependencies"])
  # the wrapper sets the default device only: the library paths live in tinygrad's source
  assert app["makeWrapperArgs"] == ["--set-default", "DEV", "CUDA"]
  assert out["orinLlmCpu"]["makeWrapperArgs"] == ["--set-default", "DEV", "CPU"]

@pytest.fixture
def patched_tinygrad(tmp_path) -> pathlib.Path:
  """The pinned sdist (downloaded by scripts/setup_venv.py into .cache) with apply-patches.sh run, as postPatch does."""
  env = dict(l.split("=", 1) for l in (ROOT / "pkgs/tinygrad/source.env").read_text().splitlines() if l and not l.startswith("#"))
  sdist = ROOT / ".cache" / f"tinygrad-{env['TINYGRAD_VERSION']}.tar.gz"
  if not sdist.exists(): pytest.skip(f"{sdist.relative_to(ROOT)} absent (scripts/setup_venv.py downloads it)")
  assert hashlib.sha256(sdist.read_bytes()).hexdigest() == env["TINYGRAD_SHA256"]
  with tarfile.open(sdist) as tf: tf.extractall(tmp_path, filter="data")
  src = tmp_path / f"tinygrad-{env['TINYGRAD_VERSION']}"
  subprocess.run(["sh", ROOT / "pkgs/tinygrad/apply-patches.sh", src], check=True)
  return src

@needs_nix
@needs_lib
def test_tinygrad_substitutions_apply(nix_env, patched_tinygrad):
  """`substituteInPlace --replace-fail` of every substitution finds its text in the patched sdist, and the
  files still compile: what the Nix build would do, checked without building."""
  for s in eval_packages(nix_env)["tinygradCuda"]["substitutions"]:
    f = patched_tinygrad / s["file"]
    text = f.read_text()
    assert text.count(s["old"]) == 1, f"{s['file']}: {s['old']!r} occurs {text.count(s['old'])} times"
    f.write_text(text.replace(s["old"], s["new"]))
    py_compile.compile(str(f), doraise=True)

# ---- the NixOS module ---------------------------------------------------------------------------

def module_eval(nix_env, config: str) -> dict:
  return nix_eval(nix_env, "tests/nix/eval-module.nix", lib=f"import {NIXPKGS_LIB}", userConfig=config)

BASE = 'enable = true; model = "/var/lib/orin-llm/Llama-3.2-1B-Instruct-Q6_K.gguf";'

@needs_nix
@needs_lib
def test_module_defaults(nix_env):
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} hugepages = {{ enable = true; count = 1024; }}; }}; }}")
  assert out["failedAssertions"] == []
  srv, pre = out["server"], out["prewarm"]
  sc = srv["serviceConfig"]
  assert re.fullmatch(r"/nix/store/\S+/bin/orin-llm serve --config /nix/store/[a-z0-9]{32}-orin-llm\.toml", sc["ExecStart"])
  assert (sc["Type"], sc["NotifyAccess"], sc["WatchdogSec"], sc["Restart"]) == ("notify", "main", "30s", "on-failure")
  assert sc["TimeoutStartSec"] == "30min"
  assert sc["User"] == sc["Group"] == "orin-llm" and "video" in sc["SupplementaryGroups"]
  assert sc["CacheDirectory"] == "orin-llm"
  assert sc["MemoryDenyWriteExecute"] is False and sc["PrivateDevices"] is False
  assert sc["DevicePolicy"] == "closed" and "/dev/nvmap rw" in sc["DeviceAllow"]
  assert srv["wantedBy"] == ["multi-user.target"]
  env = srv["environment"]
  assert env["DEV"] == "CUDA" and env["BEAM_MP_CTX"] == "fork"
  assert env["ORIN_LLM_CACHE_DIR"] == "/var/cache/orin-llm"
  assert env["CUDA_PATH"] == "/run/opengl-driver/lib/libcuda.so.1"  # from the package's passthru.runtimeEnv
  # the prewarm oneshot runs first, and the server needs it
  assert pre["before"] == ["orin-llm.service"] and pre["requiredBy"] == ["orin-llm.service"]
  assert "orin-llm-prewarm.service" in srv["after"] and "orin-llm-prewarm.service" in srv["requires"]
  psc = pre["serviceConfig"]
  assert psc["Type"] == "oneshot" and psc["RemainAfterExit"] is True
  # prewarm reads the server's own config file: the same model, context, BEAM width and cache directory
  assert psc["ExecStart"] == sc["ExecStart"].replace(" serve --config ", " prewarm --config "), psc["ExecStart"]
  assert pre["environment"] == env
  assert out["sysctl"] == {"vm.nr_hugepages": 1024}
  assert out["settings"] == {"model": "/var/lib/orin-llm/Llama-3.2-1B-Instruct-Q6_K.gguf", "host": "127.0.0.1", "port": 8080,
                             "beam": {"width": 2}, "kernel_cache": {"directory": "/var/cache/orin-llm"}}
  assert out["users"]["orin-llm"]["isSystemUser"] is True and "orin-llm" in out["groups"]
  assert out["firewall"] == [] and out["tmpfiles"] == []
  assert out["jetpack"] == {"maxClock": False, "nvpmodelProfile": None}

@needs_nix
@needs_lib
def test_module_options(nix_env):
  out = module_eval(nix_env, f"""{{ services.orin-llm = {{ {BASE}
    host = "0.0.0.0"; port = 8000; openFirewall = true; apiKeyFile = "/run/secrets/key";
    beam = {{ width = 4; workers = 6; forkMode = false; }};
    kernelCache.directory = "/srv/orin-llm-cache";
    settings = {{ context_length = 8192; extra.flag = true; beam.workers = 3; }};
    powerMode = {{ nvpmodelProfile = 0; maxClock = true; }};
    deviceAllow = null; environment.DEBUG = "2"; }}; }}""")
  assert out["failedAssertions"] == []
  sc, env = out["server"]["serviceConfig"], out["server"]["environment"]
  assert env["BEAM_MP_CTX"] == "spawn" and env["DEBUG"] == "2" and env["ORIN_LLM_CACHE_DIR"] == "/srv/orin-llm-cache"
  assert sc["LoadCredential"] == ["api-key:/run/secrets/key"]
  assert sc["DevicePolicy"] == "auto" and sc["DeviceAllow"] == []
  assert "/srv/orin-llm-cache" in sc["ReadWritePaths"]
  assert out["tmpfiles"] == ["d /srv/orin-llm-cache 0750 orin-llm orin-llm - -"]
  assert out["firewall"] == [8000] and out["sysctl"] == {}
  assert out["settings"] == {"model": "/var/lib/orin-llm/Llama-3.2-1B-Instruct-Q6_K.gguf", "host": "0.0.0.0", "port": 8000,
                             "api_key_file": "/run/credentials/orin-llm.service/api-key", "context_length": 8192,
                             "extra": {"flag": True}, "beam": {"width": 4, "workers": 3},
                             "kernel_cache": {"directory": "/srv/orin-llm-cache"}}
  assert out["jetpack"] == {"maxClock": True, "nvpmodelProfile": 0}

@needs_nix
@needs_lib
def test_module_without_prewarm(nix_env):
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} beam.width = 0; }}; }}")
  assert out["units"] == ["orin-llm"] and out["prewarm"] is None
  assert out["server"]["after"] == ["network-online.target"] and out["server"]["requires"] == []

@needs_nix
@needs_lib
def test_module_shipped_cache(nix_env):
  out = module_eval(nix_env, f'{{ services.orin-llm = {{ {BASE} kernelCache = {{ prewarm = false; shipped = "/nix/store/00000000000000000000000000000000-cache"; }}; }}; }}')
  psc = out["prewarm"]["serviceConfig"]
  (pre,) = psc["ExecStartPre"]  # `+`: full privileges; systemd splits the rest like a shell
  assert pre[0] == "+" and shlex.split(pre[1:]) == [
    "/nix/store/00000000000000000000000000000000-coreutils/bin/cp", "-r", "--no-clobber", "--no-preserve=mode,ownership",
    "/nix/store/00000000000000000000000000000000-cache/.", "/var/cache/orin-llm"]
  assert psc["ExecStart"].endswith("/bin/true")
  assert "orin-llm-prewarm.service" in out["server"]["requires"]

@needs_nix
@needs_lib
def test_module_assertions_and_disabled(nix_env):
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} hugepages.enable = true; }}; }}")
  assert any("hugepages.count is 0" in m for m in out["failedAssertions"])
  off = nix_eval(nix_env, "tests/nix/eval-module.nix", lib=f"import {NIXPKGS_LIB}",
                 userConfig='{ services.orin-llm.model = "/m.gguf"; }')
  assert off["units"] == [] and off["users"] == {}
