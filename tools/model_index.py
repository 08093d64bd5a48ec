"""The model index: ``configs/<family>/metafile.yml`` (OpenMMLab format) for every shipped
config, the root ``model-index.yml`` and the model-zoo page, ``docs/model_zoo.md``.

Parameters and FLOPs are measured by ``vitdense.analysis.complexity`` (classifiers at
the test crop, detectors at the padded test resize, 800 × 1344 on COCO, segmentors at the
512 × 512 training crop); the training memory of the dense configs (peak per GPU at the
config's batch and largest training input, float32 and mixed precision) by
``tools/analysis_tools/memory.py``; the papers' metrics and the
official weights are the facts below (paper tables, official repositories' READMEs).

    python tools/model_index.py --measure      # measure every config, write all three
    python tools/model_index.py --measure --configs configs/xcit/xcit-t12-p16_8xb128_in1k.py
    python tools/model_index.py --memory       # training memory of every dense config
    python tools/analysis_tools/memory.py CONFIG... --json > memory.jsonl
    python tools/model_index.py --memory-from memory.jsonl   # the same, from its output
    python tools/model_index.py                # docs/model_zoo.md from the metafiles only
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from vitdense.models import backbone_families

ROOT = Path(__file__).resolve().parents[1]

MODEL_ZOO = ROOT / 'docs' / 'model_zoo.md'
MODEL_ZOO_INTRO = '''\
Every shipped config, from the model index (`model-index.yml`, `configs/*/metafile.yml`).
Parameters and FLOPs (multiply-accumulates of one forward) are counted on the built model by
`tools/analysis_tools/get_flops.py`: classifiers at their test crop, Mask R-CNN at its padded
test resize (800 × 1344 on COCO) with its box head on 1000 proposals and mask head on 100
boxes (Cascade Mask R-CNN: every stage's box and mask heads), Mask2Former at its test resize
with its head and queries (not the panoptic fusion), segmentors at their 512 × 512
training crop (decode head only). The paper column is the
paper's result for that recipe; our own trained results are not in it. Training memory: the
peak per GPU of one training step at the config's batch and largest training input (2 × 800 ×
1344 on COCO, 2 × 512 × 512 on ADE20k), float32 / mixed precision, the precision the config
trains in in bold, by `tools/analysis_tools/memory.py` (see `docs/memory.md`); every dense
config measured fits a 32 GB GPU (`docs/memory.md` lists those not measured yet).
`python tools/model_index.py --measure --memory` regenerates the index and these tables.
Deviations from the papers and official code, and why they stand, are listed in
`docs/recipes.md`.
'''

COLLECTIONS = {
    'vit': dict(
        Name='ViT', Title='An Image is Worth 16x16 Words: Transformers for Image Recognition '
                          'at Scale; Three things everyone should know about Vision Transformers',
        URL='https://arxiv.org/abs/2010.11929', Recipe='https://arxiv.org/abs/2203.09795',
        Code='https://github.com/facebookresearch/deit'),
    'cait': dict(
        Name='CaiT', Title='Going deeper with Image Transformers',
        URL='https://arxiv.org/abs/2103.17239', Recipe='https://arxiv.org/abs/2103.17239',
        Code='https://github.com/facebookresearch/deit'),
    'xcit': dict(
        Name='XCiT', Title='XCiT: Cross-Covariance Image Transformers',
        URL='https://arxiv.org/abs/2106.09681', Recipe='https://arxiv.org/abs/2106.09681',
        Code='https://github.com/facebookresearch/xcit'),
    'convit': dict(
        Name='ConViT', Title='ConViT: Improving Vision Transformers with Soft Convolutional '
                             'Inductive Biases',
        URL='https://arxiv.org/abs/2103.10697', Recipe='https://arxiv.org/abs/2012.12877',
        Code='https://github.com/facebookresearch/convit'),
}

XCIT_WEIGHTS = 'https://dl.fbaipublicfiles.com/xcit/'
XCIT_NAMES = {'t12': 'tiny_12', 't24': 'tiny_24', 's12': 'small_12', 's24': 'small_24',
              'm24': 'medium_24', 'l24': 'large_24'}
# XCiT official dense results (facebookresearch/xcit detection and semantic_segmentation
# READMEs, = paper Tables 5 and 6): (box AP, mask AP) and mIoU per (size, patch)
XCIT_COCO = {('t12', 16): (42.7, 38.5), ('t12', 8): (44.5, 40.3), ('s12', 16): (45.3, 40.8),
             ('s12', 8): (47.0, 42.3), ('s24', 16): (46.5, 41.8), ('s24', 8): (48.1, 43.0),
             ('m24', 16): (46.7, 42.0), ('m24', 8): (48.5, 43.7)}
XCIT_FPN = {('t12', 16): 38.1, ('t12', 8): 39.9, ('s12', 16): 43.9, ('s12', 8): 44.2,
            ('s24', 16): 44.6, ('s24', 8): 47.1, ('m24', 16): 45.9, ('m24', 8): 46.9}
XCIT_UPERNET = {('t12', 16): 41.5, ('t12', 8): 43.5, ('s12', 16): 45.9, ('s12', 8): 46.6,
                ('s24', 16): 46.9, ('s24', 8): 48.1, ('m24', 16): 47.6, ('m24', 8): 48.4}

# ViT-Adapter (Chen et al., ICLR 2023) on DeiT-T / S / B trunks, single-scale, as the official
# README lists them: Mask R-CNN 3x + MS (Table 1) (box AP, mask AP), UperNet 160k mIoU
VIT_ADAPTER = {'t': ((46.0, 41.0), 42.6), 's': ((48.2, 42.8), 46.2), 'b': ((49.6, 43.6), 48.8)}

# ImageNet-1k top-1 of the paper for the recipe of each classification config, and the
# table it comes from; official weights of that same recipe where they were released
CLASSIFICATION = {
    **{f'vit-{size}-p16_8xb256-a2_in1k': (top1, 'Three things, Table 1 (300 epochs)', None)
       for size, top1 in (('ti', 72.7), ('s', 79.7), ('b', 82.2), ('l', 83.0))},
    'vit-b18x2-p16_8xb256-a2-ls-400e_in1k': (84.1, 'Three things, Table 2', None),
    'vit-s-p16_8xb64_in1k-384px': (82.7, 'Three things, Table 5 (AdamW, full)', None),
    'vit-s-p16-attn_8xb64_in1k-384px': (82.5, 'Three things, Table 5 (AdamW, attn)', None),
    **{f'cait-{size}_8xb128_in1k': (top1, 'CaiT, Table 3', None)
       for size, top1 in (('xxs24', 77.6), ('xxs36', 79.1), ('xs24', 81.8), ('s24', 82.7),
                          ('s36', 83.3), ('m36', 83.8))},
    'cait-xxs24-distilled_8xb128_in1k': (78.4, 'CaiT, Table 3 (distilled)',
                                         'https://dl.fbaipublicfiles.com/deit/XXS24_224.pth'),
    'cait-xxs24_8xb64_in1k-384px': (80.4, 'CaiT, Table 3 (↑384)', None),
    **{f'convit-{size}_8xb128_in1k': (
        top1, 'ConViT, Table 1', f'https://dl.fbaipublicfiles.com/convit/convit_{name}.pth')
       for size, name, top1 in (('ti', 'tiny', 73.1), ('s', 'small', 81.3), ('b', 'base', 82.4))},
    **{f'convit-{size}-plus_8xb64_in1k': (top1, 'ConViT, Table 1', None)
       for size, top1 in (('ti', 76.7), ('s', 82.2), ('b', 82.5))},
    **{f'xcit-{size}-p16_8xb128_in1k': (
        top1, 'XCiT, Table 1', f'{XCIT_WEIGHTS}xcit_{XCIT_NAMES[size]}_p16_224.pth')
       for size, top1 in (('t12', 77.1), ('t24', 79.4), ('s12', 82.0), ('s24', 82.6),
                          ('m24', 82.7), ('l24', 82.9))},
    'xcit-s12-p16-distilled_8xb128_in1k': (83.3, 'XCiT, Table 2 (distilled)',
                                           XCIT_WEIGHTS + 'xcit_small_12_p16_224_dist.pth'),
}


def families() -> dict[str, dict]:
    """The registered families (``backbone_families()``, in their order), each with its
    collection's facts from COLLECTIONS."""
    missing = [family for family in backbone_families() if family not in COLLECTIONS]
    if missing:
        raise KeyError(f'families {missing} have no collection: add their paper, recipe and '
                       f'code to COLLECTIONS in tools/model_index.py')
    return {family: COLLECTIONS[family] for family in backbone_families()}


