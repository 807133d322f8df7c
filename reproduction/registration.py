"""One standard for "registered", applied to every revision of the plan from the facts ``plan.REVISIONS`` holds.

A revision's own docstring saying "committed before its runs" is not enough: revision 2.4 was committed before its
runs but written after a run it reads again had missed the rule, and revision 4 reuses 6 runs trained and read before
it. The standard below reads both conditions from the record and prints why a revision fails it, so one rule labels
2.4 and 3.1 alike (issue 57).
"""
from typing import List, Tuple

from plan import REVISIONS, Revision

__all__ = ['STANDARD', 'label', 'revisions_table']

STANDARD = ('A revision is **registered** when it was committed before its first run started and was decided '
            'without seeing any result it changes (a run or reading it replaces, drops or reads again). Otherwise it '
            'is **post hoc**; where the record cannot order the commit and the first run (the same minute, the second '
            'not recorded) it is **not established**. A post-hoc revision\'s reading of runs already read is a '
            'sensitivity reading, shown beside the first reading of those runs, never in its place.')


def label(rev: Revision) -> Tuple[str, str]:
    """(label, why) for ``rev`` by ``STANDARD``."""
    if rev.seen_changed:
        return 'post hoc', 'it had seen ' + '; '.join(rev.seen_changed)
    if rev.first_run is None:
        return 'not established', 'its first run\'s time is not recorded'
    if len(rev.first_run) < len(rev.committed) and rev.committed.startswith(rev.first_run):
        return 'not established', f'committed at {rev.committed[11:]}, its first run started in the same minute'
    if rev.first_run > rev.committed:
        return 'registered', 'committed before its first run, and it changed nothing already seen'
    return 'post hoc', f'its first run started at {rev.first_run}, before the commit'


def revisions_table() -> List[str]:
    """The report's table: each revision's facts and the label the standard gives them."""
    lines = ['| revision | commit (UTC) | first run (UTC) | runs | label | why |', '|---|---|---|---|---|---|']
    for rev in REVISIONS:
        name, why = label(rev)
        first = f'{rev.first_run} ({rev.first_run_source})' if rev.first_run else rev.first_run_source
        lines.append(f'| {rev.name} | {rev.commit} {rev.committed} | {first} | {rev.runs} | **{name}** | {why} |')
    return lines
