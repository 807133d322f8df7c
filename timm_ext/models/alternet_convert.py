""" Convert a state_dict of the official AlterNet code (xxxnell/how-do-vits-work) to timm-ext's layout.

Strict by design, because no official AlterNet checkpoint exists and people convert what they
trained themselves: every official key must be consumed, every key of the target model filled and
every shape equal, otherwise one ``ValueError`` lists all that does not match.

Layout differences handled here (official -> ours):
  * ``layer0.layer0.0`` -> ``stem.conv``; ``layer{s}.{i}`` -> ``stages.{s-1}.blocks.{i}``;
  * Conv blocks: ``bn`` / ``conv2.0`` / ``conv3.0`` -> ``norm1`` / ``norm2`` / ``norm3``,
    ``conv2.2`` / ``conv3.2`` -> ``conv2`` / ``conv3``, ``shortcut.0`` -> ``downsample.conv``;
  * MSA blocks: ``conv`` -> ``proj_in``; the 1x1-conv ``to_q`` and ``to_kv`` (K then V) become one
    Linear ``qkv`` (Q, K, V; head-major channels on both sides); ``to_out.0`` -> Linear ``proj``;
    ``pos_embedding`` (2w-1, 2w-1), indexed by key minus query position, becomes the flat
    ``relative_position_bias_table`` in timm's Swin orientation (query minus key), i.e. flipped;
  * head: ``classifier.0.bn`` -> ``norm``, ``classifier.0.dense`` -> ``head.fc``.
A ``module.`` prefix (DataParallel) and a ``{'state_dict': ...}`` wrapper are accepted.
"""
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

__all__ = ['convert_official_alternet', 'is_official_alternet_state_dict']

_BLOCK_KEY = re.compile(r'^layer([1-9]\d*)\.(\d+)\.(.+)$')
_HEAD_KEY = re.compile(r'^classifier\.0\.(bn|dense)\.(.+)$')
# official sub-key prefix inside a block -> ours (plain renames; the MSA attention is handled apart)
_BLOCK_RENAMES = (
    ('bn.', 'norm1.'),
    ('conv2.0.', 'norm2.'),
    ('conv2.2.', 'conv2.'),
    ('conv3.0.', 'norm3.'),
    ('conv3.2.', 'conv3.'),
    ('shortcut.0.', 'downsample.conv.'),
    ('conv.', 'proj_in.'),
    ('conv1.', 'conv1.'),
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.attn.to_out.0.', 'attn.proj.'),
)
_MAX_LISTED = 20


def is_official_alternet_state_dict(state_dict: Mapping[str, Any]) -> bool:
    """True when the keys are the official code's (its stem is ``layer0.layer0.0``)."""
    return any(_strip_module(k).startswith('layer0.layer0.') for k in state_dict)


def _strip_module(key: str) -> str:
    return key[len('module.'):] if key.startswith('module.') else key


def _rename(key: str) -> Optional[str]:
    """Our key for an official key whose tensor only needs renaming (1x1 convs are reshaped later)."""
    if key == 'layer0.layer0.0.weight':
        return 'stem.conv.weight'
    match = _HEAD_KEY.match(key)
    if match:
        return f'{"norm" if match.group(1) == "bn" else "head.fc"}.{match.group(2)}'
    match = _BLOCK_KEY.match(key)
    if not match:
        return None
    stage, block, rest = int(match.group(1)) - 1, match.group(2), match.group(3)
    prefix = f'stages.{stage}.blocks.{block}.'
    if rest == 'attn.pos_embedding':
        return prefix + 'attn.relative_position_bias_table'
    for old, new in _BLOCK_RENAMES:
        if rest.startswith(old):
            return prefix + new + rest[len(old):]
    return None


def _as_linear(weight: torch.Tensor) -> Optional[torch.Tensor]:
    """A 1x1 conv weight (out, in, 1, 1) as a Linear weight (out, in); None if it is not 1x1."""
    if weight.ndim != 4 or tuple(weight.shape[2:]) != (1, 1):
        return None
    return weight.reshape(weight.shape[0], weight.shape[1])


def _shape(t: torch.Tensor) -> Tuple[int, ...]:
    return tuple(t.shape)


