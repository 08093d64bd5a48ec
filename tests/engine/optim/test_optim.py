"""LayerDecayOptimWrapperConstructor and TimeBudgetHook on real backbones and a real Runner."""
import copy
import re

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.optim import build_optim_wrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, DefaultScope
from mmengine.runner import Runner
from torch import nn

from vitdense.analysis.memory import load_config
from vitdense.checkpoint_io import safe_load
from vitdense.model_factory import build_model
from vitdense.models import CaiT, XCiT
from vitdense.registry import HOOKS

from common import CONFIGS, TINY_ARCH, IterationClock, groups_by_parameter_name


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


def _weight_decay(group: dict) -> float:
    return group.get('weight_decay', 0.05)


def test_no_decay_on_flat_params_and_backbone_names():
    model = Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))
    groups = groups_by_parameter_name(model, _build(model).optimizer)
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
    wrapper = _build(model, weight_decay_rule='custom_keys',
                     custom_keys={'norm': dict(decay_mult=0.)})
    groups = groups_by_parameter_name(model, wrapper.optimizer)
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
    groups = groups_by_parameter_name(model, _build(model, layer_decay_rate=0.5).optimizer)
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
    # without decay any backbone works: the weights decay, the biases (1-D) do not
    assert len(_build(model).optimizer.param_groups) == 2


def _layer_decay_detector(seed: int = 0, family: type = XCiT) -> Detector:
    torch.manual_seed(seed)
    return Detector(family(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN')))


def _build_optimizer(model: nn.Module, optimizer: dict):
    return _build(model, layer_decay_rate=0.8) if optimizer is None else \
        OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
            type='vitdense.LayerDecayOptimWrapperConstructor',
            optim_wrapper_cfg=dict(type='OptimWrapper', optimizer=optimizer),
            paramwise_cfg=dict(layer_decay_rate=0.8)))(model)


def _per_tensor(model: nn.Module, optim_wrapper) -> torch.optim.Optimizer:
    """The layout before groups were merged: one group per parameter, in the model's
    order, each with its merged group's options."""
    groups = groups_by_parameter_name(model, optim_wrapper.optimizer)
    optimizer = optim_wrapper.optimizer
    return type(optimizer)([dict({k: v for k, v in groups[name].items() if k != 'params'},
                                 params=[param]) for name, param in model.named_parameters()],
                           **{k: v for k, v in optimizer.defaults.items()
                              if k not in ('differentiable', 'decoupled_weight_decay')})


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(2, 3, 32, 32, generator=generator), mode='loss')['loss'].backward()
        optimizer.step()


def test_groups_merge_where_every_option_is_equal():
    """One group per (depth, weight decay) pair under layer decay; each parameter keeps the
    options it had alone."""
    model = _layer_decay_detector()
    optim_wrapper = _build(model, layer_decay_rate=0.8)
    groups = optim_wrapper.optimizer.param_groups
    options = [(g['lr'], g['weight_decay']) for g in groups]
    assert len(set(options)) == len(options)  # merged: no two groups alike
    depths = {model.backbone.get_layer_depth(n, 'backbone.')[0]
              for n, _ in model.named_parameters() if n.startswith('backbone.')}
    assert len(groups) <= 2 * len(depths) + 2  # (depth, decay) pairs, and the head's
    assert len(groups) < sum(1 for _ in model.parameters()) // 4
    params = [p for g in groups for p in g['params']]
    assert sorted(map(id, params)) == sorted(id(p) for p in model.parameters())
    by_name = groups_by_parameter_name(model, optim_wrapper.optimizer)
    assert by_name['backbone.blocks.3.mlp.fc1.weight']['lr'] == pytest.approx(1e-3 * 0.8)
    assert by_name['backbone.blocks.3.mlp.fc1.bias']['weight_decay'] == 0.0
    assert groups[0] is by_name[next(iter(dict(model.named_parameters())))]  # logged first


@pytest.mark.parametrize('optimizer', [
    None, dict(type='AdamW', lr=1e-3, weight_decay=0.05, foreach=True),
    dict(type='mmpretrain.Lamb', lr=1e-3, weight_decay=0.05),
    dict(type='vitdense.ShardedLamb', lr=1e-3, weight_decay=0.05)],
    ids=['AdamW', 'AdamW-foreach', 'Lamb', 'ShardedLamb'])
