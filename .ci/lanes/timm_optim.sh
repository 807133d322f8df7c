#!/usr/bin/env bash
# Optimizer contract lane: `bash .ci/lanes/timm_optim.sh VENV`.
# timm's own tests/test_optim.py, taken from the sdist of the timm installed in VENV (pip download from the package
# index; CI reaches no GitHub), run unchanged with timm_ext imported first (`pytest -p timm_ext`): its parametrized
# tests then cover every optimizer name timm-ext registers (samadamw, gsamsgd, looksamlamb, ...) beside timm's own.
# The environment is left as timm's CI has it on a CPU machine (the CUDA parts skip by themselves). The tests that
# name only timm's own optimizers (in their parameters, or their own name: test_kron_...) are deselected: timm's CI
# runs them, timm-ext changes nothing of those optimizers,
# and they are most of the file's time (about 14 CPU minutes with timm 1.0.31); TIMM_EXT_OPTIM_ALL=1 runs them too.
# Prints how many tests passed and how many of them name timm-ext's optimizers; fails on any failure, or when no
# test names one of timm-ext's optimizers.
set -euo pipefail
cd "$(dirname "$0")/../.."
lane_started=$SECONDS
venv="$1"
py="$(cd "$venv" && pwd)/bin/python"  # absolute: the tests run from a folder outside the clone
version=$("$py" -W ignore -c 'import timm; print(timm.__version__)')

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
download_log="$work/download.log"
if ! "$py" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "timm==$version" \
    > "$download_log" 2>&1; then
  cat "$download_log" >&2
  echo "optim lane: no sdist of timm $version from the package index" >&2
  exit 1
fi
# test_optim.py imports nothing of timm's tests/ package: the file alone, in a folder of its own
tar -xzf "$work/timm-$version.tar.gz" -C "$work" --strip-components=2 "timm-$version/tests/test_optim.py"
# torch.testing._internal (test_optim.py's TestCase) imports expecttest (in the test extra; a lane venv may lack it)
if ! "$py" -c 'import expecttest' 2> /dev/null; then
  "$py" -m pip install --quiet expecttest
fi

# the names timm-ext registers: timm's optimizer registry, entries whose class is one of timm_ext's SAM classes or
# MESA; those with a second pass (SAM's but Momentum-SAM's) also in timm_ext_two_pass.txt, MESA's in
# timm_ext_task_only.txt. A name is a family (its prefix: sam, asam, gsam, ..., mesa, bsam) around a base optimizer
# of timm (adamw, lamb, ...); timm_ext_cover.txt holds a few names that between them take every family and every
# base, each family also as its bare name (factory form, base=), and timm_ext_family.txt the first name of each family
"$py" -W ignore -c '
import sys

from timm.optim import get_optimizer_info, list_optimizers

from timm_ext.optim import MESA, SAM, MomentumSAM

ours = {}  # name -> (family, base)
refusing = set()  # MESA steps in no test that takes a base (no task): a base goes to another family
with open(sys.argv[1], "w") as names, open(sys.argv[2], "w") as two_pass, open(sys.argv[3], "w") as task_only:
    for name in list_optimizers():
        info = get_optimizer_info(name)
        cls = info.opt_class
        if isinstance(cls, type) and issubclass(cls, (SAM, MESA)):
            print(name, file=names)
            if issubclass(cls, MESA):
                print(name, file=task_only)
                refusing.add(name)
            elif not issubclass(cls, MomentumSAM):
                print(name, file=two_pass)
            base = (info.defaults or {}).get("base")
            named = base is not None and name.endswith(base) and name != base and len(name) > len(base)
            ours[name] = (name[:-len(base)] if named else name, base if named else None)
families = sorted({family for family, _ in ours.values()})
not_run = refusing | {"msamlion"}  # test_optim_factory[msamlion] is not run (the plugin below says why)
cover = [n for n in ours if ours[n][1] is None]  # the bare names: one per family, base= (bsam has no base)
uses = {family: 0 for family in families}
for base in sorted({b for _, b in ours.values() if b is not None}):  # each base once, around the least used family
    name = min((n for n in ours if ours[n][1] == base and n not in not_run), key=lambda n: (uses[ours[n][0]], n))
    cover.append(name)
    uses[ours[name][0]] += 1
