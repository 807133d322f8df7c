"""Put the runs of a withdrawn arm back into measurements.json, from the commit whose report printed them (issue 57).

``python reproduction/recover_earlier_runs.py`` (from the repository's root) reads revision 2.2's lr 2e-3 pair from
``6b6c309:docs/reproduction/measurements.json`` with git and writes it, unchanged but for the machine's folders
(``report.machine_neutral``), under ``earlier_runs`` of docs/reproduction/measurements.json, each run named
(``run``) and labelled with its revision and source. No claim reads them; the report lists them with every other
run trained for it (``run_ledger``). Running it again rewrites the same records.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from run_ledger import EARLIER

SOURCE = '6b6c309:docs/reproduction/measurements.json'
ARMS = ('vit_lr2e-3', 'vit_convstem_lr2e-3')
REVISION = '2.2'


def recovered(saved: Dict[str, Any], source: str = SOURCE) -> Dict[str, List[Dict[str, Any]]]:
    """The withdrawn arms' runs of an earlier report's measurements.json, named and labelled."""
    from report import machine_neutral

    missing = [arm for arm in ARMS if arm not in saved.get('runs', {})]
    if missing:
        raise ValueError(f'{source} holds no runs of {", ".join(missing)}: give the measurements.json of 6b6c309')
    runs = {arm: [dict(m, run=f'{arm}-s{m["seed"]}', revision=REVISION, source=source) for m in saved['runs'][arm]]
            for arm in ARMS}
    return machine_neutral(runs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python reproduction/recover_earlier_runs.py',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--into', default='docs/reproduction/measurements.json', help='the measurements.json to update')
    args = parser.parse_args(argv)
    try:
        text = subprocess.run(['git', 'show', SOURCE], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        parser.error(f'cannot read {SOURCE} with git ({e}): run this in a clone with its history')
    into = Path(args.into)
    saved = json.loads(into.read_text())
    saved[EARLIER] = recovered(json.loads(text))
    into.write_text(json.dumps(saved))
    print(f'{into}: {sum(len(v) for v in saved[EARLIER].values())} runs under {EARLIER} from {SOURCE}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
