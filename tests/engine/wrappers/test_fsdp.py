"""Sharded training (``vitdense.ShardedRunner`` + ``vitdense.FullyShardedModel``, FSDP2) steps
as DDP does, with gradient clipping and LAMB on full-tensor norms, resumes exactly, writes the
checkpoint DDP writes, and refuses what it would silently change."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmpretrain.engine.optimizers import Lamb
from torch import nn

from benchmarks import fsdp_parity
from vitdense.engine import FullyShardedModel, ShardedLamb
from vitdense.engine.wrappers.fsdp import check_sharded_optimizer
from vitdense.engine.tool_config import check_cfg_options

from common import CONFIGS, RegressToOne


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group (FSDP needs a process group)."""
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_two_sharded_processes_train_as_ddp_and_resume_exactly(tmp_path):
    iters = 4
    results = fsdp_parity.compare(tmp_path, iters=iters)
    for name in ('adamw', 'lamb'):
        entry = results[name]
        assert len(entry['fsdp_losses']) == iters
        assert entry['loss_relative_difference'] < 1e-4, name
        assert entry['weight_difference'] < 1e-5, name
        # clipping acts (norm above max_norm), on the norm of the full gradients
        assert max(entry['grad_norms'].values()) > fsdp_parity.MAX_GRAD_NORM
        for i, norm in entry['grad_norms'].items():
            assert entry['fsdp_grad_norms'][i] == pytest.approx(norm, rel=1e-4), name
    assert results['lamb']['ddp_losses'] != results['adamw']['ddp_losses']
    resume = results['resume']
    assert sorted(resume['losses']) == [str(i) for i in range(iters // 2 + 1, iters + 1)]
    assert resume['loss_difference'] == 0 and resume['weight_difference'] == 0
    assert results['same_checkpoint_layout']


def test_lora_trains_sharded_as_under_ddp_with_the_trunk_frozen(tmp_path):
    """peft's layers inside sharded blocks: frozen base weights and trained adapters in one
    FSDP unit, on CPU with gloo."""
    results = fsdp_parity.compare_lora(tmp_path, iters=4)
    assert results['loss_relative_difference'] < 1e-4
    assert results['weight_difference'] < 1e-5
    assert results['frozen'] > 0 and results['frozen_change'] == 0
    changes = results['adapter_changes']
    assert len(changes) == results['adapters'] > 0 and min(changes.values()) > 0


def _lamb_steps(optimizer_cls: type, **options) -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 2))
    groups = [dict(params=[net[0].weight, net[2].weight]),
              dict(params=[net[0].bias, net[2].bias], weight_decay=0.0)]
    optimizer = optimizer_cls(groups, lr=1e-2, weight_decay=0.05, max_grad_norm=0.3, **options)
    for _ in range(4):
        net(torch.randn(5, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in net.parameters()]


@pytest.mark.parametrize('options', [dict(), dict(bias_correction=False, trust_clip=True),
                                     dict(always_adapt=True, grad_averaging=False)])
def test_sharded_lamb_is_mmpretrains_lamb_on_plain_tensors(options):
    for ours, theirs in zip(_lamb_steps(ShardedLamb, **options), _lamb_steps(Lamb, **options)):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_what_sharding_would_change_is_refused_naming_the_fix():
    params = [nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match="optimizer.type='vitdense.ShardedLamb'"):
        check_sharded_optimizer(OptimWrapper(Lamb(params)))
    with pytest.raises(ValueError, match="param_dtype='bfloat16'"):
        # built without its __init__, which asserts a GPU
        check_sharded_optimizer(AmpOptimWrapper.__new__(AmpOptimWrapper))
    check_sharded_optimizer(OptimWrapper(ShardedLamb(params)))


def test_a_model_without_blocks_to_shard_is_refused(gloo_group):
    with pytest.raises(ValueError, match='shard_classes=.* matches no module of RegressToOne'):
        FullyShardedModel(RegressToOne(nn.Linear(4, 1)))


def test_the_sharded_model_trains_only_under_the_sharded_runner(gloo_group):
    model = FullyShardedModel(fsdp_parity.TinyViTRegressor())
    assert isinstance(model.module.backbone.blocks[0].attn.qkv.weight.data,
                      torch.distributed.tensor.DTensor)
    with pytest.raises(RuntimeError, match="runner_type='vitdense.ShardedRunner'"):
        model.train_step(dict(inputs=torch.zeros(1, 3, 16, 16)), None)


def test_state_dict_holds_full_tensors_and_loads_back_sliced(gloo_group):
    torch.manual_seed(0)
    plain = fsdp_parity.TinyViTRegressor()
    sharded = FullyShardedModel(fsdp_parity.TinyViTRegressor())
    state = plain.state_dict()
    sharded.module.load_state_dict(state)
    saved = sharded.module.state_dict()
    assert saved.keys() == state.keys()
    for key, value in state.items():
        assert type(saved[key]) is torch.Tensor and torch.equal(saved[key], value), key


def test_bfloat16_compute_keeps_float32_parameters_and_gradients(gloo_group):
    model = FullyShardedModel(fsdp_parity.TinyViTRegressor(), param_dtype='bfloat16')
    batch = fsdp_parity.RandomImages()[0]
    outputs = {}
    handle = model.module.head.register_forward_hook(
        lambda module, args, out: outputs.update(head=out))
    loss = model.module(batch['inputs'][None], batch['targets'][None])['loss']
    handle.remove()
    loss.backward()
    assert outputs['head'].dtype == torch.bfloat16 and torch.isfinite(loss)
    weight = model.module.head.weight
    assert weight.dtype == torch.float32 and weight.grad.dtype == torch.float32


def test_the_recipe_turns_sharding_on_for_a_config(tmp_path):
    leaf = CONFIGS / 'vit/vit-l-p16_8xb256-a2_in1k.py'
    sharded = tmp_path / 'vit-l_fsdp.py'
    sharded.write_text(f"_base_ = ['{leaf}', '{CONFIGS / '_base_/fsdp.py'}']\n")
    cfg = Config.fromfile(str(sharded))
    assert cfg.runner_type == 'vitdense.ShardedRunner'
    assert cfg.model_wrapper_cfg.type == 'vitdense.FullyShardedModel'
    assert cfg.model.backbone.arch == 'large'
    # the same keys as --cfg-options of the tools
    check_cfg_options(Config.fromfile(str(leaf)), {
        'runner_type': 'vitdense.ShardedRunner',
        'model_wrapper_cfg.type': 'vitdense.FullyShardedModel'}, str(leaf))


def test_activation_checkpointing_inside_sharded_blocks_gives_the_same_gradients(gloo_group):
    grads, calls = [], []
    for checkpointed in (frozenset(), frozenset(range(4))):  # with_cp=True: every block
        torch.manual_seed(0)
        model = FullyShardedModel(fsdp_parity.TinyViTRegressor())
        backbone = model.module.backbone
        backbone.checkpointed_blocks = checkpointed
        calls.append(0)
        backbone.blocks[0].register_forward_pre_hook(
            lambda *args: calls.__setitem__(-1, calls[-1] + 1))
        batch = fsdp_parity.RandomImages()[0]
        model.module(batch['inputs'][None], batch['targets'][None])['loss'].backward()
        grads.append({name: p.grad.full_tensor() for name, p in model.named_parameters()})
    assert calls == [1, 2]  # recomputed in backward
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=0, msg=name)
