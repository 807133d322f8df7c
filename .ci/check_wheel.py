"""Check the built sdist and wheel as an index would show them: ``python .ci/check_wheel.py DIST_DIR``.

The wheel must carry every file that git tracks of the package and of the entry point's timm_ext_cli/ beside it
(recipes/ ships as timm_ext/_recipes, patches/ as timm_ext/_patches), the license, and the metadata an index
page shows: the SPDX license, the Python range with a classifier per tested version, https project URLs, the
README as markdown. One line per problem, exit 1 when there is any.
"""
import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# repository folder -> where its files lie in the wheel (pyproject.toml's package-dir)
SHIPPED = {'timm_ext': 'timm_ext', 'timm_ext_cli': 'timm_ext_cli', 'recipes': 'timm_ext/_recipes',
           'patches': 'timm_ext/_patches'}
TESTED_PYTHONS = ('3.10', '3.11')


def tracked_package_files() -> set:
    out = subprocess.run(['git', 'ls-files', *SHIPPED], cwd=REPO, check=True, capture_output=True, text=True)
    files = set()
    for line in out.stdout.splitlines():
        top, _, rest = line.partition('/')
        files.add(f'{SHIPPED[top]}/{rest}')
    return files


def problems(dist: Path) -> list:
    wheels, sdists = sorted(dist.glob('*.whl')), sorted(dist.glob('*.tar.gz'))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f'{dist} should hold one wheel and one sdist, found {[p.name for p in wheels + sdists]}']
    found = []
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
        meta_name = next(n for n in names if n.endswith('.dist-info/METADATA'))
        meta = email.message_from_string(whl.read(meta_name).decode())
    missing = sorted(tracked_package_files() - names)
    found += [f'the wheel lacks {name} (add it to pyproject.toml\'s package-data)' for name in missing]
    if meta.get('License-Expression') != 'Apache-2.0':
        found.append(f'License-Expression is {meta.get("License-Expression")!r}, not Apache-2.0')
    if not any(n.endswith('/licenses/LICENSE') for n in names):
        found.append('the wheel carries no LICENSE file')
    if meta.get('Requires-Python') != '>=3.10':
        found.append(f'Requires-Python is {meta.get("Requires-Python")!r}; this check and the classifiers say >=3.10')
    classifiers = meta.get_all('Classifier') or []
    pythons = {c.rsplit(' :: ', 1)[1] for c in classifiers if c.startswith('Programming Language :: Python :: 3.')}
    if pythons != set(TESTED_PYTHONS):
        found.append(f'Python classifiers {sorted(pythons)} are not the tested versions {list(TESTED_PYTHONS)}')
    urls = meta.get_all('Project-URL') or []
    if not urls:
        found.append('no Project-URL')
    found += [f'Project-URL {u!r} is not https' for u in urls if not u.split(', ', 1)[-1].startswith('https://')]
    if meta.get('Description-Content-Type') != 'text/markdown' or '# timm-ext' not in meta.get_payload():
        found.append('the long description is not README.md as markdown')
    with tarfile.open(sdists[0]) as sdist:
        members = {m.name.split('/', 1)[1] for m in sdist.getmembers() if '/' in m.name}
    found += [f'the sdist lacks {name}' for name in ('LICENSE', 'README.md', 'pyproject.toml') if name not in members]
    return found


def main() -> int:
    dist = Path(sys.argv[1])
    found = problems(dist)
    for line in found:
        print(f'check_wheel: {line}', file=sys.stderr)
    if not found:
        wheel = next(dist.glob('*.whl'))
        print(f'check_wheel: {wheel.name}: every tracked package file, LICENSE and the index metadata are there')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
