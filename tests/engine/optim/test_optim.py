"""LayerDecayOptimWrapperConstructor and TimeBudgetHook on real backbones and a real Runner."""
import re

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.runner import Runner
from torch import nn

from vitdense.checkpoint_io import safe_load
from vitdense.models import XCiT
from vitdense.registry import HOOKS

from common import TINY_ARCH, IterationClock


class Detector(BaseModel):
    """A backbone plus a head, the shape of mmdet / mmseg / mmpretrain models."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Conv2d(backbone.embed_dims, 3, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.head(self.backbone(inputs)[0]).mean()
        return {'loss': out ** 2} if mode == 'loss' else out


def _build(model: nn.Module, **paramwise):
    return OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
        type='vitdense.LayerDecayOptimWrapperConstructor',
        optim_wrapper_cfg=dict(type='OptimWrapper',
                               optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)),
        paramwise_cfg=paramwise))(model)


def _groups_by_name(model: nn.Module, optim_wrapper) -> dict:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(g['params'][0])]: g for g in optim_wrapper.optimizer.param_groups}


def _weight_decay(group: dict) -> float:
    return group.get('weight_decay', 0.05)


def test_no_decay_on_flat_params_and_backbone_names():
    model = Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))
    groups = _groups_by_name(model, _build(model))
    assert len(groups) == sum(1 for _ in model.parameters())
    no_decay = {n for n, g in groups.items() if _weight_decay(g) == 0}
    flat = {n for n, p in model.named_parameters() if p.ndim <= 1}
    named = {'backbone.' + n for n in model.backbone.no_weight_decay()}
    assert 'backbone.blocks.0.attn.temperature' in named  # (heads, 1, 1): not flat
    assert no_decay == flat | named
    assert _weight_decay(groups['backbone.blocks.0.attn.qkv.weight']) == 0.05
    assert _weight_decay(groups['head.weight']) == 0.05
    assert all(g.get('lr', 1e-3) == 1e-3 for g in groups.values())  # decay rate 1: off


def test_custom_keys_rule_spares_only_the_keyed_names():
    """The official XCiT dense rule: custom_keys {'norm': decay_mult 0} and nothing else,
    so biases, BatchNorms, LayerScale, temperatures and the backbone's no_weight_decay()
    names decay (under the 'timm' rule above none of them would)."""
    model = Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))
    groups = _groups_by_name(model, _build(model, weight_decay_rule='custom_keys',
                                           custom_keys={'norm': dict(decay_mult=0.)}))
    no_decay = {n for n, g in groups.items() if _weight_decay(g) == 0}
    assert no_decay == {n for n, _ in model.named_parameters() if 'norm' in n}
    assert {'backbone.blocks.0.norm1.weight', 'backbone.blocks.0.norm_lpi.bias'} <= no_decay
    for name in ('backbone.blocks.0.attn.temperature', 'backbone.blocks.0.attn.qkv.bias',
                 'backbone.blocks.0.ls1.gamma', 'backbone.blocks.0.lpi.bn.weight', 'head.bias'):
        assert _weight_decay(groups[name]) == 0.05, name
    with pytest.raises(ValueError, match="weight_decay_rule must be one of .*'swin'"):
        _build(model, weight_decay_rule='swin')


def test_layer_wise_lr_decay_follows_get_layer_depth():
    model = Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))
    groups = _groups_by_name(model, _build(model, layer_decay_rate=0.5))
    num_ids = TINY_ARCH['num_layers'] + 2
    lr = {name: group['lr'] for name, group in groups.items()}
    assert lr['backbone.patch_embed.proj.0.0.weight'] == pytest.approx(1e-3 * 0.5 ** (num_ids - 1))
    assert lr['backbone.blocks.3.mlp.fc1.weight'] == pytest.approx(1e-3 * 0.5 ** 1)
    assert lr['backbone.pyramid.fpn1.0.weight'] == pytest.approx(1e-3)
    assert lr['head.weight'] == pytest.approx(1e-3)
    assert lr['backbone.blocks.0.norm1.weight'] < lr['backbone.blocks.1.norm1.weight']


def test_layer_decay_needs_get_layer_depth():
    model = Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))
    model.backbone = nn.Sequential(nn.Conv2d(3, 32, 8, 8))
    model.backbone.embed_dims = 32
    with pytest.raises(TypeError, match='get_layer_depth.*Sequential'):
        _build(model, layer_decay_rate=0.8)
    assert len(_build(model).optimizer.param_groups) == 4  # without decay any backbone works


class _Images(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return dict(inputs=torch.randn(3, 32, 32))


def _budgeted_runner(tmp_path, log_interval: int = 1000, **runner_args) -> Runner:
    """A tiny XCiT detector trained for 6 s of budget on a clock that reads one second per
    iteration (stand-in max_iters): 6 iterations."""
    return Runner(
        model=Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN'))),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=_Images(), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=100000),
        optim_wrapper=dict(constructor='vitdense.LayerDecayOptimWrapperConstructor',
                           optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)),
        custom_hooks=[IterationClock(),
                      dict(type='vitdense.TimeBudgetHook', minutes=0.1, warmup_iters=2,
                           clock='iterations')],
        default_hooks=dict(checkpoint=None,
                           logger=dict(type='LoggerHook', interval=log_interval)),
        **runner_args)


def test_time_budget_stops_training_and_anneals_lr(tmp_path, iteration_clock):
    # the last of the 6 iterations at 1/6 of the lr (2 warmup iterations, then linear decay
    # in the budget spent)
    runner = _budgeted_runner(tmp_path)
    model = runner.model
    runner.train()
    assert runner.iter == 6
    assert all(g['lr'] == pytest.approx(g['initial_lr'] / 6)
               for g in runner.optim_wrapper.param_groups)
    assert HOOKS.get('TimeBudgetHook') is not None
    saved = tmp_path / f'iter_{runner.iter}.pth'
    assert (tmp_path / 'last_checkpoint').read_text() == str(saved)
    state = safe_load(str(saved), map_location='cpu')['state_dict']
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())


def test_time_budget_log_shows_the_budget_not_the_stand_in_total(tmp_path, iteration_clock):
    # a name of its own: a runner made in the same second as another would share its logger
    runner = _budgeted_runner(tmp_path, log_interval=1, experiment_name=tmp_path.name,
                              log_processor=dict(type='vitdense.TimeBudgetLogProcessor',
                                                 by_epoch=False))
    runner.train()
    log = next(tmp_path.glob('*/*.log')).read_text()
    headers = re.findall(r'Iter\(train\) \[(\d+) \| (\d+\.\d\d)/0\.10 min\]', log)
    assert len(headers) == runner.iter == 6
    assert [int(step) for step, _ in headers] == list(range(1, runner.iter + 1))
    assert [float(spent) for _, spent in headers] == sorted(float(s) for _, s in headers)
    assert '/100000]' not in log