for family in families:  # a family no base went to, around one base
    around = [n for n in ours if ours[n][0] == family and ours[n][1] and n not in not_run]
    if not uses[family] and around:
        cover.append(min(around))
with open(sys.argv[4], "w") as f:
    f.writelines(n + "\n" for n in cover)
with open(sys.argv[5], "w") as f:
    f.writelines(min((n for n in ours if ours[n][0] == family), key=lambda n: (ours[n][1] is not None, n)) + "\n"
                 for family in sorted(families))
' "$work/timm_ext_names.txt" "$work/timm_ext_two_pass.txt" "$work/timm_ext_task_only.txt" "$work/timm_ext_cover.txt" \
  "$work/timm_ext_family.txt"

# a pytest plugin beside the file (the folder the tests run from is on sys.path)
cat > "$work/timm_ext_select.py" << 'PLUGIN'
"""Deselect the tests that name only timm's own optimizers (in their parameters, or in their own name: test_kron_...):
keep those naming one of timm-ext's, or none at all.

timm >= 1.0.31 also runs registry-wide property tests that set ``p.grad`` by hand and call ``step()`` with no
closure. SAM has no way to evaluate the loss at w + e there, and refuses with ``NoSecondPassError`` rather than take
a plain base step that would silently not be SAM (davda54/sam refuses the same; timm exempts adahessian by name for
the same reason). Those tests are expected to fail with exactly that error (strict: a pass, or any other failure,
fails the lane), and the summary counts them apart.
"""
import dataclasses
import fnmatch
import os

import pytest
import torch
from timm.optim import get_optimizer_info, list_optimizers
from timm.optim._optim_factory import default_registry

from timm_ext.optim import NoSecondPassError

# bsam needs the training set's size, which timm's tests (written for optimizers without one) cannot pass: the lane
# registers it with num_data=1000 as a default, so that every one of them builds it as they build the others
default_registry._optimizers['bsam'] = dataclasses.replace(get_optimizer_info('bsam'), defaults={'num_data': 1000})

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_names.txt')
TWO_PASS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_two_pass.txt')
TASK_ONLY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_task_only.txt')
# MESA adds its term to the loss timm's training task returns; timm's tests call no task, so every test that steps
# with gradients is expected to fail with MESA's one-line RuntimeError (MESA's own tests: tests/test_mesa.py)
NEEDS_NO_TASK = {'test_optim_factory_common_kwargs', 'test_optimizer_no_grad_step'}
NO_TASK = pytest.mark.xfail(strict=True, raises=RuntimeError, reason=(
    'MESA refuses step() when no timm training task ran (no loss to add its term to, no model to average)'))
STEP_WITHOUT_CLOSURE = {
    'test_optimizer_copy', 'test_optimizer_param_group_independent', 'test_optimizer_zero_lr',
    'test_optimizer_tensor_lr', 'test_optimizer_resume', 'test_optimizer_low_precision',
    'test_optimizer_grad_unchanged', 'test_optimizer_foreach_parity', 'test_optimizer_foreach_chunked',
}
REFUSED = pytest.mark.xfail(strict=True, raises=NoSecondPassError, reason=(
    'SAM refuses step() with hand-set gradients and no closure (NoSecondPassError): no second pass to run'))
