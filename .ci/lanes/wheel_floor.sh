#!/usr/bin/env bash
# Wheel lane: `bash .ci/lanes/wheel_floor.sh TOOLS_VENV` (a virtualenv with the release extra's build and twine).
# Build the sdist and wheel (python -m build, from a copy of the clone's files: .ci/run starts this lane beside its
# first `pip install -e .`, which writes the clone's egg-info), check them (twine check --strict, .ci/check_wheel.py), then install
# the wheel as a user of an index would (no clone, no -e) into a fresh virtualenv that holds the floor of everything
# pyproject admits: Python 3.10, torch 2.4.1, torchvision 0.19.1, timm 1.0.23 (.ci/lanes/floor_venv.sh). There,
# from a folder outside the clone: doctor, recipes list, the quick demo at 2 epochs (with train.py, then with no network and no
# train.py: the built-in loop, whose summary.csv must equal train.py's), export and reload of its checkpoint through
# timm's local-dir:, the SAM patch of train.py v1.0.22 (the packaged diffs), then the model contract (on the smallest
# size of each architecture: not its larger_sibling tests, which the newest lane runs), SAM through train.py and the
# version checks. Skips are listed (torch 2.4 has known ones, docs/compatibility.md) and allowed.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
tools_venv="$1"
shared="$repo/../shared/timm-train"
if [ ! -f "$shared/v1.0.23/train.py" ]; then
  echo "wheel lane: $shared/v1.0.23/train.py is missing (CI has ../shared)" >&2
  exit 1
fi

dist="$(mktemp -d)"
source_copy="$(mktemp -d)"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$source_copy"
build_log="$(mktemp)"
if ! "$tools_venv/bin/python" -m build --outdir "$dist" "$source_copy" > "$build_log" 2>&1; then
  tail -40 "$build_log" >&2
  exit 1
fi
ls "$dist"
"$tools_venv/bin/twine" check --strict "$dist"/*
"$tools_venv/bin/python" .ci/check_wheel.py "$dist"

# the virtualenv with the floor's torch, torchvision and timm: made just before by .ci/run (TIMM_EXT_CI_FLOOR_READY=1),
# else here
floor="$repo/.ci/.venv-floor"
if [ "${TIMM_EXT_CI_FLOOR_READY:-0}" != 1 ]; then
  bash "$repo/.ci/lanes/floor_venv.sh" "$floor"
fi
wheel=$(ls "$dist"/*.whl)
"$floor/bin/python" -m pip install --quiet "$wheel[demo]" torch==2.4.1 torchvision==0.19.1 timm==1.0.23
"$floor/bin/python" -W ignore -c "import sys, timm, torch; print(f'lane: Python {sys.version.split()[0]}, torch {torch.__version__}, timm {timm.__version__}')"

work="$(mktemp -d)"
cd "$work"  # nothing of the clone on sys.path
TIMM_EXT_CACHE="$work/cache"
export TIMM_EXT_CACHE HF_HUB_OFFLINE=1
echo "+ timm-ext doctor --timm-train $shared/v1.0.23"
"$floor/bin/timm-ext" doctor --timm-train "$shared/v1.0.23"
recipes=$("$floor/bin/timm-ext" recipes list | tail -n +2 | wc -l)
echo "+ timm-ext recipes list: $recipes recipes"
if [ "$recipes" -lt 100 ]; then
  echo "wheel lane: the wheel's timm-ext recipes list shows $recipes recipes" >&2
  exit 1
fi
# two of the quick demo's four epochs (its warmup epoch and one of the cosine schedule, every update on the
# schedule's update-wise lr; more repeat the second): the newest lane runs all four, README's line as written
echo "+ timm-ext demo --quick --epochs 2 --no-progress --timm-train $shared/v1.0.23"
"$floor/bin/timm-ext" demo --quick --epochs 2 --no-progress --timm-train "$shared/v1.0.23" --output "$work/demo"
bash "$repo/.ci/lanes/offline_demo.sh" "$work/demo" "$work" "$floor/bin/timm-ext"
echo "+ timm-ext export --checkpoint $work/demo/full/last.pth.tar --out $work/hub"
"$floor/bin/timm-ext" export --checkpoint "$work/demo/full/last.pth.tar" --out "$work/hub"
"$floor/bin/python" "$repo/.ci/hub_roundtrip.py" "$work/demo/full/last.pth.tar" "$work/hub"
if [ -f "$shared/v1.0.22/train.py" ]; then
  echo "+ timm-ext patch $shared/v1.0.22/train.py --out $work/train_patched.py"
  "$floor/bin/timm-ext" patch "$shared/v1.0.22/train.py" --out "$work/train_patched.py"
fi
TIMM_EXT_TIMM_TRAIN="$shared/v1.0.23/train.py" "$floor/bin/pytest" -q -rs -p no:cacheprovider --rootdir "$repo" -n auto -m "not larger_sibling" \
  "$repo/tests/test_models.py" "$repo/tests/test_recipes.py::test_sam_runs_in_real_train_py_and_resumes" \
  "$repo/tests/test_timm_backports.py" "$repo/tests/test_requirements.py"
