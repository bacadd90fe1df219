# services.orin-llm: the orin-llm OpenAI-compatible server as a hardened systemd service, with an
# optional oneshot unit that fills tinygrad's BEAM kernel cache before the server starts.
#
# Runs on any NixOS that provides the CUDA driver in /run/opengl-driver/lib; on a Jetson that is
# jetpack-nixos (`hardware.nvidia-jetpack.enable = true`). The power-mode options below only
# work when jetpack-nixos' module is imported as well.
{
  config,
  lib,
  options,
  pkgs,
  ...
}:
let
  inherit (lib)
    literalExpression
    mkDefault
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    optionalAttrs
    types
    ;

  cfg = config.services.orin-llm;
  settingsFormat = pkgs.formats.toml { };
  # TOML has no null: options left at `null` are dropped.
  configFile = settingsFormat.generate "orin-llm.toml" (
    lib.filterAttrsRecursive (_: value: value != null) cfg.settings
  );

  defaultCacheDirectory = "/var/cache/orin-llm";
  # systemd passes credentials (LoadCredential=) to the unit under this directory.
  apiKeyCredential = "/run/credentials/orin-llm.service/api-key";

  usePrewarmUnit = cfg.kernelCache.prewarm || cfg.kernelCache.shipped != null;

  environment = {
    DEV = "CUDA";
    # tinygrad's BEAM search pool: `fork` reuses the parent's initialised CUDA-free state and
    # avoids re-importing the whole model code in every worker (a patch in pkgs/tinygrad makes
    # the start method selectable).
    BEAM_MP_CTX = if cfg.beam.forkMode then "fork" else "spawn";
    ORIN_LLM_CACHE_DIR = cfg.kernelCache.directory;
    # Anything else tinygrad caches (it defaults to ~/.cache) lands there too.
    XDG_CACHE_HOME = cfg.kernelCache.directory;
  }
  # CUDA_PATH, CUDA_INCLUDE_PATH, NVRTC_PATH, NVJITLINK_PATH, LD_LIBRARY_PATH: the package knows
  # which cudaPackages it was built against. Its wrapper sets them too; repeating them here makes
  # them visible in `systemctl show orin-llm`.
  // (cfg.package.passthru.runtimeEnv or { })
  // cfg.environment;

  # Shared by the server and the prewarm unit.
  serviceConfigCommon = {
    User = "orin-llm";
    Group = "orin-llm";
    # /dev/nvhost-*, /dev/nvmap and /dev/nvgpu/* belong to group `video` (udev rules of
    # jetpack-nixos' l4t-init); `render` covers /dev/dri/renderD* should a DRM node be used.
    SupplementaryGroups = [
      "video"
      "render"
    ];
    CacheDirectory = "orin-llm";
    CacheDirectoryMode = "0750";
    WorkingDirectory = cfg.kernelCache.directory;
    ReadWritePaths = [ cfg.kernelCache.directory ];

    # --- Hardening. Every protection that is left off says why. ---
    # Off: CUDA's JIT (the driver's PTX compiler, NVRTC) and tinygrad's CPU JIT map memory that
    # is writable and executable.
    MemoryDenyWriteExecute = false;
    # Off: the GPU is reached through /dev/nvmap, /dev/nvhost-* and /dev/nvgpu/igpu0/*, which a
    # private /dev would hide. DevicePolicy + DeviceAllow narrow it down instead.
    PrivateDevices = false;
    DevicePolicy = if cfg.deviceAllow == null then "auto" else "closed";
    DeviceAllow = lib.optionals (cfg.deviceAllow != null) cfg.deviceAllow;
    # Off: a user namespace would leave the `video` group unmapped inside the unit; device
    # access through it is what makes the GPU usable.
    PrivateUsers = false;
    # "all", not "pid": libcuda on Tegra reads /proc/device-tree (the SoC id) and /proc/meminfo
    # (the GPU shares system memory).
    ProcSubset = "all";

    CapabilityBoundingSet = [ "" ];
    AmbientCapabilities = [ "" ];
    NoNewPrivileges = true;
    LockPersonality = true;
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
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
      "AF_UNIX" # sd_notify
    ];
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service"
      "@resources" # mbind/set_mempolicy, sched_setaffinity: used by the CUDA driver
      "~@privileged"
    ];
    UMask = "0077";
  };
