"""timm_ext.hub: train.py checkpoints read safely, hub folders exported for every family and loaded back with
timm's own ``hf-hub:`` (from a hub cache built here, offline) and ``local-dir:`` paths with identical
outputs, on the installed timm and on timm 1.0.28; one-line errors for what cannot be used; push through a
fake ``HfApi`` (never the network); the CLI wiring of ``timm-ext export`` / ``timm-ext push``."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants as hf_constants
import pytest
import timm
import torch
import yaml
from _cli import run_cli
from _threads import same_threads
from _timm_train import TRAIN_PY
from _timm_venvs import venv_python

import timm_ext  # noqa: F401  (registers the models)
from timm_ext.hub import (
    CardInfo,
    HubError,
    check_folder,
    export,
    hub_config,
    load_checkpoint,
    load_model,
    load_weights,
    push,
    save_safetensors,
)

REPO = Path(__file__).resolve().parents[1]
SHA = 'c' * 40
# one small model per family (few layers, small images): the same classes and code paths as the full models
FAMILIES = {
    'vit_tiny_cb': dict(img_size=32, patch_size=8, depth=2, num_classes=5),
    'vit_tiny_cbs': dict(img_size=32, patch_size=8, depth=2, num_classes=5),
    'pit_b_cb': dict(img_size=64, base_dims=[16, 16, 16], heads=[1, 2, 2], depth=[1, 1, 1], num_classes=5),
    'mixer_s16_cb': dict(img_size=32, patch_size=8, num_blocks=2, embed_dim=32, num_classes=5),
    'vit_tiny_convstem': dict(img_size=32, depth=2, num_classes=5),
    'volo_d1_convstem': dict(layers=(1, 1, 1, 1), embed_dims=(32, 64, 64, 64), num_heads=(2, 2, 2, 2), img_size=64,
                             num_classes=5),
    'alternet_18_cifar': dict(channels=(16, 32, 64, 128), num_heads=(1, 1, 2, 2), head_dim=8, num_classes=5),
    'resnet50_cifar': dict(layers=(1, 1, 1, 1), num_classes=5),  # how-do-vits-work's CIFAR ResNet (hdvw_baselines)
}
SMALL = FAMILIES['vit_tiny_cb']


def _small(name='vit_tiny_cb', **kwargs):
    model = timm.create_model(name, **dict(FAMILIES[name], **kwargs)).eval()
    model.test_kwargs = dict(FAMILIES[name], **kwargs)
    return model


def _export(model, out, **kwargs):
    """export() as a user calls it: timm >= 1.0.31 recorded the model's arguments itself; older timm needs them."""
    if not hasattr(model, '_model_args'):
        kwargs.setdefault('model_args', model.test_kwargs)
    return export(model, out, **kwargs)


def _publish(cache: Path, folder: Path, repo_id: str, revision: str = SHA) -> None:
    """``folder`` as huggingface_hub caches a download: models--org--name/snapshots/<sha>/, refs/main."""
    repo = cache / ('models--' + repo_id.replace('/', '--'))
    shutil.copytree(folder, repo / 'snapshots' / revision)
    (repo / 'refs').mkdir(parents=True, exist_ok=True)
    (repo / 'refs' / 'main').write_text(revision)  # no newline, as huggingface_hub writes it


@pytest.fixture
def offline(monkeypatch):
    # huggingface_hub reads HF_HUB_OFFLINE at import: the module constant is what its requests consult
    monkeypatch.setattr(hf_constants, 'HF_HUB_OFFLINE', True)


