"""The model index (model-index.yml, configs/*/metafile.yml) covers every shipped config, its
parameter counts are the built models', its FLOPs those of the papers where they report
them, and the README's model-zoo tables are generated from it."""
from pathlib import Path

import pytest
import yaml
from mmengine.config import Config

from tools import model_index
from vitdense.analysis import complexity

from common import REPO_ROOT

CONFIGS = [str(p.relative_to(REPO_ROOT)) for p in model_index.shipped_configs()]


def _entries() -> dict:
    return {model['Config']: model for family in model_index.COLLECTIONS
            for model in model_index.load_metafile(family)['Models']}


def test_every_shipped_config_is_in_the_index_once():
    index = yaml.safe_load((REPO_ROOT / 'model-index.yml').read_text())
    assert index['Import'] == [f'configs/{family}/metafile.yml'
                               for family in model_index.COLLECTIONS]
    indexed = [model['Config'] for family in model_index.COLLECTIONS
               for model in model_index.load_metafile(family)['Models']]
    assert sorted(indexed) == CONFIGS
    for family, collection in model_index.COLLECTIONS.items():
        metafile = model_index.load_metafile(family)
        assert [c['Name'] for c in metafile['Collections']] == [collection['Name']]
        for model in metafile['Models']:
            assert model['In Collection'] == collection['Name']
            assert model['Name'] == Path(model['Config']).stem
            assert Path(model['Config']).parent.name == family


@pytest.mark.parametrize('config', CONFIGS)
def test_index_parameters_are_the_built_models(config):
    """Built on the meta device: the full-size models without memory or initialisation."""
    cfg = complexity.load_config(str(REPO_ROOT / config))
    model = complexity.build_model(cfg, device='meta')
    assert _entries()[config]['Metadata']['Parameters'] == complexity.count_parameters(model)


# FLOPs (×1e9) of the papers' tables at 224 × 224: XCiT Table 1, CaiT Table 3
PAPER_GFLOPS = {
    'xcit-t12-p16_8xb128_in1k': 1.2, 'xcit-t24-p16_8xb128_in1k': 2.3,
    'xcit-s12-p16_8xb128_in1k': 4.8, 'xcit-s24-p16_8xb128_in1k': 9.1,
    'xcit-m24-p16_8xb128_in1k': 16.2, 'xcit-l24-p16_8xb128_in1k': 36.1,
    'cait-xxs24_8xb128_in1k': 2.5, 'cait-xxs36_8xb128_in1k': 3.7,
    'cait-xs24_8xb128_in1k': 5.4, 'cait-s24_8xb128_in1k': 9.4,
    'cait-s36_8xb128_in1k': 13.9, 'cait-m36_8xb128_in1k': 53.7,
}


@pytest.mark.parametrize('name', sorted(PAPER_GFLOPS))
def test_index_flops_are_the_papers(name):
    """Our counts round to the papers' (within 1%: the papers' own counters differ in what
    they include). ViT and ConViT are left out: the papers count the full last block, which
    our classifiers run for the class token only."""
    family = name.split('-')[0]
    flops = _entries()[f'configs/{family}/{name}.py']['Metadata']['FLOPs']
    assert abs(flops / 1e9 - PAPER_GFLOPS[name]) <= 0.1 + 0.01 * PAPER_GFLOPS[name]


@pytest.mark.parametrize('config, shape', [
    ('configs/xcit/xcit-t12-p16_8xb128_in1k.py', [224, 224]),
    ('configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', [160, 160]),
    ('configs/xcit/upernet_xcit-d6-p8_demo-ade.py', [128, 128]),
])
def test_get_flops_counts_the_model_of_a_config(config, shape):
    """The tool itself on a classifier, a detector and a segmentor: the index holds what it
    measures, at the input size of the config's test data."""
    result = complexity.analyse(str(REPO_ROOT / config))
    entry = _entries()[config]['Metadata']
    assert result['shape'] == shape and entry['Input Size'] == f'{shape[0]}x{shape[1]}'
    assert (result['params'], result['flops']) == (entry['Parameters'], entry['FLOPs'])


def test_get_flops_counts_attention():
    """A ViT block's multiply-adds by hand: qkv, projection and MLP maps (12 D² per token)
    and the two attention products (2 N² D), counted for the whole model."""
    import torch
    from vitdense.models import ViT
    dims, tokens, layers = 64, 16 + 1, 2
    with torch.device('meta'):
        model = ViT(dict(embed_dims=dims, num_layers=layers, num_heads=2), patch_size=16,
                    img_size=64, out_type='avg_featmap', out_indices=[layers - 1])
    cfg = Config(dict(default_scope='mmpretrain'))

    class Tensor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = model

        def forward(self, images, samples, mode):
            return self.backbone(images)

    flops = complexity.count_flops(Tensor(), cfg, (64, 64))
    patches = 16 * 3 * 16 * 16 * dims
    blocks = layers * (12 * tokens * dims ** 2 + 2 * tokens ** 2 * dims)
    assert flops == patches + blocks


def test_readme_tables_are_generated_from_the_index():
    readme = (REPO_ROOT / 'README.md').read_text()
    assert model_index.readme_tables() in readme
    using, zoo = readme.index('\n## Using it'), readme.index('\n## Model zoo')
    assert using < zoo and '\n## ' not in readme[using + 1:zoo]


DENSE = [c for c in CONFIGS if model_index.is_dense(REPO_ROOT / c)]


def test_every_dense_config_fits_32_gib_per_gpu():
    """The index's training memory (tools/analysis_tools/memory.py) in the precision each
    config trains in: 32 GB GPUs, as the official XCiT dense recipes."""
    for config in DENSE:
        memory = _entries()[config]['Metadata']['Training Memory']
        cfg = get_flops.load_config(str(REPO_ROOT / config))
        amp = cfg.optim_wrapper.get('type') == 'AmpOptimWrapper'
        assert memory['Precision'] == ('AMP float16' if amp else 'float32'), config
        assert memory['Peak AMP (GiB)' if amp else 'Peak FP32 (GiB)'] <= 32, config


def test_index_memory_is_what_the_tool_measures():
    import memory  # tools/analysis_tools/memory.py
    config = 'configs/xcit/fpn_xcit-t12-p16_8xb2-80k_ade20k-512x512.py'
    entry = _entries()[config]['Metadata']['Training Memory']
    assert model_index.memory_entry(REPO_ROOT / config,
                                    memory.account(str(REPO_ROOT / config))) == entry
