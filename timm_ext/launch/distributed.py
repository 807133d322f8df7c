"""Where the training processes run: one process, torchrun on one node, or torchrun across nodes (SLURM).

timm's train.py reads its rank and world size from the environment torchrun (``python -m
torch.distributed.run``) sets; timm-ext only builds torchrun's own arguments (``--nnodes``,
``--nproc-per-node``, ``--node-rank``, ``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-id``,
``--max-restarts``, ``--standalone``) and refuses, one line each, what torchrun would reject or wait on
forever (a node rank outside the nodes, several nodes without a rendezvous endpoint). Under SLURM
(``SLURM_JOB_ID`` set, ``srun --ntasks-per-node=1`` starting one ``timm-ext train`` per node), the node
count, the node rank, the rendezvous host (the first host of the job's node list) and the job id come
from SLURM's environment where the command line does not give them.
"""
import re
from dataclasses import dataclass
from itertools import product
from typing import List, Mapping, Optional, Tuple

__all__ = ['DEFAULT_PORT', 'DEFAULT_RDZV_BACKEND', 'Launch', 'LaunchError', 'expand_nodelist', 'resolve_launch']

DEFAULT_PORT = 29500  # torchrun's own default master port
DEFAULT_RDZV_BACKEND = 'c10d'  # torchrun's default is 'static', which needs --node-rank on every node

_BRACKETS = re.compile(r'\[([^\[\]]*)\]')


class LaunchError(ValueError):
    """Launch arguments (or SLURM's environment) that torchrun would reject or hang on (one line per problem)."""


@dataclass(frozen=True)
class Launch:
    """torchrun's arguments for this node. ``nnodes`` is ``'N'`` or elastic ``'MIN:MAX'`` (None: one node,
    ``--standalone`` unless ``rdzv_endpoint`` is given); ``notes`` say where SLURM's values came from."""
    nproc_per_node: int
    nnodes: Optional[str] = None
    node_rank: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    rdzv_id: Optional[str] = None
    rdzv_backend: Optional[str] = None
    max_restarts: Optional[int] = None
    notes: Tuple[str, ...] = ()

    @property
    def max_nodes(self) -> int:
        return _node_range(self.nnodes)[1] if self.nnodes else 1

    @property
    def world_size(self) -> int:
        """Processes in all: ``nproc_per_node`` x nodes. An elastic ``MIN:MAX`` job counts MAX nodes, so the
        pre-flight checks (steps per epoch, global batch) hold for the largest job the rendezvous admits."""
        return self.nproc_per_node * self.max_nodes

    @property
    def standalone(self) -> bool:
        return self.rdzv_endpoint is None

    def torchrun_args(self) -> List[str]:
        """The arguments of ``python -m torch.distributed.run`` before the script, under torchrun's own names."""
        if self.standalone:
            args = ['--standalone', f'--nproc-per-node={self.nproc_per_node}']
        else:
            args = [f'--nnodes={self.nnodes or 1}', f'--nproc-per-node={self.nproc_per_node}',
                    f'--rdzv-backend={self.rdzv_backend or DEFAULT_RDZV_BACKEND}',
                    f'--rdzv-endpoint={self.rdzv_endpoint}']
            args += [f'--rdzv-id={self.rdzv_id}'] if self.rdzv_id else []
            args += [f'--node-rank={self.node_rank}'] if self.node_rank is not None else []
        return args + ([f'--max-restarts={self.max_restarts}'] if self.max_restarts is not None else [])


def expand_nodelist(nodelist: str) -> List[str]:
    """SLURM's compressed host list as host names, in SLURM's order (``scontrol show hostnames``, which login
    nodes have but a launcher cannot count on): ``gpu[01-03,07]`` -> gpu01, gpu02, gpu03, gpu07; ``a[1-2],b3``;
    several bracket groups (``rack[1-2]-n[01-02]``: rack1-n01, rack1-n02, rack2-n01, ...); zero padding kept."""
    hosts: List[str] = []
    for item in _split_top_level(nodelist.strip()):
        if not item:
            raise LaunchError(f'node list {nodelist!r} has an empty host name')
        parts = _BRACKETS.split(item)  # literal, group, literal, group, ..., literal
        if any(c in p for p in parts[::2] for c in '[]'):
            raise LaunchError(f'node list {nodelist!r}: unbalanced brackets in {item!r}')
        groups = [_expand_group(g, nodelist) for g in parts[1::2]]
        for numbers in product(*groups):
            hosts.append(''.join(literal + n for literal, n in zip(parts[::2], (*numbers, ''))))
    return hosts


