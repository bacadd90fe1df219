"""Checks of the Nix side (flake.nix, pkgs/*/default.nix, nixos/module.nix) that run without a
Nix daemon, a binary cache or the network.

- Every .nix file parses (`nix-instantiate --parse`).
- flake.lock is consistent with flake.nix, and the tinygrad pin in SRI form matches source.env.
- With ORIN_LLM_NIXPKGS_LIB pointing at a nixpkgs `lib` directory (CI: ../shared/nixpkgs-lib/lib,
  the revision flake.lock pins): nixos/module.nix evaluated by the NixOS module system
  (lib.evalModules, tests/nix/eval-module.nix), the units it produces checked as systemd would read
  them (ExecStart's argv, environment, ordering, hardening); and the package expressions called with
  stand-in builders (tests/nix/eval-packages.nix), their store-path substitutions applied to the
  patched tinygrad sdist.

nix-instantiate runs against a throw-away store and state directory under pytest's tmp_path, with
no substituters and no user or system nix.conf.
"""
import base64, hashlib, json, os, pathlib, py_compile, re, shutil, subprocess, sys, tarfile

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
  assert {"numpy", "gguf", "tokenizers", "jinja2", "aiohttp", "prometheus-client", "llguidance", "tinygrad"} <= set(app["dependencies"])
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

def host_lib_dir(*names) -> str | None:
  for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64"):
    if all((pathlib.Path(d) / n).exists() for n in names): return d
  return None

@needs_nix
@needs_lib
def test_substituted_tinygrad_compiles_without_path(nix_env, patched_tinygrad):
  """Finding 2: the CPU backend of the substituted tinygrad compiles and runs a kernel with nothing on
  PATH. The store paths of the stand-ins are replaced by this host's clang and libraries."""
  clang, libc_dir, gcc_dir = shutil.which("clang"), host_lib_dir("libc.so.6", "libm.so.6"), host_lib_dir("libgcc_s.so.1")
  if not (clang and libc_dir and gcc_dir): pytest.skip("no clang, libc or libgcc_s on this host")
  host = {f"{STORE}glibc-lib/lib": libc_dir, f"{STORE}gcc-lib/lib": gcc_dir, f"{STORE}clang/bin/clang": clang}
  for s in eval_packages(nix_env)["tinygradCpu"]["substitutions"]:
    new = s["new"]
    for fake, real in host.items(): new = new.replace(fake, real)
    f = patched_tinygrad / s["file"]
    f.write_text(f.read_text().replace(s["old"], new))
  code = "from tinygrad import Tensor; print((Tensor([0.0, 1.0]).exp() + 1).tolist())"
  env = {"PATH": "/nonexistent", "PYTHONPATH": str(patched_tinygrad), "DEV": "CPU", "HOME": str(patched_tinygrad),
         "CACHELEVEL": "0"}
  r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=patched_tinygrad)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads(r.stdout) == pytest.approx([2.0, 3.7182818], rel=1e-6), r.stdout

# ---- the NixOS module ---------------------------------------------------------------------------

def module_eval(nix_env, config: str) -> dict:
  return nix_eval(nix_env, "tests/nix/eval-module.nix", lib=f"import {NIXPKGS_LIB}", userConfig=config)

def exec_argv(line: str) -> list[str]:
  """An ExecStart= line split as systemd splits the quoting utils.escapeSystemdExecArgs writes:
  double-quoted words with C escapes; `%%` and `$$` stand for `%` and `$`."""
  words = re.findall(r'"((?:[^"\\]|\\.)*)"', line)
  assert " ".join(f'"{w}"' for w in words) == line, line
  return [json.loads(f'"{w}"').replace("%%", "%").replace("$$", "$") for w in words]

