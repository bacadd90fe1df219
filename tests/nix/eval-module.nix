# Evaluates nixos/module.nix with the NixOS module system (lib.evalModules from a nixpkgs `lib`)
# without the rest of NixOS: the options the module defines values for are declared by stubs
# below, with freeform types, so what the module writes comes out as it wrote it. With
# `viaFlake = true` the module is the flake's nixosModules.default, whose package comes from the
# flake's overlay called on these pkgs. Pure and offline; used by tests/test_nix.py:
#   nix-instantiate --eval --strict --json tests/nix/eval-module.nix \
#     --arg lib 'import /path/to/nixpkgs/lib' --arg userConfig '{ services.orin-llm = { ... }; }'
{
  lib,
  userConfig,
  viaFlake ? false,
}:
let
  inherit (lib) mkOption types;

  freeform = types.submodule { freeformType = types.lazyAttrsOf types.anything; };
  listOption = mkOption {
    type = types.listOf types.unspecified;
    default = [ ];
  };

  fakePackage = name: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
    meta.mainProgram = name;
  };

  # The flake's outputs, of which only `lib` of nixpkgs is used by the overlay and the module.
  flake = (import ../../flake.nix).outputs {
    self = flake;
    nixpkgs = { inherit lib; };
    jetpack-nixos = { };
  };

  # The parts of nixpkgs the module uses (and the flake's overlay: callPackage, cudaPackages).
  pkgs = {
    orin-llm = if viaFlake then throw "the flake's module must not need pkgs.orin-llm" else fakePackage "orin-llm";
    callPackage = path: args: fakePackage "flake-${baseNameOf path}" // { passthru.callArgs = args; };
    cudaPackages = "the system's cudaPackages";
    nvidia-jetpack.cudaPackages = "nvidia-jetpack.cudaPackages";
    # pkgs.formats.toml: the same value type (TOML has no null); renders JSON, which the tests read.
    formats.toml =
      { }:
      {
        type =
          let
            value = types.oneOf [
              types.bool
              types.int
              types.float
              types.str
              types.path
              (types.attrsOf value)
              (types.listOf value)
            ];
          in
          types.attrsOf value;
        generate = name: value: builtins.toFile name (builtins.toJSON value);
      };
  };

  # utils.escapeSystemdExecArgs of nixos/lib/utils.nix: each argument JSON-quoted, then `%` and `$`
  # doubled so that systemd expands neither specifiers nor variables.
  utils.escapeSystemdExecArgs = lib.concatMapStringsSep " " (
    arg: builtins.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON (toString arg))
  );

  # Options of NixOS that the module defines values for.
  stubs.options = {
    assertions = listOption;
    warnings = listOption;
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
    systemd.tmpfiles.rules = listOption;
    networking.firewall.allowedTCPPorts = listOption;
    boot.kernel.sysctl = mkOption {
      type = types.attrsOf types.anything;
      default = { };
    };
    environment.systemPackages = listOption;
  };

  eval = lib.evalModules {
    modules = [
      (if viaFlake then flake.nixosModules.default else ../../nixos/module.nix)
      stubs
      { _module.args = { inherit pkgs utils; }; }
      userConfig
    ];
  };
  inherit (eval) config;
  services = config.systemd.services;
in
{
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  inherit (config) warnings;
  units = builtins.attrNames services;
  server = services.orin-llm or null;
  prewarm = services.orin-llm-prewarm or null;
  # The server's --config file, read back: the last word of ExecStart, without its quotes.
  settings =
    if services ? orin-llm then
      lib.pipe services.orin-llm.serviceConfig.ExecStart [
        (lib.splitString " ")
        lib.last
        (lib.removePrefix "\"")
        (lib.removeSuffix "\"")
        lib.importJSON
      ]
    else
      null;
  sysctl = config.boot.kernel.sysctl;
  firewall = config.networking.firewall.allowedTCPPorts;
  tmpfiles = config.systemd.tmpfiles.rules;
  users = config.users.users;
  groups = builtins.attrNames config.users.groups;
  systemPackages = map (p: p.name) config.environment.systemPackages;
  packageCuda = config.services.orin-llm.package.passthru.callArgs.cudaPackages or null;
}
