"""One rank of the FSDP2 tests (tests/test_sharded.py), launched as ``python -m torch.distributed.run --standalone
--nproc-per-node 2 tests/_fsdp2_worker.py OUT``: a fresh interpreter per rank, so nothing an earlier test left in
the pytest process (threads, a process group) can hang the collectives. Rank 0 writes OUT/results.json."""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import closure  # tests/ is this script's folder
from torch.distributed.fsdp import fully_shard

from timm_ext.optim import GSAM, SAM, LookSAM

FAMILIES = {
    'sam': (SAM, dict(rho=0.2)),
    'asam': (SAM, dict(rho=0.5, adaptive=True)),
    'gsam': (GSAM, dict(rho_max=0.3, rho_min=0.1, alpha=0.4)),
    'looksam': (LookSAM, dict(rho=0.2, alpha=0.5, interval=2)),
    'interval': (SAM, dict(rho=0.2, interval=2)),
}
STEPS = 4


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 4))


def batches():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]


def optimizer_for(name, model, **overrides):
    family, kwargs = FAMILIES[name]
    return family(torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01), model=model,
                  **(overrides if overrides else kwargs))


def train(model, opt, data, part=lambda t: t):
    for x, y in data:
        opt.step(closure(model, opt, part(x), part(y)))


def full_weights(model):
    return [(p.full_tensor() if hasattr(p, 'full_tensor') else p).detach().clone() for p in model.parameters()]


def shard(model):
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def main(out: str) -> None:
    dist.init_process_group('gloo')
    results = run(out, dist.get_rank(), dist.get_world_size())
    gc.collect()  # the FSDP2 modules go before their process group (torch 2.14's gloo may abort at exit otherwise)
    if dist.get_rank() == 0:
        with open(os.path.join(out, 'results.json'), 'w') as f:
            json.dump(results, f)
    dist.destroy_process_group()


def run(out: str, rank: int, world: int) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    half = lambda t: t.chunk(world)[rank]  # noqa: E731  (each rank: its part of the global batch)
    data = batches()
    results = {}
    for name in FAMILIES:
        model = shard(small_model())
        opt = optimizer_for(name, model)
        train(model, opt, data, half)
        results[name] = [t.tolist() for t in full_weights(model)]
        if name == 'sam':
            shard_bytes = sum(p.to_local().numel() * p.to_local().element_size() for p in model.parameters())
            results['extra_memory_shards'] = opt.extra_memory_bytes() / shard_bytes
    for name in ('sam', 'looksam', 'gsam'):  # 2 steps, a sharded checkpoint, 2 more in fresh objects
        model = shard(small_model())
        opt = optimizer_for(name, model)
        train(model, opt, data[:2], half)
        model_sd, optim_sd = get_state_dict(model, opt)
        path = os.path.join(out, f'ckpt_{name}')
        dcp.save({'model': model_sd, 'optim': optim_sd}, checkpoint_id=path)
        torch.manual_seed(1)
        model2 = shard(nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 4)))
        opt2 = FAMILIES[name][0](torch.optim.AdamW(model2.parameters(), lr=0.05, weight_decay=0.01), model=model2)
        model_sd, optim_sd = get_state_dict(model2, opt2)  # the family's defaults: the checkpoint must win
        state = {'model': model_sd, 'optim': optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model2, opt2, model_state_dict=state['model'], optim_state_dict=state['optim'])
        train(model2, opt2, data[2:], half)
        results[f'resumed_{name}'] = [t.tolist() for t in full_weights(model2)]
    model = shard(small_model())
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.1, m_sharpness=2, model=model)
    x, y = data[0]
    w = full_weights(model)

    def chunked(chunk):
        opt.zero_grad()
        xs, ys = chunk(half(x), half(y))
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        return loss
    try:
        opt.step(chunked)
        results['m_sharpness'] = 'ran'
    except ValueError as e:
        results['m_sharpness'] = str(e)
    results['m_sharpness_untouched'] = all(torch.equal(a, b) for a, b in zip(w, full_weights(model)))
    return results


if __name__ == '__main__':
    main(sys.argv[1])
