# tinygrad as orin-llm runs it: the sdist pinned in ./source.env with the patch series of
# ./patches applied by ./apply-patches.sh (the script scripts/setup_venv.py runs, so the venv and
# the Nix build carry the same files). Then, as nixpkgs' own python3Packages.tinygrad does, every
# library and tool tinygrad would look for in /usr/lib, /lib or PATH is replaced by a store path,
# so nothing has to be set in the environment of the program or the service.
{
  lib,
  stdenv,
  config,
  buildPythonPackage,
  fetchPypi,
  setuptools,
  addDriverRunpath,
  llvmPackages,
  cudaSupport ? config.cudaSupport,
  cudaPackages ? { },
}:
let
  # source.env is shell syntax (KEY=VALUE lines); it is the one place the pin lives.
  pin = lib.pipe ./source.env [
    builtins.readFile
    (lib.splitString "\n")
    (builtins.filter (line: builtins.match "[A-Z_]+=.*" line != null))
    (map (line: builtins.match "([A-Z_]+)=(.*)" line))
    (map (kv: lib.nameValuePair (builtins.elemAt kv 0) (builtins.elemAt kv 1)))
    builtins.listToAttrs
  ];

  # TINYGRAD_SHA256 of source.env in SRI form (tests/test_nix.py checks that the two agree; Nix
  # 2.19+ checks it again below with builtins.convertHash).
  hash = "sha256-Q3vmu3SB7CbjMuT0NC9uoJ5BJY5ixcCfSp7XrreCmgc=";

  # Only the script and the patches: editing this file does not change the patched source.
  patchSeries = lib.fileset.toSource {
    root = ./.;
    fileset = lib.fileset.unions [
      ./apply-patches.sh
      (lib.fileset.maybeMissing ./patches)
    ];
  };

  libc = "${lib.getLib stdenv.cc.libc}/lib";
  substitute = file: old: new: { inherit file old new; };

  # Applied after the patch series with `substituteInPlace --replace-fail`: a tinygrad whose text
  # moved fails the build instead of searching /usr/lib at run time. tests/test_nix.py applies the
  # same list to the patched sdist. A <NAME>_PATH variable still overrides each library (tinygrad's
  # DLL loader reads it first).
  substitutions = [
    (substitute "tinygrad/runtime/autogen/libc.py" "c.DLL('libc', 'c', use_errno=True)"
      "c.DLL('libc', '${libc}/libc.so.6', use_errno=True)"
    )
    # libm for the CPU backend's JIT linker; libgcc_s for __clear_cache (the instruction cache
    # flush after writing code, which aarch64 needs).
    (substitute "tinygrad/runtime/ops_cpu.py" "else 'gcc_s'), DLL('m', 'm')"
      "else '${lib.getLib stdenv.cc.cc}/lib/libgcc_s.so.1'), DLL('m', '${libc}/libm.so.6')"
    )
    # The CPU backend compiles with clang. Unwrapped, as in nixpkgs' tinygrad: it builds
    # freestanding objects for -march/-mcpu=native. $CC no longer overrides it: in a Nix shell it
    # is the wrapped host compiler, which cannot target *-none-unknown-elf.
    (substitute "tinygrad/runtime/support/compiler_cpu.py" "getenv(\"CC\", 'clang')"
      "'${lib.getExe llvmPackages.clang-unwrapped}'"
    )
  ]
  ++ lib.optionals cudaSupport [
    # libcuda belongs to the driver, so it comes from /run/opengl-driver; .so.1 is its soname,
    # which the driver always provides.
    (substitute "tinygrad/runtime/autogen/cuda.py" "c.DLL('cuda', 'nvcuda' if WIN else 'cuda')"
      "c.DLL('cuda', '${addDriverRunpath.driverLink}/lib/libcuda.so.1')"
    )
    (substitute "tinygrad/runtime/autogen/nvrtc.py" "c.DLL('nvrtc', 'nvrtc', ["
      "c.DLL('nvrtc', '${lib.getLib cudaPackages.cuda_nvrtc}/lib/libnvrtc.so', ["
    )
    (substitute "tinygrad/runtime/autogen/nvjitlink.py" "c.DLL('nvjitlink', 'nvJitLink', ["
      "c.DLL('nvjitlink', '${lib.getLib cudaPackages.libnvjitlink}/lib/libnvJitLink.so', ["
    )
    # The headers NVRTC compiles kernels against (cuda_fp16.h from cudart, which includes
    # <nv/target> from cccl) as the default of CUDA_INCLUDE_PATH, the variable patch 0002 adds.
    (substitute "tinygrad/runtime/support/compiler_cuda.py" "getenv(\"CUDA_INCLUDE_PATH\", \"\")"
      "getenv(\"CUDA_INCLUDE_PATH\", \"${lib.getInclude cudaPackages.cuda_cudart}/include:${lib.getInclude cudaPackages.cuda_cccl}/include\")"
    )
  ];
in
assert
  builtins ? convertHash
  -> builtins.convertHash {
    hash = pin.TINYGRAD_SHA256;
    hashAlgo = "sha256";
    toHashFormat = "sri";
  } == hash;
buildPythonPackage {
  pname = "tinygrad";
  version = pin.TINYGRAD_VERSION;
  pyproject = true;

  src = fetchPypi {
    pname = "tinygrad";
    version = pin.TINYGRAD_VERSION;
    inherit hash;
  };

  postPatch = ''
    sh ${patchSeries}/apply-patches.sh .
  ''
  + lib.concatMapStrings (s: ''
    substituteInPlace ${s.file} --replace-fail ${lib.escapeShellArg s.old} ${lib.escapeShellArg s.new}
  '') substitutions;

  build-system = [ setuptools ];

  # tinygrad's own tests want devices, network and far more time than a build has.
  doCheck = false;
  pythonImportsCheck = [
    "tinygrad"
    "tinygrad.orin_llm_patches"
    "tinygrad.runtime.ops_cpu"
  ]
  ++ lib.optionals cudaSupport [ "tinygrad.runtime.ops_cuda" ];

  passthru = { inherit substitutions; };

  meta = {
    description = "tinygrad with orin_llm's patch series";
    homepage = "https://github.com/tinygrad/tinygrad";
    license = lib.licenses.mit;
  };
}
