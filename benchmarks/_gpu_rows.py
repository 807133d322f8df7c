"""Rows of the GPU report: a measured ratio, its goal and whether it is met; the report as JSON and markdown."""
import math
import operator
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

_OPS = {'<=': operator.le, '>=': operator.ge}


@dataclass(frozen=True)
class Goal:
    """``value <op> target``; ``source`` says where the target comes from."""
    op: str
    target: float
    source: str

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f'Goal op {self.op!r}: use one of {sorted(_OPS)}')

    def met(self, value: Optional[float]) -> Optional[bool]:
        """Whether ``value`` meets the goal; ``None`` when there is no finite value to judge (e.g. memory on CPU)."""
        if value is None or not math.isfinite(value):
            return None
        return bool(_OPS[self.op](value, self.target))

    def __str__(self) -> str:
        return f'{self.op} {self.target:g}'


@dataclass(frozen=True)
class Row:
    """One line of the report. ``claim``: a paper's number shown beside the value (reported, not a goal)."""
    measurement: str
    name: str
    value: Optional[float]
    unit: str = 'x'
    goal: Optional[Goal] = None
    claim: Optional[float] = None
    note: str = ''

    @property
    def met(self) -> Optional[bool]:
        return self.goal.met(self.value) if self.goal is not None else None

    def to_json(self) -> Dict[str, Any]:
        goal = None if self.goal is None else dict(op=self.goal.op, target=self.goal.target, source=self.goal.source)
        return dict(measurement=self.measurement, name=self.name, value=self.value, unit=self.unit, goal=goal,
                    met=self.met, claim=self.claim, note=self.note)


def time_ratio(times: Dict[str, float], num: str, den: str) -> float:
    """Step-time ratio ``num / den`` (SAM / AdamW: how many AdamW steps one SAM step costs)."""
    return times[num] / times[den]


def speed_ratio(times: Dict[str, float], candidate: str, base: str) -> float:
    """Throughput ratio of ``candidate`` to ``base`` (> 1: the candidate is faster)."""
    return times[base] / times[candidate]


def copies(extra_bytes: Optional[float], param_bytes: int) -> Optional[float]:
    """Extra memory in parameter copies; ``None`` where it was not measured."""
    return None if extra_bytes is None else extra_bytes / param_bytes


def all_met(rows: List[Row]) -> Optional[bool]:
    """True when every evaluated goal is met; ``None`` when no goal could be evaluated."""
    verdicts = [r.met for r in rows if r.met is not None]
    return all(verdicts) if verdicts else None


def _num(value: Optional[float], digits: int = 3) -> str:
    return 'n/a' if value is None else f'{value:.{digits}f}'


def _verdict(met: Optional[bool], has_goal: bool) -> str:
    if not has_goal:
        return 'report'
    return 'n/a' if met is None else ('yes' if met else '**no**')


def markdown(report: Dict[str, Any]) -> str:
    """The report's header, its rows (value, goal, met) and its measurements (times, peak memory, reps)."""
    lines = [f'GPU report: {report["device"]} ({report["device_type"]}), torch {report["torch"]}, '
             f'timm {report["timm"]}, timm-ext {report["timm_ext"]}, AMP {report["amp"]}'
             f'{", smoke sizes" if report["smoke"] else ""}; {report["elapsed_s"]:.0f} s '
             f'(budget {report["budget_s"]:.0f} s)', '',
             *(['Smoke sizes check that every measurement runs; their ratios mean nothing.', '']
               if report['smoke'] else []),
             '| measurement | row | value | goal | met | paper | note |', '|---|---|---:|---|---|---:|---|']
    for r in report['rows']:
        goal = r['goal']
        lines.append(f'| {r["measurement"]} | {r["name"]} | {_num(r["value"])}{"" if r["value"] is None else r["unit"]}'
                     f' | {"" if goal is None else goal["op"] + " " + format(goal["target"], "g")}'
                     f' | {_verdict(r["met"], goal is not None)} | {_num(r["claim"], 2) if r["claim"] else ""}'
                     f' | {r["note"].replace("|", "/")} |')
    lines += ['', '| measurement | config | candidate | ms / call | peak MiB | reps |', '|---|---|---|---:|---:|---:|']
    for m in report['measurements']:
        if m['status'] != 'ok':
            lines.append(f'| {m["name"]} | {m["config"]} | skipped: {m["reason"]} | | | |')
            continue
        for cand, ms in m['time_ms'].items():
            peak = m['peak_mib'].get(cand)
            lines.append(f'| {m["name"]} | {m["config"]} | {cand} | {ms:.2f} | {_num(peak, 0)} | {m["reps"]} |')
    return '\n'.join(lines) + '\n'
