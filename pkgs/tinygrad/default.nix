# tinygrad as orin-llm runs it: the sdist pinned in ./source.env with the patch series of
# ./patches applied by ./apply-patches.sh, the same script scripts/setup_venv.py runs, so the
# venv and the Nix build carry the same files.
{
  lib,
  buildPythonPackage,
  fetchPypi,
  setuptools,
}:
let
  # source.env is shell syntax (KEY=VALUE lines); it is the one place the pin lives.
  pin = lib.pipe ./source.env [
    builtins.readFile
    (lib.splitString "\n")
    (builtins.filter (line: builtins.match "[A-Z_]+=.*" line != null))
    (map (line: builtins.match "([A-Z_]+)=(.*)" line))
    (map (kv: lib.nameValuePair (builtins.elemAt kv 0) (builtins.elemAt kv 1)))
    builtins.listToAttrs
  ];

  # TINYGRAD_SHA256 of source.env in SRI form (tests/test_nix.py checks that the two agree; Nix
  # 2.19+ checks it again below with builtins.convertHash).
  hash = "sha256-Q3vmu3SB7CbjMuT0NC9uoJ5BJY5ixcCfSp7XrreCmgc=";

  # Only the script and the patches: editing this file does not change the patched source.
  patchSeries = lib.fileset.toSource {
    root = ./.;
    fileset = lib.fileset.unions [
      ./apply-patches.sh
      (lib.fileset.maybeMissing ./patches)
    ];
  };
in
assert
  builtins ? convertHash
  -> builtins.convertHash {
    hash = pin.TINYGRAD_SHA256;
    hashAlgo = "sha256";
    toHashFormat = "sri";
  } == hash;
buildPythonPackage {
  pname = "tinygrad";
  version = pin.TINYGRAD_VERSION;
  pyproject = true;

  src = fetchPypi {
    pname = "tinygrad";
    version = pin.TINYGRAD_VERSION;
    inherit hash;
  };

  postPatch = ''
    sh ${patchSeries}/apply-patches.sh .
  '';

  build-system = [ setuptools ];

  # tinygrad's own tests want devices, network and far more time than a build has.
  doCheck = false;
  pythonImportsCheck = [
    "tinygrad"
    "tinygrad.orin_llm_patches"
  ];

  meta = {
    description = "tinygrad with orin_llm's patch series";
    homepage = "https://github.com/tinygrad/tinygrad";
    license = lib.licenses.mit;
  };
}