def shipped_configs() -> list[Path]:
    """Every config a user can run: configs/<family>/*.py (``_base_`` pieces excluded)."""
    return sorted(p for family in families() for p in (ROOT / 'configs' / family).glob('*.py'))


def task_of(name: str) -> str:
    if name.startswith(('eomt_', 'mask2former_')):
        return 'Panoptic Segmentation' if '_panoptic_' in name else \
            'Semantic Segmentation' if ('_ade20k-' in name or name.endswith('_demo-ade')) \
            else 'Instance Segmentation'
    for prefix, task in (('mask-rcnn_', 'Instance Segmentation'),
                         ('cascade-mask-rcnn_', 'Instance Segmentation'),
                         ('upernet_', 'Semantic Segmentation'),
                         ('fpn_', 'Semantic Segmentation'),
                         ('linear-probe_', 'Semantic Segmentation'),
                         ('ms-probe_', 'Semantic Segmentation')):
        if name.startswith(prefix):
            return task
    return 'Image Classification'


def training_data(name: str) -> str:
    if task_of(name) == 'Panoptic Segmentation':
        return 'demo COCO panoptic set' if '_demo-' in name else 'COCO panoptic'
    if '_demo-' in name:
        return {'coco': 'demo COCO-layout set', 'ade': 'demo ADE20k-layout set',
                'in10': 'demo ImageNet-layout set (10 classes)'}[name.split('_demo-')[1]
                                                                 .split('-')[0].split('.')[0]]
    if name.startswith(('mask-rcnn_', 'cascade-mask-rcnn_')):
        return 'COCO'
    if name.startswith(('eomt_', 'mask2former_')):
        return 'ADE20K' if '_ade20k-' in name else 'COCO'
    if name.startswith(('upernet_', 'fpn_', 'linear-probe_', 'ms-probe_')):
        return 'ADE20K'
    return 'ImageNet-1k'


