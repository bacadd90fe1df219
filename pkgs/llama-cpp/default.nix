# llama.cpp with CUDA for the Orin's GPU (sm_87): the reference `orin-llm bench` compares
# against (llama-bench), and llama-server for A/B tests of the API.
{
  lib,
  llama-cpp,
  cudaPackages,
}:
(llama-cpp.override {
  cudaSupport = true;
  inherit cudaPackages;
}).overrideAttrs
  (old: {
    pname = "llama-cpp-orin";
    # nixpkgs derives the architectures from config.cudaCapabilities; pin sm_87 whatever the
    # caller's config says (a later -D wins in CMake).
    cmakeFlags = (old.cmakeFlags or [ ]) ++ [
      (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" "87")
    ];
    meta = (old.meta or { }) // {
      mainProgram = "llama-server";
    };
  })