in
{
  options.services.orin-llm = {
    enable = mkEnableOption "orin-llm, an OpenAI-compatible LLM server for the Jetson AGX Orin";

    package = mkPackageOption pkgs "orin-llm" {
      extraDescription = ''
        The flake's overlay (`orin-llm.overlays.default`, applied by `orin-llm.nixosModules.default`)
        provides it, built against the CUDA of the configured JetPack.
      '';
    };

    model = mkOption {
      type = types.path;
      example = literalExpression ''
        # Get the hash with:
        #   nix-prefetch-url https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q6_K.gguf
        # (prints a base32 sha256; `nix hash convert --hash-algo sha256 <that>` turns it into SRI)
        pkgs.fetchurl {
          name = "Llama-3.2-1B-Instruct-Q6_K.gguf";
          url = "https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q6_K.gguf";
          hash = lib.fakeHash; # replace with the real hash: the first build prints it
        }
      '';
      description = ''
        The GGUF model file to serve. A store path (from `pkgs.fetchurl`) makes the model part of
        the system closure; a plain string path such as `"/var/lib/models/x.gguf"` is used in place,
        and must be readable by the `orin-llm` user.
      '';
    };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = "Address the HTTP API listens on.";
    };

    port = mkOption {
      type = types.port;
      default = 8080;
      example = 8000;
      description = "TCP port of the HTTP API.";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Whether to open {option}`services.orin-llm.port` in the firewall. Only useful together with a
        {option}`services.orin-llm.host` other than loopback; consider {option}`services.orin-llm.apiKeyFile`.
      '';
    };

    apiKeyFile = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/run/secrets/orin-llm-api-key";
      description = ''
        File holding the bearer token clients must send. A string, not a Nix path, so the secret stays
        out of the world-readable Nix store. systemd hands it to the service as a credential
        (`LoadCredential=`), so the file itself may be readable by root only.
      '';
    };

    beam = {
      width = mkOption {
        type = types.ints.unsigned;
        default = 2;
        example = 4;
        description = ''
          tinygrad BEAM search width for kernel optimisation (`0` disables BEAM search). Wider searches
          find faster kernels and take longer the first time; the results are cached in
          {option}`services.orin-llm.kernelCache.directory`.
        '';
      };
      workers = mkOption {
        type = types.nullOr types.ints.positive;
        default = null;
        example = 8;
        description = "Processes the BEAM search compiles and times kernels with; `null`: one per CPU core.";
      };
      forkMode = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Start BEAM workers with `fork` (sets `BEAM_MP_CTX=fork`) instead of `spawn`. Fork is much
          faster to start on the Orin's CPU; turn it off only to debug a worker that hangs after fork.
        '';
      };
    };

    kernelCache = {
      directory = mkOption {
        type = types.str;
        default = defaultCacheDirectory;
        description = ''
          Writable directory of tinygrad's kernel cache (an SQLite database in WAL mode, keyed by GPU
          architecture). The default is the unit's `CacheDirectory=`; another path is created by
          systemd-tmpfiles.
        '';
      };
      prewarm = mkOption {
        type = types.bool;
        default = cfg.beam.width > 0;
        defaultText = literalExpression "config.services.orin-llm.beam.width > 0";
        description = ''
          Run `orin-llm prewarm` in a oneshot unit, `orin-llm-prewarm.service`, ordered before and
          required by `orin-llm.service`. The first run after a model or tinygrad change can take many
          minutes; later runs find everything in the cache and finish quickly.
        '';
      };
      shipped = mkOption {
        type = types.nullOr types.path;
        default = null;
        example = literalExpression "./kernel-cache"; # produced by `orin-llm prewarm --cache ./kernel-cache` on an Orin
        description = ''
          A prebuilt, read-only kernel cache directory (for example in the Nix store) copied into
          {option}`services.orin-llm.kernelCache.directory` before prewarming. It is copied rather than
          used in place because SQLite in WAL mode cannot open a database on a read-only path.
          Existing files are not overwritten.
        '';
      };
    };

    hugepages = {
      enable = mkEnableOption ''
        reserving huge pages (`vm.nr_hugepages`) for the server's load staging buffers (the repacked
        planes of one matrix at a time; a buffer that does not fit falls back to ordinary pages). The
        Orin has no separate GPU memory: CPU and GPU share the 64 GB of LPDDR5, and pages reserved here
        are taken from that one pool whether or not anything uses them. No load-time gain was measured
        on x86 (README.md, Huge pages); the Orin is unmeasured'';
      count = mkOption {
        type = types.ints.unsigned;
        default = 0;
        example = 2048;
        description = "Number of 2 MiB huge pages to reserve (2048 = 4 GiB); the largest matrix's planes are enough (1B Q6_K: about 105).";
      };
    };

    powerMode = {
      nvpmodelProfile = mkOption {
        type = types.nullOr types.ints.unsigned;
        default = null;
        example = 0;
        description = ''
          nvpmodel power profile to select at boot through jetpack-nixos (`services.nvpmodel.profileNumber`).
          On the AGX Orin, profile `0` is MAXN. `null` leaves the board's default. Requires jetpack-nixos.
        '';
      };
      maxClock = mkOption {
        type = types.bool;
        default = false;
        description = ''
          Pin CPU, GPU and EMC clocks at their maximum with `jetson_clocks`
          (`hardware.nvidia-jetpack.maxClock`). Requires jetpack-nixos.
        '';
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
        # r36's nvgpu driver: the nodes behind /dev/nvhost-*-gpu (/dev/nvgpu/igpu0/*), matched by
        # their /proc/devices group names.
        "char-nvgpu* rw"
        "char-nvhost* rw"
        "char-nvmap rw"
      ];
      description = ''
        Devices the units may open (`DeviceAllow=`, with `DevicePolicy=closed`). Paths that do not
        exist are ignored by systemd. `null` lifts the restriction (`DevicePolicy=auto`): try that
        first if CUDA initialisation fails under the unit but works for a user in `video`.
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        DEBUG = "2";
      };
      description = "Extra environment variables of both units (tinygrad reads many, e.g. `DEBUG`).";
    };

    settings = mkOption {
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          context_length = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            example = 8192;
            description = "Maximum context in tokens; `null`: the model's own.";
          };
          queue_size = mkOption {
            type = types.nullOr types.ints.positive;
            default = null;
            example = 16;
            description = "Requests waiting beyond the one being decoded before the server answers 503; `null`: the program's default.";
          };
        };
      };
      default = { };
      example = {
        context_length = 8192;
        queue_size = 16;
      };
      description = ''
        The server's TOML configuration (`orin-llm serve --config`). `model`, `host`, `port`,
        `api_key_file`, `[beam]` and `[kernel_cache]` are filled from the options above; anything
        set here is rendered as is. Options left `null` are omitted.
      '';
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = cfg.hugepages.enable -> cfg.hugepages.count > 0;
          message = "services.orin-llm.hugepages.enable is set but services.orin-llm.hugepages.count is 0.";
        }
        {
          assertion =
            (cfg.powerMode.nvpmodelProfile != null || cfg.powerMode.maxClock)
            -> options ? hardware.nvidia-jetpack.maxClock;
          message = "services.orin-llm.powerMode needs jetpack-nixos' NixOS module (hardware.nvidia-jetpack).";
        }
      ];

      # Defaults at the leaves, so a user's `settings.beam.workers` does not drop `beam.width`.
      services.orin-llm.settings =
        {
          model = mkDefault "${cfg.model}";
          host = mkDefault cfg.host;
          port = mkDefault cfg.port;
          beam =
            {
              width = mkDefault cfg.beam.width;
            }
            // optionalAttrs (cfg.beam.workers != null) { workers = mkDefault cfg.beam.workers; };
          kernel_cache.directory = mkDefault cfg.kernelCache.directory;
        }
        // optionalAttrs (cfg.apiKeyFile != null) { api_key_file = mkDefault apiKeyCredential; };

      users.users.orin-llm = {
        isSystemUser = true;
        group = "orin-llm";
        description = "orin-llm server";
      };
      users.groups.orin-llm = { };

      systemd.tmpfiles.rules = lib.optional (
        cfg.kernelCache.directory != defaultCacheDirectory
      ) "d ${cfg.kernelCache.directory} 0750 orin-llm orin-llm - -";

      systemd.services.orin-llm = {
        description = "orin-llm OpenAI-compatible LLM server";
        wantedBy = [ "multi-user.target" ];
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ] ++ lib.optional usePrewarmUnit "orin-llm-prewarm.service";
        requires = lib.optional usePrewarmUnit "orin-llm-prewarm.service";
        inherit environment;
        serviceConfig = serviceConfigCommon // {
          Type = "notify";
          NotifyAccess = "main";
          ExecStart = lib.escapeShellArgs [
            (lib.getExe cfg.package)
            "serve"
            "--config"
            "${configFile}"
          ];
          # Without a prewarmed cache the server BEAM-searches every kernel before READY=1.
          TimeoutStartSec = "30min";
          WatchdogSec = "30s";
          Restart = "on-failure";
          RestartSec = "5s";
          LoadCredential = lib.optional (cfg.apiKeyFile != null) "api-key:${cfg.apiKeyFile}";
        };
      };

      systemd.services.orin-llm-prewarm = mkIf usePrewarmUnit {
        description = "Fill the orin-llm kernel cache";
        before = [ "orin-llm.service" ];
        requiredBy = [ "orin-llm.service" ];
        inherit environment;
        serviceConfig = serviceConfigCommon // {
          Type = "oneshot";
          RemainAfterExit = true;
          TimeoutStartSec = "30min";
          # `+`: runs with full privileges, so the copy works whatever the shipped files' modes.
          ExecStartPre = lib.optional (cfg.kernelCache.shipped != null) (
            "+"
            + lib.escapeShellArgs [
              "${pkgs.coreutils}/bin/cp"
              "-r"
              "--no-clobber"
              "--no-preserve=mode,ownership"
              "${cfg.kernelCache.shipped}/."
              cfg.kernelCache.directory
            ]
          );
          ExecStartPost = lib.optional (cfg.kernelCache.shipped != null) (
            "+"
            + lib.escapeShellArgs [
              "${pkgs.coreutils}/bin/chown"
              "-R"
              "orin-llm:orin-llm"
              cfg.kernelCache.directory
            ]
          );
          ExecStart =
            if cfg.kernelCache.prewarm then
              # the server's own config: same model, context, BEAM width and cache directory, so that
              # the kernel database and the captured steps it fills are the ones the server loads
              lib.escapeShellArgs [
                (lib.getExe cfg.package)
                "prewarm"
                "--config"
                "${configFile}"
              ]
            else
              "${pkgs.coreutils}/bin/true";
        };
      };

      networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.port;

      boot.kernel.sysctl = mkIf cfg.hugepages.enable { "vm.nr_hugepages" = cfg.hugepages.count; };

      environment.systemPackages = [ cfg.package ];
    }

    # jetpack-nixos' options exist only when its module is imported; refer to them only then.
    (optionalAttrs (options ? hardware.nvidia-jetpack.maxClock) {
      hardware.nvidia-jetpack.maxClock = mkIf cfg.powerMode.maxClock true;
      services.nvpmodel.profileNumber = mkIf (cfg.powerMode.nvpmodelProfile != null) cfg.powerMode.nvpmodelProfile;
    })
  ]);
}
