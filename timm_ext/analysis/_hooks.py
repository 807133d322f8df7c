"""Shared plumbing of the analysis functions: hooks with one owner, evaluation mode, the math attention path.

Every function of :mod:`timm_ext.analysis` leaves the model as it found it: hooks are removed, the
train/eval mode, timm's ``fused_attn`` flags and the weights are restored, even when the measurement
raises. These context managers are the one place where that happens.
"""
import contextlib
import re
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = [
    'Batch', 'LossFn', 'Point', 'as_batches', 'capture', 'eval_mode', 'feature_points', 'forward_batches', 'hooks',
    'math_attention', 'mean_loss', 'model_device', 'num_prefix_tokens', 'select_points', 'tokens_to_map', 'to_map',
]

Batch = Tuple[torch.Tensor, torch.Tensor]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); CPU for a model without tensors."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device('cpu')


def as_batches(batches: Iterable[Any], name: str = 'batches') -> List[Batch]:
    """The ``(inputs, targets)`` pairs of ``batches`` as a list (a single pair is accepted as one batch)."""
    if isinstance(batches, (tuple, list)) and len(batches) == 2 and all(torch.is_tensor(b) for b in batches):
        batches = [tuple(batches)]
    out = []
    for b in batches:
        if not isinstance(b, (tuple, list)) or len(b) < 2 or not torch.is_tensor(b[0]):
            raise TypeError(f'{name} must yield (inputs, targets) pairs of tensors, got {type(b).__name__}')
        out.append((b[0], b[1]))
    if not out:
        raise ValueError(f'{name} is empty: pass at least one (inputs, targets) batch')
    return out


@contextlib.contextmanager
def eval_mode(model: nn.Module, train: bool = False) -> Iterator[nn.Module]:
    """Put the model in eval (or train) mode and restore each module's own mode afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield model
    finally:
        for m, mode in modes:
            m.training = mode


@contextlib.contextmanager
def math_attention(model: nn.Module) -> Iterator[nn.Module]:
    """The attention path that has a double backward: timm's explicit softmax and SDPA's math kernel.

    timm's fused attention and SDPA's flash/efficient kernels have no second derivative, so Hessian-vector
    products fail on them. Inside this context every module with a ``fused_attn`` flag (timm's attention
    classes) takes its explicit path and ``F.scaled_dot_product_attention`` uses ``SDPBackend.MATH``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flags = [(m, m.fused_attn) for m in model.modules() if isinstance(getattr(m, 'fused_attn', None), bool)]
    for m, _ in flags:
        m.fused_attn = False
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield model
    finally:
        for m, flag in flags:
            m.fused_attn = flag


@contextlib.contextmanager
def hooks(handles: Optional[List[Any]] = None) -> Iterator[List[Any]]:
    """A list to append hook handles to; all of them are removed on exit, whatever happens."""
    handles = [] if handles is None else handles
    try:
        yield handles
    finally:
        for h in handles:
            h.remove()
        handles.clear()


def forward_batches(model: nn.Module, images: Any, fn: Optional[Callable[[torch.Tensor], None]] = None) -> None:
    """Run the model on one image tensor or an iterable of tensors / (images, targets) pairs, without grad."""
    device = model_device(model)
    chunks = [images] if torch.is_tensor(images) else images
    with torch.no_grad():
        for chunk in chunks:
            x = chunk[0] if isinstance(chunk, (tuple, list)) else chunk
            if not torch.is_tensor(x):
                raise TypeError(f'images must be a tensor or an iterable of tensors, got {type(x).__name__}')
            out = model(x.to(device))
            if fn is not None:
                fn(out)


def num_prefix_tokens(model: nn.Module) -> int:
    """Class/register tokens in front of the patch tokens (timm's ``num_prefix_tokens``; 0 if absent)."""
    n = getattr(model, 'num_prefix_tokens', 0)
    return int(n) if isinstance(n, int) else 0


def tokens_to_map(x: torch.Tensor, prefix: int) -> torch.Tensor:
    """(B, N, C) tokens without their ``prefix`` tokens as a (B, C, h, w) map; the patch grid must be square."""
    patches = x[:, prefix:]
    n = patches.shape[1]
    side = int(round(n ** 0.5))
    if side * side != n:
        raise ValueError(f'cannot lay out {n} patch tokens as a square grid (prefix tokens: {prefix})')
    return patches.transpose(1, 2).reshape(x.shape[0], x.shape[2], side, side)


