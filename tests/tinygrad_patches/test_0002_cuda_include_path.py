"""0002-cuda-include-path: CUDA_INCLUDE_PATH (colon-separated) gives NVRTC's -I options, for CUDA
toolkits split across prefixes (NixOS keeps the cudart headers apart from nvrtc). Runs without a GPU
or libnvrtc: nvrtcVersion, the one NVRTC call the constructor makes, is replaced by a stub."""
import json, os, subprocess, sys, textwrap

OPTIONS = textwrap.dedent("""
  import json
  from tinygrad.runtime.autogen import nvrtc
  from tinygrad.runtime.support import compiler_cuda
  def nvrtcVersion(major, minor):
    major.value, minor.value = 12, 6
    return 0
  nvrtc.nvrtcVersion = nvrtcVersion
  print(json.dumps(compiler_cuda.NVRTCCompiler("sm_87").compile_options))
""")

def compile_options(**env) -> list[str]:
  env = {**{k: v for k, v in os.environ.items() if k not in ("CUDA_PATH", "CUDA_INCLUDE_PATH")}, **env}
  r = subprocess.run([sys.executable, "-c", OPTIONS], env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.splitlines()[-1])

def includes(opts: list[str]) -> list[str]: return [o for o in opts if o.startswith("-I")]

def test_cuda_include_path_list():
  opts = compile_options(CUDA_PATH="/opt/cuda-toolkit", CUDA_INCLUDE_PATH="/nix/store/aaa-cuda_cudart/include:/nix/store/bbb-cuda_nvrtc/include:")
  assert includes(opts) == ["-I/nix/store/aaa-cuda_cudart/include", "-I/nix/store/bbb-cuda_nvrtc/include"], opts
  assert opts[0] == "--gpu-architecture=sm_87" and "--minimal" in opts, opts

def test_cuda_path_unchanged():
  assert includes(compile_options(CUDA_PATH="/opt/cuda-toolkit")) == ["-I/opt/cuda-toolkit/include"]
  assert includes(compile_options()) == ["-I/usr/local/cuda/include", "-I/usr/include", "-I/opt/cuda/include"]
