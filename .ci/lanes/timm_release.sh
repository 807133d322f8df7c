#!/usr/bin/env bash
# Compatibility lane: `bash .ci/lanes/timm_release.sh VERSION MAIN_VENV`.
# timm==VERSION in a virtualenv over MAIN_VENV's packages (the same torch, timm-ext from this clone), with that
# release's own train.py from ../shared: `timm-ext doctor`, `timm-ext demo --quick`, the model contract
# (tests/test_models.py), SAM through train.py (one checked update, then resume) and the backports of timm's
# bugs. No test may skip here: a skip would hide the release this lane exists for. Then, with this timm still in the
# lane's virtualenv, timm's own tests/test_optim.py of this release (.ci/lanes/timm_optim.sh, which times itself).
set -euo pipefail
cd "$(dirname "$0")/../.."
version="$1"
main_venv="$2"
scripts="../shared/timm-train/v$version"
if [ ! -f "$scripts/train.py" ]; then
  echo "lane timm $version: $scripts/train.py is missing (CI has ../shared)" >&2
  exit 1
fi
lane=".ci/.venv-timm-$version"
rm -rf "$lane"
"$main_venv/bin/python" -m venv --without-pip "$lane"
site_dir=$("$lane/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
parent_dir=$("$main_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# after the lane's own site-packages on sys.path: the lane's timm wins, the rest is the main virtualenv's
echo "import site; site.addsitedir('$parent_dir')" > "$site_dir/_ci_parent_site.pth"
"$main_venv/bin/python" -m pip install --quiet --no-deps --target "$site_dir" "timm==$version"
py="$lane/bin/python"
"$py" -W ignore -c "import sys, timm, torch; print(f'lane: Python {sys.version.split()[0]}, torch {torch.__version__}, timm {timm.__version__}'); assert timm.__version__ == '$version'"

TIMM_EXT_CACHE="$(mktemp -d)"
export TIMM_EXT_CACHE HF_HUB_OFFLINE=1
echo "+ timm-ext doctor --timm-train $scripts"
"$py" -m timm_ext doctor --timm-train "$scripts"
echo "+ timm-ext demo --quick --no-progress --timm-train $scripts"
"$py" -m timm_ext demo --quick --no-progress --timm-train "$scripts" --output "$(mktemp -d)/demo"
log="$(mktemp)"
TIMM_EXT_TIMM_TRAIN="$scripts/train.py" "$py" -m pytest -q -rs -p no:cacheprovider tests/test_models.py \
  tests/test_recipes.py::test_sam_runs_in_real_train_py_and_resumes tests/test_timm_backports.py | tee "$log"
if grep -qE '[0-9]+ skipped' "$log"; then
  echo "lane timm $version: tests skipped (listed above); every test of this lane must run" >&2
  exit 1
fi
bash .ci/lanes/timm_optim.sh "$lane"