def _split_top_level(text: str) -> List[str]:
    """Split at commas outside brackets (``a[1-2],b3`` -> ``a[1-2]``, ``b3``)."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == '[') - (c == ']')
        if c == ',' and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def _expand_group(group: str, nodelist: str) -> List[str]:
    """``01-03,07`` -> 01, 02, 03, 07 (each range as wide as its first number, as SLURM pads)."""
    numbers = []
    for span in group.split(','):
        lo, sep, hi = span.partition('-')
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise LaunchError(f'node list {nodelist!r}: {span!r} in [{group}] is not a number or a range N-M')
        if sep and int(hi) < int(lo):
            raise LaunchError(f'node list {nodelist!r}: the range {span!r} in [{group}] runs backwards')
        numbers += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi if sep else lo) + 1)]
    return numbers


def resolve_launch(
        nproc_per_node: Optional[int] = None,
        nnodes: Optional[str] = None,
        node_rank: Optional[int] = None,
        rdzv_endpoint: Optional[str] = None,
        rdzv_id: Optional[str] = None,
        rdzv_backend: Optional[str] = None,
        max_restarts: Optional[int] = None,
        environ: Optional[Mapping[str, str]] = None,
) -> Optional[Launch]:
    """torchrun's arguments from the command line's (None: not given) and, inside a SLURM job (``environ`` has
    ``SLURM_JOB_ID``), SLURM's for those not given; None when train.py runs as one plain process.

    SLURM is read only for a torchrun command: ``--nproc-per-node`` or ``--nnodes`` given, or a job on several
    nodes; a one-node job without them runs ``python train.py`` as outside SLURM. Every problem is raised at
    once as a LaunchError, one line each.
    """
    rank_given = node_rank is not None
    slurm = _Slurm(environ or {})
    notes: List[str] = []
    if slurm.job_id and (nproc_per_node is not None or nnodes is not None or slurm.nodes(1) > 1):
        slurm.check_tasks_per_node()
        nnodes = nnodes if nnodes is not None else str(slurm.nodes())
        nproc_per_node = nproc_per_node if nproc_per_node is not None else slurm.gpus()
        if _node_range(nnodes, strict=False)[1] > 1:
            node_rank = node_rank if node_rank is not None else slurm.node_id()
            rdzv_id = rdzv_id if rdzv_id is not None else slurm.job_id
            if rdzv_endpoint is None:
                rdzv_endpoint = f'{slurm.first_host()}:{DEFAULT_PORT}'
                notes.append(f'SLURM job {slurm.job_id}: rendezvous at {rdzv_endpoint}, the first host of '
                             f'{slurm.nodelist_name} (port {DEFAULT_PORT} by default; --rdzv-endpoint HOST:PORT '
                             f'sets another)')
    if nproc_per_node is None and nnodes is None:
        problems = _one_node_problems(node_rank, rdzv_id, rdzv_backend, rdzv_endpoint)
        if rdzv_endpoint is not None:
            problems.append(f'--rdzv-endpoint {rdzv_endpoint} is torchrun\'s: add --nproc-per-node N (and --nnodes N '
                            f'for several nodes)')
        if max_restarts is not None:
            problems.append(f'--max-restarts {max_restarts} restarts torchrun\'s workers: add --nproc-per-node N')
        if problems:
            raise LaunchError('\n'.join(problems))
        return None
    problems = _problems(nproc_per_node, nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_backend, max_restarts,
                         slurm)
    if problems:
        raise LaunchError('\n'.join(problems))
    explicit_rank = rank_given or rdzv_backend == 'static'
    return Launch(nproc_per_node, nnodes if rdzv_endpoint else None, node_rank if explicit_rank else None,
                  rdzv_endpoint, rdzv_id, rdzv_backend, max_restarts, tuple(notes))


def _problems(
        nproc: Optional[int], nnodes: Optional[str], node_rank: Optional[int], endpoint: Optional[str],
        rdzv_id: Optional[str], backend: Optional[str], max_restarts: Optional[int], slurm: '_Slurm',
) -> List[str]:
    """One line per launch argument torchrun would refuse, or whose run would wait forever or do nothing."""
    problems = []
    nodes = f'{slurm.nodes_from or "--nnodes"} {nnodes or 1}'
    if nproc is None:
        where = '; this SLURM job sets no SLURM_GPUS_ON_NODE or SLURM_GPUS_PER_NODE' if slurm.job_id else ''
        problems.append(f'{nodes} needs --nproc-per-node N, the processes on each node (usually its GPU '
                        f'count){where}')
    elif nproc < 1:
        problems.append(f'--nproc-per-node must be at least 1, got {nproc}')
    bad_nnodes = _nnodes_problems(nnodes, slurm) if nnodes else []
    problems += bad_nnodes
    low, high = _node_range(nnodes, strict=False) if nnodes else (1, 1)
    if high > 1 and endpoint is None:
        problems.append(f'{nodes} needs --rdzv-endpoint HOST:PORT, the same on every node (a host of the job and a '
                        f'free port, e.g. the first node:{DEFAULT_PORT})')
    if endpoint is not None:
        problems += _endpoint_problems(endpoint)
    if not bad_nnodes:
        problems += _one_node_problems(node_rank, rdzv_id, backend, endpoint) if high <= 1 else []
        if node_rank is not None and (high > 1 or endpoint is not None) and not 0 <= node_rank < high:
            source = slurm.node_rank_from or '--node-rank'
            problems.append(f'{source} {node_rank} is outside the nodes 0..{high - 1} of {nodes}: give each node its '
                            f'own rank from 0 to {high - 1}')
    if backend == 'static' and high > 1 and (low != high or node_rank is None):
        problems.append(f'--rdzv-backend static needs a fixed --nnodes N and --node-rank on every node (got '
                        f'--nnodes {nnodes}{"" if node_rank is not None else ", no --node-rank"}); the default '
                        f'{DEFAULT_RDZV_BACKEND} assigns the ranks itself')
    if max_restarts is not None and max_restarts < 0:
        problems.append(f'--max-restarts must be 0 or more, got {max_restarts}')
    return problems


def _one_node_problems(
        node_rank: Optional[int], rdzv_id: Optional[str], backend: Optional[str], endpoint: Optional[str]) -> List[str]:
    """Rendezvous arguments on one node without an endpoint: torchrun --standalone ignores them."""
    if endpoint is not None:
        return []
    return [f'{flag} {value} needs several nodes: add --nnodes N (N > 1) and --rdzv-endpoint HOST:PORT; one node '
            f'runs torchrun --standalone, which ignores it'
            for flag, value in (('--node-rank', node_rank), ('--rdzv-id', rdzv_id), ('--rdzv-backend', backend))
            if value is not None]


def _nnodes_problems(nnodes: str, slurm: '_Slurm') -> List[str]:
    source = slurm.nodes_from or '--nnodes'
    try:
        low, high = _node_range(nnodes)
    except ValueError:
        return [f'{source} {nnodes!r} is not a node count: give N or MIN:MAX (elastic), e.g. --nnodes 4 or 2:4']
    if low < 1:
        return [f'{source} {nnodes} must be at least 1 node']
    if low > high:
        return [f'{source} {nnodes}: MIN {low} is above MAX {high}; give MIN:MAX with MIN <= MAX, e.g. {high}:{low}']
    return []


def _node_range(nnodes: Optional[str], strict: bool = True) -> Tuple[int, int]:
    """``'4'`` -> (4, 4), ``'2:4'`` -> (2, 4); malformed: ValueError, or (1, 1) with ``strict=False``."""
    parts = str(nnodes).split(':')
    if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
        return int(parts[0]), int(parts[-1])
    if strict:
        raise ValueError(f'not a node count: {nnodes!r}')
    return 1, 1


def _endpoint_problems(endpoint: str) -> List[str]:
    host, sep, port = endpoint.rpartition(':')
    if not sep or not host.strip('[]'):
        return [f'--rdzv-endpoint {endpoint!r} needs HOST:PORT (the first node\'s address and a free port, '
                f'e.g. node01:{DEFAULT_PORT})']
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return [f'--rdzv-endpoint {endpoint!r}: the port must be a number from 1 to 65535, e.g. {host}:{DEFAULT_PORT}']
    return []


class _Slurm:
    """SLURM's job environment, read lazily; each bad value is a LaunchError naming the variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.job_id = environ.get('SLURM_JOB_ID') or None
        self.nodes_from: Optional[str] = None
        self.node_rank_from: Optional[str] = None
        self.nodelist_name = next((n for n in ('SLURM_JOB_NODELIST', 'SLURM_NODELIST') if environ.get(n)),
                                  'SLURM_JOB_NODELIST')

    def _int(self, name: str, flag: str) -> Optional[int]:
        value = self.env.get(name)
        if value is None or value == '':
            return None
        if not value.strip().isdigit():
            raise LaunchError(f'{name}={value!r} is not a whole number: pass {flag}')
        return int(value)

    def nodes(self, default: Optional[int] = None) -> int:
        for name in ('SLURM_JOB_NUM_NODES', 'SLURM_NNODES'):
            value = self._int(name, '--nnodes N')
            if value is not None:
                if default is None:
                    self.nodes_from = name
                return value
        if default is not None:
            return default
        raise LaunchError('SLURM_JOB_ID is set but neither SLURM_JOB_NUM_NODES nor SLURM_NNODES: pass --nnodes N')

    def node_id(self) -> Optional[int]:
        value = self._int('SLURM_NODEID', '--node-rank R')
        if value is not None:
            self.node_rank_from = 'SLURM_NODEID'
        return value

    def gpus(self) -> Optional[int]:
        """GPUs of this node: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE without its type (``a100:8`` -> 8)."""
        value = self._int('SLURM_GPUS_ON_NODE', '--nproc-per-node N')
        if value is not None:
            return value
        per_node = self.env.get('SLURM_GPUS_PER_NODE')
        if not per_node:
            return None
        match = re.fullmatch(r'(?:[\w.-]+:){0,2}(\d+)', per_node.strip())  # 8, a100:8, gpu:a100:8
        if not match:
            raise LaunchError(f'SLURM_GPUS_PER_NODE={per_node!r} is not a GPU count (N or TYPE:N): pass '
                              f'--nproc-per-node N')
        return int(match.group(1))

    def first_host(self) -> str:
        nodelist = self.env.get('SLURM_JOB_NODELIST') or self.env.get('SLURM_NODELIST')
        if not nodelist:
            raise LaunchError('SLURM_JOB_ID is set but neither SLURM_JOB_NODELIST nor SLURM_NODELIST: pass '
                              f'--rdzv-endpoint HOST:PORT (a host of the job and a free port such as {DEFAULT_PORT})')
        try:
            return expand_nodelist(nodelist)[0]
        except LaunchError as e:
            raise LaunchError(f'{self.nodelist_name}: {e}; pass --rdzv-endpoint HOST:PORT (the first node and a free '
                              f'port)') from None

    def check_tasks_per_node(self) -> None:
        tasks = self.env.get('SLURM_NTASKS_PER_NODE', '')
        match = re.match(r'\d+', tasks)
        if match and int(match.group()) > 1:
            raise LaunchError(
                f'SLURM_NTASKS_PER_NODE is {tasks}: timm-ext train starts torchrun, which starts the '
                f'--nproc-per-node processes of its node itself, so it needs one task per node; run it with srun '
                f'--ntasks-per-node=1 (with {int(match.group())} tasks each node would start {int(match.group())} '
                f'torchruns)')
