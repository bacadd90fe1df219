# services.orin-llm: orin-llm's OpenAI-compatible LLM server as a hardened systemd service, and a
# oneshot unit that fills tinygrad's kernel cache first. Needs the CUDA driver in
# /run/opengl-driver/lib: on a Jetson, jetpack-nixos (`hardware.nvidia-jetpack.enable`,
# `hardware.graphics.enable`), whose options also set power modes (`services.nvpmodel`).
{
  config,
  lib,
  pkgs,
  utils,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;

  cfg = config.services.orin-llm;
  settingsFormat = pkgs.formats.toml { };
  configFile = settingsFormat.generate "orin-llm.toml" cfg.settings;

  cacheDir = cfg.settings.kernel_cache.directory;
  defaultCacheDir = "/var/cache/orin-llm";
  # systemd hands LoadCredential= files to the unit under this directory.
  apiKeyCredential = "/run/credentials/orin-llm.service/api-key";

  # `orin-llm serve|prewarm --config FILE`: both read the same file, so prewarm fills exactly the
  # kernel database (model, context, BEAM width, directory) the server loads.
  execWith =
    command:
    utils.escapeSystemdExecArgs [
      (lib.getExe cfg.package)
      command
      "--config"
      "${configFile}"
    ];

  environment = {
    # tinygrad caches under $XDG_CACHE_HOME (default ~/.cache; the user's home is /var/empty).
    XDG_CACHE_HOME = cacheDir;
  }
  // cfg.environment;

  # Shared by the server and the prewarm unit.
  serviceConfig = {
    User = "orin-llm";
    Group = "orin-llm";
    # the GPU's nodes (/dev/nvhost-*, /dev/nvmap, /dev/nvgpu/*; /dev/dri/renderD*)
    SupplementaryGroups = [
      "video"
      "render"
    ];
    CacheDirectory = "orin-llm";
    CacheDirectoryMode = "0750";
    # CacheDirectory= is writable; another directory (made by tmpfiles) must be named.
    ReadWritePaths = lib.optional (cacheDir != defaultCacheDir) cacheDir;
    WorkingDirectory = cacheDir;
    # Client connections (the server admits a few hundred), SQLite's WAL files, the BEAM pool's
    # pipes and the GPU's device files: more than the soft default of 1024 at peak.
    LimitNOFILE = 4096;

    # Hardening. Off, each for a reason:
    # - MemoryDenyWriteExecute: tinygrad's CPU backend and the CUDA driver's PTX JIT map W+X code.
    MemoryDenyWriteExecute = false;
    # - PrivateDevices: would hide the GPU's nodes; DevicePolicy/DeviceAllow narrow them instead.
    PrivateDevices = false;
    # - PrivateUsers: would leave `video`, the group that opens the GPU, unmapped.
    PrivateUsers = false;
    # - ProcSubset=pid: libcuda on Tegra reads /proc/device-tree and /proc/meminfo.
    ProcSubset = "all";
    # - PrivateNetwork, IPAddressDeny: it serves HTTP (`settings.host`, `openFirewall` decide to whom).
    DevicePolicy = if cfg.deviceAllow == null then "auto" else "closed";
    DeviceAllow = lib.optionals (cfg.deviceAllow != null) cfg.deviceAllow;
    CapabilityBoundingSet = [ "" ];
    LockPersonality = true;
    NoNewPrivileges = true;
    PrivateTmp = true;
    ProtectClock = true;
    ProtectControlGroups = true;
    ProtectHome = true;
    ProtectHostname = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    ProtectProc = "invisible";
    ProtectSystem = "strict";
    RemoveIPC = true;
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
      "AF_UNIX" # sd_notify
    ];
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      "@resources" # mbind, sched_setaffinity: the CUDA driver
      "~@privileged"
    ];
    UMask = "0077";
  };

  optionPath = name: [ "services" "orin-llm" ] ++ lib.splitString "." name;