@pytest.mark.parametrize('family', [XCiT, CaiT], ids=['XCiT', 'CaiT'])
def test_merged_groups_train_as_one_group_per_tensor(optimizer, family):
    """Five steps of merged groups and of one group per tensor (the same options): the same
    weights to the bit (CaiT: its class-attention stage and talking heads too). AdamW steps
    each tensor alone; LAMB's global gradient norm adds the tensors' squares in another order,
    which measured bit-identical here too."""
    merged_model = _layer_decay_detector(family=family)
    per_tensor_model = _layer_decay_detector(family=family)
    merged = _build_optimizer(merged_model, optimizer).optimizer
    per_tensor = _per_tensor(per_tensor_model, _build_optimizer(per_tensor_model, optimizer))
    assert len(per_tensor.param_groups) > 4 * len(merged.param_groups)
    _train(merged_model, merged, 5, seed=1)
    _train(per_tensor_model, per_tensor, 5, seed=1)
    for (name, ours), theirs in zip(merged_model.state_dict().items(),
                                    per_tensor_model.state_dict().values()):
        assert torch.equal(ours, theirs), name


def test_state_saved_one_group_per_tensor_resumes_exactly_on_merged_groups():
    """An older checkpoint's optimizer state (one group per tensor, its lr scheduled) loads
    onto the merged groups through the wrapper, as ``Runner.resume`` loads it, and training
    goes on exactly as it would have."""
    old_model = _layer_decay_detector()
    old = _per_tensor(old_model, _build(old_model, layer_decay_rate=0.8))
    _train(old_model, old, 3, seed=1)
    for group in old.param_groups:  # as a scheduler leaves them
        group['initial_lr'], group['lr'] = group['lr'], group['lr'] * 0.5
    saved = copy.deepcopy(old.state_dict())
    model = _layer_decay_detector()
    model.load_state_dict(old_model.state_dict())
    optim_wrapper = _build(model, layer_decay_rate=0.8)
    optim_wrapper.load_state_dict(saved)
    assert len(optim_wrapper.param_groups) < len(saved['param_groups'])
    lr = {n: g['lr'] for n, g in groups_by_parameter_name(model, optim_wrapper.optimizer).items()}
    assert lr == {n: g['lr'] for n, g in zip(dict(model.named_parameters()), old.param_groups)}
    _train(old_model, old, 2, seed=2)
    _train(model, optim_wrapper.optimizer, 2, seed=2)
    for (name, ours), theirs in zip(model.state_dict().items(), old_model.state_dict().values()):
        assert torch.equal(ours, theirs), name
    # a state dict of the merged layout loads as it is
    again = _build(_layer_decay_detector(), layer_decay_rate=0.8)
    again.load_state_dict(copy.deepcopy(optim_wrapper.state_dict()))
    assert again.optimizer.state_dict()['state'].keys() == \
        optim_wrapper.optimizer.state_dict()['state'].keys()


def test_state_that_cannot_map_onto_the_merged_groups_is_refused():
    model = _layer_decay_detector()
    old = _per_tensor(model, _build(model, layer_decay_rate=0.8))
    _train(model, old, 1, seed=1)
    saved = old.state_dict()
    with pytest.raises(ValueError, match='saved with another paramwise_cfg'):
        _build(model).load_state_dict(copy.deepcopy(saved))  # saved with layer decay
    with pytest.raises(ValueError, match='16 parameter groups.*another model'):
        _build(model, layer_decay_rate=0.8).load_state_dict(
            dict(saved, param_groups=saved['param_groups'][:16]))
    swapped = copy.deepcopy(saved)  # two parameters' state exchanged: shapes disagree
    state = swapped['state']
    state[0], state[1] = state[1], state[0]
    with pytest.raises(ValueError, match="'exp_avg' of parameter 0 has shape"):
        _build(model, layer_decay_rate=0.8).load_state_dict(swapped)