def _outputs(model, size, seed=1):
    x = torch.randn(2, *size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


# --- checkpoints ---------------------------------------------------------------------------------

def _train_py_checkpoint(path: Path, net, ema_shift=1.0, **args):
    """What train.py's CheckpointSaver writes: DDP-prefixed weights, EMA, its argparse.Namespace, optimizer."""
    sd = {f'module.{k}': v for k, v in net.state_dict().items()}
    ema = {k: v + ema_shift if v.is_floating_point() else v for k, v in net.state_dict().items()}
    torch.save({'epoch': 7, 'arch': args.get('model', 'vit_tiny_cb'), 'state_dict': sd, 'state_dict_ema': ema,
                'optimizer': {'state': {}, 'param_groups': [{'lr': 0.1, 'params': [0]}]}, 'version': 2,
                'args': argparse.Namespace(**args), 'metric': 12.5}, path)


def test_load_checkpoint_reads_train_py_layout(tmp_path):
    model = _small()
    _train_py_checkpoint(tmp_path / 'last.pth.tar', model, model='vit_tiny_cb', num_classes=5, in_chans=None,
                         input_size=None, img_size=32, gp=None, bn_eps=None, bn_momentum=0.1, drop_path=0.1,
                         model_kwargs={'img_size': 32, 'patch_size': 8, 'depth': 2}, mean=None, std=None,
                         interpolation='', crop_pct=0.95, crop_mode=None, lr=0.1)
    ckpt = load_checkpoint(tmp_path / 'last.pth.tar')
    assert ckpt.arch == 'vit_tiny_cb' and ckpt.epoch == 7 and not ckpt.ema
    assert set(ckpt.state_dict) == set(model.state_dict())  # module. stripped
    assert torch.equal(ckpt.state_dict['pos_embed'], model.pos_embed)
    # what train.py passed to create_model and to its data pipeline (None and '' mean "the model's")
    assert ckpt.model_kwargs() == dict(num_classes=5, img_size=32, patch_size=8, depth=2)
    assert ckpt.data_config() == dict(input_size=(3, 32, 32), crop_pct=0.95)
    ema = load_checkpoint(tmp_path / 'last.pth.tar', use_ema=True)
    assert ema.ema and torch.equal(ema.state_dict['pos_embed'], model.pos_embed + 1)


_RAN = []


def _record(tag):
    _RAN.append(tag)
    return {}


class _Payload:
    def __reduce__(self):
        return _record, ('unpickled',)


def test_load_checkpoint_never_unpickles_objects(tmp_path):
    torch.save({'state_dict': _small().state_dict(), 'extra': _Payload()}, tmp_path / 'evil.pth')
    with pytest.raises(HubError, match=r'evil\.pth holds objects that torch\.load\(weights_only=True\) refuses '
                                       r'\(test_hub\._record\): in a session you trust, load it and save its '
                                       r'state_dict\(\) with torch\.save$'):
        load_checkpoint(tmp_path / 'evil.pth')
    assert _RAN == []  # the payload's callable never ran
    torch.load(tmp_path / 'evil.pth', weights_only=False)  # what an unsafe loader would have done
    assert _RAN == ['unpickled']


def test_load_checkpoint_errors(tmp_path):
    model = _small()
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'no_ema.pth.tar')
    with pytest.raises(HubError, match=r'no_ema\.pth\.tar has no EMA weights .*--model-ema'):
        load_checkpoint(tmp_path / 'no_ema.pth.tar', use_ema=True)
    with pytest.raises(HubError, match=r'missing\.pth does not exist'):
        load_checkpoint(tmp_path / 'missing.pth')
    good = (tmp_path / 'no_ema.pth.tar').read_bytes()
    (tmp_path / 'cut.pth.tar').write_bytes(good[:len(good) // 2])
    with pytest.raises(HubError, match=r'cut\.pth\.tar is not a readable PyTorch checkpoint \(a zip archive '
                                       r'that is truncated or corrupt: .*\): copy it again, or save it again with '
                                       r'torch\.save$'):
        load_checkpoint(tmp_path / 'cut.pth.tar')
    torch.save([1, 2], tmp_path / 'list.pth')
    with pytest.raises(HubError, match=r'list\.pth holds a list'):
        load_checkpoint(tmp_path / 'list.pth')


_EXPECTED = ("expected a file written by torch.save (train.py's last.pth.tar or model_best.pth.tar, a .pth "
             "state_dict) or a .safetensors file")


def _not_a_checkpoint(tmp_path):
    """Files a user may pass by mistake, each with what the error should say it is."""
    import pickle
    import zipfile
    (tmp_path / 'notes.txt').write_text('model: vit_small_cb\nepochs: 300\n')
    (tmp_path / 'random.bin').write_bytes(bytes([0x9e, 0x03, 0x51, 0xff, 0x00, 0x7a, 0x10, 0x42]) * 64)
    (tmp_path / 'empty.pth').write_bytes(b'')
    with zipfile.ZipFile(tmp_path / 'photos.zip', 'w') as archive:
        archive.writestr('a.txt', 'x')
        archive.writestr('b/c.txt', 'y')
    (tmp_path / 'plain.pkl').write_bytes(pickle.dumps({'weight': [1.0, 2.0]}, protocol=4))
    return {
        'notes.txt': "it is text: 'model: vit_small_cb'",
        'random.bin': 'unknown binary data starting 9e 03 51 ff 00 7a 10 42',
        'empty.pth': 'it is empty',
        'photos.zip': "a zip archive of a.txt, b/c.txt, without torch.save's <name>/data.pkl",
        'plain.pkl': 'a Python pickle that torch.save did not write',
    }


def test_cli_export_says_a_file_is_not_a_checkpoint(tmp_path, capsys):
    """Text, random bytes, an empty file, a foreign zip, a plain pickle: one line saying what the file is and what
    was expected, never the advice meant for a checkpoint that holds objects."""
    for name, what in _not_a_checkpoint(tmp_path).items():
        code, out, err = _cli(capsys, 'export', '--checkpoint', tmp_path / name, '--out', tmp_path / 'o')
        assert (code, out) == (2, '')
        assert err == f'timm-ext export: error: {tmp_path / name} is not a PyTorch checkpoint ({what}): {_EXPECTED}\n'
    assert not (tmp_path / 'o').exists()


def test_cli_export_checkpoints_that_do_not_load(tmp_path, capsys):
    """A real torch.save file: objects get the advice to re-save it in a trusted session (their classes named, the
    pickle only walked), a truncated pickle is named as such; the legacy (non-zip) format is read too."""
    import tarfile
    import zipfile
    model, ran = _small(), list(_RAN)
    torch.save({'state_dict': model.state_dict(), 'extra': _Payload()}, tmp_path / 'objects.pth')
    code, _, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'objects.pth', '--out', tmp_path / 'o')
    assert code == 2 and err == (f'timm-ext export: error: {tmp_path / "objects.pth"} holds objects that '
                                 f'torch.load(weights_only=True) refuses (test_hub._record): in a session you trust, '
                                 f'load it and save its state_dict() with torch.save\n')
    assert _RAN == ran  # the payload's callable never ran
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'good.pth')
    with zipfile.ZipFile(tmp_path / 'good.pth') as src, zipfile.ZipFile(tmp_path / 'cut_pickle.pth', 'w') as dst:
        for name in src.namelist():  # a whole archive whose data.pkl stops half-way
            data = src.read(name)
            dst.writestr(name, data[:len(data) // 2] if name.endswith('/data.pkl') else data)
    code, _, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'cut_pickle.pth', '--out', tmp_path / 'o')
    assert code == 2 and err == (f'timm-ext export: error: {tmp_path / "cut_pickle.pth"} is not a readable PyTorch '
                                 f'checkpoint (its pickle is truncated or corrupt): copy it again, or save it again '
                                 f'with torch.save\n')
    with tarfile.open(tmp_path / 'old.pth', 'w') as archive:  # torch < 0.4's layout, which torch.load reads
        for name in ('sys_info', 'pickle', 'storages', 'tensors'):  # with weights_only=False only
            archive.addfile(tarfile.TarInfo(name))
    code, _, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'old.pth', '--out', tmp_path / 'o')
    assert code == 2 and err == (f'timm-ext export: error: {tmp_path / "old.pth"} is a torch < 0.4 checkpoint (a tar '
                                 f'archive), which torch.load(weights_only=True) cannot read: in a session you trust, '
                                 f'load it and save its state_dict() with torch.save\n')
    torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_cb'}, tmp_path / 'legacy.pth',
               _use_new_zipfile_serialization=False)
    code, out, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'legacy.pth', '--out', tmp_path / 'o',
                          '--model-kwargs', *[f'{k}={v}' for k, v in SMALL.items()])
    assert code == 0, err
    assert torch.equal(load_checkpoint(tmp_path / 'legacy.pth').state_dict['pos_embed'], model.pos_embed)


