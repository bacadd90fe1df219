{
  description = "orin-llm: an LLM appliance for the NVIDIA Jetson AGX Orin (JetPack 6, L4T r36.4)";

  inputs = {
    # The branch jetpack-nixos tracks at the revision below; flake.lock pins the very commit
    # jetpack-nixos' own flake.lock had there.
    nixpkgs.url = "github:nixos/nixpkgs/nixos-25.11";

    # Pinned by revision, not branch, so `nix flake update` cannot move it to another L4T.
    # 5a83306 (merge of PR #462, 2026-02-14) is the last master commit on JetPack 6.2.1 /
    # L4T 36.4.4 / CUDA 12.6; the next merge (#453, 92f4790) moved JetPack 6 to L4T 36.5.0.
    jetpack-nixos = {
      url = "github:anduril/jetpack-nixos/5a83306ab06568aaa276a981aad1987b26af21c3";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      jetpack-nixos,
    }:
    let
      inherit (nixpkgs) lib;

      systems = [
        "aarch64-linux"
        "x86_64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f (pkgsFor system));

      # aarch64-linux is the Orin: CUDA for sm_87 from JetPack 6's package set, as a
      # jetpack-nixos NixOS system would have it. x86_64-linux: no CUDA, for development and CI.
      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config = lib.optionalAttrs (system == "aarch64-linux") {
            allowUnfree = true; # CUDA and the L4T driver
            cudaSupport = true;
            cudaCapabilities = [ "8.7" ];
          };
          overlays =
            lib.optionals (system == "aarch64-linux") [
              jetpack-nixos.overlays.default
              # What jetpack-nixos' NixOS module sets for hardware.nvidia-jetpack.majorVersion = "6"
              # (modules/default.nix): both nvidia-jetpack and cudaPackages, the latter to
              # cudaPackages_12 (cuda_compat covers the releases newer than JetPack 6's CUDA 12.6).
              # So the flake's packages are those a jetpack-nixos system builds.
              (final: _: {
                nvidia-jetpack = final.nvidia-jetpack6;
                cudaPackages = final."cudaPackages_${lib.versions.major final.nvidia-jetpack6.cudaMajorMinorVersion}";
              })
            ]
            ++ [ self.overlays.default ];
        };

      # A NixOS system with only this flake's module, as small as evaluation allows: the
      # module-eval checks build its unit files.
      moduleTestSystem =
        system:
        lib.nixosSystem {
          modules = [
            self.nixosModules.default
            {
              nixpkgs.hostPlatform = system;
              boot.isContainer = true;
              system.stateVersion = "25.11";
              services.orin-llm = {
                enable = true;
                settings.model = "/var/lib/orin-llm/model.gguf";
              };
            }
          ];
        };
    in
    {
      overlays.default =
        final: _:
        let
          # The CUDA the L4T driver ships (12.6 for JetPack 6), not the system's cudaPackages
          # (cudaPackages_12 on jetpack-nixos), on purpose: tinygrad dlopens libcuda from
          # /run/opengl-driver itself, so the cuda_compat libcuda that nixpkgs puts in the RUNPATH
          # of ELF files never reaches it, and without it the driver must accept what this NVRTC
          # compiles (Tegra has no minor-version compatibility). llama.cpp, the benchmark's
          # reference, uses the same release so the two are compared like for like.
          cudaPackages = final.nvidia-jetpack.cudaPackages or final.cudaPackages;
        in
        {
          orin-llm = final.callPackage ./pkgs/orin-llm { inherit cudaPackages; };
          orin-llm-llama-cpp = final.callPackage ./pkgs/llama-cpp { inherit cudaPackages; };
          orin-llm-bench = final.writeShellApplication {
            name = "orin-llm-bench";
            text = ''
              exec ${lib.getExe final.orin-llm} bench --llama-bench ${final.orin-llm-llama-cpp}/bin/llama-bench "$@"
            '';
          };
        };

      # The module with the flake's package, built from the system's own nixpkgs (its config:
      # cudaSupport, capabilities) without adding an overlay, so it works under nixpkgs.readOnlyPkgs.
      nixosModules.default =
        { lib, pkgs, ... }:
        {
          imports = [ ./nixos/module.nix ];
          services.orin-llm.package = lib.mkDefault (self.overlays.default pkgs pkgs).orin-llm;
        };

      packages = forAllSystems (
        pkgs:
        {
          inherit (pkgs) orin-llm;
          inherit (pkgs.orin-llm.passthru) tinygrad;
          default = pkgs.orin-llm;
        }
        // lib.optionalAttrs (pkgs.stdenv.hostPlatform.system == "aarch64-linux") {
          llama-cpp = pkgs.orin-llm-llama-cpp;
          bench = pkgs.orin-llm-bench;
        }
      );

      # nix run .#bench -- --model ./Llama-3.2-1B-Instruct-Q6_K.gguf --json bench.json
      apps.aarch64-linux.bench = {
        type = "app";
        program = lib.getExe self.packages.aarch64-linux.bench;
        meta.description = "orin-llm bench against llama.cpp's llama-bench on the same model";
      };

      checks = forAllSystems (
        pkgs:
        let
          inherit (pkgs.stdenv.hostPlatform) system;
          units = (moduleTestSystem system).config.systemd.units;
        in
        self.packages.${system}
        // {
          # The unit files NixOS writes (tests/test_nix.py checks the evaluated units in detail;
          # this is the one place they are rendered by NixOS itself).
          module-eval = pkgs.runCommand "orin-llm-module-eval" { } ''
            server=${units."orin-llm.service".unit}/orin-llm.service
            prewarm=${units."orin-llm-prewarm.service".unit}/orin-llm-prewarm.service
            grep -qx 'Type=notify' "$server"
            grep -qx 'ExecStart=".*/bin/orin-llm" "serve" "--config" "/nix/store/.*-orin-llm.toml"' "$server"
            grep -qx 'After=network.target orin-llm-prewarm.service' "$server"
            grep -qx 'LimitNOFILE=4096' "$server"
            if grep -q 'BEAM_MP_CTX\|CUDA_PATH' "$server"; then exit 1; fi
            grep -qx 'ExecStart=".*/bin/orin-llm" "prewarm" "--config" "/nix/store/.*-orin-llm.toml"' "$prewarm"
            touch $out
          '';
        }
      );

      # The example appliance. Replace the model's lib.fakeHash (the first build prints the real
      # one) and the file systems with your own before building.
      nixosConfigurations.orin-agx-devkit = lib.nixosSystem {
        modules = [
          jetpack-nixos.nixosModules.default
          self.nixosModules.default
          (
            { lib, pkgs, ... }:
            {
              nixpkgs.hostPlatform = "aarch64-linux";
              nixpkgs.config.allowUnfree = true;

              hardware.nvidia-jetpack = {
                enable = true;
                som = "orin-agx";
                carrierBoard = "devkit";
              };
              # Provides /run/opengl-driver (libcuda) and makes jetpack-nixos build nixpkgs with
              # CUDA for sm_87 (hardware.nvidia-jetpack.configureCuda defaults to this).
              hardware.graphics.enable = true;

              boot.loader.systemd-boot.enable = true;
              boot.loader.efi.canTouchEfiVariables = true;
              fileSystems."/" = {
                device = "/dev/disk/by-label/nixos";
                fsType = "ext4";
              };
              networking.hostName = "orin";
              services.openssh.enable = true;
              system.stateVersion = "25.11";

              services.nvpmodel.profileNumber = 0; # MAXN on the AGX Orin

              services.orin-llm = {
                enable = true;
                settings = {
                  model = pkgs.fetchurl {
                    name = "Llama-3.2-1B-Instruct-Q6_K.gguf";
                    url = "https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q6_K.gguf";
                    # Placeholder: `nix-prefetch-url <url>` or the first build prints the real hash.
                    hash = lib.fakeHash;
                  };
                  host = "0.0.0.0";
                  context_length = 8192;
                };
                openFirewall = true;
              };
            }
          )
        ];
      };
    };
}
