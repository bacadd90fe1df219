# Evaluates nixos/module.nix with the NixOS module system (lib.evalModules from a nixpkgs `lib`)
# without the rest of NixOS: the options the module defines values for are declared by stubs
# below, with freeform types, so what the module writes comes out as it wrote it. Pure and
# offline; used by tests/test_nix.py:
#   nix-instantiate --eval --strict --json --readonly-mode tests/nix/eval-module.nix \
#     --arg lib 'import /path/to/nixpkgs/lib' --arg userConfig '{ services.orin-llm = { ... }; }'
{
  lib,
  userConfig,
}:
let
  inherit (lib) mkOption types;

  freeform = types.submodule { freeformType = types.lazyAttrsOf types.anything; };

  fakePackage =
    name: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "/nix/store/00000000000000000000000000000000-${name}";
      meta.mainProgram = name;
    }
    // extra;

  # The parts of nixpkgs the module uses.
  pkgs = {
    coreutils = fakePackage "coreutils" { };
    orin-llm = fakePackage "orin-llm" {
      passthru.runtimeEnv = {
        CUDA_PATH = "/run/opengl-driver/lib/libcuda.so.1";
        NVRTC_PATH = "/nix/store/00000000000000000000000000000000-cuda_nvrtc-lib/lib/libnvrtc.so";
      };
    };
    # pkgs.formats.toml: same interface; renders JSON, which the tests read back.
    formats.toml = { }: {
      type = types.attrsOf types.anything;
      generate = name: value: builtins.toFile name (builtins.toJSON value);
    };
  };

  # Options of NixOS (and of jetpack-nixos) that the module defines values for.
  stubs = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      users.users = mkOption {
        type = types.attrsOf freeform;
        default = { };
      };
      users.groups = mkOption {
        type = types.attrsOf freeform;
        default = { };
      };
      systemd.services = mkOption {
        type = types.attrsOf freeform;
        default = { };
      };
      systemd.tmpfiles.rules = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      boot.kernel.sysctl = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      environment.systemPackages = mkOption {
        type = types.listOf types.package;
        default = [ ];
      };
      # jetpack-nixos (modules/default.nix, modules/nvpmodel.nix at the pinned revision).
      hardware.nvidia-jetpack.maxClock = mkOption {
        type = types.bool;
        default = false;
      };
      services.nvpmodel.profileNumber = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
    };
  };

  eval = lib.evalModules {
    modules = [
      ../../nixos/module.nix
      stubs
      { _module.args.pkgs = pkgs; }
      userConfig
    ];
  };
  inherit (eval) config;
  services = config.systemd.services;
  unitNames = builtins.attrNames services;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  units = unitNames;
  server = services.orin-llm or null;
  prewarm = services.orin-llm-prewarm or null;
  # The rendered --config file, read back.
  settings =
    if services ? orin-llm then
      lib.importJSON (lib.last (lib.splitString " " services.orin-llm.serviceConfig.ExecStart))
    else
      null;
  sysctl = config.boot.kernel.sysctl;
  firewall = config.networking.firewall.allowedTCPPorts;
  tmpfiles = config.systemd.tmpfiles.rules;
  users = config.users.users;
  groups = builtins.attrNames config.users.groups;
  jetpack = {
    maxClock = config.hardware.nvidia-jetpack.maxClock;
    nvpmodelProfile = config.services.nvpmodel.profileNumber;
  };
}
