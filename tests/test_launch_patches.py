"""timm_ext.launch.patches (patches/) for timm train.py v1.0.15 ... v1.0.22: the index, the pure-Python diff
applier, the refusals, the ``timm-ext patch`` command, and SAM in the patched script against an independent
two-pass SAM (in-process with the installed timm, and end to end under timm 1.0.22 in a virtualenv).

timm's scripts are found under TIMM_EXT_TIMM_SCRIPTS (default: ../shared/timm-train next to the
repository) as ``<tag>/train.py``; tags whose script is absent are skipped.
"""
import argparse
import contextlib
import copy
import csv
import difflib
import hashlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from _timm_venvs import venv_python as _venv_python

from timm_ext.cli import main
from timm_ext.launch.patches import (
    apply_unified_diff,
    find_patch,
    load_patch_index,
    patch_script,
    patches_dir,
    supported_tags,
)
from timm_ext.launch.release_table import sha256_of

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(os.environ.get('TIMM_EXT_TIMM_SCRIPTS', REPO.parent / 'shared' / 'timm-train')).resolve()
INTEGRATION_TAG = 'v1.0.22'


def _script(tag: str) -> Path:
    path = SCRIPTS / tag / 'train.py'
    if not path.is_file():
        pytest.skip(f'timm {tag} train.py not found at {path} (set TIMM_EXT_TIMM_SCRIPTS to a folder of '
                    f'<tag>/train.py)')
    return path


def _timm_table():
    with open(REPO / 'timm_ext' / '_data' / 'timm_scripts.tsv', newline='') as f:
        return list(csv.DictReader(f, delimiter='\t'))


# ---- the index ------------------------------------------------------------------------------------

def test_index_covers_every_train_py_without_task_api():
    table = _timm_table()
    expected = {r['tag']: r['train.py_sha256'] for r in table if r['has_task_api'] == 'no'}
    assert set(expected) == {f'v1.0.{i}' for i in range(15, 23)}
    patches = load_patch_index()
    assert {tag: p.sha256_in for p in patches for tag in p.tags} == expected
    assert supported_tags() == sorted(expected, key=lambda t: int(t.split('.')[-1]))
    # one diff per distinct script, named after its tags, and each one on disk
    assert len({p.sha256_in for p in patches}) == len(patches) == 4
    for p in patches:
        name = p.tags[0] if len(p.tags) == 1 else f'{p.tags[0]}-{p.tags[-1]}'
        assert p.patch == f'train_{name}.diff' and (patches_dir() / p.patch).is_file()
        assert find_patch(p.sha256_in) == p and find_patch(p.sha256_in.upper()) == p
        assert p.sha256_out != p.sha256_in
    assert find_patch('0' * 64) is None


def _changes(diff: str):
    """The added and removed lines of each hunk (context lines differ between timm versions)."""
    hunks = diff.split('\n@@ ')[1:]
    return [[ln for ln in h.splitlines()[1:] if ln[:1] in '+-'] for h in hunks]


def test_every_script_gets_the_same_small_change():
    """The four diffs make the same edits (one helper block, a few lines of train_one_epoch)."""
    diffs = [(patches_dir() / p.patch).read_text() for p in load_patch_index()]
    assert all(_changes(d) == _changes(diffs[0]) for d in diffs[1:])
    lines = diffs[0].splitlines()
    removed = [ln for ln in lines if ln.startswith('-') and not ln.startswith('---')]
    added = [ln for ln in lines if ln.startswith('+') and not ln.startswith('+++')]
    assert len(removed) == 2 and len(added) < 60, (len(removed), len(added))
    assert all(ln.endswith('need_update,') or ln.endswith('if need_update:') for ln in removed)


# ---- the diff applier ---------------------------------------------------------------------------------

TEXT = 'a\nb\nc\nd\ne\nf\n'
DIFF = '--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -5,2 +5,3 @@\n e\n f\n+g\n'


def test_apply_unified_diff():
    assert apply_unified_diff(TEXT, DIFF) == 'a\nB\nc\nd\ne\nf\ng\n'
    no_newline = '--- a/x\n+++ b/x\n@@ -6 +6 @@\n-f\n\\ No newline at end of file\n+F\n'
    assert apply_unified_diff('a\nb\nc\nd\ne\nf', no_newline) == 'a\nb\nc\nd\ne\nF\n'


