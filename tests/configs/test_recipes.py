"""Classification recipes hold the weight-decay rule of their official code: timm's
create_optimizer (DeiT / CaiT / XCiT / ConViT main.py) exempts 1-D parameters, biases and
the names the model lists in no_weight_decay(). Checked on the optimizer each config builds
for a downsized model, parameter by parameter."""
import re

import pytest
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS, DefaultScope

from vitdense.model_factory import register_host

from common import REPO_ROOT


def _built(config: str):
    cfg = Config.fromfile(str(REPO_ROOT / config))
    register_host(cfg)
    cfg.model.pop('teacher', None)
    backbone = cfg.model.backbone
    arch = MODELS.get(backbone.type).resolve_arch(backbone.arch)
    arch.update(num_layers=4, embed_dims=8 * arch['num_heads'])
    if 'num_local_layers' in arch:
        arch['num_local_layers'] = 2
    backbone.update(arch=arch)
    cfg.model.head.in_channels = arch['embed_dims']
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
        return model, build_optim_wrapper(model, cfg.optim_wrapper)


# our names of the official models' no_weight_decay() entries that they have
OFFICIAL_SKIP = {
    'configs/xcit/xcit-s12-p16_8xb128_in1k.py': {'backbone.cls_token'},
    'configs/cait/cait-xxs24_8xb128_in1k.py': {'backbone.cls_token', 'backbone.pos_embed.weight'},
    'configs/convit/convit-s_8xb128_in1k.py': {'backbone.cls_token', 'backbone.pos_embed.weight'},
}


@pytest.mark.parametrize('config', sorted(OFFICIAL_SKIP))
def test_weight_decay_is_the_official_codes(config):
    model, optim_wrapper = _built(config)
    names = {id(p): n for n, p in model.named_parameters()}
    exempt = {names[id(p)] for g in optim_wrapper.optimizer.param_groups for p in g['params']
              if g.get('weight_decay', optim_wrapper.optimizer.defaults['weight_decay']) == 0}
    official = {name for name, param in model.named_parameters()
                if param.ndim == 1 or name.endswith('.bias') or name in OFFICIAL_SKIP[config]}
    assert exempt == official


A2_CONFIGS = sorted(str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob('configs/vit/*-a2*.py'))


@pytest.mark.parametrize('config', A2_CONFIGS)
def test_a2_recipes_spare_flat_params_position_and_class_token(config):
    """The "Three things" A2 recipes decay as timm's create_optimizer does in the DeiT code:
    no decay on 1-D parameters (norms, biases, LayerScale), the position embedding and the
    class token; every other parameter decays at the optimizer's rate. Parallel blocks
    stack their branches' parameters: a (branches, ...) tensor is 1-D per branch when one
    branch's slice has at most one dimension longer than 1."""
    model, optim_wrapper = _built(config)
    branches = model.backbone.arch['num_parallel']

    def flat(name: str, param) -> bool:
        if branches > 1 and name.startswith('backbone.blocks.'):
            param = param[0].squeeze()
        return param.ndim <= 1

    names = {id(p): n for n, p in model.named_parameters()}
    rate = optim_wrapper.optimizer.defaults['weight_decay']
    decay = {names[id(p)]: g.get('weight_decay', rate)
             for g in optim_wrapper.optimizer.param_groups for p in g['params']}
    assert sorted(decay) == sorted(names.values())
    spared = {name for name, param in model.named_parameters()
              if flat(name, param) or name in ('backbone.pos_embed.weight', 'backbone.cls_token')}
    assert {'backbone.pos_embed.weight', 'backbone.cls_token'} <= set(names.values())
    assert {name for name, value in decay.items() if value == 0} == spared
    assert rate > 0 and all(value == rate for name, value in decay.items() if name not in spared)


CONFIG_FILES = sorted(REPO_ROOT.glob('configs/**/*.py'))
SETS_WEIGHT_DECAY = re.compile(r'paramwise_cfg|weight_decay\s*=')


@pytest.mark.parametrize('config', CONFIG_FILES,
                         ids=lambda p: str(p.relative_to(REPO_ROOT / 'configs')))
def test_weight_decay_is_described_where_it_is_set(config):
    """Which weight decay a recipe trains with, and from which source (docs/recipes.md), is
    said once: in the config piece that sets it (a schedule base, or a leaf overriding it),
    not again in the configs that inherit it."""
    lines = config.read_text().splitlines()
    comments = ' '.join(line for line in lines if line.lstrip().startswith('#')).lower()
    code = '\n'.join(line for line in lines if not line.lstrip().startswith('#'))
    described = 'weight decay' in comments or 'weight-decay' in comments
    assert described == bool(SETS_WEIGHT_DECAY.search(code))