# Momentum-SAM (one pass) runs every test; a few properties differ by design, as timm's own _PROPERTY_EXCEPTIONS
# list such deviations for its optimizers: (test, name pattern, parameter dtype or None, reason), each expected to fail
# its assertion (strict)
ONE_PASS_EXCEPTIONS = [
    ('test_optimizer_zero_lr', 'msam*', None, 'Momentum-SAM without a model leaves the weights at w - rho v / ||v|| '
     'after step() with hand-set gradients, as its paper\'s code: lr 0 still displaces them'),
    ('test_optimizer_param_group_independent', 'msam*', None, 'Momentum-SAM\'s ||v|| spans all param groups, as its '
     'paper\'s (timm exempts *lamb* for its global grad norm)'),
    ('test_optimizer_resume', 'msamnadam', torch.bfloat16, 'timm exempts nadam: torch.optim.NAdam keeps mu_product '
     'in fp32, cast to the param dtype by Optimizer.load_state_dict'),
    ('test_optimizer_foreach_parity', 'msamradam', None, 'a compiled RAdam step differs from the eager one at float32 '
     'precision in the float64 parameter (timm allows 1e-6); the weights, read displaced by rho 3 along v / ||v||, '
     'differ by 1.4e-6'),
]
# (test, name, reason): not run; the summary prints each
DESELECTED = [
    ('test_optim_factory', 'msamlion', 'its toy problem is drawn unseeded, and rho 3 (the paper\'s, for networks) '
     'moves its 55 weights by 3 before each gradient: Lion\'s sign update lowers the loss on some draws, not on '
     'others (at rho 0.3 it does on every draw tried), so its outcome is chance'),
]
DESELECTED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_deselected.txt')
# fewer names where more prove nothing more (docs/compatibility.md#timms-own-optimizer-tests): a release lane
# (TIMM_EXT_OPTIM_SUBSET=cover) runs the names of timm_ext_cover.txt, every family and every base of timm between
# them; a refusal by design (SAM's step() without a closure, MESA's without a task) comes from the family's code before
# any base runs, so every lane runs those tests for one name per family (timm_ext_family.txt)
COVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_cover.txt')
FAMILY = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_family.txt')
THINNED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'timm_ext_thinned.txt')


def one_pass_exception(item):
    """The reason ``item`` (a test naming a one-pass optimizer) is expected to fail, else None."""
    params = getattr(item, 'callspec', None)
    params = params.params if params is not None else {}
    names = [v[0] if isinstance(v, tuple) else v for v in params.values()]
    for test, pattern, dtype, reason in ONE_PASS_EXCEPTIONS:
        if item.originalname == test and any(isinstance(n, str) and fnmatch.fnmatch(n, pattern) for n in names) \
                and (dtype is None or params.get('dtype') == dtype):
            return reason
    return None