@pytest.mark.parametrize('text, diff, message', [
    ('a\nX\nc\nd\ne\nf\n', DIFF, 'does not match the file at line 2'),
    (TEXT, DIFF.replace('@@ -5,2', '@@ -4,2'), 'does not match the file at line 4'),  # no offset search
    (TEXT, DIFF.replace('@@ -1,3 +1,3', '@@ -1,4 +1,3'), 'header says 4/3'),
    (TEXT, DIFF + '--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n', 'more than one file'),
    (TEXT, 'no diff here\n', 'not a unified diff'),
    (TEXT, DIFF.replace('@@ -5,2 +5,3 @@', '@@ -1,2 +1,3 @@'), 'overlaps'),
], ids=['context', 'offset', 'count', 'two-files', 'not-a-diff', 'overlap'])
def test_apply_unified_diff_refuses(text, diff, message):
    with pytest.raises(ValueError, match=message):
        apply_unified_diff(text, diff)


# ---- patch_script on the real scripts -----------------------------------------------------------------

@pytest.mark.parametrize('patch', load_patch_index(), ids=lambda p: p.patch)
def test_patch_applies_to_its_script(tmp_path, patch):
    src = next((SCRIPTS / t / 'train.py' for t in patch.tags if (SCRIPTS / t / 'train.py').is_file()), None)
    if src is None:
        pytest.skip(f'no train.py of timm {patch.label} under {SCRIPTS} (set TIMM_EXT_TIMM_SCRIPTS)')
    before = src.read_bytes()
    assert hashlib.sha256(before).hexdigest() == patch.sha256_in
    dst = tmp_path / 'train_patched.py'
    assert patch_script(src, dst) == patch.label
    assert src.read_bytes() == before and sha256_of(dst) == patch.sha256_out
    # an independent diff of input and output gives back exactly the shipped diff's changed lines
    changed = [ln for ln in difflib.unified_diff(before.decode().splitlines(), dst.read_text().splitlines(), n=0,
                                                 lineterm='') if ln[:1] in '+-' and ln[:3] not in ('---', '+++')]
    shipped = [ln for ln in (patches_dir() / patch.patch).read_text().splitlines()
               if ln[:1] in '+-' and ln[:3] not in ('---', '+++')]
    assert changed == shipped
    compile(dst.read_text(), str(dst), 'exec')
    # an existing identical output is accepted as it is; patching the patched script is refused
    assert patch_script(src, dst) == patch.label
    with pytest.raises(ValueError, match='already patched by timm-ext'):
        patch_script(dst, tmp_path / 'again.py')


def test_unknown_file_is_refused(tmp_path):
    src = tmp_path / 'train.py'
    src.write_text('print("not timm")\n')
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    with pytest.raises(ValueError) as e:
        patch_script(src, tmp_path / 'out.py')
    message = str(e.value)
    assert str(src) in message and sha in message and 'v1.0.15 ... v1.0.22' in message and '\n' not in message
    assert not (tmp_path / 'out.py').exists()


def test_edited_script_is_refused(tmp_path):
    src = tmp_path / 'train.py'
    src.write_bytes(_script(INTEGRATION_TAG).read_bytes() + b'\n')
    with pytest.raises(ValueError, match='is not a train.py timm-ext can patch'):
        patch_script(src, tmp_path / 'out.py')


def test_script_with_task_api_needs_no_patch(tmp_path):
    with pytest.raises(ValueError, match=r"is timm's train.py of v1\.0\.27, v1\.0\.28, which needs no patch"):
        patch_script(_script('v1.0.28'), tmp_path / 'out.py')
    with pytest.raises(ValueError, match=r"is timm's validate.py of v1\.0\.20, v1\.0\.21, v1\.0\.22, which needs no"):
        patch_script(_script(INTEGRATION_TAG).with_name('validate.py'), tmp_path / 'out.py')


