#!/usr/bin/env bash
# Model contract lane: `bash .ci/lanes/timm_model_tests.sh VENV [PYTEST_ARGS...]` (e.g. `-k default_cfgs`: a part).
# timm's own tests/test_models.py, taken from the sdist of the timm installed in VENV (pip download from the package
# index, kept in $TIMM_EXT_CACHE/timm-sdist; CI reaches no GitHub), run unchanged with timm_ext imported first
# (`pytest -p timm_ext`, so timm's module-level list_models() sees every model timm-ext registers) and only the
# tests whose `model_name` is one of those models kept: timm's CI runs the rest, over models timm-ext does not change.
# The environment is left as timm's CI has it on a CPU machine. Prints how many tests ran, per test function, and
# fails on any failure, when no test names a timm-ext model, or when a registered model is in no test.
set -euo pipefail
cd "$(dirname "$0")/../.."
lane_started=$SECONDS
venv="$1"
shift
py="$(cd "$venv" && pwd)/bin/python"  # absolute: the tests run from a folder outside the clone
version=$("$py" -W ignore -c 'import timm; print(timm.__version__)')

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sdist_dir="${TIMM_EXT_CACHE:-$HOME/.cache/timm-ext}/timm-sdist"
sdist="$sdist_dir/timm-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$sdist_dir"
  if ! "$py" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "timm==$version" \
      > "$work/download.log" 2>&1; then
    cat "$work/download.log" >&2
    echo "model lane: no sdist of timm $version from the package index" >&2
    exit 1
  fi
  mv "$work/timm-$version.tar.gz" "$sdist"
fi
# test_models.py imports nothing of timm's tests/ package: the file alone, in a folder of its own
tar -xzf "$sdist" -C "$work" --strip-components=2 "timm-$version/tests/test_models.py"

# the names timm-ext registers: timm's registry, entrypoints defined in timm_ext
"$py" -W ignore -c '
import timm
from timm.models import model_entrypoint

import timm_ext  # noqa: F401

print("\n".join(n for n in timm.list_models() if model_entrypoint(n).__module__.startswith("timm_ext.")))
' > "$work/timm_ext_models.txt"

# a pytest plugin beside the file (the folder the tests run from is on sys.path)
cat > "$work/timm_ext_models_select.py" << 'PLUGIN'
"""Keep the tests of timm's test_models.py parametrized with a model timm-ext registers (``model_name``, with or
without a pretrained tag); deselect the rest. Registers timm's markers (its pyproject.toml does, not this folder)."""
import os

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_models.txt')
MARKERS = ('base', 'forward', 'backward', 'cfg', 'cfg_nonstd', 'torchscript', 'features', 'fxforward', 'fxbackward')


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line('markers', f'{marker}: timm test_models.py marker')
    if not config.pluginmanager.hasplugin('timeout'):
        config.addinivalue_line('markers', 'timeout: pytest-timeout marker (not installed here, ignored)')


def pytest_collection_modifyitems(config, items):
    with open(NAMES) as f:
        ours = set(f.read().split())
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, 'callspec', None)
        model = callspec.params.get('model_name') if callspec is not None else None
        (keep if isinstance(model, str) and model.split('.')[0] in ours else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
PLUGIN

# the released weights of timm-ext's four how-do-vits-work tags live on GitHub, which CI does not reach: each is
# written in its official layout with random values (tests/test_hdvw_baselines.py's tables) where torch's hub cache
# keeps a download, so test_model_load_pretrained / test_model_features_pretrained load them through the tags' urls,
# checkpoint filters, in_chans=1 and num_classes 5 / 0 included
export TORCH_HOME="$work/torch"
"$py" -W ignore - "$TORCH_HOME/hub/checkpoints" << 'SEED'
import sys
from pathlib import Path

import torch

sys.path.insert(0, 'tests')
from test_hdvw_baselines import CASES, FILES, random_weights  # noqa: E402

folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
for name, (layout, _) in CASES.items():
    torch.save({'state_dict': random_weights(layout()), 'name': name}, folder / FILES[name])
SEED

echo "+ (cd $work && python -m pytest -p timm_ext -p timm_ext_models_select -q --tb=short -p no:cacheprovider test_models.py $*)"
rc=0
(cd "$work" && "$py" -m pytest -p timm_ext -p timm_ext_models_select -q --tb=short -p no:cacheprovider \
  --junitxml="$work/report.xml" test_models.py "$@") || rc=$?

"$py" - "$work/report.xml" "$work/timm_ext_models.txt" "$version" "$((SECONDS - lane_started))" "$rc" "$#" << 'SUMMARY'
import collections
import os
import sys
import xml.etree.ElementTree as ET

report, names_file, version, seconds, rc, selected = sys.argv[1:]
with open(names_file) as f:
    names = set(f.read().split())
if not os.path.exists(report):
    sys.exit(f'model lane: pytest wrote no report (exit {rc}); its output is above')
per_test = collections.defaultdict(collections.Counter)  # test function -> outcome -> count
per_time = collections.Counter()  # test function -> seconds
covered = set()
for case in ET.parse(report).iter('testcase'):
    kinds = {child.tag for child in case}
    outcome = 'failed' if kinds & {'failure', 'error'} else 'skipped' if 'skipped' in kinds else 'passed'
    function, _, params = case.get('name').partition('[')
    per_test[function][outcome] += 1
    per_time[function] += float(case.get('time', 0))
    covered |= names.intersection(p.split('.')[0] for p in params.rstrip(']').split('-'))
total = sum(per_test.values(), collections.Counter())
print(f'== model lane, timm {version}: {total["passed"]} passed, {total["skipped"]} skipped, {total["failed"]} failed '
      f'of {sum(total.values())} run, over {len(covered)} of the {len(names)} models timm-ext registers; {seconds} s')
for function, counts in sorted(per_test.items()):
    print(f'   {function}: ' + ', '.join(f'{counts[o]} {o}' for o in ('passed', 'skipped', 'failed') if counts[o])
          + f' ({per_time[function]:.0f} s)')
if names - covered and selected == '0':
    print(f'model lane: no test of timm {version} names {" ".join(sorted(names - covered))}')
if not covered or (names - covered and selected == '0'):  # all of it must run every model
    sys.exit(f'model lane: timm {version}\'s test_models.py must run every model timm-ext registers')
if int(rc) or total['failed']:
    sys.exit(f'model lane: timm {version}\'s test_models.py fails for timm-ext\'s models (pytest exit {rc})')
SUMMARY
