"""After ``timm-ext export --checkpoint CKPT --out DIR``: ``python .ci/hub_roundtrip.py CKPT DIR``.

The folder loads through timm's own ``local-dir:`` route, as a user of the hub would load it, and gives the
same logits as the model rebuilt from the train.py checkpoint. Also checks that timm_ext is imported from
this interpreter's environment (the installed wheel), not from a clone on the path.
"""
import sys
from pathlib import Path

import timm
import torch

import timm_ext
from timm_ext.hub import load_checkpoint


def main() -> int:
    checkpoint, folder = Path(sys.argv[1]), Path(sys.argv[2])
    where = Path(timm_ext.__file__).resolve()
    if not where.is_relative_to(Path(sys.prefix).resolve()):
        print(f'hub_roundtrip: timm_ext comes from {where}, not from this environment ({sys.prefix})', file=sys.stderr)
        return 1
    ckpt = load_checkpoint(checkpoint)
    reference = timm.create_model(ckpt.arch, **ckpt.model_kwargs())
    reference.load_state_dict(ckpt.state_dict)
    loaded = timm.create_model(f'local-dir:{folder}', pretrained=True)
    size = loaded.pretrained_cfg['input_size']
    x = torch.randn(4, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = reference.eval()(x), loaded.eval()(x)
    if not torch.equal(expected, got):
        print(f'hub_roundtrip: local-dir:{folder} differs from {checkpoint} by '
              f'{(expected - got).abs().max().item():.3g}', file=sys.stderr)
        return 1
    print(f'hub_roundtrip: local-dir:{folder} ({ckpt.arch}, input {tuple(size)}) gives the checkpoint\'s logits '
          f'exactly; timm_ext from {where.parent}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