def test_never_writes_over_input_or_an_existing_file(tmp_path):
    src = tmp_path / 'train.py'
    shutil.copyfile(_script(INTEGRATION_TAG), src)
    original = src.read_bytes()
    with pytest.raises(ValueError, match='is the input itself'):
        patch_script(src, src)
    with pytest.raises(ValueError, match='is the input itself'):
        patch_script(src, tmp_path / '.' / 'train.py')
    other = tmp_path / 'other.py'
    other.write_text('keep me\n')
    with pytest.raises(ValueError, match='already exists and is not the patched script'):
        patch_script(src, other)
    assert src.read_bytes() == original and other.read_text() == 'keep me\n'
    with pytest.raises(ValueError, match='is not a file'):
        patch_script(tmp_path / 'missing.py', tmp_path / 'out.py')


# ---- the command --------------------------------------------------------------------------------------

def test_cli_patch(tmp_path, capsys):
    src = tmp_path / 'train.py'
    shutil.copyfile(_script(INTEGRATION_TAG), src)
    assert main(['patch', str(src)]) == 0
    dst = tmp_path / 'train_timm_ext.py'
    assert sha256_of(dst) == find_patch(sha256_of(src)).sha256_out
    assert str(dst) in capsys.readouterr().out

    (tmp_path / 'taken.py').write_text('x\n')
    assert main(['patch', str(src), '--out', str(tmp_path / 'taken.py')]) == 2
    err = capsys.readouterr().err
    assert err.startswith('timm-ext patch: error: ') and err.count('\n') == 1 and 'already exists' in err
    assert (tmp_path / 'taken.py').read_text() == 'x\n'

    assert main(['patch', str(tmp_path / 'taken.py'), '--out', str(tmp_path / 'new.py')]) == 2
    err = capsys.readouterr().err
    assert 'is not a train.py timm-ext can patch' in err and err.count('\n') == 1
    assert main(['patch', str(src), '--out', str(src)]) == 2
    assert 'is the input itself' in capsys.readouterr().err


# ---- SAM in the patched train_one_epoch, in-process (the installed timm) ---------------------------------

def _load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:  # a newer timm may drop something the old script imports
        pytest.skip(f'{path} does not import under the installed timm: {e}')
    return module


# the in-process checks run for every patch whose script is present (normally v1.0.22's only)
_LOOP_TAGS = [p.tags[-1] for p in load_patch_index() if (SCRIPTS / p.tags[-1] / 'train.py').is_file()]


@pytest.fixture(scope='module', params=_LOOP_TAGS or [INTEGRATION_TAG])
def train_modules(request, tmp_path_factory):
    src = _script(request.param)
    dst = tmp_path_factory.mktemp('patched') / 'train_patched.py'
    patch_script(src, dst)
    name = request.param.replace('.', '_')
    return _load_script(src, f'_timm_train_{name}'), _load_script(dst, f'_timm_train_{name}_patched')


class _Net(nn.Module):
    """BatchNorm (running statistics) and dropout (masks) make both passes' bookkeeping visible."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = self.drop(torch.relu(self.bn(self.conv(x))))
        return self.fc(x.mean((2, 3)))


def _run_epoch(module, model, optimizer, batches, accum, amp_dtype=None, scaler=False, clip=None):
    args = module.parser.parse_args(['--grad-accum-steps', str(accum), '--log-interval', '100'])
    args.prefetcher, args.distributed, args.world_size, args.rank = False, False, 1, 0
    if clip is not None:
        args.clip_grad, args.clip_mode = clip
    amp_autocast = partial(torch.autocast, device_type='cpu', dtype=amp_dtype) if amp_dtype else module.suppress
    from timm.utils import NativeScaler
    kwargs = dict(device=torch.device('cpu'), amp_autocast=amp_autocast,
                  loss_scaler=NativeScaler(device='cpu') if scaler else None)
    kwargs = {k: v for k, v in kwargs.items() if k in inspect.signature(module.train_one_epoch).parameters}
    torch.manual_seed(1)
    return module.train_one_epoch(0, model, batches, optimizer, nn.CrossEntropyLoss(), args, **kwargs)


def _reference_sam(model, batches, accum, rho, lr, amp_dtype=None, clip_value=None, same_masks=True):
    """Two-pass SAM written out: gradient of the window at w, e = rho g / ||g||, gradient at w + e with the
    same dropout masks (RNG state of each micro-batch), BatchNorm statistics of the first pass, SGD from w."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    base = torch.optim.SGD(params, lr=lr, momentum=0.9)
    autocast = partial(torch.autocast, 'cpu', dtype=amp_dtype, enabled=amp_dtype is not None)
    torch.manual_seed(1)
    for start in range(0, len(batches), accum):
        window = batches[start:start + accum]
        states = []
        for x, y in window:
            states.append(torch.get_rng_state())
            with autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            (loss / len(window)).backward()
        if clip_value is not None:
            for p in params:
                p.grad.clamp_(-clip_value, clip_value)
        buffers = [b.clone() for b in model.buffers()]
        grads = [p.grad.clone() for p in params]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        w = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g * (rho / norm).float())
                p.grad = None
        after_first = torch.get_rng_state()
        for (x, y), state in zip(window, states):
            if same_masks:
                torch.set_rng_state(state)
            with autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            (loss / len(window)).backward()
        torch.set_rng_state(after_first)
        with torch.no_grad():
            for p, w0 in zip(params, w):
                p.copy_(w0)
            for b, saved in zip(model.buffers(), buffers):
                b.copy_(saved)
        base.step()
        base.zero_grad()
    return model


