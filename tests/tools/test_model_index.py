"""The model index (model-index.yml, configs/*/metafile.yml) covers every shipped config, its
parameter counts are the built models', its FLOPs the analytic multiply-add counts and,
at the papers' rounding, the papers' (or the difference is stated), and docs/model_zoo.md is generated from it."""
import functools
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from mmengine.config import Config

from tools import model_index
from vitdense.analysis import complexity
from vitdense.model_factory import build_model

from common import REPO_ROOT

CONFIGS = [str(p.relative_to(REPO_ROOT)) for p in model_index.shipped_configs()]


@functools.cache
def _entries() -> dict:
    """The index's models by config, parsed once for the module (its tests only read them)."""
    return {model['Config']: model for family in model_index.COLLECTIONS
            for model in model_index.load_metafile(family)['Models']}


@functools.cache
def _config(config: str) -> Config:
    """A shipped config as the tools read it, loaded once for the module: the tests that
    build its model and the one that reads its precision share it."""
    return complexity.load_config(str(REPO_ROOT / config))


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


#: every shipped config's parameters (names and shapes, in order) as first recorded, by
#: :func:`_parameter_digest`: a change of the code that builds them must leave them as they were
RECORDED_PARAMETERS = json.loads((Path(__file__).parent / 'shipped_config_parameters.json')
                                 .read_text())


def _parameter_digest(model) -> str:
    names_and_shapes = '\n'.join(f'{name}:{tuple(parameter.shape)}'
                                  for name, parameter in model.named_parameters())
    return hashlib.sha256(names_and_shapes.encode()).hexdigest()[:16]


@pytest.mark.parametrize('config', CONFIGS)
def test_index_parameters_are_the_built_models(config):
    """Built on the meta device: the full-size models without memory or initialisation; the
    parameters, name by name and shape by shape, as recorded."""
    model = build_model(_config(config), 'count', device='meta')
    assert _entries()[config]['Metadata']['Parameters'] == complexity.count_parameters(model)
    digest = _parameter_digest(model)
    assert config in RECORDED_PARAMETERS, (
        f'a new shipped config: add "{config}": "{digest}" to shipped_config_parameters.json')
    assert digest == RECORDED_PARAMETERS[config], (
        f'{config} builds other parameters (names or shapes) than recorded')