def results_and_weights(family: str, name: str) -> tuple[list, str | None]:
    """The paper's metric for this config (if it reports one) and official weights. Dense
    metrics are single-scale, as XCiT reports them; mmseg's metafiles name them so (`mIoU`,
    where a multi-scale + flip result is `mIoU(ms+flip)`)."""
    if name in CLASSIFICATION:
        top1, source, weights = CLASSIFICATION[name]
        return [dict(Task='Image Classification', Dataset='ImageNet-1k',
                     Metrics={'Top 1 Accuracy': top1}, Source=source)], weights
    adapter = re.match(r'(mask-rcnn|upernet)_vit-([tsb])-p16_adapter_', name)
    if family == 'vit' and adapter:
        (box, mask), miou = VIT_ADAPTER[adapter.group(2)]
        if adapter.group(1) == 'mask-rcnn':
            return [dict(Task='Object Detection', Dataset='COCO', Metrics={'box AP': box},
                         Source='ViT-Adapter, Table 1'),
                    dict(Task='Instance Segmentation', Dataset='COCO',
                         Metrics={'mask AP': mask}, Source='ViT-Adapter, Table 1')], None
        return [dict(Task='Semantic Segmentation', Dataset='ADE20K', Metrics={'mIoU': miou},
                     Source='ViT-Adapter, ADE20K UperNet results')], None
    match = re.match(r'(mask-rcnn|upernet|fpn)_xcit-(t12|s12|s24|m24)-p(16|8)_', name)
    # the paper's dense results are of the multi-layer pyramid, not of ViTDet's layout
    if family != 'xcit' or not match or '_vitdet_' in name:
        return [], None
    task, size, patch = match.group(1), match.group(2), int(match.group(3))
    official = f'xcit_{XCIT_NAMES[size]}_p{patch}.pth'
    if task == 'mask-rcnn':
        box, mask = XCIT_COCO[size, patch]
        return [dict(Task='Object Detection', Dataset='COCO', Metrics={'box AP': box},
                     Source='XCiT, Table 5'),
                dict(Task='Instance Segmentation', Dataset='COCO', Metrics={'mask AP': mask},
                     Source='XCiT, Table 5')], XCIT_WEIGHTS + 'coco/maskrcnn_' + official
    miou = (XCIT_FPN if task == 'fpn' else XCIT_UPERNET)[size, patch]
    prefix = 'sem_fpn_' if task == 'fpn' else 'upernet_'
    return [dict(Task='Semantic Segmentation', Dataset='ADE20K', Metrics={'mIoU': miou},
                 Source='XCiT, Table 6')], XCIT_WEIGHTS + 'ade/' + prefix + official