def test_load_checkpoint_reads_safetensors_by_content(tmp_path):
    """A safetensors file passed under a .pth name is read as safetensors; a torch.save file named .safetensors
    as a torch checkpoint: the bytes decide, not the name."""
    from safetensors.torch import save_file
    model = _small()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / 'weights.pth')
    assert torch.equal(load_checkpoint(tmp_path / 'weights.pth').state_dict['pos_embed'], model.pos_embed)
    with pytest.raises(HubError, match=r'weights\.pth is a safetensors file, .*drop --ema'):
        load_checkpoint(tmp_path / 'weights.pth', use_ema=True)
    torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_cb'}, tmp_path / 'misnamed.safetensors')
    assert load_checkpoint(tmp_path / 'misnamed.safetensors').arch == 'vit_tiny_cb'


def test_load_checkpoint_safetensors(tmp_path):
    from safetensors.torch import save_file
    model = _small()
    save_file({f'_orig_mod.{k}': v.contiguous() for k, v in model.state_dict().items()}, tmp_path / 'w.safetensors')
    ckpt = load_checkpoint(tmp_path / 'w.safetensors')
    assert set(ckpt.state_dict) == set(model.state_dict()) and ckpt.arch is None
    with pytest.raises(HubError, match=r'w\.safetensors is a safetensors file, .*drop --ema'):
        load_checkpoint(tmp_path / 'w.safetensors', use_ema=True)
    data = (tmp_path / 'w.safetensors').read_bytes()
    (tmp_path / 'cut.safetensors').write_bytes(data[:len(data) - 100])
    with pytest.raises(HubError, match=r'cut\.safetensors is not a readable safetensors file .*truncated or corrupt'):
        load_checkpoint(tmp_path / 'cut.safetensors')


def test_load_weights_names_what_does_not_fit():
    source = _small().state_dict()
    with pytest.raises(HubError, match=r'ckpt\.pth does not fit vit_tiny_cb: head\.weight is \(5, 192\) in the '
                                       r'checkpoint but \(3, 192\) in the model .*num_classes=5'):
        load_weights(_small(num_classes=3), source, 'ckpt.pth')
    with pytest.raises(HubError, match=r'pos_embed is \(1, 17, 192\) .* \(1, 5, 192\) .*--model-kwargs'):
        load_weights(_small(patch_size=16), source, 'ckpt.pth')
    partial = {k: v for k, v in source.items() if k != 'cls_token'}
    with pytest.raises(HubError, match=r'1 model keys missing from it \(first: cls_token\)'):
        load_weights(_small(), partial, 'ckpt.pth')


# --- export ----------------------------------------------------------------------------------------

