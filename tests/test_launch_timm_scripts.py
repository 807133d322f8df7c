"""timm_ext.launch.timm_scripts: where timm's train.py / validate.py come from, which files are accepted, and
how a command line is read as the script reads it.

Most tests run against a table of synthetic scripts (their sha256 computed here with hashlib), so
they do not depend on timm's real files; the shipped table is checked against the real scripts of
../shared/timm-train when they are there (or at $TIMM_EXT_TIMM_TRAIN), and so is the caching of the script
beside a given one, through ``timm-ext`` too. The network is never used: ``fetch_url`` is replaced.
"""
import hashlib
import os
import shlex
import stat
import sys
import urllib.error
from pathlib import Path

import pytest
from _cli import run_cli, train_py_argv
from _timm_train import SCRIPTS_DIR
from conftest import require_timm_script
from PIL import Image

from timm_ext.launch import release_table as table_module
from timm_ext.launch import timm_scripts
from timm_ext.launch.release_table import release_table
from timm_ext.launch.timm_scripts import SCRIPT_URL, ScriptError, find_script, load_script_parser, script_args

SHARED = Path(__file__).resolve().parents[2] / 'shared' / 'timm-train'
# synthetic scripts: (tag, train.py text, validate.py text, has task API)
FAKE = [
    ('v1.0.22', 'print("train 22")\n', 'print("validate 22")\n', False),
    ('v1.0.27', 'print("train 27/28")\n', 'print("validate 27")\n', True),
    ('v1.0.28', 'print("train 27/28")\n', 'print("validate 28")\n', True),
]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(autouse=True)
def _offline_cache(offline_scripts):
    """Every test here runs with a private cache and no network."""


@pytest.fixture
def fake_table(tmp_path, monkeypatch):
    """The table replaced by FAKE; returns a function that writes a tag's script into a folder."""
    table = tmp_path / 'table.tsv'
    rows = ['tag\ttrain.py_sha256\tvalidate.py_sha256\thas_task_api\thas_device_modules']
    rows += [f'{tag}\t{_sha(t)}\t{_sha(v)}\t{"yes" if api else "no"}\tyes' for tag, t, v, api in FAKE]
    table.write_text('\n'.join(rows) + '\n')
    monkeypatch.setattr(table_module, 'TABLE_PATH', table)
    release_table.cache_clear()
    yield _write_release
    release_table.cache_clear()


def _write_release(folder: Path, tag: str) -> Path:
    train, validate = next((t, v) for name, t, v, _ in FAKE if name == tag)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'train.py').write_text(train)
    (folder / 'validate.py').write_text(validate)
    return folder / 'train.py'


# --- the shipped table ---------------------------------------------------------------------------

def test_shipped_table_rows():
    table = release_table()
    versions = [tuple(int(p) for p in tag[1:].split('.')) for tag in table]
    assert versions == sorted(versions) and versions[0] == (1, 0, 15)
    for tag, row in table.items():
        assert len(row.train_sha256) == 64 and len(row.validate_sha256) == 64
        int(row.train_sha256, 16), int(row.validate_sha256, 16)
        # timm's task API (timm.task) arrived in 1.0.23; --device-modules exists in every listed release
        assert row.has_task_api == (tuple(int(p) for p in tag[1:].split('.')) >= (1, 0, 23)), tag
        assert row.has_device_modules


@pytest.mark.parametrize('tag', ['v1.0.22', 'v1.0.28'])
def test_shipped_table_matches_real_scripts(tag):
    folder = SHARED / tag
    if not folder.is_dir():
        pytest.skip(f'timm\'s scripts of {tag} not found at {folder} (the shared folder is not beside the repo)')
    row = release_table()[tag]
    assert hashlib.sha256((folder / 'train.py').read_bytes()).hexdigest() == row.train_sha256
    assert hashlib.sha256((folder / 'validate.py').read_bytes()).hexdigest() == row.validate_sha256


# --- explicit path and $TIMM_EXT_TIMM_TRAIN -------------------------------------------------------