MODEL = "/var/lib/orin-llm/Llama-3.2-1B-Instruct-Q6_K.gguf"
BASE = f'enable = true; settings.model = "{MODEL}";'
EXE = STORE + "orin-llm/bin/orin-llm"
CONFIG = re.compile(r"/nix/store/[a-z0-9]{32}-orin-llm\.toml")
# Every switch the units leave off, each with its reason in nixos/module.nix; a new one fails here.
HARDENING_OFF = {"MemoryDenyWriteExecute": False, "PrivateDevices": False, "PrivateUsers": False, "ProcSubset": "all"}
HARDENING_ON = {
  "CapabilityBoundingSet": [""], "LockPersonality": True, "NoNewPrivileges": True, "PrivateTmp": True, "ProtectClock": True,
  "ProtectControlGroups": True, "ProtectHome": True, "ProtectHostname": True, "ProtectKernelLogs": True,
  "ProtectKernelModules": True, "ProtectKernelTunables": True, "ProtectProc": "invisible", "ProtectSystem": "strict",
  "RemoveIPC": True, "RestrictAddressFamilies": ["AF_INET", "AF_INET6", "AF_UNIX"], "RestrictNamespaces": True,
  "RestrictRealtime": True, "RestrictSUIDSGID": True, "SystemCallArchitectures": "native",
  "SystemCallFilter": ["@system-service", "@resources", "~@privileged"], "UMask": "0077"}

def check_common(sc: dict, cache="/var/cache/orin-llm", devices="closed"):
  """What both units share: user, groups, cache directory, limits, hardening."""
  assert (sc["User"], sc["Group"], sc["SupplementaryGroups"]) == ("orin-llm", "orin-llm", ["video", "render"])
  assert (sc["CacheDirectory"], sc["CacheDirectoryMode"], sc["WorkingDirectory"]) == ("orin-llm", "0750", cache)
  assert sc["ReadWritePaths"] == ([] if cache == "/var/cache/orin-llm" else [cache])
  assert sc["LimitNOFILE"] == 4096
  assert {k: sc.get(k) for k in HARDENING_OFF} == HARDENING_OFF
  assert {k: sc.get(k) for k in HARDENING_ON} == HARDENING_ON and sc["DevicePolicy"] == devices
  assert "PrivateNetwork" not in sc and "DynamicUser" not in sc
  # nothing runs as root: no `+`-prefixed commands, no copy or chown around the program
  assert not {"ExecStartPre", "ExecStartPost"} & set(sc)

@needs_nix
@needs_lib
def test_module_defaults(nix_env):
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} }}; }}")
  assert out["failedAssertions"] == [] and out["warnings"] == []
  srv, pre = out["server"], out["prewarm"]
  sc, psc = srv["serviceConfig"], pre["serviceConfig"]
  argv = exec_argv(sc["ExecStart"])
  assert argv[:3] == [EXE, "serve", "--config"] and len(argv) == 4 and CONFIG.fullmatch(argv[3])
  # prewarm reads the server's own config file: the same model, context, BEAM width and cache directory
  assert exec_argv(psc["ExecStart"]) == [EXE, "prewarm", "--config", argv[3]]
  assert out["settings"] == {"model": MODEL, "host": "127.0.0.1", "port": 8080, "max_batch": 4, "gather_ms": 0, "beam": {"width": 0},
                             "kernel_cache": {"directory": "/var/cache/orin-llm"}}
  # the program reads what the module renders (types included: Nix writes gather_ms' default as an integer)
  from orin_llm.server.config import from_dict
  cfg = from_dict(out["settings"])
  assert (cfg.max_batch, cfg.gather_ms, cfg.port) == (4, 0.0, 8080)
  assert (sc["Type"], sc["NotifyAccess"], sc["WatchdogSec"], sc["TimeoutStartSec"]) == ("notify", "main", "30s", "30min")
  assert (sc["Restart"], sc["RestartSec"], sc["LoadCredential"]) == ("on-failure", "5s", [])
  assert (psc["Type"], psc["RemainAfterExit"], psc["TimeoutStartSec"]) == ("oneshot", True, "30min")
  check_common(sc); check_common(psc)
  assert "/dev/nvmap rw" in sc["DeviceAllow"] and sc["DeviceAllow"] == psc["DeviceAllow"]
  # one environment, and none of what the package knows (DEV, CUDA paths) nor fork for the server
  assert srv["environment"] == pre["environment"] == {"XDG_CACHE_HOME": "/var/cache/orin-llm"}
  # ordering: started at boot, after the network and the prewarm, which it wants but does not require
  assert srv["wantedBy"] == ["multi-user.target"]
  assert srv["after"] == ["network.target", "orin-llm-prewarm.service"] and srv["wants"] == ["orin-llm-prewarm.service"]
  assert "requires" not in srv and "network-online.target" not in str(srv)
  assert not {"wantedBy", "requiredBy", "before", "after"} & set(pre)
  assert out["units"] == ["orin-llm", "orin-llm-prewarm"]
  assert out["users"] == {"orin-llm": {"isSystemUser": True, "group": "orin-llm"}} and out["groups"] == ["orin-llm"]
  assert (out["firewall"], out["tmpfiles"], out["sysctl"], out["systemPackages"]) == ([], [], {}, ["orin-llm"])

