# Calls pkgs/tinygrad and pkgs/orin-llm with stand-ins for nixpkgs' builders (they return their
# arguments), to check the Nix logic of the two derivations without nixpkgs: the pin read from
# source.env, the patch script in postPatch, the wrapper's CUDA environment. Used by
# tests/test_nix.py (same flags as eval-module.nix).
{ lib }:
let
  fakePackage = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
    lib = fakePackage "${name}-lib";
    include = fakePackage "${name}-include";
  };
  python3Packages = rec {
    buildPythonPackage = attrs: attrs;
    buildPythonApplication = attrs: attrs;
    fetchPypi = attrs: attrs;
    callPackage =
      f: overrides:
      let
        fn = import f;
      in
      fn (builtins.intersectAttrs (builtins.functionArgs fn) (scope // overrides));
    scope = {
      inherit lib buildPythonPackage fetchPypi;
      setuptools = fakePackage "setuptools";
    };
    setuptools = fakePackage "setuptools";
    numpy = fakePackage "numpy";
    gguf = fakePackage "gguf";
    tokenizers = fakePackage "tokenizers";
    jinja2 = fakePackage "jinja2";
    aiohttp = fakePackage "aiohttp";
    prometheus-client = fakePackage "prometheus-client";
  };
  cudaPackages = {
    cuda_nvrtc = fakePackage "cuda_nvrtc";
    libnvjitlink = fakePackage "libnvjitlink";
    cuda_cudart = fakePackage "cuda_cudart";
  };
  orinLlm =
    cudaSupport:
    import ../../pkgs/orin-llm {
      inherit lib python3Packages cudaSupport cudaPackages;
      addDriverRunpath.driverLink = "/run/opengl-driver";
      config = { };
    };
  tinygrad = python3Packages.callPackage ../../pkgs/tinygrad { };
  # lib.fileset (the packages' sources) needs Nix >= 2.14 (builtins.readFileType); older Nix, as
  # Debian's nix-bin 2.8, evaluates everything else.
  hasFileset = builtins ? readFileType;
in
{
  inherit hasFileset;
  tinygrad = {
    inherit (tinygrad) pname version pythonImportsCheck;
    postPatch = if hasFileset then tinygrad.postPatch else null;
    src = { inherit (tinygrad.src) pname version hash; };
  };
  orinLlmCuda = {
    inherit (orinLlm true) pname version makeWrapperArgs;
    inherit ((orinLlm true).passthru) runtimeEnv;
    dependencies = map (p: p.name or p.pname) (orinLlm true).dependencies;
    src = if hasFileset then "${(orinLlm true).src}" else null;
  };
  orinLlmCpu = {
    inherit (orinLlm false) makeWrapperArgs;
    inherit ((orinLlm false).passthru) runtimeEnv;
  };
}