in
{
  # Options of earlier revisions of this module.
  imports =
    lib.mapAttrsToList (from: to: lib.mkRenamedOptionModule (optionPath from) (optionPath to)) {
      model = "settings.model";
      host = "settings.host";
      port = "settings.port";
      "beam.width" = "settings.beam.width";
      "beam.workers" = "settings.beam.workers";
      "kernelCache.directory" = "settings.kernel_cache.directory";
      "kernelCache.shipped" = "settings.kernel_cache.shipped";
      "kernelCache.prewarm" = "prewarm";
    }
    ++ lib.mapAttrsToList (name: why: lib.mkRemovedOptionModule (optionPath name) why) {
      "beam.forkMode" = "The server always starts BEAM workers with spawn; prewarm forks on its own.";
      "powerMode.nvpmodelProfile" = "Set jetpack-nixos' services.nvpmodel.profileNumber instead.";
      "powerMode.maxClock" = "Set jetpack-nixos' hardware.nvidia-jetpack.maxClock instead.";
    };

  options.services.orin-llm = {
    enable = lib.mkEnableOption "orin-llm, an OpenAI-compatible LLM server for the Jetson AGX Orin";

    package = lib.mkPackageOption pkgs "orin-llm" {
      extraDescription = "The flake's `nixosModules.default` sets it from the flake, built with the system's nixpkgs.";
    };

    settings = mkOption {
      description = ''
        The server's TOML configuration (`orin-llm serve --config`; docs/SERVER.md lists the keys),
        which `orin-llm prewarm` reads too. Keys not declared here are rendered as they are.
      '';
      default = { };
      example.context_length = 8192;
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          model = mkOption {
            type = types.path;
            example = literalExpression "pkgs.fetchurl { url = \"https://…/Llama-3.2-1B-Instruct-Q6_K.gguf\"; hash = \"sha256-…\"; }";
            description = ''
              The GGUF model file. A store path (`pkgs.fetchurl`) puts it in the system closure; a
              string such as `"/var/lib/models/x.gguf"` is used in place and must be readable by the
              `orin-llm` user.
            '';
          };
          host = mkOption { type = types.str; default = "127.0.0.1"; description = "Address the HTTP API listens on."; };
          port = mkOption { type = types.port; default = 8080; description = "TCP port of the HTTP API."; };
          max_batch = mkOption {
            type = types.ints.between 1 64;
            default = 4;
            description = "Requests generating at once, each in a KV-cache slot of `context_length` tokens (continuous batching).";
          };
          gather_ms = mkOption {
            type = types.numbers.between 0 100;
            default = 0;
            description = ''
              The most milliseconds an idle engine that has taken a request waits for other generation
              requests still being read, so that clients which send together start their prompts in one
              step; the wait ends as soon as none is being read or every slot is taken, so a lone client
              waits for nothing. `0`: off.
            '';
          };
          beam.width = mkOption {
            type = types.ints.unsigned;
            default = 0;
            description = ''
              tinygrad's BEAM search width (`0`: the hand-coded layouts of the patch series, no search). On
              an H200 the 1B's decode at `0` is as fast as after a `2` search of the same build, and its
              prefill within 1.6-2.5%; the prewarm compiles in ~1.5 minutes instead of searching for ~8
              (docs/CACHE.md). A search (`2`) may find more for a model or GPU the layouts were not made on.
              Its bounds are the keys `beam.time_limit` (seconds a kernel, default 30) and `beam.min_us`
              (kernels under this many microseconds a step are not searched, default 300).
            '';
          };
          kernel_cache.directory = mkOption {
            type = types.str;
            default = defaultCacheDir;
            description = ''
              Writable directory of the kernel databases (the units' `CacheDirectory=`, or made by
              tmpfiles). A prebuilt cache in the store goes in `kernel_cache.shipped`: the program
              copies a database it lacks from there (SQLite in WAL mode cannot open read-only files).
            '';
          };
        };
      };
    };

    apiKeyFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/orin-llm-api-key";
      description = ''
        File with the bearer token clients must send; a string, to keep it out of the Nix store.
        The unit gets it as a credential (`LoadCredential=`), so it may be readable by root only.
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Whether to open `settings.port` in the firewall (with a `settings.host` other than loopback).";
    };

    prewarm = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Run `orin-llm prewarm` in a oneshot unit before the server: it compiles (and with `beam.width`
        above 0 searches) every step's kernels and keeps the captured steps, so the server is ready in
        seconds. Without it the server compiles them at its first start.
      '';
    };

    hugepages = {
      enable = lib.mkEnableOption ''
        reserving huge pages (`vm.nr_hugepages`) for the server's load staging buffers. The Orin's
        CPU and GPU share one memory, and reserved pages are taken from it whether used or not; no
        gain was measured on x86 (README.md, Huge pages)'';
      count = mkOption {
        type = types.ints.positive;
        default = 128;
        description = "Number of 2 MiB pages; the largest matrix's planes are enough (1B Q6_K: about 105).";
      };
    };

    deviceAllow = mkOption {
      type = types.nullOr (types.listOf types.str);
      default = [
        "/dev/nvmap rw"
        "/dev/nvhost-ctrl rw"
        "/dev/nvhost-ctrl-gpu rw"
        "/dev/nvhost-gpu rw"
        "/dev/nvhost-as-gpu rw"
        "/dev/nvhost-tsg-gpu rw"
        "/dev/nvhost-sched-gpu rw"
        "/dev/nvhost-nvsched-gpu rw"
        "/dev/nvhost-prof-gpu rw"
        "/dev/nvhost-dbg-gpu rw"
        "/dev/nvhost-ctxsw-gpu rw"
        "/dev/nvhost-power-gpu rw"
        "/dev/host1x-fence rw"
        "/dev/nvsciipc rw"
        # r36's nvgpu nodes (/dev/nvgpu/igpu0/*), by their /proc/devices group names
        "char-nvgpu* rw"
        "char-nvhost* rw"
        "char-nvmap rw"
      ];
      description = "`DeviceAllow=` of the units (`DevicePolicy=closed`); `null` lifts it, to try if CUDA fails only in the unit.";
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example.DEBUG = "2";
      description = "Extra environment of both units (tinygrad reads many variables, e.g. `DEBUG`).";
    };
  };

  config = lib.mkIf cfg.enable {
    services.orin-llm.settings.api_key_file = lib.mkIf (cfg.apiKeyFile != null) apiKeyCredential;

    users.users.orin-llm = {
      isSystemUser = true;
      group = "orin-llm";
    };
    users.groups.orin-llm = { };

    systemd.tmpfiles.rules = lib.optional (
      cacheDir != defaultCacheDir
    ) "d ${cacheDir} 0750 orin-llm orin-llm - -";

    systemd.services.orin-llm = {
      description = "orin-llm OpenAI-compatible LLM server";
      wantedBy = [ "multi-user.target" ];
      # Wants=, not Requires=: the prewarm only saves time, and a failed one leaves the server to
      # compile what is missing rather than keeping it down.
      wants = lib.optional cfg.prewarm "orin-llm-prewarm.service";
      after = [ "network.target" ] ++ lib.optional cfg.prewarm "orin-llm-prewarm.service";
      inherit environment;
      serviceConfig = serviceConfig // {
        Type = "notify";
        NotifyAccess = "main";
        ExecStart = execWith "serve";
        # Without a prewarmed cache the server compiles and BEAM-searches every step before READY=1.
        TimeoutStartSec = "30min";
        # The server pings while its engine thread serves, and also while that thread compiles or
        # BEAM-searches a kernel that makes progress (a shape met first at request time).
        WatchdogSec = "30s";
        Restart = "on-failure";
        RestartSec = "5s";
        LoadCredential = lib.optional (cfg.apiKeyFile != null) "api-key:${cfg.apiKeyFile}";
      };
    };

    systemd.services.orin-llm-prewarm = lib.mkIf cfg.prewarm {
      description = "Fill the orin-llm kernel cache";
      inherit environment;
      serviceConfig = serviceConfig // {
        Type = "oneshot";
        # Done once per boot: restarting the server does not search again. A changed unit (a new
        # config file) is restarted by nixos-rebuild switch.
        RemainAfterExit = true;
        TimeoutStartSec = "30min";
        ExecStart = execWith "prewarm";
      };
    };

    networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.settings.port;

    boot.kernel.sysctl = lib.mkIf cfg.hugepages.enable { "vm.nr_hugepages" = cfg.hugepages.count; };

    environment.systemPackages = [ cfg.package ];
  };
}