@needs_nix
@needs_lib
def test_module_options(nix_env):
  out = module_eval(nix_env, f"""{{ services.orin-llm = {{ {BASE}
    settings = {{ host = "0.0.0.0"; port = 8000; beam = {{ width = 4; workers = 3; }}; context_length = 8192; max_batch = 8; gather_ms = 2.5;
                 kernel_cache.directory = "/srv/orin-llm-cache"; extra.flag = true; }};
    openFirewall = true; apiKeyFile = "/run/secrets/key"; hugepages.enable = true;
    deviceAllow = null; environment.DEBUG = "2"; }}; }}""")
  assert out["failedAssertions"] == [] and out["warnings"] == []
  srv = out["server"]
  sc, env = srv["serviceConfig"], srv["environment"]
  for unit in (sc, out["prewarm"]["serviceConfig"]): check_common(unit, cache="/srv/orin-llm-cache", devices="auto")
  assert env == {"XDG_CACHE_HOME": "/srv/orin-llm-cache", "DEBUG": "2"} and out["prewarm"]["environment"] == env
  assert sc["LoadCredential"] == ["api-key:/run/secrets/key"]
  assert sc["DeviceAllow"] == []
  assert out["tmpfiles"] == ["d /srv/orin-llm-cache 0750 orin-llm orin-llm - -"]
  assert out["firewall"] == [8000] and out["sysctl"] == {"vm.nr_hugepages": 128}
  assert out["settings"] == {"model": MODEL, "host": "0.0.0.0", "port": 8000, "context_length": 8192, "max_batch": 8, "gather_ms": 2.5,
                             "api_key_file": "/run/credentials/orin-llm.service/api-key", "extra": {"flag": True},
                             "beam": {"width": 4, "workers": 3}, "kernel_cache": {"directory": "/srv/orin-llm-cache"}}

@needs_nix
@needs_lib
@pytest.mark.parametrize("setting", ["max_batch = 0", "max_batch = 65", "gather_ms = 100.5", "gather_ms = -1", 'gather_ms = "2"'])
def test_module_typed_settings_refuse_out_of_bounds(nix_env, setting):
  """The typed settings' bounds are the program's (server/config.py): a value it would refuse at start-up fails the
  evaluation, naming the option."""
  ok = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} }}; }}")
  assert ok["failedAssertions"] == []
  with pytest.raises(AssertionError, match=r"services\.orin-llm\.settings\." + setting.split(" ")[0]):
    module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} settings.{setting}; }}; }}")

@needs_nix
@needs_lib
def test_module_shipped_cache_with_prewarm(nix_env):
  """A shipped cache with the prewarm on (the default): the program copies it, as the service
  user, writable (kernel_cache.install_shipped); no root copy whose modes the user cannot read."""
  ship = STORE + "kernel-cache"
  out = module_eval(nix_env, f'{{ services.orin-llm = {{ {BASE} settings.kernel_cache.shipped = "{ship}"; }}; }}')
  assert out["failedAssertions"] == [] and out["units"] == ["orin-llm", "orin-llm-prewarm"]
  assert out["settings"]["kernel_cache"] == {"directory": "/var/cache/orin-llm", "shipped": ship}
  srv, pre = out["server"], out["prewarm"]
  check_common(pre["serviceConfig"]); check_common(srv["serviceConfig"])
  assert exec_argv(pre["serviceConfig"]["ExecStart"])[:2] == [EXE, "prewarm"]
  assert pre["serviceConfig"]["User"] == "orin-llm"
  # a failed prewarm does not keep the server down
  assert srv["wants"] == ["orin-llm-prewarm.service"] and "requires" not in srv

