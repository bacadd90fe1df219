# orin-llm, the Python application, from the repository's pyproject.toml.
#
# tinygrad (../tinygrad) carries the store paths of every library it loads (libcuda of the driver
# in /run/opengl-driver/lib, NVRTC, nvJitLink, the CUDA headers, libc, clang), so the wrapper sets
# only the device tinygrad uses by default, with --set-default so that an environment that sets
# DEV wins.
{
  lib,
  python3Packages,
  config,
  cudaSupport ? config.cudaSupport,
  cudaPackages ? { },
}:
let
  tinygrad = python3Packages.callPackage ../tinygrad { inherit cudaSupport cudaPackages; };

  # Only the files the Python build needs: the store path (and the build) does not change when
  # Nix files, tests or docs do.
  src = lib.fileset.toSource {
    root = ../..;
    fileset = lib.fileset.unions [
      ../../pyproject.toml
      ../../orin_llm
    ];
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
    llguidance # JSON-schema output and tool calls (orin_llm/structured.py); pyproject asks for >= 1.8
    tinygrad
  ];
  # The `systemd` extra (systemd-python) is left out: orin_llm.server speaks sd_notify itself without
  # it, and stderr of a unit goes to the journal anyway.

  # nixpkgs versions gguf after llama.cpp builds on some revisions; the API orin_llm uses is old.
  pythonRelaxDeps = [ "gguf" ];

  makeWrapperArgs = [
    "--set-default"
    "DEV"
    (if cudaSupport then "CUDA" else "CPU")
  ];

  # The test suite needs the model files and (for most of it) a GPU; `make test` runs it.
  doCheck = false;
  pythonImportsCheck = [ "orin_llm" ];

  passthru = { inherit tinygrad; };

  meta = {
    description = "LLM appliance for the Jetson AGX Orin: GGUF models on a patched tinygrad behind an OpenAI-compatible API";
    license = lib.licenses.mit;
    mainProgram = "orin-llm";
    platforms = lib.platforms.linux;
  };
}