# FLOPs (x1e9) of the papers' tables at 224 x 224, and the arch (width d, heads, depth): XCiT
# Table 1, CaiT Table 3
PAPERS = {
    'cait-xxs24_8xb128_in1k': (2.5, (192, 4, 24)), 'cait-xxs36_8xb128_in1k': (3.7, (192, 4, 36)),
    'cait-xs24_8xb128_in1k': (5.4, (288, 6, 24)), 'cait-s24_8xb128_in1k': (9.4, (384, 8, 24)),
    'cait-s36_8xb128_in1k': (13.9, (384, 8, 36)), 'cait-m36_8xb128_in1k': (53.7, (768, 16, 36)),
    'xcit-t12-p16_8xb128_in1k': (1.2, (192, 4, 12)), 'xcit-t24-p16_8xb128_in1k': (2.3, (192, 4, 24)),
    'xcit-s12-p16_8xb128_in1k': (4.8, (384, 8, 12)), 'xcit-s24-p16_8xb128_in1k': (9.1, (384, 8, 24)),
    'xcit-m24-p16_8xb128_in1k': (16.2, (512, 8, 24)),
    'xcit-l24-p16_8xb128_in1k': (36.1, (768, 16, 24)),
}
# Where our count, rounded as the paper rounds, is not the paper's: (ours rounded, why). Our
# counts are the multiply-adds of the formulas below, exactly. The papers do not say how
# they counted; none of the conventions tried (LayerNorm or GELU counted, talking heads not
# counted, the class-attention FFN or query over all tokens, the class token in the
# self-attention stage) gives all 12 of their values, and their values are not one
# convention away from ours: CaiT XXS-36 lies below our count while S-24 and M-36 lie above.
NOT_THE_PAPERS = {
    'cait-xxs36_8xb128_in1k': (3.8, 'ours 3.756, the paper at most 3.75 (>= 0.15% less), though '
                               'its XXS-24 (2.5) and the 12 blocks between them (1.2) agree '
                               'with ours (2.523, 1.232)'),
    'cait-s24_8xb128_in1k': (9.3, 'ours 9.327, the paper at least 9.35 (>= 0.25% more); its '
                             'S-36 (13.9) agrees with ours (13.902)'),
    'cait-m36_8xb128_in1k': (53.4, 'ours 53.367, the paper 53.65-53.75 (0.5-0.7% more)'),
    'xcit-m24-p16_8xb128_in1k': (16.1, 'ours 16.084, the paper at least 16.15 (>= 0.4% more)'),
    'xcit-l24-p16_8xb128_in1k': (35.8, 'ours 35.787, the paper at least 36.05 (>= 0.7% more); '
                                 'T12-S24 round to the paper'),
}
PATCHES = (224 // 16) ** 2


def _class_attention(d: int) -> int:
    """A class-attention block (CaiT Sec. 3, Eq. 6-7): keys and values of the class token
    and patches, query, attention and projection of the class token, FFN of the class token."""
    tokens = PATCHES + 1
    return 2 * tokens * d * d + 2 * d * d + 2 * tokens * d + 8 * d * d


def analytic_flops(name: str) -> int:
    """Multiply-adds at 224 x 224, patch 16, 1000 classes, two class-attention blocks.

    CaiT (Sec. 2-3): patch embedding; per block qkv, projection and MLP (12 N d^2), the
    two attention products (2 N^2 d) and the talking-heads maps before and after the
    softmax (2 h^2 N^2). XCiT (Sec. 3.1): the convolutional stem (four 3x3 stride-2
    convolutions, d/8 -> d channels); the positional encoding (64 -> d); per block the same
    12 N d^2, cross-covariance attention per head (2 N (d/h)^2, h heads) and the two
    depth-wise 3x3 convolutions of the LPI (18 N d).
    """
    d, heads, depth = PAPERS[name][1]
    n = PATCHES
    head = d * 1000 + 2 * _class_attention(d)
    if name.startswith('cait'):
        block = 12 * n * d * d + 2 * n * n * d + 2 * heads * heads * n * n
        return n * 3 * 16 * 16 * d + depth * block + head
    widths = [3, d // 8, d // 4, d // 2, d]
    stem = sum((224 >> (i + 1)) ** 2 * 9 * widths[i] * widths[i + 1] for i in range(4))
    block = 12 * n * d * d + 2 * n * d * d // heads + 18 * n * d
    return stem + n * 64 * d + depth * block + head


def _index_flops(name: str) -> int:
    return _entries()[f'configs/{name.split("-")[0]}/{name}.py']['Metadata']['FLOPs']


@pytest.mark.parametrize('name', sorted(PAPERS))
def test_index_flops_are_the_analytic_count(name):
    assert _index_flops(name) == analytic_flops(name)


@pytest.mark.parametrize('name', sorted(PAPERS))
def test_index_flops_round_to_the_papers(name):
    """At the papers' rounding (0.1 GFLOPs) our count is the paper's, or the difference
    and what is known of it are stated in NOT_THE_PAPERS. ViT and ConViT are left out: the
    papers count the full last block, which our classifiers run for the class token only."""
    ours = round(_index_flops(name) / 1e9, 1)
    assert ours == NOT_THE_PAPERS.get(name, PAPERS[name])[0]


@pytest.mark.parametrize('config, shape', [
    ('configs/xcit/xcit-t12-p16_8xb128_in1k.py', [224, 224]),
    ('configs/cait/cait-xxs24_8xb128_in1k.py', [224, 224]),
    ('configs/vit/vit-ti-p16_8xb256-a2_in1k.py', [224, 224]),
    ('configs/convit/convit-ti_8xb128_in1k.py', [224, 224]),
    ('configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py', [160, 160]),
    ('configs/xcit/upernet_xcit-d6-p8_demo-ade.py', [128, 128]),
    ('configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py', [128, 128]),
    ('configs/vit/eomt_vit-d6-p8_panoptic_demo-coco.py', [128, 128]),
    ('configs/vit/mask2former_vit-adapter-s-p16-dinov3_8xb2-160k_ade20k-512x512.py', [512, 512]),
])
def test_get_flops_counts_the_model_of_a_config(config, shape):
    """The tool itself on a classifier of each family, a detector, a segmentor,
    Mask2Former (mmdet's and mmseg's) and EoMT in mmdet's Mask2Former (its backbone makes the
    predictions): the index holds what it measures, at the input size of
    the config's test data."""
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

    flops = complexity.forward_multiply_adds(Tensor(), cfg, (64, 64))
    patches = 16 * 3 * 16 * 16 * dims
    blocks = layers * (12 * tokens * dims ** 2 + 2 * tokens ** 2 * dims)
    assert flops == patches + blocks


def test_model_zoo_page_is_generated_from_the_index():
    page = (REPO_ROOT / 'docs/model_zoo.md').read_text()
    assert page == model_index.model_zoo_page(), 'run `python tools/model_index.py`'
    for config in CONFIGS:
        assert f'](../{config})' in page, config


DENSE = [c for c in CONFIGS if model_index.is_dense(REPO_ROOT / c)]
#: the heading of docs/memory.md's list of dense configs whose training memory is not measured
UNMEASURED = '### Not measured'


def test_every_dense_config_fits_32_gib_per_gpu():
    """The index's training memory (tools/analysis_tools/memory.py) in the precision each
    config trains in: 32 GB GPUs, as the official XCiT dense recipes. A config whose memory
    the index lacks is named, with the reason, in docs/memory.md's list of unmeasured ones."""
    unmeasured = (REPO_ROOT / 'docs/memory.md').read_text().split(UNMEASURED)[1]
    for config in DENSE:
        memory = _entries()[config]['Metadata'].get('Training Memory')
        if memory is None:
            assert f'`{Path(config).name}`' in unmeasured, f'{config}: measure its memory'
            continue
        amp = _config(config).optim_wrapper.get('type') == 'AmpOptimWrapper'
        assert memory['Precision'] == ('AMP float16' if amp else 'float32'), config
        assert memory['Peak AMP (GiB)' if amp else 'Peak FP32 (GiB)'] <= 32, config


def test_index_memory_is_what_the_tool_measures():
    from vitdense.analysis import memory
    config = 'configs/xcit/fpn_xcit-t12-p16_8xb2-80k_ade20k-512x512.py'
    entry = _entries()[config]['Metadata']['Training Memory']
    assert model_index.memory_entry(REPO_ROOT / config,
                                    memory.account(str(REPO_ROOT / config))) == entry


def test_the_families_are_the_registry_s(monkeypatch):
    from vitdense.models import backbone_families
    assert list(model_index.families()) == list(backbone_families())
    monkeypatch.setattr(model_index, 'backbone_families',
                        lambda: {**backbone_families(), 'toyformer': object})
    with pytest.raises(KeyError, match=r"families \['toyformer'\] have no collection"):
        model_index.shipped_configs()