@needs_nix
@needs_lib
def test_module_without_prewarm(nix_env):
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} prewarm = false; }}; }}")
  assert out["units"] == ["orin-llm"] and out["prewarm"] is None
  assert out["server"]["after"] == ["network.target"] and out["server"]["wants"] == []
  on = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} settings.beam.width = 0; prewarm = true; }}; }}")
  assert on["units"] == ["orin-llm", "orin-llm-prewarm"]

@needs_nix
@needs_lib
def test_module_exec_escaping(nix_env):
  """`%` and `$` in an argument reach the program as written: systemd would expand them otherwise."""
  pkg = '{ type = "derivation"; name = "odd"; outPath = "/nix/store/00000000000000000000000000000000-a%n$HOME"; meta.mainProgram = "orin-llm"; }'
  out = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} package = {pkg}; }}; }}")
  line = out["server"]["serviceConfig"]["ExecStart"]
  assert "a%%n$$HOME" in line
  assert exec_argv(line)[0] == "/nix/store/00000000000000000000000000000000-a%n$HOME/bin/orin-llm"

@needs_nix
@needs_lib
def test_module_renamed_and_removed_options(nix_env):
  out = module_eval(nix_env, """{ services.orin-llm = { enable = true; model = "/m.gguf"; port = 8000;
    beam = { width = 0; workers = 3; }; kernelCache = { directory = "/srv/c"; prewarm = true; }; }; }""")
  assert out["failedAssertions"] == []
  assert out["settings"] == {"model": "/m.gguf", "host": "127.0.0.1", "port": 8000, "max_batch": 4, "gather_ms": 0, "beam": {"width": 0, "workers": 3},
                             "kernel_cache": {"directory": "/srv/c"}}
  assert out["units"] == ["orin-llm", "orin-llm-prewarm"]
  assert len(out["warnings"]) == 6 and all("has been renamed to `services.orin-llm." in w for w in out["warnings"])
  # power modes are jetpack-nixos' own options; fork for the server is gone
  gone = module_eval(nix_env, f"{{ services.orin-llm = {{ {BASE} powerMode = {{ nvpmodelProfile = 0; maxClock = true; }}; beam.forkMode = true; }}; }}")
  msgs = "\n".join(gone["failedAssertions"])
  assert "services.nvpmodel.profileNumber" in msgs and "hardware.nvidia-jetpack.maxClock" in msgs and "beam.forkMode" in msgs

@needs_nix
@needs_lib
def test_module_disabled(nix_env):
  off = module_eval(nix_env, '{ services.orin-llm.settings.model = "/m.gguf"; }')
  assert off["units"] == [] and off["users"] == {} and off["systemPackages"] == []

@needs_nix
@needs_lib
def test_flake_module(nix_env):
  """The flake's nixosModules.default: the package from the flake's overlay called on the system's pkgs
  (with the driver's CUDA, nvidia-jetpack.cudaPackages), and no nixpkgs.overlays (readOnlyPkgs): the
  stubs declare no such option, so setting it would fail this evaluation."""
  out = nix_eval(nix_env, "tests/nix/eval-module.nix", lib=f"import {NIXPKGS_LIB}", viaFlake="true",
                 userConfig=f"{{ services.orin-llm = {{ {BASE} }}; }}")
  assert out["failedAssertions"] == [] and out["systemPackages"] == ["flake-orin-llm"]
  assert out["packageCuda"] == "nvidia-jetpack.cudaPackages"
  assert exec_argv(out["server"]["serviceConfig"]["ExecStart"])[0] == STORE + "flake-orin-llm/bin/flake-orin-llm"
  own = nix_eval(nix_env, "tests/nix/eval-module.nix", lib=f"import {NIXPKGS_LIB}", viaFlake="true",
                 userConfig=f'{{ services.orin-llm = {{ {BASE} package = {{ type = "derivation"; name = "mine"; outPath = "/nix/store/00000000000000000000000000000000-mine"; meta.mainProgram = "orin-llm"; }}; }}; }}')
  assert own["systemPackages"] == ["mine"]
