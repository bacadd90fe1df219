# orin-llm, the Python application, from the repository's pyproject.toml.
#
# With CUDA (the default where nixpkgs is configured with cudaSupport, as jetpack-nixos does),
# the wrapper points tinygrad at the CUDA pieces it loads at run time: libcuda of the L4T driver
# (in /run/opengl-driver/lib on jetpack-nixos), NVRTC and nvJitLink from cudaPackages, and the
# CUDA headers NVRTC compiles against. Every variable is set with --set-default, so an
# environment that sets it wins.
{
  lib,
  python3Packages,
  addDriverRunpath,
  config,
  cudaSupport ? config.cudaSupport,
  cudaPackages ? { },
}:
let
  tinygrad = python3Packages.callPackage ../tinygrad { };

  # Only the files the Python build needs: the store path (and the build) does not change when
  # Nix files, tests or docs do.
  src = lib.fileset.toSource {
    root = ../..;
    fileset = lib.fileset.unions [
      ../../pyproject.toml
      ../../orin_llm
    ];
  };

  driverLib = "${addDriverRunpath.driverLink}/lib";

  # Also exported as passthru.runtimeEnv for the NixOS module.
  runtimeEnv = lib.optionalAttrs cudaSupport {
    # tinygrad's DLL loader takes <NAME>_PATH as the library file to load.
    CUDA_PATH = "${driverLib}/libcuda.so.1";
    NVRTC_PATH = "${lib.getLib cudaPackages.cuda_nvrtc}/lib/libnvrtc.so";
    NVJITLINK_PATH = "${lib.getLib cudaPackages.libnvjitlink}/lib/libnvJitLink.so";
    # cuda_fp16.h, cuda_bf16.h for NVRTC (read through a pkgs/tinygrad patch; upstream derives
    # the include directory from CUDA_PATH).
    CUDA_INCLUDE_PATH = "${lib.getInclude cudaPackages.cuda_cudart}/include";
  };
in
python3Packages.buildPythonApplication {
  pname = "orin-llm";
  version = (lib.importTOML ../../pyproject.toml).project.version;
  pyproject = true;
  inherit src;

  build-system = [ python3Packages.setuptools ];

  dependencies = with python3Packages; [
    numpy
    gguf
    tokenizers
    jinja2
    aiohttp
    prometheus-client
    tinygrad
  ];
  # The `systemd` extra (systemd-python) is left out: orin_llm.server speaks sd_notify itself without
  # it, and stderr of a unit goes to the journal anyway.

  # nixpkgs versions gguf after llama.cpp builds on some revisions; the API orin_llm uses is old.
  pythonRelaxDeps = [ "gguf" ];

  makeWrapperArgs =
    [
      "--set-default"
      "DEV"
      (if cudaSupport then "CUDA" else "CPU")
    ]
    ++ lib.concatLists (lib.mapAttrsToList (name: value: [ "--set-default" name value ]) runtimeEnv)
    ++ lib.optionals cudaSupport [
      # Fallback for anything that looks libcuda up by name.
      "--suffix"
      "LD_LIBRARY_PATH"
      ":"
      driverLib
    ];

  # The test suite needs the model files and (for most of it) a GPU; `make test` runs it.
  doCheck = false;
  pythonImportsCheck = [ "orin_llm" ];

  passthru = {
    inherit tinygrad runtimeEnv;
  };

  meta = {
    description = "LLM appliance for the Jetson AGX Orin: GGUF models on a patched tinygrad behind an OpenAI-compatible API";
    license = lib.licenses.mit;
    mainProgram = "orin-llm";
    platforms = lib.platforms.linux;
  };
}
