#!/usr/bin/env bash
# Compatibility lane: `bash .ci/lanes/timm_release.sh VERSION MAIN_VENV`.
# timm==VERSION in a virtualenv over MAIN_VENV's packages (the same torch, timm-ext from this clone), with that
# release's own train.py and validate.py from ../shared: `timm-ext doctor`, `timm-ext demo --quick` (unless
# TIMM_EXT_LANE_DEMO=0), then the project's whole suite with that release's scripts, but its slow tests and those
# that call no timm code or timm's models only, and the model contract's larger sizes of an architecture
# (`-m "not slow and not timm_free and not timm_models_only and not larger_sibling"`, tests/_timm_free.py,
# tests/test_models.py: the newest-timm lane runs them; the model contract on the smallest of each runs here).
# A skip that would hide the release (a script not found or not of this timm, a test that needs another timm)
# fails the lane; the skips of a CPU machine (CUDA, an accelerator, inductor's opt-in) are listed and allowed.
# Then, with this timm still in the lane's virtualenv, timm's own tests/test_optim.py of this release over names of
# timm-ext's that take every family and every base optimizer between them (.ci/lanes/timm_optim.sh, which times
# itself; the newest lane runs every name).
set -euo pipefail
cd "$(dirname "$0")/../.."
version="$1"
main_venv="$2"
scripts="$PWD/../shared/timm-train/v$version"
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
if [ "${TIMM_EXT_LANE_DEMO:-1}" = 1 ]; then
  echo "+ timm-ext demo --quick --no-progress --timm-train $scripts"
  "$py" -m timm_ext demo --quick --no-progress --timm-train "$scripts" --output "$(mktemp -d)/demo"
fi
log="$(mktemp)"
TIMM_EXT_TIMM_TRAIN="$scripts/train.py" "$py" -m pytest tests -q -rs -p no:cacheprovider \
  -m "not slow and not timm_free and not timm_models_only and not larger_sibling" -n "${TIMM_EXT_CI_WORKERS:-auto}" | tee "$log"
hidden=$(grep -E '^SKIPPED' "$log" | grep -iE 'TIMM_EXT_TIMM_TRAIN|script not found|train.py not found|needs timm|installed timm|pip could not' \
  || true)
if [ -n "$hidden" ]; then
  echo "$hidden" >&2
  echo "lane timm $version: the tests above skipped for a reason that hides this release; every one must run" >&2
  exit 1
fi
TIMM_EXT_OPTIM_SUBSET=cover bash .ci/lanes/timm_optim.sh "$lane"