@pytest.mark.parametrize('config,tensors,groups', [
    ('vit/mask-rcnn_vit-b-p16_fpn_3x_coco.py', 198, 2),
    ('cait/mask-rcnn_cait-s24-p16_fpn_3x_coco.py', 485, 2),
    ('cait/mask-rcnn_cait-s24-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py', 557, 2 * 26),
    ('cait/cait-s24_8xb128_in1k.py', 472, 2),
])
def test_shipped_configs_group_tensors_by_learning_rate_and_decay(config, tensors, groups):
    """The shipped configs' optimizers, built as configured: with and without weight decay
    (and, under layer decay, per depth: CaiT-S24's 24 blocks, its class-attention blocks
    and the embedding share 24 + 1 + 1 depths), not one group per tensor."""
    cfg = load_config(str(CONFIGS / config))
    model = build_model(cfg, 'count', device='meta')
    optim_cfg = {k: v for k, v in cfg.optim_wrapper.items()
                 if k not in ('type', 'dtype', 'loss_scale')}  # AMP needs a GPU to build
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        optimizer = build_optim_wrapper(model, optim_cfg).optimizer
    assert sum(len(g['params']) for g in optimizer.param_groups) == tensors
    assert len(optimizer.param_groups) == groups
    options = {(g['lr'], g['weight_decay']) for g in optimizer.param_groups}
    assert len(options) == groups


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


class _SameImages(torch.utils.data.Dataset):
    """The same images at every index: a run's batches do not depend on the sampler's
    place, which a resumed run does not restore by itself."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return dict(inputs=torch.linspace(-1, 1, 3 * 32 * 32).view(3, 32, 32) * (index + 1))


def _runner(tmp_path, constructor: str, max_iters: int, **runner_args) -> Runner:
    torch.manual_seed(0)
    return Runner(
        model=Detector(XCiT(TINY_ARCH, patch_size=8, pyramid_norm_cfg=dict(type='BN'))),
        work_dir=str(tmp_path), experiment_name=f'{tmp_path.name}_{constructor}_{max_iters}',
        train_dataloader=dict(dataset=_SameImages(), batch_size=2,
                              collate_fn=dict(type='default_collate'),
                              sampler=dict(type='InfiniteSampler', shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(constructor=constructor,
                           optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
                           paramwise_cfg=dict(weight_decay_rule='custom_keys',
                                              flat_decay_mult=0.0)
                           if constructor.startswith('vitdense') else
                           dict(flat_decay_mult=0.0)),
        param_scheduler=dict(type='LinearLR', start_factor=0.1, by_epoch=False, end=4),
        default_hooks=dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', interval=2,
                                           by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1000)),
        randomness=dict(seed=0), **runner_args)


def test_runner_resumes_a_checkpoint_of_per_tensor_groups_exactly(tmp_path):
    """A run whose optimizer had one group per tensor (mmengine's own constructor, the same
    options) saves at iteration 2 and goes on to 4; the same run resumed from that
    checkpoint with merged groups ends with the same weights and optimizer state."""
    old = _runner(tmp_path / 'old', 'DefaultOptimWrapperConstructor', 4)
    old.train()
    old_groups = old.optim_wrapper.optimizer.param_groups
    assert len(old_groups) == sum(1 for _ in old.model.parameters())
    resumed = _runner(tmp_path / 'new', 'vitdense.LayerDecayOptimWrapperConstructor', 4,
                      resume=True, load_from=str(tmp_path / 'old' / 'iter_2.pth'))
    resumed.train()
    groups = resumed.optim_wrapper.optimizer.param_groups
    assert resumed.iter == 4 and len(groups) == 2
    for (name, ours), theirs in zip(resumed.model.state_dict().items(),
                                    old.model.state_dict().values()):
        assert torch.equal(ours, theirs), name
    names = {id(p): n for n, p in resumed.model.named_parameters()}
    merged = {names[id(p)]: resumed.optim_wrapper.optimizer.state[p]
              for g in groups for p in g['params']}
    for (name, param) in old.model.named_parameters():
        ours, theirs = merged[name], old.optim_wrapper.optimizer.state[param]
        assert ours.keys() == theirs.keys(), name  # none for the pyramid levels left unused
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), name
    assert any(merged.values())
    assert {g['lr'] for g in groups} == {g['lr'] for g in old_groups}