def test_export_writes_safetensors_config_and_card(tmp_path):
    model = _small()
    out = _export(model, tmp_path / 'out', card=CardInfo(top1=71.25, repo_id='acme/vit-tiny-cb', dataset='cifar100'))
    assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']
    config = json.loads((out / 'config.json').read_text())
    assert config['architecture'] == 'vit_tiny_cb' and config['num_classes'] == 5 and config['num_features'] == 192
    assert config['model_args'] == dict(SMALL)
    cfg = config['pretrained_cfg']
    assert cfg['input_size'] == [3, 32, 32] and cfg['num_classes'] == 5 and cfg['custom_load'] is False
    assert not {'url', 'file', 'hf_hub_id', 'hf_hub_filename', 'source', 'state_dict', 'architecture'} & set(cfg)
    card = (out / 'README.md').read_text()
    front = yaml.safe_load(card.split('---')[1])
    assert front['library_name'] == 'timm' and front['license'] == 'apache-2.0'
    assert {'timm', 'timm-ext', 'context-broadcasting'} <= set(front['tags']) and front['datasets'] == ['cifar100']
    assert '71.25' in card and "timm.create_model('hf-hub:acme/vit-tiny-cb', pretrained=True)" in card
    assert 'import timm_ext' in card and 'arxiv.org/abs/2210.08457' in card and 'hyeonwoo2023scratching' in card
    params = sum(p.numel() for p in model.parameters())  # parameters, not buffers
    assert f'**Parameters (M):** {params / 1e6:.2f}' in card


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_export_files_take_the_umask(tmp_path, umask):
    """model.safetensors gets the mode every other new file gets (safetensors itself writes 0600)."""
    out = _export(_small(), tmp_path / 'out')
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == dict.fromkeys(['README.md', 'config.json', 'model.safetensors'], 0o666 & ~umask)
    assert modes['model.safetensors'] == {0o022: 0o644, 0o027: 0o640}[umask]
    save_safetensors({'w': torch.ones(2)}, tmp_path / 'converted.safetensors')  # `timm-ext convert` writes with it
    assert (tmp_path / 'converted.safetensors').stat().st_mode & 0o777 == 0o666 & ~umask


def test_export_keeps_nothing_of_the_source_weights(tmp_path):
    model = timm.create_model('vit_tiny_patch2_32', depth=1).eval()  # tag hdvw_cifar100: a url, notes, origin
    out = export(model, tmp_path / 'out', model_args=dict(depth=1), card=CardInfo(license='cc-by-4.0'))
    cfg = json.loads((out / 'config.json').read_text())['pretrained_cfg']
    assert not {'url', 'tag', 'notes', 'origin_url'} & set(cfg) and cfg['license'] == 'cc-by-4.0'
    assert cfg['num_classes'] == 100 and cfg['mean'] == [0.5071, 0.4867, 0.4408]  # the preprocessing stays
    assert 'license: cc-by-4.0' in (out / 'README.md').read_text()


def test_export_card_from_a_recipe(tmp_path, monkeypatch):
    import timm_ext.recipes as recipes
    import timm_ext.recipes.lookup as lookup
    root = tmp_path / 'recipes'
    (root / 'context-broadcasting' / 'imagenet').mkdir(parents=True)
    (root / 'context-broadcasting' / 'imagenet' / 'vit_ti_cb.yaml').write_text(
        '# ViT-Ti + CB, Table 5 of the paper\n#   timm-ext train -c context-broadcasting/imagenet/vit_ti_cb\n'
        'device_modules: [timm_ext]\nmodel: vit_tiny_cb\n')
    (root / 'index.csv').write_text('recipe,paper,dataset,table,row,model,global_batch,expected_top1\n'
                                    'context-broadcasting/imagenet/vit_ti_cb.yaml,context-broadcasting,imagenet,'
                                    'Table 5,ViT-Ti + CB,vit_tiny_cb,1024,73.3\n')
    monkeypatch.setattr(recipes, 'recipes_dir', lambda: root)  # the card reads index.csv there
    monkeypatch.setattr(lookup, 'recipes_dir', lambda: root)  # find_recipe looks there
    out = _export(_small(), tmp_path / 'out', card=CardInfo(recipe='context-broadcasting/imagenet/vit_ti_cb'))
    card = (out / 'README.md').read_text()
    assert '`context-broadcasting/imagenet/vit_ti_cb` (Table 5, ViT-Ti + CB)' in card
    assert "Paper's top-1 for this row (%):** 73.3" in card and 'not measured' in card
    assert 'timm-ext train -c context-broadcasting/imagenet/vit_ti_cb --data-dir' in card
    assert 'ViT-Ti + CB, Table 5 of the paper' in card and '- imagenet-1k' in card
    with pytest.raises(HubError, match=r"unknown recipe 'nope'"):
        _export(_small(), tmp_path / 'other', card=CardInfo(recipe='nope'))
    with pytest.raises(HubError, match=r'top1=101.0 must be a percentage'):
        _export(_small(), tmp_path / 'other', card=CardInfo(top1=101.0))


def test_export_refuses_a_non_empty_folder_and_keeps_other_files(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'notes.txt').write_text('mine')
    with pytest.raises(HubError, match=r'out is not empty \(notes\.txt\): .*--force'):
        _export(_small(), out)
    assert sorted(p.name for p in out.iterdir()) == ['notes.txt']
    _export(_small(), out, overwrite=True)
    first = (out / 'model.safetensors').read_bytes()
    _export(_small(num_classes=7), out, overwrite=True)  # replaces the three files only
    assert (out / 'notes.txt').read_text() == 'mine' and (out / 'model.safetensors').read_bytes() != first
    assert json.loads((out / 'config.json').read_text())['num_classes'] == 7
    (out / 'last.pth.tar').write_bytes(b'x')
    with pytest.raises(HubError, match=r'other weight files \(last\.pth\.tar\) that timm could load instead'):
        _export(_small(), out, overwrite=True)
    assert (out / 'last.pth.tar').read_bytes() == b'x'


