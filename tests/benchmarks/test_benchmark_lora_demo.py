"""benchmarks/benchmark_lora_demo.py: the pretrained classifier's trunk loads into both
fine-tunings, which differ in ``peft`` alone and run on the same time budget."""
import torch

from benchmarks import benchmark_lora_demo as tool
from vitdense.model_factory import build_model


def test_both_fine_tunings_start_from_the_pretrained_trunk(tmp_path):
    pretrain = tool.stage_config('pretrain', 1.0, tmp_path / 'pretrain', None)
    classifier = build_model(pretrain, 'count')
    base = tmp_path / 'base.pth'
    torch.save(dict(state_dict=classifier.state_dict()), base)
    configs = {stage: tool.stage_config(stage, 2.0, tmp_path / stage, base)
               for stage in ('lora', 'full')}
    assert configs['lora'].model.backbone.peft is not None
    assert configs['full'].model.backbone.peft is None
    configs['full'].model.backbone.peft = configs['lora'].model.backbone.peft
    assert configs['full'].model == configs['lora'].model
    for stage, cfg in configs.items():
        assert [hook for hook in cfg.custom_hooks if hook['type'] == 'vitdense.TimeBudgetHook'] \
            == [dict(type='vitdense.TimeBudgetHook', minutes=2.0, clock='process')]
        model = build_model(cfg, 'train')
        model.init_weights()
        qkv = model.backbone.blocks[0].attn.qkv
        weight = qkv.base_layer.weight if stage == 'lora' else qkv.weight
        assert torch.equal(weight, classifier.backbone.blocks[0].attn.qkv.weight), stage