def measure(config: Path) -> dict:
    from vitdense.analysis.complexity import analyse
    return analyse(str(config))


def is_dense(config: Path) -> bool:
    """A full dense config (Mask R-CNN, Mask2Former, UperNet, Semantic FPN, probe), not a
    demo."""
    name = config.stem
    return name.startswith(('mask-rcnn_', 'cascade-mask-rcnn_', 'mask2former_', 'upernet_',
                            'fpn_', 'linear-probe_', 'ms-probe_')) and \
        '_demo' not in name


def measure_memory(config: Path) -> dict:
    from vitdense.analysis.memory import account
    return account(str(config))


def memory_entry(config: Path, result: dict) -> dict:
    """The index's training-memory metadata from a ``memory.py`` account of ``config``."""
    from vitdense.analysis.memory import load_config, uses_amp

    height, width = result['shape']
    return {'Batch per GPU': result['batch'], 'Input': f'{height}x{width}',
            'Peak FP32 (GiB)': round(result['fp32']['peak'] / 2 ** 30, 1),
            'Peak AMP (GiB)': round(result['amp']['peak'] / 2 ** 30, 1),
            'Precision': 'AMP float16' if uses_amp(load_config(str(config))) else 'float32',
            'with_cp': result['with_cp']}


def model_entry(config: Path, measured: dict) -> dict:
    family, name = config.parent.name, config.stem
    results, weights = results_and_weights(family, name)
    height, width = measured['shape']
    entry = {'Name': name, 'In Collection': COLLECTIONS[family]['Name'],
             'Config': str(config.relative_to(ROOT)),
             'Metadata': {'Training Data': training_data(name),
                          'Input Size': f'{height}x{width}',
                          'Parameters': measured['params'], 'FLOPs': measured['flops']},
             'Results': results}
    if weights:
        entry['Weights'] = weights
    return entry


def metafile_path(family: str) -> Path:
    return ROOT / 'configs' / family / 'metafile.yml'


def load_metafile(family: str) -> dict:
    path = metafile_path(family)
    if not path.exists():
        return dict(Collections=[], Models=[])
    return yaml.safe_load(path.read_text())


def write_metafiles(measured: dict[Path, dict], memory: dict[Path, dict]) -> None:
    """Update (or add) the measured configs' entries (``measured``: parameters and FLOPs,
    ``memory``: training memory); entries of configs that no longer exist are dropped, the
    others kept as they are."""
    for family, collection in families().items():
        existing = {m['Name']: m for m in load_metafile(family)['Models']}
        for config, result in measured.items():
            if config.parent.name == family:
                kept = existing.get(config.stem, {}).get('Metadata', {}).get('Training Memory')
                existing[config.stem] = model_entry(config, result)
                if kept:
                    existing[config.stem]['Metadata']['Training Memory'] = kept
        for config, result in memory.items():
            if config.parent.name == family:
                if config.stem not in existing:
                    raise KeyError(f'{config}: not in the index yet; run --measure first')
                existing[config.stem]['Metadata']['Training Memory'] = memory_entry(config,
                                                                                    result)
        shipped = [p.stem for p in shipped_configs() if p.parent.name == family]
        models = [existing[name] for name in shipped if name in existing]
        paper = {'Title': collection['Title'], 'URL': collection['URL']}
        data = {'Collections': [{'Name': collection['Name'], 'Paper': paper,
                                 'Metadata': {'Recipe': collection['Recipe']},
                                 'Code': {'URL': collection['Code']}}],
                'Models': models}
        metafile_path(family).write_text(
            yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))
    imports = [f'configs/{family}/metafile.yml' for family in families()]
    (ROOT / 'model-index.yml').write_text(yaml.safe_dump({'Import': imports}, sort_keys=False))