def _batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)]


def _flat(model):
    return torch.cat([t.detach().reshape(-1).double() for t in model.state_dict().values()])


@pytest.mark.parametrize('amp_dtype, scaler, clip', [
    (None, False, None),
    (torch.bfloat16, True, (0.02, 'value')),  # bf16 autocast, a GradScaler and clipping of the scaled gradient
], ids=['fp32', 'bf16-scaler-clip'])
def test_patched_loop_is_two_pass_sam(train_modules, amp_dtype, scaler, clip):
    from timm_ext.optim import SAM
    _, patched = train_modules
    torch.manual_seed(0)
    model0, batches, rho, lr = _Net(), _batches(), 0.5, 0.1
    model = copy.deepcopy(model0)
    with warnings.catch_warnings():  # no model= on purpose: the patch itself keeps the first pass's statistics
        warnings.filterwarnings('ignore', message='SAM does not know the model')
        optimizer = SAM(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), rho=rho)
        _run_epoch(patched, model, optimizer, batches, accum=2, amp_dtype=amp_dtype, scaler=scaler, clip=clip)

    clip_value = clip[0] if clip else None
    exact = _reference_sam(model0, batches, 2, rho, lr, amp_dtype, clip_value)
    fresh_masks = _reference_sam(model0, batches, 2, rho, lr, amp_dtype, clip_value, same_masks=False)
    plain = _reference_sam(model0, batches, 2, 0.0, lr, amp_dtype, clip_value)
    got, update = _flat(model), (_flat(exact) - _flat(model0)).norm()
    err = (got - _flat(exact)).norm() / update
    assert err < 1e-4, err
    assert (got - _flat(fresh_masks)).norm() / update > 1e-2  # the second pass reuses the first's dropout masks
    assert (got - _flat(plain)).norm() / update > 1e-2  # ... and it is not plain SGD
    assert model.bn.num_batches_tracked.item() == len(batches)  # BatchNorm counted the first pass only


def test_patched_loop_is_unchanged_for_other_optimizers(train_modules):
    original, patched = train_modules
    torch.manual_seed(0)
    model0, batches = _Net(), _batches()
    results = []
    for module in (original, patched):
        model = copy.deepcopy(model0)
        _run_epoch(module, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batches, accum=2)
        results.append(_flat(model))
    assert torch.equal(results[0], results[1]) and not torch.equal(results[0], _flat(model0))


# ---- end to end: the patched v1.0.22 train.py under timm 1.0.22, in a throwaway virtualenv --------------

def _image_folder(root: Path):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in (('train', 4), ('validation', 1)):
        for cls in range(2):
            folder = root / split / f'class{cls}'
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                pixels[..., cls] //= 4  # a learnable signal
                Image.fromarray(pixels).save(folder / f'{i}.png')


def _load_train_images(root: Path, mean, std):
    import numpy as np
    from PIL import Image
    xs, ys = [], []
    for cls in range(2):
        for path in sorted((root / 'train' / f'class{cls}').glob('*.png')):
            x = torch.from_numpy(np.asarray(Image.open(path).convert('RGB'), dtype=np.float32) / 255.)
            xs.append((x.permute(2, 0, 1) - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None])
            ys.append(cls)
    return torch.stack(xs), torch.tensor(ys)