def test_export_refuses_model_args_that_do_not_rebuild_the_model(tmp_path):
    # timm < 1.0.31 records no model_args: a 32 px model exported without them would come back at 224
    with pytest.raises(HubError, match=r'model\.safetensors: pos_embed is \(1, 17, 192\) in the file but '
                                       r'\(1, 197, 192\) in vit_tiny_cb.*model_args='):
        export(_small(), tmp_path / 'out', model_args={'num_classes': 5})
    assert list((tmp_path / 'out').iterdir()) == []  # nothing half-written is left
    with pytest.raises(HubError, match=r"model_args\['act_layer'\] = .* cannot be written to config\.json"):
        export(_small(), tmp_path / 'out', model_args=dict(SMALL, act_layer=torch.nn.GELU))
    with pytest.raises(HubError, match=r'model_args num_classes=9 disagrees with the model \(num_classes=5\)'):
        hub_config(_small(), model_args=dict(SMALL, num_classes=9))


# --- loading back: every family, hf-hub: from a local cache and local-dir:, identical outputs ---------------

@pytest.mark.parametrize('name', list(FAMILIES))
def test_roundtrip_every_family(name, tmp_path, offline):
    model = _small(name)
    out = _export(model, tmp_path / 'export')
    config = json.loads((out / 'config.json').read_text())
    assert config['model_args'] == json.loads(json.dumps(FAMILIES[name]))  # recorded by timm >= 1.0.31
    size = config['pretrained_cfg']['input_size']
    expected = _outputs(model, size)
    _publish(tmp_path / 'hub', out, f'acme/{name}')
    from_hub = timm.create_model(f'hf-hub:acme/{name}', pretrained=True, cache_dir=tmp_path / 'hub').eval()
    from_dir = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    assert torch.equal(_outputs(from_hub, size), expected) and torch.equal(_outputs(from_dir, size), expected)
    assert tuple(from_hub.pretrained_cfg['input_size']) == tuple(size)


def test_roundtrip_pinned_revision_and_load_model(tmp_path, offline):
    model = _small()
    _publish(tmp_path / 'hub', _export(model, tmp_path / 'export'), 'acme/cb')
    pinned = load_model(f'hf-hub:acme/cb@{SHA}', cache_dir=tmp_path / 'hub').eval()
    assert torch.equal(_outputs(pinned, (3, 32, 32)), _outputs(model, (3, 32, 32)))


@pytest.mark.slow
def test_hub_checkpoint_needs_import_timm_ext(tmp_path):
    out = _export(_small(), tmp_path / 'export')
    load = f'timm.create_model("local-dir:{out}", pretrained=True)'
    code = f'import timm\ntry:\n    {load}\nexcept RuntimeError as e:\n    print(e)\n' \
           f'import timm_ext\nprint({load}.num_classes)'
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HF_HUB_OFFLINE='1'))
    assert proc.stdout.split('\n')[:2] == ['Unknown model (vit_tiny_cb)', '5'], proc.stderr[-2000:]


# --- loading errors: one line, the file and the fix -----------------------------------------------------

def test_load_model_offline_with_nothing_cached(tmp_path, offline):
    with pytest.raises(HubError, match=r'hf-hub:acme/absent: config\.json is not in the Hugging Face cache '
                                       r'\(.*hub\) and the hub is not reachable \(HF_HUB_OFFLINE=1\): .*'
                                       r'hf download acme/absent'):
        load_model('hf-hub:acme/absent', cache_dir=tmp_path / 'hub')
    with pytest.raises(HubError, match=r'nowhere/config\.json does not exist: export the folder'):
        load_model(f'local-dir:{tmp_path / "nowhere"}')


