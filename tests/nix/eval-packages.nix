# Calls pkgs/tinygrad and pkgs/orin-llm with stand-ins for nixpkgs' builders (they return their
# arguments), to check the Nix logic of the two derivations without nixpkgs: the pin read from
# source.env, the patch script and the store-path substitutions in postPatch, the wrapper. Used by
# tests/test_nix.py (same flags as eval-module.nix).
{ lib }:
let
  fakePackage = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
    lib = fakePackage "${name}-lib";
    include = fakePackage "${name}-include";
    meta.mainProgram = name;
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
      config = { };
      setuptools = fakePackage "setuptools";
      stdenv.cc = {
        libc = fakePackage "glibc";
        cc = fakePackage "gcc";
      };
      addDriverRunpath.driverLink = "/run/opengl-driver";
      llvmPackages.clang-unwrapped = fakePackage "clang";
    };
    setuptools = fakePackage "setuptools";
    numpy = fakePackage "numpy";
    gguf = fakePackage "gguf";
    tokenizers = fakePackage "tokenizers";
    jinja2 = fakePackage "jinja2";
    aiohttp = fakePackage "aiohttp";
    prometheus-client = fakePackage "prometheus-client";
    llguidance = fakePackage "llguidance";
  };
  cudaPackages = lib.genAttrs [
    "cuda_nvrtc"
    "libnvjitlink"
    "cuda_cudart"
    "cuda_cccl"
  ] fakePackage;
  orinLlm =
    cudaSupport:
    import ../../pkgs/orin-llm {
      inherit lib python3Packages cudaSupport;
      cudaPackages = if cudaSupport then cudaPackages else { };
      config = { };
    };
  tinygradOf =
    cudaSupport:
    let
      tg = (orinLlm cudaSupport).passthru.tinygrad;
    in
    {
      inherit (tg) pname version pythonImportsCheck;
      inherit (tg.passthru) substitutions;
      postPatch = if hasFileset then tg.postPatch else null;
      src = { inherit (tg.src) pname version hash; };
    };
  # lib.fileset (the packages' sources) needs Nix >= 2.14 (builtins.readFileType); older Nix, as
  # Debian's nix-bin 2.8, evaluates everything else.
  hasFileset = builtins ? readFileType;
in
{
  inherit hasFileset;
  tinygradCuda = tinygradOf true;
  tinygradCpu = tinygradOf false;
  orinLlmCuda = {
    inherit (orinLlm true) pname version makeWrapperArgs;
    dependencies = map (p: p.name or p.pname) (orinLlm true).dependencies;
    src = if hasFileset then "${(orinLlm true).src}" else null;
  };
  orinLlmCpu = { inherit (orinLlm false) makeWrapperArgs; };
}