def _metric_text(results: list) -> str:
    parts = [f'{key} {value}' for result in results for key, value in result['Metrics'].items()]
    return ', '.join(parts) if parts else '—'


def _memory_text(memory: dict | None) -> str:
    """Peak per GPU in float32 / mixed precision, the configured one in bold."""
    if not memory:
        return '—'
    fp32, amp = memory['Peak FP32 (GiB)'], memory['Peak AMP (GiB)']
    text = f'{fp32} / **{amp}**' if memory['Precision'].startswith('AMP') \
        else f'**{fp32}** / {amp}'
    return text + (' (with_cp)' if memory['with_cp'] else '')


def model_zoo_page() -> str:
    """The model-zoo page: its introduction, then one table per family (in the order of
    families()) from the metafiles, configs linked relative to docs/."""
    lines = ['# Model zoo', '', '<!-- generated by tools/model_index.py, do not edit -->', '',
             MODEL_ZOO_INTRO.rstrip('\n')]
    for family, collection in families().items():
        lines += ['', f'## {collection["Name"]} ([paper]({collection["URL"]}))', '',
                  '| config | task | data | input | params (M) | FLOPs (G) | '
                  'training GiB/GPU fp32 / AMP | paper | official weights |',
                  '|---|---|---|---|---|---|---|---|---|']
        for model in load_metafile(family)['Models']:
            meta = model['Metadata']
            weights = f'[download]({model["Weights"]})' if model.get('Weights') else '—'
            lines.append(
                f'| [{model["Name"]}](../{model["Config"]}) | {task_of(model["Name"])} | '
                f'{meta["Training Data"]} | {meta["Input Size"]} | '
                f'{meta["Parameters"] / 1e6:.1f} | {meta["FLOPs"] / 1e9:.1f} | '
                f'{_memory_text(meta.get("Training Memory"))} | '
                f'{_metric_text(model["Results"])} | {weights} |')
    return '\n'.join(lines) + '\n'


def write_model_zoo() -> None:
    """Write docs/model_zoo.md whole, atomically (a temporary file renamed over it)."""
    temporary = MODEL_ZOO.with_suffix('.md.tmp')
    temporary.write_text(model_zoo_page())
    temporary.replace(MODEL_ZOO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--measure', action='store_true',
                        help='measure parameters and FLOPs and rewrite the metafiles')
    parser.add_argument('--memory', action='store_true',
                        help='measure the training memory of the dense configs')
    parser.add_argument('--memory-from', type=Path, metavar='JSONL',
                        help='training memory from `memory.py --json` output instead')
    parser.add_argument('--configs', nargs='*', type=Path,
                        help='only these configs (default: every shipped config)')
    args = parser.parse_args()
    configs = [p.resolve() for p in args.configs] if args.configs else shipped_configs()
    measured, memory = {}, {}
    if args.measure:
        for config in configs:
            measured[config] = measure(config)
            print(f'{config.relative_to(ROOT)}: {measured[config]["params"] / 1e6:.2f} M, '
                  f'{measured[config]["flops"] / 1e9:.2f} G', flush=True)
    if args.memory:
        for config in filter(is_dense, configs):
            memory[config] = measure_memory(config)
            print(f'{config.relative_to(ROOT)}: {memory_entry(config, memory[config])}',
                  flush=True)
    if args.memory_from:
        for line in args.memory_from.read_text().splitlines():
            result = json.loads(line)
            memory[(ROOT / result['config']).resolve()] = result
    if measured or memory:
        write_metafiles(measured, memory)
    write_model_zoo()


if __name__ == '__main__':
    main()