def _listing(title: str, items: List[str]) -> List[str]:
    if not items:
        return []
    shown = items[:_MAX_LISTED] + ([f'... and {len(items) - _MAX_LISTED} more'] if len(items) > _MAX_LISTED else [])
    return [f'  {title} ({len(items)}):'] + [f'    {item}' for item in shown]


def convert_official_alternet(
        state_dict: Mapping[str, Any],
        model: nn.Module,
) -> Dict[str, torch.Tensor]:
    """ Official AlterNet state_dict -> a state_dict that ``model.load_state_dict(..., strict=True)`` accepts.

    ``model`` must be built like the checkpoint's model (depth, msa_blocks, window_size, num_classes,
    stem); it is only read. Raises ValueError listing every unknown, unused, missing or mis-shaped key.
    """
    if 'state_dict' in state_dict and not torch.is_tensor(state_dict['state_dict']):
        state_dict = state_dict['state_dict']
    target = model.state_dict()
    converted: Dict[str, torch.Tensor] = {}
    unknown, unused, bad_shapes = [], [], []
    qkv_parts: Dict[str, Dict[str, Tuple[str, torch.Tensor]]] = {}

    def put(new_key: str, value: torch.Tensor, source: str) -> None:
        if new_key not in target:
            unused.append(f'{source} -> {new_key}')
        elif _shape(value) != _shape(target[new_key]):
            bad_shapes.append(f'{source} {_shape(state_dict_raw[source])} -> {new_key}: '
                              f'converted {_shape(value)}, model expects {_shape(target[new_key])}')
        else:
            converted[new_key] = value.detach().clone()

    state_dict_raw = {_strip_module(k): v for k, v in state_dict.items()}
    for key, value in state_dict_raw.items():
        match = _BLOCK_KEY.match(key)
        if match and match.group(3) in ('attn.attn.to_q.weight', 'attn.attn.to_kv.weight'):
            prefix = f'stages.{int(match.group(1)) - 1}.blocks.{match.group(2)}.attn.qkv.weight'
            qkv_parts.setdefault(prefix, {})[match.group(3).split('.')[-2]] = (key, value)
            continue
        new_key = _rename(key)
        if new_key is None:
            unknown.append(f'{key} {_shape(value)}')
        elif new_key.endswith('relative_position_bias_table'):
            # official bias[q, k] = P[k - q + w - 1]; ours table[q - k + w - 1]: the same table flipped
            put(new_key, value.flip(0, 1).reshape(-1) if value.ndim == 2 else value, key)
        elif new_key.endswith(('attn.proj.weight', 'head.fc.weight')) and value.ndim == 4:
            linear = _as_linear(value)
            put(new_key, value if linear is None else linear, key)
        else:
            put(new_key, value, key)

    for new_key, parts in qkv_parts.items():
        if set(parts) != {'to_q', 'to_kv'}:
            for key, value in parts.values():
                unknown.append(f'{key} {_shape(value)} (to_q and to_kv must come together)')
            continue
        (q_key, q), (kv_key, kv) = parts['to_q'], parts['to_kv']
        q_lin, kv_lin = _as_linear(q), _as_linear(kv)
        if q_lin is None or kv_lin is None or q_lin.shape[1] != kv_lin.shape[1]:
            bad_shapes.append(f'{q_key} {_shape(q)} + {kv_key} {_shape(kv)} -> {new_key}: '
                              f'expected 1x1 convs (k=1, no KV downsampling) of equal input width')
            continue
        put(new_key, torch.cat([q_lin, kv_lin], dim=0), q_key)

    missing = [f'{k} {_shape(v)}' for k, v in target.items() if k not in converted]
    if unknown or unused or bad_shapes or missing:
        lines = [f'Official AlterNet state_dict does not match {type(model).__name__} '
                 f'(build the model with the checkpoint\'s depth, msa_blocks, window_size, num_classes and stem):']
        lines += _listing('official keys with no counterpart in our layout', unknown)
        lines += _listing('official keys whose converted key the model lacks', unused)
        lines += _listing('shape mismatches', bad_shapes)
        lines += _listing('model keys not filled by the checkpoint', missing)
        raise ValueError('\n'.join(lines))
    return converted