def test_load_model_corrupt_weights(tmp_path, offline):
    out = _export(_small(), tmp_path / 'export')
    data = (out / 'model.safetensors').read_bytes()
    (out / 'model.safetensors').write_bytes(data[:len(data) // 2])
    with pytest.raises(HubError, match=r'export/model\.safetensors is not a readable safetensors file .*delete it'):
        load_model(f'local-dir:{out}')
    _publish(tmp_path / 'hub', out, 'acme/cut')
    cached = tmp_path / 'hub' / 'models--acme--cut' / 'snapshots' / SHA / 'model.safetensors'
    with pytest.raises(HubError, match=rf'{cached} is not a readable safetensors file'):
        load_model('hf-hub:acme/cut', cache_dir=tmp_path / 'hub')
    with pytest.raises(HubError, match=r'model\.safetensors is not a readable safetensors file .*truncated'):
        check_folder(out)


def test_timms_own_route_gives_the_same_line_for_corrupt_weights(tmp_path, offline):
    """``timm.create_model('local-dir:...')`` / ``('hf-hub:...')``, as docs/hub.md shows it: load_model's line."""
    out = _export(_small(), tmp_path / 'export')
    data = (out / 'model.safetensors').read_bytes()
    (out / 'model.safetensors').write_bytes(data[:len(data) // 2])
    with pytest.raises(HubError, match=r'export/model\.safetensors is not a readable safetensors file .*delete it'):
        timm.create_model(f'local-dir:{out}', pretrained=True)
    _publish(tmp_path / 'hub', out, 'acme/cut')
    cached = tmp_path / 'hub' / 'models--acme--cut' / 'snapshots' / SHA / 'model.safetensors'
    with pytest.raises(HubError, match=rf'{cached} is not a readable safetensors file'):
        timm.create_model('hf-hub:acme/cut', pretrained=True, cache_dir=tmp_path / 'hub')


def test_load_model_unknown_architecture(tmp_path, offline):
    out = _export(_small(), tmp_path / 'export')
    config = json.loads((out / 'config.json').read_text())
    (out / 'config.json').write_text(json.dumps(dict(config, architecture='vit_tiny_cbx')))
    with pytest.raises(HubError, match=r"export/config\.json names architecture 'vit_tiny_cbx', which is not "
                                       r"registered with timm: `import timm_ext` before timm\.create_model"):
        load_model(f'local-dir:{out}')
    with pytest.raises(HubError, match=r"config\.json names architecture 'vit_tiny_cbx'.*import timm_ext"):
        check_folder(out)


def test_load_model_pretrained_cfg_key_this_timm_does_not_know(tmp_path, offline):
    """A key of a newer timm's PretrainedCfg (timm raises TypeError) is named with the fix."""
    config = _export(_small(), tmp_path / 'export') / 'config.json'
    saved = json.loads(config.read_text())
    config.write_text(json.dumps(dict(saved, pretrained_cfg=dict(saved['pretrained_cfg'], from_the_future=1))))
    with pytest.raises(HubError, match=rf"export/config\.json: its pretrained_cfg has a key timm {timm.__version__} "
                                       r"does not know \(.*from_the_future.*\); export the folder again"):
        load_model(f'local-dir:{config.parent}')


def test_load_model_shapes_that_do_not_fit(tmp_path, offline):
    out = _export(_small('mixer_s16_cb'), tmp_path / 'export')
    config = json.loads((out / 'config.json').read_text())
    config['model_args']['embed_dim'] = 16
    (out / 'config.json').write_text(json.dumps(config))
    with pytest.raises(HubError, match=r'export/model\.safetensors does not fit the model built from .*'
                                       r'config\.json: size mismatch for stem\.proj\.weight.* model_args in '
                                       r'config\.json must be the arguments the weights were trained with'):
        load_model(f'local-dir:{out}')
    with pytest.raises(HubError, match=r'stem\.proj\.weight is \(32, 3, 8, 8\) in the file but \(16, 3, 8, 8\)'):
        check_folder(out)
    config['model_args'].update(embed_dim=32, num_blocks=1)
    (out / 'config.json').write_text(json.dumps(config))
    with pytest.raises(HubError, match=r'does not fit the model built from .*Unexpected key\(s\) in state_dict: '
                                       r'"blocks\.1\.'):
        load_model(f'local-dir:{out}')
    out = _export(_small(), tmp_path / 'vit')  # a timm-ext checkpoint filter's own refusal gets the file's name
    config = json.loads((out / 'config.json').read_text())
    config['model_args']['embed_dim'] = 96
    (out / 'config.json').write_text(json.dumps(config))
    with pytest.raises(HubError, match=r'vit/model\.safetensors could not be loaded with .*config\.json: The '
                                       r'checkpoint stem .* does not fit'):
        load_model(f'local-dir:{out}')


# --- push (a fake HfApi: never the network) ------------------------------------------------------------

class _FakeApi:
    calls = []
    fail = None

    def __init__(self, token=None):
        self.calls.append(('init', token))

    def create_repo(self, **kwargs):
        self.calls.append(('create_repo', kwargs))
        if self.fail:
            raise self.fail
        return f'https://huggingface.co/{kwargs["repo_id"]}'

    def create_branch(self, **kwargs):
        self.calls.append(('create_branch', kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(('upload_folder', dict(kwargs, files=sorted(os.listdir(kwargs['folder_path'])))))
        return argparse.Namespace(oid='d' * 40, commit_url=f'https://huggingface.co/{kwargs["repo_id"]}/commit/dd')


@pytest.fixture
def fake_api(monkeypatch):
    _FakeApi.calls, _FakeApi.fail = [], None
    monkeypatch.setattr(huggingface_hub, 'HfApi', _FakeApi)
    return _FakeApi


def test_push_uploads_a_checked_folder(tmp_path, fake_api):
    out = _export(_small(), tmp_path / 'export')
    result = push(out, 'acme/vit-tiny-cb', private=True, revision='v1')
    assert [c[0] for c in fake_api.calls] == ['init', 'create_repo', 'create_branch', 'upload_folder']
    assert fake_api.calls[1][1] == dict(repo_id='acme/vit-tiny-cb', repo_type='model', private=True, exist_ok=True)
    assert fake_api.calls[2][1] == dict(repo_id='acme/vit-tiny-cb', branch='v1', repo_type='model', exist_ok=True)
    upload = fake_api.calls[3][1]
    assert upload['folder_path'] == str(out) and upload['revision'] == 'v1'
    assert upload['files'] == ['README.md', 'config.json', 'model.safetensors']
    assert result.pinned_id == 'acme/vit-tiny-cb@' + 'd' * 40


def test_push_refuses_before_any_upload(tmp_path, fake_api):
    out = _export(_small(), tmp_path / 'export')
    with pytest.raises(HubError, match=r"repo id 'acme' must be ORG/NAME"):
        push(out, 'acme')
    with pytest.raises(HubError, match=r'must be a branch name, not a commit'):
        push(out, 'acme/x', revision='e' * 40)
    torch.save({}, out / 'pytorch_model.bin')
    with pytest.raises(HubError, match=r'holds weight files besides model\.safetensors \(pytorch_model\.bin\)'):
        push(out, 'acme/x')
    assert fake_api.calls == []
    (out / 'pytorch_model.bin').unlink()
    fake_api.fail = ConnectionError('Max retries exceeded\nwith url: /api/repos/create')
    with pytest.raises(HubError, match=r'^pushing .*export to acme/x failed: ConnectionError: Max retries exceeded$'):
        push(out, 'acme/x')


# --- the command line -------------------------------------------------------------------------------

_cli = run_cli


def test_cli_export_from_a_train_py_checkpoint(tmp_path, capsys, offline):
    model = _small()
    _train_py_checkpoint(tmp_path / 'model_best.pth.tar', model, ema_shift=0.5, model='vit_tiny_cb', num_classes=5,
                         gp='token', model_kwargs={'img_size': 32, 'patch_size': 8, 'depth': 2},
                         mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), epochs=300, opt='samadamw', drop_path=0.1)
    code, out, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'model_best.pth.tar', '--out', tmp_path / 'hub',
                          '--ema', '--top1', '72.5', '--repo-id', 'acme/cb')
    assert code == 0, err
    assert 'wrote' in out and 'EMA weights of model_best.pth.tar' in out and 'timm-ext push' in out
    config = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert config['model_args'] == dict(SMALL, global_pool='token') and config['pretrained_cfg']['mean'] == [0.5] * 3
    loaded = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True).eval()
    ema_model = _small()
    ema_model.load_state_dict({k: v + 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()})
    assert torch.equal(_outputs(loaded, (3, 32, 32)), _outputs(ema_model, (3, 32, 32)))
    card = (tmp_path / 'hub' / 'README.md').read_text()
    assert '72.50' in card and 'EMA weights (train.py --model-ema) after epoch 7' in card
    assert '| `opt` | `samadamw` |' in card and '| `epochs` | `300` |' in card


def test_cli_export_errors_are_one_line(tmp_path, capsys):
    model = _small()
    torch.save(model.state_dict(), tmp_path / 'plain.pth')
    code, _, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'plain.pth', '--out', tmp_path / 'o')
    assert code == 2 and err == f'timm-ext export: error: {tmp_path / "plain.pth"} records no architecture: ' \
                                'pass --model NAME\n'
    code, _, err = _cli(capsys, 'export', '--checkpoint', tmp_path / 'plain.pth', '--out', tmp_path / 'o',
                        '--model', 'vit_tiny_cb', '--model-kwargs', 'img_size=32', 'patch_size=8', 'depth=2')
    assert code == 2 and err.count('\n') == 1
    assert 'head.weight is (5, 192) in the checkpoint but (1000, 192) in the model' in err and 'num_classes=5' in err
    assert not (tmp_path / 'o').exists()


def test_cli_push_with_a_fake_api(tmp_path, capsys, fake_api):
    out = _export(_small(), tmp_path / 'export')
    code, stdout, err = _cli(capsys, 'push', out, '--repo-id', 'acme/cb')
    assert code == 0, err
    assert f'pin it in a pretrained tag: hf_hub_id="acme/cb@{"d" * 40}"' in stdout
    assert fake_api.calls[1][1]['private'] is False and fake_api.calls[-1][1]['revision'] is None
    code, _, err = _cli(capsys, 'push', tmp_path / 'nothing', '--repo-id', 'acme/cb')
    assert code == 2 and err == f'timm-ext push: error: {tmp_path / "nothing"} is not a folder: export one first ' \
                                'with `timm-ext export`\n'


# --- timm 1.0.28 (a throwaway virtualenv): export there, load there, and load what 1.0.31 wrote ----------------

_OLD_TIMM_SCRIPT = textwrap.dedent('''
    import json, os, shutil, sys
    from pathlib import Path
    import timm, torch
    import timm_ext
    from timm_ext.hub import HubError, export
    families, root, sha = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    cache = Path(os.environ['HF_HUB_CACHE'])
    result = {'timm': timm.__version__}
    def outputs(model, size):
        x = torch.randn(2, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            return model.eval()(x)
    for name, kwargs in families.items():
        torch.manual_seed(0)
        model = timm.create_model(name, **kwargs).eval()
        out = export(model, root / 'old' / name, model_args=kwargs)
        repo = cache / f'models--old--{name}'
        shutil.copytree(out, repo / 'snapshots' / sha)
        (repo / 'refs').mkdir()
        (repo / 'refs' / 'main').write_text(sha)
        size = json.loads((out / 'config.json').read_text())['pretrained_cfg']['input_size']
        y = outputs(model, size)
        hub = timm.create_model(f'hf-hub:old/{name}', pretrained=True)  # HF_HUB_CACHE from the environment
        local = timm.create_model(f'local-dir:{out}', pretrained=True)
        new = timm.create_model(f'local-dir:{root / "new" / name}', pretrained=True)  # written under timm 1.0.31
        result[name] = [torch.equal(outputs(hub, size), y), torch.equal(outputs(local, size), y),
                        torch.equal(outputs(new, size), torch.load(root / 'new' / f'{name}.pt'))]
    try:
        export(timm.create_model('vit_tiny_cb', img_size=32, num_classes=5), root / 'no_args')
    except HubError as e:
        result['no_model_args'] = str(e)
    print(json.dumps(result))
''')


@pytest.mark.slow
def test_roundtrip_every_family_under_timm_1_0_28(tmp_path):
    from timm_ext.layers.small_map_conv import AUTOTUNE_ENV, small_map_autotune

    python = venv_python('1.0.28')
    # outputs are compared bit for bit across two processes: AlterNet's convs must take the same route in both,
    # not the one each process times fastest (SmallMapConv2d autotune), so both use the fixed rule
    with small_map_autotune(False):
        for name in FAMILIES:  # exported by the installed timm, loaded under 1.0.28
            model = _small(name)
            out = _export(model, tmp_path / 'new' / name)
            size = json.loads((out / 'config.json').read_text())['pretrained_cfg']['input_size']
            torch.save(_outputs(model, size), tmp_path / 'new' / f'{name}.pt')
    # the child computes on this process's thread count: its outputs are compared bit for bit with ours, and float
    # sums split over another number of threads may add in another order (tests/_threads.py)
    env = dict(os.environ, HF_HUB_OFFLINE='1', HF_HUB_CACHE=str(tmp_path / 'hub'), OMP_NUM_THREADS=same_threads(),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]), **{AUTOTUNE_ENV: '0'})
    (tmp_path / 'hub').mkdir()
    proc = subprocess.run([str(python), '-c', _OLD_TIMM_SCRIPT, json.dumps(FAMILIES), str(tmp_path), SHA], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.pop('timm') == '1.0.28'
    assert 'pos_embed is (1, 5, 192) in the file but (1, 197, 192)' in result.pop('no_model_args')
    assert result == {name: [True, True, True] for name in FAMILIES}


# --- public weights the recipes start from ---------------------------------------------------------------------

@pytest.mark.timm_models_only
@pytest.mark.parametrize('tag', ['vit_base_patch16_224.sam_in1k', 'vit_base_patch32_224.sam_in1k'])
def test_vit_sam_weights_are_timm_tags(tag):
    """The ViT-SAM fine-tuning recipes name these timm tags as their model (docs/hub.md)."""
    from timm.models import get_pretrained_cfg

    assert tag in timm.list_pretrained('*sam_in1k')
    cfg = get_pretrained_cfg(tag)
    assert cfg.hf_hub_id == f'timm/{tag}' and cfg.num_classes == 1000 and cfg.mean == cfg.std == (0.5, 0.5, 0.5)
    model = timm.create_model(tag, num_classes=100, device='meta')  # a fine-tuning head
    assert model.pretrained_cfg['tag'] == 'sam_in1k' and model.num_classes == 100


def test_vit_sam_tag_in_a_recipe_is_accepted_by_train_py():
    from timm_ext.launch.timm_scripts import ScriptError, load_script_parser
    from timm_ext.recipes import check_recipe

    if not TRAIN_PY.is_file():
        pytest.skip(f'timm train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')
    try:
        parser = load_script_parser(TRAIN_PY)
    except ScriptError as e:
        pytest.skip(str(e))
    recipe = {'device_modules': ['timm_ext'], 'model': 'vit_base_patch16_224.sam_in1k', 'pretrained': True,
              'num_classes': 100}
    assert check_recipe(recipe, parser) == []
    parser.set_defaults(**recipe)
    args = parser.parse_args([])
    assert (args.model, args.pretrained, args.num_classes) == ('vit_base_patch16_224.sam_in1k', True, 100)


@pytest.mark.slow
def test_export_a_real_train_py_checkpoint(tmp_path, capsys):
    """timm's own train.py (v1.0.28) trains a tiny CB ViT with EMA; `timm-ext export` needs no --model: the
    architecture and its arguments come from the checkpoint; the folder loads back with the EMA weights."""
    import numpy as np
    from PIL import Image

    if not TRAIN_PY.is_file():
        pytest.skip(f'timm train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')
    rng = np.random.default_rng(0)
    for cls in range(2):
        folder = tmp_path / 'data' / 'train' / f'c{cls}'
        folder.mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f'{i}.png')
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='2',
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))
    cmd = [sys.executable, str(TRAIN_PY), '--data-dir', str(tmp_path / 'data'), '--model', 'vit_tiny_cb',
           '--model-kwargs', 'img_size=32', 'patch_size=8', 'depth=2', '--num-classes', '2', '--img-size', '32',
           '--mean', '0.5', '0.5', '0.5', '--std', '0.25', '0.25', '0.25', '--device-modules', 'timm_ext',
           '--device', 'cpu', '--epochs', '1', '--batch-size', '4', '--workers', '1', '--warmup-epochs', '0',
           '--model-ema', '--model-ema-decay', '0.5', '--output', str(tmp_path / 'out'), '--experiment', 'run']
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    checkpoint = tmp_path / 'out' / 'run' / 'last.pth.tar'
    code, out, err = _cli(capsys, 'export', '--checkpoint', checkpoint, '--out', tmp_path / 'hub', '--ema')
    assert code == 0, err
    config = json.loads((tmp_path / 'hub' / 'config.json').read_text())
    assert config['architecture'] == 'vit_tiny_cb' and config['num_classes'] == 2
    assert config['model_args'] == dict(num_classes=2, img_size=32, patch_size=8, depth=2)
    assert config['pretrained_cfg']['mean'] == [0.5] * 3 and config['pretrained_cfg']['std'] == [0.25] * 3
    loaded = timm.create_model(f'local-dir:{tmp_path / "hub"}', pretrained=True).eval()
    ema = _small(num_classes=2)
    ema.load_state_dict(load_checkpoint(checkpoint, use_ema=True).state_dict)
    plain = load_checkpoint(checkpoint).state_dict
    assert not torch.equal(plain['head.weight'], ema.head.weight)  # EMA (decay 0.5) differs from the model
    assert torch.equal(_outputs(loaded, (3, 32, 32)), _outputs(ema, (3, 32, 32)))