@pytest.mark.slow
@pytest.mark.parametrize('tag', _LOOP_TAGS or [INTEGRATION_TAG])
def test_sam_in_patched_train_py_under_its_timm(tmp_path, tag):
    """Two epochs of samsgd (rho 0.5) in the patched script, run under its own timm version, equal two steps
    of a two-pass SAM written out here: one update per epoch over all 8 images (2 micro-batches of 4,
    accumulated), so the sampler's order cannot matter for a LayerNorm ViT."""
    import timm
    src = _script(tag)
    python = _venv_python(tag[1:])
    train_py = tmp_path / 'train_timm_ext.py'
    patch_script(src, train_py)
    _image_folder(tmp_path / 'data')
    torch.manual_seed(0)
    model0 = timm.create_model('test_vit', num_classes=2, img_size=32)
    torch.save(model0.state_dict(), tmp_path / 'init.pth')
    lr, rho = 0.1, 0.5
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='2',
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))
    cmd = [str(python), str(train_py), '--data-dir', str(tmp_path / 'data'), '--model', 'test_vit',
           '--model-kwargs', 'img_size=32', '--img-size', '32', '--num-classes', '2',
           '--initial-checkpoint', str(tmp_path / 'init.pth'), '--device-modules', 'timm_ext', '--device', 'cpu',
           '--opt', 'samsgd', '--opt-kwargs', f'rho={rho}', '--lr', str(lr), '--momentum', '0.9',
           '--weight-decay', '0', '--sched', 'step', '--decay-epochs', '100', '--warmup-epochs', '0',
           '--epochs', '2', '--batch-size', '4', '--grad-accum-steps', '2', '--smoothing', '0', '--no-aug',
           '--workers', '1', '--log-interval', '1', '--output', str(tmp_path / 'out'), '--experiment', 'run',
           '--checkpoint-hist', '1']
    if tag != INTEGRATION_TAG:  # opt-in extra versions: timm-ext itself may need a newer timm
        check = subprocess.run([str(python), '-c', 'import timm_ext'], env=env, cwd=tmp_path, capture_output=True,
                               text=True)
        if check.returncode != 0:
            pytest.skip(f'timm_ext does not import under timm {tag[1:]}: {check.stderr.strip().splitlines()[-1]}')
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    version = subprocess.run([str(python), '-c', 'import timm; print(timm.__version__)'],
                             env=env, cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert version == tag[1:] and 'Created SAMSGD (samsgd) optimizer' in log, log[-3000:]
    if not hasattr(torch.serialization, 'safe_globals'):  # torch < 2.5
        torch.serialization.add_safe_globals([argparse.Namespace])
    safe = getattr(torch.serialization, 'safe_globals', lambda _: contextlib.nullcontext())
    with safe([argparse.Namespace]):  # train.py saves its args in the checkpoint
        state = torch.load(tmp_path / 'out' / 'run' / 'last.pth.tar', map_location='cpu', weights_only=True)
    assert state['epoch'] == 1

    cfg = model0.pretrained_cfg
    x, y = _load_train_images(tmp_path / 'data', cfg['mean'], cfg['std'])
    results = {}
    for name, radius in (('sam', rho), ('sgd', 0.0)):
        model = copy.deepcopy(model0)
        params = list(model.parameters())
        base = timm.optim.create_optimizer_v2(model, 'sgd', lr=lr, momentum=0.9, weight_decay=0)  # nesterov
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
            norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
            w = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=radius / norm.item())
                    p.grad = None
            nn.functional.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p, w0 in zip(params, w):
                    p.copy_(w0)
            base.step()
            base.zero_grad()
        results[name] = torch.cat([p.detach().reshape(-1) for p in params])
    got = torch.cat([state['state_dict'][n].reshape(-1) for n, _ in model0.named_parameters()])
    w0 = torch.cat([p.detach().reshape(-1) for p in model0.parameters()])
    update = (results['sam'] - w0).norm()
    # measured: 5e-7 against the two-pass SAM, 1.6 against plain nesterov SGD
    assert (got - results['sam']).norm() / update < 1e-5, ((got - results['sam']).norm() / update).item()
    assert (got - results['sgd']).norm() / update > 0.1
