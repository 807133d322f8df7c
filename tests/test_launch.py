"""timm_ext.launch as a package: the library reads timm's release table in one place (which way its imports
point is tests/test_architecture.py's)."""
from pathlib import Path

import timm_ext.launch.release_table as release_table

PACKAGE = Path(__file__).resolve().parents[1] / 'timm_ext'


def test_one_reader_of_the_release_table_and_one_sha256():
    readers = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob('*.py') if 'timm_scripts.tsv' in p.read_text()]
    assert readers == ['launch/release_table.py']
    hashers = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / 'launch').rglob('*.py')
               if 'hashlib' in p.read_text()]
    assert hashers == ['launch/release_table.py']


def test_sha256_of_a_file_and_of_bytes(tmp_path):
    (tmp_path / 'f').write_bytes(b'abc')
    digest = 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    assert release_table.sha256_of(tmp_path / 'f') == release_table.sha256_of(b'abc') == digest
    assert release_table.sha256_of(str(tmp_path / 'f')) == digest