def pytest_collection_modifyitems(config, items):
    with open(NAMES) as f:
        ours = set(f.read().split())
    with open(TWO_PASS) as f:
        two_pass = set(f.read().split())
    with open(TASK_ONLY) as f:
        task_only = set(f.read().split())  # Momentum-SAM steps on hand-set gradients as any one-pass optimizer
    with open(COVER) as f:
        cover = set(f.read().split())
    with open(FAMILY) as f:
        family = set(f.read().split())
    covering = os.environ.get('TIMM_EXT_OPTIM_SUBSET') == 'cover'
    registry = set(list_optimizers())
    registry |= {f'lookahead_{name}' for name in registry}  # timm's factory takes a lookahead_ prefix on any name
    everything = os.environ.get('TIMM_EXT_OPTIM_ALL') == '1'
    keep, drop, thinned = [], [], {'cover': 0, 'family': 0}
    for item in items:
        params = set(item.name.partition('[')[2].rstrip(']').split('-'))  # e.g. test_optimizer_copy[samadamw-pickle]
        refused = params & two_pass and item.originalname in STEP_WITHOUT_CLOSURE
        no_task = params & task_only and item.originalname not in NEEDS_NO_TASK
        if not everything and params & ours and (covering and not params & cover
                                                 or (refused or no_task) and not params & family):
            thinned['cover' if covering and not params & cover else 'family'] += 1
            drop.append(item)
            continue
        if refused:
            item.add_marker(REFUSED)
        elif no_task:
            item.add_marker(NO_TASK)
        elif params & (ours - two_pass - task_only) and one_pass_exception(item):
            item.add_marker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=one_pass_exception(item)))
        reason = next((r for test, name, r in DESELECTED if item.originalname == test and name in params), None)
        if reason is not None:
            with open(DESELECTED_FILE, 'a') as f:
                print(f'{item.name}: {reason}', file=f)
            drop.append(item)
            continue
        # a test named after one of timm's own optimizers (test_kron_..., test_mars_...) builds that class by hand:
        # no name of timm-ext's reaches it, timm's CI runs it (test_kron_update_prob_per_param: 25 s of inductor)
        named_after = item.originalname.split('_')[1] if item.originalname.count('_') >= 2 else ''
        timms_own = params & registry or named_after in registry - ours
        (keep if everything or params & ours or not timms_own else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    with open(THINNED_FILE, 'w') as f:
        print(thinned['cover'], thinned['family'], file=f)
PLUGIN
select=(-p timm_ext_select)  # with TIMM_EXT_OPTIM_ALL=1 it deselects nothing (timm's own optimizers too)

echo "+ (cd $work && python -m pytest -p timm_ext ${select[*]} -q --tb=short -p no:cacheprovider -n auto --dist worksteal test_optim.py)"
rc=0
# pytest-xdist over the cores (in the test extra), one torch thread per worker: timm's tensors here are tiny; a worker
# that runs out of tests takes some of the other's (--dist worksteal): Momentum-SAM's foreach-parity tests (5-8 s each,
# Dynamo tracing its step) come last in a row, and xdist's default left them to one worker, the other core idle
(cd "$work" && OMP_NUM_THREADS=1 "$py" -m pytest -p timm_ext "${select[@]}" -q --tb=short -p no:cacheprovider \
  -n "${TIMM_EXT_CI_WORKERS:-auto}" --dist worksteal --junitxml="$work/report.xml" test_optim.py) || rc=$?

"$py" - "$work/report.xml" "$work/timm_ext_names.txt" "$version" "$((SECONDS - lane_started))" "$rc" << 'SUMMARY'
import os
import sys
import xml.etree.ElementTree as ET

report, names_file, version, seconds, rc = sys.argv[1:]
with open(names_file) as f:
    names = set(f.read().split())
if not os.path.exists(report):
    sys.exit(f'optim lane: pytest wrote no report (exit {rc}); its output is above')
outcomes = {}  # test id -> passed / skipped / failed
for case in ET.parse(report).iter('testcase'):
    kinds = {child.tag for child in case}
    failed = kinds & {'failure', 'error'}
    refused = any(c.tag == 'skipped' and c.get('type') == 'pytest.xfail' for c in case)
    outcomes[case.get('name')] = ('failed' if failed else 'refused' if refused else 'skipped' if 'skipped' in kinds
                                  else 'passed')


def names_of(test_id):  # the timm-ext names among a test id's parameters, e.g. test_optimizer_copy[samadamw-pickle]
    return names.intersection(test_id.partition('[')[2].rstrip(']').split('-'))


def count(results, outcome):
    return sum(1 for o in results.values() if o == outcome)


ours = {test_id: outcome for test_id, outcome in outcomes.items() if names_of(test_id)}
covered = set().union(*map(names_of, ours))
print(f'== optim lane, timm {version}: {count(outcomes, "passed")} passed, {count(outcomes, "skipped")} skipped, '
      f'{count(outcomes, "failed")} failed of {len(outcomes)} run; naming timm-ext\'s optimizers: '
      f'{count(ours, "passed")} passed, {count(ours, "skipped")} skipped, {count(ours, "failed")} failed, '
      f'{count(ours, "refused")} refused or exempt by design (SAM\'s step() without a closure: NoSecondPassError; '
      f'MESA\'s without a task; Momentum-SAM\'s listed properties) of {len(ours)} '
      f'({len(covered)} of the {len(names)} names timm-ext registers); {seconds} s')
with open(os.path.join(os.path.dirname(report), 'timm_ext_thinned.txt')) as f:
    by_cover, by_family = map(int, f.read().split())
if by_cover or by_family:
    print(f'optim lane: not run, {by_cover} tests of names whose families and bases other names take '
          f'(timm_ext_cover.txt) and {by_family} refusals by design of names whose family another name refuses for '
          f'(timm_ext_family.txt)')
deselected = os.path.join(os.path.dirname(report), 'timm_ext_deselected.txt')
if os.path.exists(deselected):
    with open(deselected) as f:
        for line in sorted(set(f.read().splitlines())):
            print(f'optim lane: not run, {line}')
expected = names
if by_cover:  # a release lane: the names of timm_ext_cover.txt
    with open(os.path.join(os.path.dirname(report), 'timm_ext_cover.txt')) as f:
        expected = names & set(f.read().split())
if expected - covered:
    print(f'optim lane: no test of timm {version} names {" ".join(sorted(expected - covered))}')
if not ours:
    sys.exit(f'optim lane: timm {version}\'s test_optim.py ran no test naming an optimizer timm-ext registers')
if int(rc) or count(outcomes, 'failed'):
    sys.exit(f'optim lane: timm {version}\'s test_optim.py fails with timm_ext imported (pytest exit {rc})')
SUMMARY
