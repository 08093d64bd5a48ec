"""TorchScript archives (OpenAI's CLIP release) give their weights without their code
running: the state dict of the scripted modules, as ``safe_load`` reads any checkpoint, and
an archive whose pickle asks for anything else is refused."""
import zipfile

import pytest
import torch
from torch import nn

from vitdense.checkpoint_io import UnsafeCheckpointError, safe_load
from vitdense.models import ViT


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2)
        self.register_buffer('scale', torch.arange(3.))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln_1(x), x, x, need_weights=False)[0] * self.scale.sum()


def scripted_archive(path, module: nn.Module) -> None:
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(module), str(path))


def test_an_archive_gives_its_modules_tensors(tmp_path):
    module = nn.Sequential(Block(), nn.Linear(8, 4))
    path = tmp_path / 'scripted.pt'
    scripted_archive(path, module)
    weights = safe_load(str(path))
    assert weights.keys() == module.state_dict().keys()
    for key, value in module.state_dict().items():
        assert torch.equal(weights[key], value), key


def test_an_archive_asking_for_other_globals_is_refused_unread(tmp_path):
    """A ``data.pkl`` that asks for ``os.system`` is refused naming it; nothing runs."""
    path = tmp_path / 'scripted.pt'
    scripted_archive(path, Block())
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = next(name for name in entries if name.endswith('/data.pkl'))
    entries[data] = b'\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.'
    forged = tmp_path / 'forged.pt'
    with zipfile.ZipFile(forged, 'w') as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    with pytest.raises(UnsafeCheckpointError, match=r'os.system'):
        safe_load(str(forged))


def test_openai_clip_archive_loads_into_vit(tmp_path):
    """OpenAI's CLIP release layout as a TorchScript archive (``visual.*`` modules) loads
    through ``Pretrained``: every tensor of the image tower, exactly."""
    source = ViT(dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32, pre_norm=True,
                 norm_eps=1e-5, act_layer='quick_gelu', out_type='cls_token')
    nn.init.zeros_(source.patch_embed.proj.bias)  # OpenAI's patch projection has none
    ours = source.state_dict()
    openai = {'visual.conv1.weight': ours['patch_embed.proj.weight'],
              'visual.class_embedding': ours['cls_token'].reshape(-1),
              'visual.positional_embedding': ours['pos_embed.weight'][0],
              'visual.proj': torch.randn(32, 8), 'logit_scale': torch.ones(())}
    for name, theirs in (('norm_pre', 'ln_pre'), ('norm', 'ln_post')):
        for param in ('weight', 'bias'):
            openai[f'visual.{theirs}.{param}'] = ours[f'{name}.{param}']
    for block in range(2):
        renames = {'norm1': 'ln_1', 'norm2': 'ln_2', 'attn.qkv.weight': 'attn.in_proj_weight',
                   'attn.qkv.bias': 'attn.in_proj_bias', 'attn.proj': 'attn.out_proj',
                   'mlp.fc1': 'mlp.c_fc', 'mlp.fc2': 'mlp.c_proj'}
        for key, value in ours.items():
            if key.startswith(f'blocks.{block}.'):
                for mine, theirs in renames.items():
                    key = key.replace(mine, theirs)
                openai[key.replace('blocks.', 'visual.transformer.resblocks.')] = value
    root = nn.Module()
    for key, value in openai.items():
        module = root
        *path, name = key.split('.')
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(name, nn.Parameter(value.clone()))
    path = tmp_path / 'ViT-B-16.pt'
    torch.jit.save(torch.jit.script(root), str(path))
    model = ViT(dict(embed_dims=32, num_layers=2, num_heads=2), img_size=32, pre_norm=True,
                norm_eps=1e-5, act_layer='quick_gelu', out_type='cls_token',
                init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    for key, value in ours.items():
        assert torch.equal(model.state_dict()[key], value), key
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model.eval()(images)[0], source.eval()(images)[0])