def to_map(x: torch.Tensor, prefix: int) -> torch.Tensor:
    """A feature map (B, C, H, W) from a map (returned as is), (B, N, C) tokens or NHWC timm features."""
    if x.ndim == 4:
        return x
    if x.ndim == 3:
        return tokens_to_map(x, prefix)
    raise ValueError(f'expected a (B, C, H, W) map or (B, N, C) tokens, got shape {tuple(x.shape)}')


class Point(NamedTuple):
    """A place to read a feature map: the module, its input ('pre') or output ('post'), a kind, prefix tokens."""
    module: nn.Module
    where: str
    kind: str
    prefix: int


def _is_msa(module: nn.Module) -> bool:
    return hasattr(module, 'attn') and not hasattr(module, 'mlp') and not hasattr(module, 'conv1')


def feature_points(model: nn.Module) -> 'OrderedDict[str, Point]':
    """Where to read feature maps, ``name -> Point``, in forward order.

    * timm ViTs (``blocks`` of ``Block`` with ``norm2``): the patch embedding, then for each block the
      tokens after the MSA residual (the input of ``norm2``, kind ``msa``) and after the MLP residual
      (the block output, kind ``mlp``), as how-do-vits-work Fig. 8/9 split them;
    * staged models (``stages.i.blocks.j``, e.g. AlterNet, timm's ResNetV2): the stem and every block,
      kind ``msa`` for blocks with an ``attn`` and no MLP or conv, ``conv`` otherwise;
    * anything else: every module named ``blocks.N`` or ``layers.N`` (kind ``block``).
    """
    points: 'OrderedDict[str, Point]' = OrderedDict()
    named = dict(model.named_modules())
    for stem in ('patch_embed', 'stem'):
        if stem in named:
            points[stem] = Point(named[stem], 'post', 'stem', 0)
            break
    prefix = num_prefix_tokens(model)
    blocks = getattr(model, 'blocks', None)
    if isinstance(blocks, nn.Sequential) and all(hasattr(b, 'norm2') and hasattr(b, 'attn') for b in blocks):
        for i, block in enumerate(blocks):
            points[f'blocks.{i}.msa'] = Point(block.norm2, 'pre', 'msa', prefix)
            points[f'blocks.{i}.mlp'] = Point(block, 'post', 'mlp', prefix)
        return points
    pattern = re.compile(r'^(stages\.\d+\.blocks\.\d+|blocks\.\d+|layers\.\d+)$')
    for name, module in model.named_modules():
        if pattern.match(name):
            kind = ('msa' if _is_msa(module) else 'conv') if name.startswith('stages') else 'block'
            points[name] = Point(module, 'post', kind, prefix)
    if len(points) <= 1:
        raise ValueError(
            f'{type(model).__name__} has no blocks that timm_ext.analysis recognises (blocks.N, stages.N.blocks.M, '
            f'layers.N): pass the modules to read with modules=')
    return points


def select_points(
        model: nn.Module, modules: Optional[Sequence[str]] = None,
) -> 'OrderedDict[str, Point]':
    """``feature_points(model)`` or, with ``modules``, those named modules' outputs (kind ``module``)."""
    if modules is None:
        return feature_points(model)
    named = dict(model.named_modules())
    missing = [m for m in modules if m not in named]
    if missing:
        raise ValueError(f'{type(model).__name__} has no module {missing[0]!r}; use names from model.named_modules()')
    prefix = num_prefix_tokens(model)
    return OrderedDict((m, Point(named[m], 'post', 'module', 0 if m == 'patch_embed' else prefix)) for m in modules)


def capture(points: Dict[str, Point], fn: Callable[[str, torch.Tensor], None],
            handles: List[Any]) -> None:
    """Register hooks that call ``fn(name, tensor)`` with each point's input ('pre') or output ('post')."""
    for name, (module, where, _, _) in points.items():
        if where == 'pre':
            handles.append(module.register_forward_pre_hook(lambda m, args, n=name: fn(n, args[0])))
        else:
            handles.append(module.register_forward_hook(
                lambda m, args, out, n=name: fn(n, out[0] if isinstance(out, (tuple, list)) else out)))


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mean_loss(model: nn.Module, loss_fn: LossFn, batches: Sequence[Batch]) -> float:
    """The loss over ``batches``, each batch weighted by its size (no grad, the model's current mode)."""
    device = model_device(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            n = x.shape[0]
            total += float(loss_fn(model(x.to(device)), y.to(device))) * n
            count += n
    return total / count