def test_explicit_file_of_the_installed_release(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('train.py', path=path, timm_version='1.0.28', remember=False)
    assert (script.path, script.tag, script.source, script.notes) == (path, 'v1.0.28', '--timm-train', ())
    assert script.sha256 == _sha(FAKE[2][1]) and not script.patched
    assert not (tmp_path / 'cache').exists()  # remember=False writes nothing


def test_explicit_folder_gives_the_named_script(tmp_path, fake_table):
    fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('validate.py', path=tmp_path / 'timm', timm_version='1.0.28')
    assert script.path == tmp_path / 'timm' / 'validate.py' and script.tag == 'v1.0.28'


def test_older_release_runs_on_newer_timm_with_a_note(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('train.py', path=path, timm_version='1.0.31', remember=False)
    assert script.tag == 'v1.0.28'  # the newest of v1.0.27/v1.0.28, which share train.py
    assert script.notes == ("using train.py of v1.0.28 with timm 1.0.31 (a release's script runs on later timm "
                            "releases)",)


def test_script_newer_than_timm_is_refused_naming_its_tag(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    with pytest.raises(ScriptError, match=r'this is validate.py of v1.0.28, but timm 1.0.27 is installed'):
        find_script('validate.py', path=path.parent, timm_version='1.0.27')
    script = find_script('validate.py', path=path.parent, timm_version='1.0.27', allow_unverified=True)
    assert script.tag == 'v1.0.28' and 'but timm 1.0.27 is installed' in script.notes[0]


def test_unknown_file_is_refused_unless_allowed(tmp_path, fake_table):
    path = tmp_path / 'train.py'
    path.write_text('print("edited")\n')
    with pytest.raises(ScriptError) as info:
        find_script('train.py', path=path, timm_version='1.0.28')
    message = str(info.value)
    assert str(path) in message and _sha('print("edited")\n')[:16] in message
    assert 'v1.0.22..v1.0.28' in message and '--allow-unverified' in message and '\n' not in message
    script = find_script('train.py', path=path, timm_version='1.0.28', allow_unverified=True)
    assert script.tag is None and script.path == path and 'unverified' in script.notes[0]


def test_validate_py_given_as_train_py_is_named(tmp_path, fake_table):
    fake_table(tmp_path / 'timm', 'v1.0.28')
    with pytest.raises(ScriptError, match=r'this is validate.py of v1.0.28, not train.py'):
        find_script('train.py', path=tmp_path / 'timm' / 'validate.py', timm_version='1.0.28')


def test_missing_explicit_file(tmp_path, fake_table):
    with pytest.raises(ScriptError, match=r'^--timm-validate \S+/nowhere: no such file$'):
        find_script('validate.py', path=tmp_path / 'nowhere', timm_version='1.0.28')


def test_env_file_or_folder(tmp_path, fake_table, monkeypatch):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    for value in (path, path.parent):
        monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(value))
        train = find_script('train.py', timm_version='1.0.28')
        validate = find_script('validate.py', timm_version='1.0.28')  # validate.py beside train.py
        assert (train.path, train.source) == (path, 'TIMM_EXT_TIMM_TRAIN')
        assert validate.path == path.parent / 'validate.py' and validate.tag == 'v1.0.28'
    # the explicit path comes first
    other = fake_table(tmp_path / 'other', 'v1.0.27')
    assert find_script('train.py', path=other, timm_version='1.0.28').path == other


def test_env_pointing_nowhere(tmp_path, fake_table, monkeypatch):
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(tmp_path / 'missing' / 'train.py'))
    with pytest.raises(ScriptError, match=r'^TIMM_EXT_TIMM_TRAIN .*missing.*train.py: no such file$'):
        find_script('train.py', timm_version='1.0.28')


# --- cache and download --------------------------------------------------------------------------

def test_download_is_verified_cached_and_reused(tmp_path, fake_table, monkeypatch):
    urls = []

    def fetch(url, timeout=30.0):
        urls.append(url)
        return FAKE[2][2].encode()  # validate.py of v1.0.28

    monkeypatch.setattr(timm_scripts, 'fetch_url', fetch)
    script = find_script('validate.py', timm_version='1.0.28')
    cached = tmp_path / 'cache' / 'timm-train' / 'v1.0.28' / 'validate.py'
    assert urls == [SCRIPT_URL.format(tag='v1.0.28', name='validate.py')]
    assert urls[0] == 'https://raw.githubusercontent.com/huggingface/pytorch-image-models/v1.0.28/validate.py'
    assert (script.path, script.source, script.tag) == (cached, 'download', 'v1.0.28')
    assert cached.read_text() == FAKE[2][2]
    again = find_script('validate.py', timm_version='1.0.28')  # from the cache: one download in all
    assert (again.path, again.source, len(urls)) == (cached, 'cache', 1)


@pytest.mark.parametrize('mask', [0o022, 0o027])
def test_downloaded_script_takes_the_umask(tmp_path, fake_table, monkeypatch, mask):
    """The cached download gets a new file's mode, not the 0600 of the temporary file it was written to."""
    monkeypatch.setattr(timm_scripts, 'fetch_url', lambda url, timeout=30.0: FAKE[2][2].encode())
    old = os.umask(mask)
    try:
        script = find_script('validate.py', timm_version='1.0.28')
    finally:
        os.umask(old)
    assert stat.S_IMODE(script.path.stat().st_mode) == 0o666 & ~mask


def test_download_with_wrong_digest_is_not_saved(tmp_path, fake_table, monkeypatch):
    monkeypatch.setattr(timm_scripts, 'fetch_url', lambda url, timeout=30.0: b'print("tampered")\n')
    with pytest.raises(ScriptError, match=r'downloaded from https://\S+/v1.0.28/train.py has sha256 .* not saved'):
        find_script('train.py', timm_version='1.0.28')
    assert not list((tmp_path / 'cache').rglob('*.py'))


def test_offline_error_names_the_url_and_the_three_other_ways(tmp_path, fake_table, monkeypatch):
    def offline(url, timeout=30.0):
        raise urllib.error.URLError(OSError(-3, 'Temporary failure in name resolution'))

    monkeypatch.setattr(timm_scripts, 'fetch_url', offline)
    with pytest.raises(ScriptError) as info:
        find_script('train.py', timm_version='1.0.28')
    message = str(info.value)
    assert '\n' not in message
    assert 'https://raw.githubusercontent.com/huggingface/pytorch-image-models/v1.0.28/train.py' in message
    assert 'Temporary failure in name resolution' in message
    for way in ('--timm-train PATH', 'TIMM_EXT_TIMM_TRAIN=PATH',
                str(tmp_path / 'cache' / 'timm-train' / 'v1.0.28' / 'train.py')):
        assert way in message


def test_cached_file_is_verified_too(tmp_path, fake_table):
    cached = tmp_path / 'cache' / 'timm-train' / 'v1.0.28' / 'train.py'
    cached.parent.mkdir(parents=True)
    cached.write_text('print("edited in the cache")\n')
    with pytest.raises(ScriptError, match=r'^cache .*v1.0.28/train.py: its sha256'):
        find_script('train.py', timm_version='1.0.28')


def test_timm_newer_than_the_table_takes_the_newest_verified_release(tmp_path, fake_table, monkeypatch):
    urls = []
    monkeypatch.setattr(timm_scripts, 'fetch_url', lambda url, timeout=30.0: urls.append(url) or FAKE[2][1].encode())
    script = find_script('train.py', timm_version='1.0.31')
    assert urls == [SCRIPT_URL.format(tag='v1.0.28', name='train.py')] and script.tag == 'v1.0.28'
    assert 'no sha256 for timm 1.0.31' in script.notes[0]
    # with --allow-unverified the installed release's own script is fetched, and said to be unverified
    monkeypatch.setattr(timm_scripts, 'fetch_url', lambda url, timeout=30.0: urls.append(url) or b'print("31")\n')
    script = find_script('train.py', timm_version='1.0.31', allow_unverified=True)
    assert urls[-1] == SCRIPT_URL.format(tag='v1.0.31', name='train.py') and script.tag is None
    assert script.path == tmp_path / 'cache' / 'timm-train' / 'v1.0.31' / 'train.py'


def test_timm_older_than_the_table(fake_table):
    with pytest.raises(ScriptError, match=r'timm 1.0.14 is older than every timm release .*v1.0.22..v1.0.28'):
        find_script('train.py', timm_version='1.0.14')


# --- a file given once is remembered in the cache ------------------------------------------------

def _cached(tmp_path, tag, name='train.py'):
    return tmp_path / 'cache' / 'timm-train' / tag / name


def test_given_file_is_cached_once_and_found_without_the_flag(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('train.py', path=path, timm_version='1.0.31')
    target = _cached(tmp_path, 'v1.0.28')
    assert (script.path, script.source, script.tag) == (path, '--timm-train', 'v1.0.28')  # runs the given file
    assert script.notes[1:] == (
        f'cached train.py of v1.0.28 as {target}: later commands find it there without --timm-train',
        f'cached validate.py of v1.0.28 (beside the given train.py) as {target.with_name("validate.py")}: later '
        f'commands find it there without --timm-validate')
    assert target.read_text() == FAKE[2][1] and not list(target.parent.glob('.*'))  # no temporary file left
    assert target.stat().st_mode == path.stat().st_mode
    # the next command, without the flag and without network (fetch_url fails the test), takes the cached copy
    again = find_script('train.py', timm_version='1.0.31')
    assert (again.path, again.source, again.tag) == (target, 'cache', 'v1.0.28')
    assert not any('cached' in note for note in again.notes)
    # giving the same file again: already there, nothing written, nothing said
    mtime = target.stat().st_mtime_ns
    third = find_script('train.py', path=path, timm_version='1.0.31')
    assert not any('cache' in note for note in third.notes) and target.stat().st_mtime_ns == mtime


def test_env_file_is_cached_with_its_validate_py(tmp_path, fake_table, monkeypatch):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(path))
    validate = find_script('validate.py', timm_version='1.0.28')
    target = _cached(tmp_path, 'v1.0.28', 'validate.py')
    assert validate.notes == (
        f'cached validate.py of v1.0.28 as {target}: later commands find it there without $TIMM_EXT_TIMM_TRAIN',
        f'cached train.py of v1.0.28 (beside the given validate.py) as {target.with_name("train.py")}: later '
        f'commands find it there without $TIMM_EXT_TIMM_TRAIN')
    assert target.read_text() == FAKE[2][2]
    monkeypatch.delenv('TIMM_EXT_TIMM_TRAIN')
    assert find_script('validate.py', timm_version='1.0.28').path == target
    assert find_script('train.py', timm_version='1.0.28').path == target.with_name('train.py')


def test_a_different_cached_file_is_never_overwritten(tmp_path, fake_table):
    target = _cached(tmp_path, 'v1.0.28')
    target.parent.mkdir(parents=True)
    target.write_text('print("my own edits")\n')
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').unlink()  # this test is about the given file (its neighbour: further down)
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert script.path == path and target.read_text() == 'print("my own edits")\n'
    assert script.notes == (f'did not cache train.py of v1.0.28: {target} already holds another file, left as '
                            f'it is (later commands without --timm-train use it; delete it to cache this one)',)


def test_a_file_written_meanwhile_by_another_process_is_kept(tmp_path, fake_table, monkeypatch):
    target = _cached(tmp_path, 'v1.0.28')
    real_link = os.link

    def racing_link(src, dst):  # another process saves a different file between the check and the link
        Path(dst).write_text('print("the other process")\n')
        return real_link(src, dst)

    monkeypatch.setattr(os, 'link', racing_link)
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').unlink()
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert target.read_text() == 'print("the other process")\n' and 'did not cache' in script.notes[-1]
    assert sorted(p.name for p in target.parent.iterdir()) == ['train.py']


def test_without_hard_links_the_copy_is_moved_in_place(tmp_path, fake_table, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, 'Operation not permitted')

    monkeypatch.setattr(os, 'link', no_links)
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').unlink()
    script = find_script('train.py', path=path, timm_version='1.0.28')
    target = _cached(tmp_path, 'v1.0.28')
    assert target.read_text() == FAKE[2][1] and script.notes[-1].startswith('cached train.py of v1.0.28 as ')
    assert sorted(p.name for p in target.parent.iterdir()) == ['train.py']


def test_unwritable_cache_is_a_note_not_an_error(tmp_path, fake_table, monkeypatch):
    (tmp_path / 'cache').write_text('a file where the cache folder should be\n')
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert script.path == path and [note.split(' as ')[0] for note in script.notes] == [
        'could not cache train.py of v1.0.28', 'could not cache validate.py of v1.0.28 (beside the given train.py)']
    assert script.notes[0].endswith('--timm-train stays needed')
    assert script.notes[1].endswith('--timm-validate stays needed')


def test_unknown_and_unverified_files_are_not_cached(tmp_path, fake_table):
    path = tmp_path / 'train.py'
    path.write_text('print("edited")\n')
    script = find_script('train.py', path=path, timm_version='1.0.28', allow_unverified=True)
    assert script.tag is None and len(script.notes) == 1  # only "running an unverified train.py"
    # a known file newer than the installed timm, run only because of --allow-unverified
    newer = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('validate.py', path=newer.parent, timm_version='1.0.27', allow_unverified=True)
    assert script.tag == 'v1.0.28' and len(script.notes) == 1
    assert not (tmp_path / 'cache').exists()


def test_older_release_than_the_cache_looks_for_is_not_claimed_remembered(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.27')  # validate.py of v1.0.27; timm 1.0.31 looks for v1.0.28's
    script = find_script('validate.py', path=path.parent, timm_version='1.0.31')
    assert script.tag == 'v1.0.27' and not (tmp_path / 'cache').exists()
    assert script.notes[-1] == (
        f'validate.py of v1.0.27 is not cached: without --timm-validate, timm 1.0.31 looks for the validate.py of '
        f'v1.0.28 ({_cached(tmp_path, "v1.0.28", "validate.py")})')


def test_release_without_task_api_is_cached_and_patched_from_the_cache(tmp_path, fake_table, monkeypatch):
    import timm_ext.launch.patches as patches
    sources = []

    def patch_script(src, dst):
        sources.append(Path(src))
        Path(dst).write_text(Path(src).read_text() + '# patched\n')

    monkeypatch.setattr(patches, 'patch_script', patch_script)
    path = fake_table(tmp_path / 'timm', 'v1.0.22')
    first = find_script('train.py', path=path, timm_version='1.0.22')
    patched = _cached(tmp_path, 'v1.0.22', 'train_patched.py')
    assert first.path == patched and first.original == path and 'cached train.py of v1.0.22' in first.notes[0]
    again = find_script('train.py', timm_version='1.0.22')  # no flag: the cached original, patched again
    assert (again.path, again.original, again.source) == (patched, _cached(tmp_path, 'v1.0.22'), 'cache')
    assert sources == [path, _cached(tmp_path, 'v1.0.22')] and patched.read_text() == FAKE[0][1] + '# patched\n'


def test_the_cli_prints_what_was_cached(tmp_path, fake_table, monkeypatch, capsys):
    from timm_ext.cli._scripts import resolve_script

    monkeypatch.setattr('timm.__version__', '1.0.28')
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    resolve_script('train.py', str(path), allow_unverified=False)
    target = _cached(tmp_path, 'v1.0.28')
    assert capsys.readouterr().err == (
        f'timm-ext: note: cached train.py of v1.0.28 as {target}: later commands find it there without --timm-train\n'
        f'timm-ext: note: cached validate.py of v1.0.28 (beside the given train.py) as '
        f'{target.with_name("validate.py")}: later commands find it there without --timm-validate\n')
    assert resolve_script('train.py', None, allow_unverified=False).path == target
    assert capsys.readouterr().err == ''


# --- one script given, both remembered: the other one beside it ---------------------------------

def test_train_py_given_once_then_validate_py_comes_from_the_cache(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    target = _cached(tmp_path, 'v1.0.28', 'validate.py')
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert script.notes[-1] == (f'cached validate.py of v1.0.28 (beside the given train.py) as {target}: later '
                                f'commands find it there without --timm-validate')
    assert target.read_text() == FAKE[2][2] and target.stat().st_mode == path.with_name('validate.py').stat().st_mode
    validate = find_script('validate.py', timm_version='1.0.28')  # no flag, no network: fetch_url fails the test
    assert (validate.path, validate.source, validate.tag, validate.notes) == (target, 'cache', 'v1.0.28', ())


def test_validate_py_given_once_then_train_py_comes_from_the_cache(tmp_path, fake_table):
    folder = fake_table(tmp_path / 'timm', 'v1.0.28').parent
    target = _cached(tmp_path, 'v1.0.28', 'train.py')
    script = find_script('validate.py', path=folder / 'validate.py', timm_version='1.0.28')
    assert script.notes[-1] == (f'cached train.py of v1.0.28 (beside the given validate.py) as {target}: later '
                                f'commands find it there without --timm-train')
    train = find_script('train.py', timm_version='1.0.28')
    assert (train.path, train.source, train.tag, train.notes) == (target, 'cache', 'v1.0.28', ())


def test_a_neighbour_of_another_release_is_not_cached(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').write_text(FAKE[1][2])  # validate.py of v1.0.27 beside train.py of v1.0.28
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert script.notes[-1] == (f'did not cache the validate.py beside the given train.py ({path.parent}/validate.py): '
                                f'it is the validate.py of v1.0.27, not of v1.0.28')
    assert sorted(p.name for p in _cached(tmp_path, 'v1.0.28').parent.iterdir()) == ['train.py']


MINE = 'print("my validate")\n'


def test_an_unknown_neighbour_is_not_cached(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').write_text(MINE)
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert script.notes[-1] == (
        f'did not cache the validate.py beside the given train.py ({path.parent}/validate.py): its sha256 '
        f'{_sha(MINE)[:16]}... is not the '
        f'validate.py of v1.0.28 (nor of any timm release timm-ext knows)')
    assert not _cached(tmp_path, 'v1.0.28', 'validate.py').exists()


def test_no_neighbour_nothing_said(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    (path.parent / 'validate.py').unlink()
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert len(script.notes) == 1 and script.notes[0].startswith('cached train.py of v1.0.28 as ')


def test_a_cached_file_is_never_overwritten_by_a_neighbour(tmp_path, fake_table):
    target = _cached(tmp_path, 'v1.0.28', 'validate.py')
    target.parent.mkdir(parents=True)
    target.write_text('print("my own validate")\n')
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    script = find_script('train.py', path=path, timm_version='1.0.28')
    assert target.read_text() == 'print("my own validate")\n'
    assert script.notes[-1] == (
        f'did not cache validate.py of v1.0.28 (beside the given train.py): {target} already holds another file, '
        f'left as it is (later commands without --timm-validate use it; delete it to cache this one)')


def test_an_unverified_given_file_caches_no_neighbour(tmp_path, fake_table):
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    path.write_text('print("edited")\n')
    script = find_script('train.py', path=path, timm_version='1.0.28', allow_unverified=True)
    assert script.tag is None and len(script.notes) == 1 and not (tmp_path / 'cache').exists()


def test_remember_false_caches_no_neighbour(tmp_path, fake_table):
    find_script('train.py', path=fake_table(tmp_path / 'timm', 'v1.0.28'), timm_version='1.0.28', remember=False)
    assert not (tmp_path / 'cache').exists()


# timm's real scripts: $TIMM_EXT_TIMM_TRAIN (read at import, before the fixtures clear it) or ../shared's v1.0.28
REAL_DIR = SCRIPTS_DIR


def _real_release(name: str) -> Path:
    """timm's real ``name``, when it is there and of the release the cache is searched for (else skip)."""
    path = REAL_DIR / name
    require_timm_script(path)
    given = timm_scripts.locate_script(name, path=path)
    wanted = timm_scripts.locate_script(name, path=None)  # nothing cached yet: where a download would go
    if given.tag != wanted.tag:
        pytest.skip(f'the scripts at {REAL_DIR} are of {given.tag}; the installed timm looks for {wanted.tag}\'s')
    return path


@pytest.mark.parametrize('given, other', [('train.py', 'validate.py'), ('validate.py', 'train.py')])
def test_real_script_given_once_then_the_other_comes_from_the_cache(given, other):
    path = _real_release(given)
    target = timm_scripts.locate_script(other).path
    script = find_script(given, path=path)
    flag = '--timm-validate' if other == 'validate.py' else '--timm-train'
    assert script.notes[-1] == (f'cached {other} of {script.tag} (beside the given {given}) as {target}: later '
                                f'commands find it there without {flag}')
    found = find_script(other)  # no flag, no network: fetch_url fails the test
    assert (found.path, found.source, found.tag) == (target, 'cache', script.tag)
    assert found.sha256 == hashlib.sha256((REAL_DIR / other).read_bytes()).hexdigest()


def test_cli_train_once_then_validate_uses_the_cached_validate_py(tmp_path, capsys):
    """``timm-ext train --timm-train DIR/train.py --dry-run`` caches validate.py; ``timm-ext validate`` takes it."""
    train_py = _real_release('train.py')
    for split in ('train', 'validation'):
        for cls in ('a', 'b'):
            (tmp_path / 'data' / split / cls).mkdir(parents=True)
            for i in range(2):
                Image.new('RGB', (8, 8)).save(tmp_path / 'data' / split / cls / f'{i}.png')
    data = tmp_path / 'data'
    cached = timm_scripts.locate_script('validate.py').path
    code, out, err = run_cli(capsys, 'train', '--timm-train', train_py, '--dry-run', '--device', 'cpu', '--model',
                             'resnet18', '--data-dir', data, '--num-classes', '2', '-b', '2')
    assert code == 0 and shlex.split(out)[1:1 + len(train_py_argv(train_py))] == train_py_argv(train_py)
    tag = timm_scripts.locate_script('train.py', path=train_py).tag  # the release of TIMM_EXT_TIMM_TRAIN's scripts
    assert (f'timm-ext: note: cached validate.py of {tag} (beside the given train.py) as {cached}: later commands '
            f'find it there without --timm-validate') in err.splitlines()
    checkpoint = tmp_path / 'model.pth.tar'
    checkpoint.write_bytes(b'')
    code, out, err = run_cli(capsys, 'validate', '--dry-run', '--no-run-args', '--checkpoint', checkpoint, '--device',
                             'cpu', '--data-dir', data)
    assert code == 0 and shlex.split(out) == [sys.executable, '-m', 'timm_ext.cli._child', 'timm_ext', str(cached),
                                              '--checkpoint', str(checkpoint), '--device', 'cpu', '--data-dir',
                                              str(data)]
    assert 'download' not in err and 'cached' not in err


# --- where a file would come from, without fetching it -------------------------------------------

def test_locate_script_reports_without_downloading_or_writing(tmp_path, fake_table, monkeypatch):
    location = timm_scripts.locate_script('train.py', timm_version='1.0.31')
    target = _cached(tmp_path, 'v1.0.28')
    assert (location.source, location.path, location.tag, location.script) == ('download', target, 'v1.0.28', None)
    assert location.url == SCRIPT_URL.format(tag='v1.0.28', name='train.py')
    assert 'no sha256 for timm 1.0.31' in location.notes[0]
    path = fake_table(tmp_path / 'timm', 'v1.0.28')
    given = timm_scripts.locate_script('train.py', path=path, timm_version='1.0.31')
    assert (given.source, given.path, given.tag, given.url) == ('--timm-train', path, 'v1.0.28', None)
    assert given.script.sha256 == _sha(FAKE[2][1]) and not (tmp_path / 'cache').exists()
    target.parent.mkdir(parents=True)
    target.write_text(FAKE[2][1])
    cached = timm_scripts.locate_script('train.py', timm_version='1.0.31')
    assert (cached.source, cached.script.path, cached.url) == ('cache', target, None)
    path.write_text('print("edited")\n')
    with pytest.raises(ScriptError, match=r'^--timm-train \S+train.py: its sha256 '):
        timm_scripts.locate_script('train.py', path=path, timm_version='1.0.31')


# --- train.py without the task API: the patched copy ---------------------------------------------

def test_release_without_task_api_runs_the_patched_copy(tmp_path, fake_table, monkeypatch):
    import timm_ext.launch.patches as patches
    calls = []

    def patch_script(src, dst):
        calls.append((Path(src), Path(dst)))
        Path(dst).write_text(Path(src).read_text() + '# patched\n')
        return 'v1.0.22'

    monkeypatch.setattr(patches, 'patch_script', patch_script)
    path = fake_table(tmp_path / 'timm', 'v1.0.22')
    script = find_script('train.py', path=path, timm_version='1.0.22')
    target = tmp_path / 'cache' / 'timm-train' / 'v1.0.22' / 'train_patched.py'
    assert calls and calls[0][0] == path and script.patched
    assert (script.path, script.original, script.tag) == (target, path, 'v1.0.22')
    assert target.read_text() == FAKE[0][1] + '# patched\n'
    assert 'no task API' in script.notes[-1] and not list(target.parent.glob('.train_patched*'))
    assert find_script('validate.py', path=path.parent, timm_version='1.0.22').path == path.parent / 'validate.py'
    assert find_script('train.py', path=path, timm_version='1.0.22', patch=False).path == path


def test_patch_failure_is_one_line(tmp_path, fake_table, monkeypatch):
    import timm_ext.launch.patches as patches

    def refuse(src, dst):
        raise ValueError('the diff does not match the file at line 3')

    monkeypatch.setattr(patches, 'patch_script', refuse)
    path = fake_table(tmp_path / 'timm', 'v1.0.22')
    with pytest.raises(ScriptError, match=r'^cannot patch train.py of v1.0.22 .*line 3$'):
        find_script('train.py', path=path, timm_version='1.0.22')


def test_real_v1_0_22_is_patched_for_sam():
    path = SHARED / 'v1.0.22' / 'train.py'
    if not path.is_file():
        pytest.skip(f'timm\'s train.py v1.0.22 not found at {path}')
    from timm_ext.launch.patches import load_patch_index
    script = find_script('train.py', path=path, timm_version='1.0.22')
    expected = next(p.sha256_out for p in load_patch_index() if 'v1.0.22' in p.tags)
    assert script.patched and hashlib.sha256(script.path.read_bytes()).hexdigest() == expected
    assert os.path.getsize(path) < os.path.getsize(script.path)


# --- reading a script without running it ---------------------------------------------------------

def test_load_script_parser_does_not_run_main(tmp_path):
    path = tmp_path / 'train.py'
    path.write_text('import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument("--lr", type=float)\n'
                    'if __name__ == "__main__":\n    raise SystemExit("main ran")\n')
    parser = timm_scripts.load_script_parser(path)
    assert parser.parse_args(['--lr', '0.5']).lr == 0.5
    path.write_text('x = 1\n')
    with pytest.raises(ScriptError, match='no module-level argparse `parser`'):
        timm_scripts.load_script_parser(path)
    path.write_text('from timm.task import NotYetThere\n')
    with pytest.raises(ScriptError, match=r'^cannot read the arguments of \S+train.py: ImportError: cannot import'):
        timm_scripts.load_script_parser(path)


def test_ddp_device_ids_detection(tmp_path):
    path = tmp_path / 'train.py'
    path.write_text('task.prepare_distributed(device_ids=[device], broadcast_buffers=True)\n')
    assert timm_scripts.ddp_passes_device_ids(path)
    path.write_text('task.prepare_distributed(device_ids=[device] if device.type == "cuda" else None)\n')
    assert not timm_scripts.ddp_passes_device_ids(path)  # a script that keeps them for CUDA can run DDP on CPU
    path.write_text('model = NativeDDP(model, device_ids=[device])\n')  # train.py v1.0.15 .. v1.0.22
    assert timm_scripts.ddp_passes_device_ids(path)
    path.write_text('task.prepare_distributed()\n')
    assert not timm_scripts.ddp_passes_device_ids(path)
    real = SHARED / 'v1.0.28' / 'train.py'
    if real.is_file():
        assert timm_scripts.ddp_passes_device_ids(real)


def test_script_args_parse_as_train_py():
    """The recipe through set_defaults: text converted by each argument's type, the command line on top. train.py of
    the installed timm's release (TIMM_EXT_TIMM_TRAIN): a newer one may import what this timm lacks (1.0.28's needs
    timm.task.TokenDistillationTask, which timm 1.0.23 has not)."""
    path = _real_release('train.py')
    train_parser = load_script_parser(path)  # the file is there: a failure to read its parser is a failure
    args = script_args(train_parser, ['--epochs', '3'], {'lr': '0.1', 'epochs': 9, 'rho': 0.05})
    assert args.lr == 0.1 and args.epochs == 3 and args.rho == 0.05
    assert train_parser.get_default('lr') is None and train_parser.get_default('rho') is None  # left as it was
    assert script_args(train_parser, ['--no-such-argument']) is None


def test_bad_script_name():
    with pytest.raises(ValueError, match=r"Unknown timm script 'inference.py'; one of: train.py, validate.py"):
        find_script('inference.py')
