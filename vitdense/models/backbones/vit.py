"""ViT (Dosovitskiy et al., 2021) with the options of "Three things everyone should know
about Vision Transformers" (Touvron et al., 2022): parallel blocks (§3), the hMLP stem
(§5, Appendix C) and LayerScale.

Class token and learned absolute positions as in the ViT paper; widths are DeiT's for
tiny/small and ViT's for base/large/huge.
"""
import math
import re
from typing import Optional, Union

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from timm.layers import resample_patch_embed

from vitdense.registry import MODELS
from ..layers.attention import MultiheadSelfAttention
from ..layers.blocks import FeedForward, TransformerBlock
from ..layers.embed import (HMLPPatchEmbed, LearnedPositionEmbedding, PatchEmbed,
                             PositionKernel)
from ..layers.relative_bias import RelativePositionBias
from ..layers.rotary import RotaryPositionEmbedding
from ..layers.swiglu import SwiGLU, merge_swiglu_tensors
from .base import AttentionLayout, ColumnarBackbone
from .checkpoint_keys import Alias, KeyTable, TensorRule

STEMS = ('linear', 'hmlp')
POS_EMBEDS = ('learn', 'none')
#: timm's EVA attention keeps q and v biases beside a bias-free fused qkv (``q_bias``,
#: ``v_bias``) or three maps (``q_proj``, ``k_proj`` without bias, ``v_proj``)
EVA_QV_BIAS = re.compile(r'^(blocks\.\d+\.attn)\.q_bias$')
EVA_SPLIT_QKV = re.compile(r'^(blocks\.\d+\.attn)\.q_proj\.weight$')
BLOCK = re.compile(r'^blocks\.(\d+)\.')
#: EVA-02's rotary tables as saved against ours: cosines and sines of the same angles,
#: computed in float32 in another order of operations
ROTARY_TABLE_TOLERANCE = 1e-5
#: timm's per-branch modules of a parallel block (``attns.<b>.norm``, ...) -> ours
TIMM_PARALLEL_MODULES = {('attns', 'norm'): 'norm1', ('attns', 'attn'): 'attn',
                         ('attns', 'ls'): 'ls1', ('ffns', 'norm'): 'norm2',
                         ('ffns', 'mlp'): 'mlp', ('ffns', 'ls'): 'ls2'}
#: detectron2's ViTDet detector keys (``ViT`` in ``backbone.net``, ``SimpleFeaturePyramid``
#: stages ``backbone.simfp_<log2 stride>.<index>``) -> ours (``backbone.`` ViT built with
#: ``dense_class_token=False``, ``neck.`` :class:`SimpleFeaturePyramid`)
DETECTRON2_VITDET_KEYS = KeyTable(keys=(
    Alias('^backbone.net.pos_embed$', '^backbone.pos_embed.weight$'),
    Alias('^backbone.net.', '^backbone.'),
    Alias('.attn.rel_pos_h$', '.attn.rel_pos.height$'),
    Alias('.attn.rel_pos_w$', '.attn.rel_pos.width$'),
    # stride 4: transposed conv, LayerNorm, GELU, transposed conv, then the two convs
    Alias('^backbone.simfp_2.{i:0|1|3}.', '^neck.rescales.0.{i}.'),
    Alias('^backbone.simfp_2.4.', '^neck.lateral_convs.0.'),
    Alias('^backbone.simfp_2.5.', '^neck.fpn_convs.0.'),
    # stride 8: transposed conv, then the two convs
    Alias('^backbone.simfp_3.0.', '^neck.rescales.1.0.'),
    Alias('^backbone.simfp_3.1.', '^neck.lateral_convs.1.'),
    Alias('^backbone.simfp_3.2.', '^neck.fpn_convs.1.'),
    # stride 16: the two convs; stride 32: max pooling, then the two convs
    Alias('^backbone.simfp_4.0.', '^neck.lateral_convs.2.'),
    Alias('^backbone.simfp_4.1.', '^neck.fpn_convs.2.'),
    Alias('^backbone.simfp_5.1.', '^neck.lateral_convs.3.'),
    Alias('^backbone.simfp_5.2.', '^neck.fpn_convs.3.'),
    # detectron2's Conv2d holds its norm; ours is conv + norm
    Alias('^neck.{kind:lateral|fpn}_convs.{i}.weight$', '^neck.{kind}_convs.{i}.conv.weight$'),
))
#: OpenMMLab's ViT keys (mmpretrain ``VisionTransformer`` / ``DeiT3``, mmseg
#: ``VisionTransformer``) -> ours; mmseg's attention is torch's ``nn.MultiheadAttention``
#: (``in_proj`` holds q, k, v stacked as our ``qkv``); mmpretrain's ``ln2`` is the norm after
#: average pooling (``out_type='avg_featmap'``: MAE's fine-tuned layout), our ``fc_norm``
OPENMMLAB_VIT_KEYS: tuple[Alias, ...] = (
    Alias('^layers.', '^blocks.'),
    Alias('^ln1.', '^norm.'),
    Alias('^ln2.', '^fc_norm.'),
    Alias('^blocks.{i}.ln{n:1|2}.', '^blocks.{i}.norm{n}.'),
    Alias('^patch_embed.projection.', '^patch_embed.proj.'),
    Alias('.attn.attn.in_proj_{param:weight|bias}$', '.attn.qkv.{param}$'),
    Alias('.attn.attn.out_proj.', '.attn.proj.'),
    Alias('.attn.gamma1.weight$', '.ls1.gamma$'),
    Alias('.ffn.gamma2.weight$', '.ls2.gamma$'),
)
#: OpenAI's CLIP state dict (``visual.``: ``conv1`` without bias, ``class_embedding`` and
#: ``positional_embedding`` without their batch axis, ``ln_pre`` / ``ln_post``, residual
#: blocks of torch's ``nn.MultiheadAttention`` and ``c_fc`` / ``c_proj``) -> ours; its
#: image projection and text tower are left out (``OPENAI_CLIP_ONLY_KEYS``)
OPENAI_CLIP_KEYS: tuple[Alias, ...] = (
    Alias('^visual.conv1.', '^patch_embed.proj.'),
    Alias('^visual.class_embedding$', '^cls_token$'),
    Alias('^visual.positional_embedding$', '^pos_embed.weight$'),
    Alias('^visual.ln_pre.', '^norm_pre.'),
    Alias('^visual.ln_post.', '^norm.'),
    Alias('^visual.transformer.resblocks.', '^blocks.'),
    Alias('^blocks.{i}.ln_{n:1|2}.', '^blocks.{i}.norm{n}.'),
    Alias('^blocks.{i}.attn.in_proj_{param:weight|bias}$', '^blocks.{i}.attn.qkv.{param}$'),
    Alias('^blocks.{i}.attn.out_proj.', '^blocks.{i}.attn.proj.'),
    Alias('^blocks.{i}.mlp.c_fc.', '^blocks.{i}.mlp.fc1.'),
    Alias('^blocks.{i}.mlp.c_proj.', '^blocks.{i}.mlp.fc2.'),
)
#: OpenAI's CLIP tensors outside the image trunk: the image projection and the text tower
OPENAI_CLIP_ONLY_KEYS = (r'^(visual\.proj|transformer\.|token_embedding\.|positional_embedding|'
                         r'ln_final\.|text_projection|logit_scale)')
#: the official layouts of the ViT sources timm converts -> ours: DINOv3's hub files
#: (storage tokens), DeiT-distilled's distillation token (a register with a position row:
#: ``reg_tokens=1``), SAM's image encoder (``image_encoder.``, ``mlp.lin1``, relative position
#: tables), DINOv2-g's fused SwiGLU (``w12``, ``w3``), EVA-02's releases (SwiGLU ``w1``,
#: ``w2``, ``w3``, its ``ffn_ln``); DINOv2's registers are merged (``ViT.checkpoint_keys``)
SOURCE_KEYS: tuple[Alias, ...] = (
    Alias('^storage_tokens$', '^reg_token$'),
    Alias('^dist_token$', '^reg_token$'),
    Alias('^image_encoder.pos_embed$', '^pos_embed.weight$'),
    Alias('^image_encoder.', '^'),
    Alias('.mlp.lin{n:1|2}.', '.mlp.fc{n}.'),
    Alias('.mlp.w12.', '.mlp.fc1.'),
    Alias('.mlp.w1.', '.mlp.fc1_g.'),
    Alias('.mlp.w2.', '.mlp.fc1_x.'),
    Alias('.mlp.w3.', '.mlp.fc2.'),
    Alias('.mlp.ffn_ln.', '.mlp.norm.'),
    Alias('.attn.rel_pos_h$', '.attn.rel_pos.height$'),
    Alias('.attn.rel_pos_w$', '.attn.rel_pos.width$'),
    Alias('.attn.relative_position_bias_table$', '.attn.relative_position_bias.table$'),
) + OPENAI_CLIP_KEYS
#: BEiT's pretraining checkpoints: one relative position table shared by all blocks, which
#: fine-tuning gives each block a copy of (BEiT §2.6)
SHARED_RELATIVE_TABLE = 'rel_pos_bias.relative_position_bias_table'
#: tensors of the sources' pretraining or other tasks that ViT has no module for, left out
#: with a log line naming them (as timm does): DINOv2's and DINOv3's mask token, DINOv3's
#: rotary periods (recomputed) and key-bias mask (applied first), SAM's neck and its prompt
#: encoder and mask decoder, BEiT's relative position indices (recomputed), EVA-02's
#: masked-image-modelling head, BEiT v2's pretraining head on the class token (its
#: ``cls_pt_layers`` blocks, norms and head: the backbone's blocks do not feed them), DINOv3
#: L SAT-493M's and 7B's norm of the local crops' class tokens (used in training only)
SOURCE_ONLY_KEYS = (r'^(mask_token|rope_embed\.periods|lm_head\.|neck\.|prompt_encoder\.|'
                    r'mask_decoder\.|cls_pt_|local_cls_norm\.)|\.qkv\.bias_mask$|'
                    r'relative_position_index$')
#: DINOv3's norm of the class and storage tokens where it is not the patches' (untied)
UNTIED_CLASS_NORM = 'cls_norm.'
#: learned rotary frequencies (the rope-mixed ViTs: timm's ``rope.freqs``, Naver's ``freqs``)
LEARNED_ROTARY = re.compile(r'^(rope\.)?freqs$')
#: the first block's norm and attention as saved in timm's layout (their order shows where
#: the block normalises)
BLOCK_MODULE_AS_SAVED = re.compile(r'^blocks\.0\.(norm1|attn)\.')
#: EVA-02's rotary tables, which its official code keeps as buffers, once for the model and
#: once in every block: checked against what the model computes, then dropped
EVA_ROTARY_TABLE = re.compile(r'^(|blocks\.\d+\.attn\.)rope\.freqs_(cos|sin)$')
#: the official DeiT III parallel block's modules (after the LayerScale renames) -> timm's
#: per-branch modules; a block is parallel when it has the second branch's first norm
OFFICIAL_PARALLEL_MODULES = {
    'norm1': 'attns.0.norm', 'attn': 'attns.0.attn', 'ls1.gamma': 'attns.0.ls.gamma',
    'norm11': 'attns.1.norm', 'attn1': 'attns.1.attn', 'gamma_1_1': 'attns.1.ls.gamma',
    'norm2': 'ffns.0.norm', 'mlp': 'ffns.0.mlp', 'ls2.gamma': 'ffns.0.ls.gamma',
    'norm21': 'ffns.1.norm', 'mlp1': 'ffns.1.mlp', 'gamma_2_1': 'ffns.1.ls.gamma'}
OFFICIAL_PARALLEL_MODULE = re.compile(
    rf'^(blocks\.\d+)\.({"|".join(re.escape(m) for m in OFFICIAL_PARALLEL_MODULES)})(\..+|$)')
OFFICIAL_SECOND_BRANCH = re.compile(r'^(blocks\.\d+)\.norm11\.')
#: timm's per-branch modules of a parallel block: block, group, branch, module, parameter
PARALLEL_BRANCH = re.compile(r'^(blocks\.\d+)\.(attns|ffns)\.(\d+)\.(\w+)\.(.+)$')
#: our modules of a block, which a parallel block branches
BLOCK_MODULE = re.compile(r'^(blocks\.\d+)\.(norm1|attn|ls1|norm2|mlp|ls2)\.(.+)$')


def merge_eva_attention(state_dict: dict) -> dict:
    """timm's EVA attention as our ``qkv``: its separate q, k, v maps stacked, and its q and
    v biases with the key's zero bias between them."""
    for key in [k for k in state_dict if EVA_SPLIT_QKV.match(k)]:
        attn = EVA_SPLIT_QKV.match(key).group(1)
        state_dict[f'{attn}.qkv.weight'] = torch.cat(
            [state_dict.pop(f'{attn}.{name}_proj.weight') for name in 'qkv'])
        if f'{attn}.q_proj.bias' in state_dict:
            state_dict[f'{attn}.q_bias'] = state_dict.pop(f'{attn}.q_proj.bias')
            state_dict[f'{attn}.v_bias'] = state_dict.pop(f'{attn}.v_proj.bias')
    for key in [k for k in state_dict if EVA_QV_BIAS.match(k)]:
        attn, q_bias = EVA_QV_BIAS.match(key).group(1), state_dict.pop(key)
        state_dict[f'{attn}.qkv.bias'] = torch.cat(
            [q_bias, torch.zeros_like(q_bias), state_dict.pop(f'{attn}.v_bias')])
    return state_dict


def apply_key_bias_mask(state_dict: dict) -> dict:
    """DINOv3's hub files: the key bias masked out (to zero) as their forward does."""
    for key in [k for k in state_dict if k.endswith('.qkv.bias_mask')]:
        bias = key[:-len('_mask')]
        state_dict[bias] = state_dict[bias] * torch.nan_to_num(state_dict[key])
    return state_dict


def copy_shared_relative_table(state_dict: dict) -> dict:
    """BEiT's pretraining checkpoints: the shared relative position table copied to each
    block (BEiT §2.6)."""
    if SHARED_RELATIVE_TABLE in state_dict:
        shared = state_dict.pop(SHARED_RELATIVE_TABLE)
        for block in sorted({int(m.group(1)) for m in map(BLOCK.match, state_dict) if m}):
            state_dict[f'blocks.{block}.attn.relative_position_bias.table'] = shared.clone()
    return state_dict


def merge_hub_registers(state_dict: dict) -> dict:
    """DINOv2's hub files position the class token, not the registers: as timm, the class
    token's row joins the token and the registers join without positions
    (``no_embed_class=True``)."""
    if 'register_tokens' in state_dict:
        table = state_dict['pos_embed.weight']
        state_dict['reg_token'] = state_dict.pop('register_tokens')
        state_dict['cls_token'] = state_dict['cls_token'] + table[:, :1]
        state_dict['pos_embed.weight'] = table[:, 1:]
    return state_dict


def flatten_position_grid(state_dict: dict) -> dict:
    """SAM's position table, (1, rows, cols, C), as our (1, rows * cols, C)."""
    table = state_dict.get('pos_embed.weight')
    if table is not None and table.dim() == 4:
        state_dict['pos_embed.weight'] = table.flatten(1, 2)
    return state_dict


def add_batch_axes(state_dict: dict) -> dict:
    """A class token (C) and a position table (N, C) saved without their batch axis
    (OpenAI's CLIP) with it, as ours."""
    for key, dims in (('cls_token', 1), ('pos_embed.weight', 2)):
        value = state_dict.get(key)
        if value is not None and value.dim() == dims:
            state_dict[key] = value.reshape(1, -1, value.shape[-1])
    return state_dict


def add_zero_patch_bias(state_dict: dict) -> dict:
    """A patch projection saved without bias (mmseg's ``patch_bias=False``) with the zero
    bias that computes the same."""
    weight = state_dict.get('patch_embed.proj.weight')
    if weight is not None and 'patch_embed.proj.bias' not in state_dict:
        state_dict['patch_embed.proj.bias'] = weight.new_zeros(weight.shape[0])
    return state_dict


def name_official_parallel_branches(state_dict: dict) -> dict:
    """The official DeiT III parallel blocks (``Layer_scale_init_Block_paralx2``: a second
    branch's ``norm11``, ``attn1``, ``gamma_1_1``, ``norm21``, ``mlp1``, ``gamma_2_1``) named
    as timm's per-branch modules, which :func:`stack_parallel_branches` then stacks."""
    parallel = {match.group(1) for match in map(OFFICIAL_SECOND_BRANCH.match, state_dict)
                if match}
    for key in list(state_dict):
        match = OFFICIAL_PARALLEL_MODULE.match(key)
        if match and match.group(1) in parallel:
            block, module, rest = match.groups()
            state_dict[f'{block}.{OFFICIAL_PARALLEL_MODULES[module]}{rest}'] = state_dict.pop(key)
    return state_dict


def stack_parallel_branches(state_dict: dict) -> dict:
    """timm's per-branch modules of parallel blocks (``attns.<b>`` / ``ffns.<b>``) stacked
    into our branched parameters."""
    branches: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in state_dict if PARALLEL_BRANCH.match(k)]:
        block, group, branch, module, param = PARALLEL_BRANCH.match(key).groups()
        target = f'{block}.{TIMM_PARALLEL_MODULES[group, module]}.{param}'
        branches.setdefault(target, {})[int(branch)] = state_dict.pop(key)
    for target, tensors in branches.items():
        stacked = torch.stack([tensors[b] for b in sorted(tensors)])
        if target.split('.')[2].startswith('ls'):
            stacked = stacked.view(len(tensors), 1, 1, -1)
        state_dict[target] = stacked
    return state_dict


def split_parallel_branches(state_dict: dict) -> dict:
    """Our branched parameters (blocks whose norms hold one row per branch) as timm's
    per-branch modules: the inverse of :func:`stack_parallel_branches`."""
    branched = {key[:-len('.norm1.weight')] for key, value in state_dict.items()
                if re.match(r'^blocks\.\d+\.norm1\.weight$', key) and value.dim() == 2}
    timm_modules = {ours: theirs for theirs, ours in TIMM_PARALLEL_MODULES.items()}
    for key in list(state_dict):
        match = BLOCK_MODULE.match(key)
        if not match or match.group(1) not in branched:
            continue
        block, module, param = match.groups()
        group, name = timm_modules[module]
        for branch, tensor in enumerate(state_dict.pop(key)):
            tensor = tensor.reshape(-1) if module.startswith('ls') else tensor
            state_dict[f'{block}.{group}.{branch}.{name}.{param}'] = tensor.clone()
    return state_dict


#: the options of the published families timm holds (their sizes: ``ViT.timm_models``):
#: EVA-02 (Fang et al. 2023): rotary positions and SwiGLU (B and L: ``scale_mlp=True``), its
#: rotary reference grid the 16 x 16 of its 224-px pretraining at every fine-tuned size
EVA02 = dict(patch_size=14, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, rope='eva02',
             ref_feat_shape=(16, 16))
#: DINOv3 (Siméoni et al. 2025): rotary positions alone, 4 storage tokens, LayerScale
DINOV3 = dict(pos_embed='none', rope='dinov3', reg_tokens=4, layer_scale=1e-5,
              qkv_bias=False, norm_eps=1e-5)
#: BEiT (Bao et al. 2022): relative position bias in every block, LayerScale
BEIT = dict(pos_embed='none', use_rel_pos_bias=True, layer_scale=1e-5)
#: CLIP's image tower (Radford et al. 2021): a norm before the blocks (OpenAI's: QuickGELU)
CLIP = dict(pre_norm=True, norm_eps=1e-5)


def sam_options(depth: int, global_blocks: tuple[int, ...]) -> dict:
    """SAM's image encoder (Kirillov et al. 2023) in ViTDet's layout: no class token, 14 x 14
    windows in all blocks but ``global_blocks``, relative positions, 1024-px input."""
    return dict(img_size=1024, class_token=False, window_size=14, use_rel_pos=True,
                window_block_indexes=tuple(i for i in range(depth) if i not in global_blocks))


def convert_detectron2_vitdet(state_dict: dict) -> dict:
    """The ViT backbone and simple feature pyramid of a detectron2 ViTDet state dict in our
    layout (``backbone.*``, ``neck.*``); other tensors (its RPN and RoI heads) are left out."""
    converted = {DETECTRON2_VITDET_KEYS.key_to_ours(key): value
                 for key, value in state_dict.items()}
    return {key: value for key, value in converted.items()
            if key.startswith(('backbone.', 'neck.'))}


@MODELS.register_module()
class ViT(ColumnarBackbone):
    """ViT backbone.

    Args (each family option left None takes ``arch``'s value, else ``arch_defaults``'s):
        arch: 'tiny', 'small', 'base', 'large', 'huge' or a dict.
        mlp_ratio: FFN hidden width over ``embed_dims`` (4).
        qkv_bias: biases of the query, key and value maps (True).
        num_parallel: parallel attention / FFN branches per block ("Three things" §3).
        stem: 'linear' patch projection or 'hmlp'.
        stem_norm: 'BN' or 'LN' inside the hMLP stem.
        no_embed_class: the position table has rows for the patches only; the class token
            (and registers) get no position (timm's option: DeiT III, DINOv2).
        reg_tokens: register tokens after the class token (Darcet et al., 2024; timm's
            option: DINOv2 with registers; DINOv3's storage tokens; DeiT-distilled's
            distillation token is one, with its position row: ``reg_tokens=1``).
        pos_embed: 'learn' (a learned absolute table) or 'none' (positions from ``rope``
            alone: DINOv3).
        rope: rotary position embeddings in every block's attention, one of
            ``rotary.ROPE_STYLES``: 'eva02' (EVA-02) or 'dinov3'; None: none.
        rope_temperature: the rotary frequency base (None: the style's: 10000 for EVA-02,
            100 for DINOv3).
        ref_feat_shape: ``rope='eva02'``: the grid (rows, cols) patch coordinates are
            rescaled to, the pretraining grid (timm's name; default ``img_size //
            patch_size``): a detector at 1024 px keeps the 224-px model's 16 x 16.
        qk_norm: LayerNorm of each head's queries and keys (timm's option).
        swiglu_mlp: SwiGLU FFN of ``mlp_ratio`` hidden width (EVA-02: ``mlp_ratio=4 * 2 /
            3``), timm's packed or unpacked tensors alike.
        scale_mlp: SwiGLU: a LayerNorm of the hidden units before ``fc2`` (EVA-02 B/L).
        act_layer: FFN activation, 'gelu' or 'quick_gelu' (OpenAI's CLIP).
        pre_norm: a LayerNorm of the tokens before the first block (``norm_pre``: CLIP).
        resample_patch_embed: load a checkpoint's patch projection of another kernel size
            resampled to ``patch_size`` (FlexiViT's pseudo-inverse resize, timm's
            ``resample_patch_embed``): how EVA-02's detectors take its 14-px kernels at 16 px.
            Not exact: the model computes about what the checkpoint's did.
        use_rel_pos_bias: BEiT's relative position bias in every block (timm's name: BEiT,
            data2vec; with ``pos_embed='none'``), its tables sized for ``img_size`` and
            resampled as BEiT does to other grids (at load and in forward); a pretraining
            checkpoint's shared table is copied to each block.
        res_post_norm: normalise the output of each block's attention and FFN, not their
            input (timm's res-post-norm blocks, ``ResPostBlock``: ``vit_*_rpn_*``).
        class_token: False: a model without class token (SigLIP, timm's ``*_gap`` ViTs; its
            registers, if any, kept), read by ``out_type='avg_featmap'`` or densely; SigLIP's
            attention-pooling head (``attn_pool``) is unused by dense models.
        Other arguments (``depth``, e.g. 18 for ViT-S18×2, and ``layer_scale`` among them):
        see :class:`ColumnarBackbone`.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=192, num_layers=12, num_heads=3),
        'small': dict(embed_dims=384, num_layers=12, num_heads=6),
        'base': dict(embed_dims=768, num_layers=12, num_heads=12),
        'large': dict(embed_dims=1024, num_layers=24, num_heads=16),
        'huge': dict(embed_dims=1280, num_layers=32, num_heads=16),
    }
    arch_defaults = dict(mlp_ratio=4., qkv_bias=True, layer_scale=None, num_parallel=1,
                         stem='linear', stem_norm='BN', no_embed_class=False, reg_tokens=0,
                         pos_embed='learn', rope=None, rope_temperature=None,
                         ref_feat_shape=None, qk_norm=False, swiglu_mlp=False,
                         scale_mlp=False, act_layer='gelu', pre_norm=False, class_token=True,
                         use_rel_pos_bias=False, resample_patch_embed=False,
                         res_post_norm=False)
    #: timm's ViT keys are ours (its bare position table: the shared table's); the sources'
    #: layouts are read on load. The sources' tensors stored otherwise are merged, each
    #: stored by timm's VisionTransformer as ours or refused by the export
    #: (``timm_inexpressible``), but for parallel blocks, split back into timm's branches
    checkpoint_keys = KeyTable(
        keys=OPENMMLAB_VIT_KEYS + SOURCE_KEYS,
        tensors=(TensorRule(merge_swiglu_tensors, to_timm=None),
                 TensorRule(merge_eva_attention, to_timm=None),
                 TensorRule(apply_key_bias_mask, to_timm=None),
                 TensorRule(copy_shared_relative_table, to_timm=None),
                 TensorRule(merge_hub_registers, to_timm=None),
                 TensorRule(flatten_position_grid, to_timm=None),
                 TensorRule(add_batch_axes, to_timm=None),
                 TensorRule(add_zero_patch_bias, to_timm=None),
                 TensorRule(name_official_parallel_branches, to_timm=None),
                 TensorRule(stack_parallel_branches, split_parallel_branches)),
        left_out=f'{SOURCE_ONLY_KEYS}|{OPENAI_CLIP_ONLY_KEYS}')
    no_weight_decay_names = ('table',)  # BEiT's relative position tables
    #: SigLIP's attention-pooling head (``attn_pool``) belongs to the classification stage
    classification_keys = r'^(norm|fc_norm|cls_blocks|attn_pool)\.'
    #: mmpretrain's ``resize_pos_embed`` and mmseg's ``resize_pos_embed`` (at load and in
    #: forward): ``F.interpolate`` bicubic without antialiasing; DINOv2's hub models
    #: (``interpolate_pos_encoding``): without registers (a ``mask_token``, LayerScale, the
    #: class row in the table), plain bicubic with the scale factor offset by 0.1; with
    #: registers, antialiased without offset, as timm
    position_kernels = (
        ((r'^layers\.\d+\.',), None, PositionKernel(antialias=False)),
        ((r'^mask_token$', r'^blocks\.\d+\.ls1\.gamma$', r'^pos_embed$'), r'^register_tokens$',
         PositionKernel(antialias=False, offset=.1)),
    )
    timm_arguments = dict(layer_scale='init_values', no_embed_class='no_embed_class',
                          reg_tokens='reg_tokens', class_token='class_token',
                          qk_norm='qk_norm', act_layer='act_layer', pre_norm='pre_norm',
                          fc_norm_after_pooling='fc_norm')
    #: timm's VisionTransformer has no rotary positions, SwiGLU or relative position bias
    #: (its Eva and Beit classes do, in layouts of their own), and builds res-post-norm
    #: blocks from a block class (``block_fn``), which no keyword names
    timm_inexpressible = dict(rope=None, swiglu_mlp=False, use_rel_pos_bias=False,
                              res_post_norm=False)
    checkpoint_markers = (r'^blocks\.\d+\.attn\.qkv\.',)
    #: the sources' layouts as saved, named by a refused load's advice: their rotary
    #: positions, relative bias and norms (the shapes show SwiGLU and the registers)
    checkpoint_layouts = (
        (r'relative_position_bias_table$', None, dict(use_rel_pos_bias=True, pos_embed='none'),
         "BEiT's relative position bias"),
        (r'\.attn\.(q_bias|q_proj\.weight)$', r'relative_position_bias_table$',
         dict(rope='eva02'), "EVA-02's rotary positions, which no tensor shows"),
        (r'^patch_embed\.', r'^(image_encoder\.)?pos_embed|relative_position_bias_table$',
         dict(pos_embed='none', rope='dinov3', norm_eps=1e-5),
         "DINOv3's rotary positions, its only ones"),
        (r'^(norm_pre|visual\.ln_pre)\.', None, dict(pre_norm=True, norm_eps=1e-5),
         "CLIP's norm before the blocks: OpenAI's weights take act_layer='quick_gelu' too, "
         "which no tensor shows"),
        (r'\.attn\.q_norm\.', None, dict(qk_norm=True), 'norms of the queries and keys'),
        (r'\.mlp\.(norm|ffn_ln)\.', None, dict(scale_mlp=True),
         "EVA-02's norm of the SwiGLU hidden units"),
    )
    timm_models = (
        ('tiny', {}, 'vit_tiny_patch16_224'),
        ('small', {}, 'vit_small_patch16_224'),
        ('base', {}, 'vit_base_patch16_224'),
        ('large', {}, 'vit_large_patch16_224'),
        ('huge', dict(patch_size=14), 'vit_huge_patch14_224'),
        ('small', dict(patch_size=8), 'vit_small_patch8_224'),
        ('base', dict(patch_size=32), 'vit_base_patch32_224'),
        ('small', dict(depth=18, num_parallel=2, layer_scale=1e-5),
         'vit_small_patch16_18x2_224'),
        ('small', dict(depth=36, layer_scale=1e-5), 'vit_small_patch16_36x1_224'),
        ('base', dict(depth=18, num_parallel=2, layer_scale=1e-5), 'vit_base_patch16_18x2_224'),
        ('small', dict(stem='hmlp'), None),
        ('small', EVA02, 'eva02_small_patch14_224'),
        ('base', dict(EVA02, scale_mlp=True), 'eva02_base_patch14_224'),
        ('large', dict(EVA02, scale_mlp=True), 'eva02_large_patch14_224'),
        ('small', dict(EVA02, img_size=336), 'eva02_small_patch14_336'),
        ('base', dict(EVA02, scale_mlp=True, img_size=448), 'eva02_base_patch14_448'),
        ('large', dict(EVA02, scale_mlp=True, img_size=448), 'eva02_large_patch14_448'),
        ('small', DINOV3, 'vit_small_patch16_dinov3'),
        ('base', DINOV3, 'vit_base_patch16_dinov3'),
        ('large', DINOV3, 'vit_large_patch16_dinov3'),
        ('base', CLIP, 'vit_base_patch16_clip_224'),
        ('large', dict(CLIP, patch_size=14), 'vit_large_patch14_clip_224'),
        ('base', dict(CLIP, act_layer='quick_gelu'), 'vit_base_patch16_clip_quickgelu_224'),
        ('large', dict(CLIP, patch_size=14, act_layer='quick_gelu'),
         'vit_large_patch14_clip_quickgelu_224'),
        ('base', dict(BEIT, layer_scale=.1), 'beit_base_patch16_224'),
        ('large', BEIT, 'beit_large_patch16_224'),
        ('base', sam_options(12, (2, 5, 8, 11)), 'samvit_base_patch16'),
        ('large', sam_options(24, (5, 11, 17, 23)), 'samvit_large_patch16'),
        ('base', dict(class_token=False), 'vit_base_patch16_siglip_224'),
        ('base', dict(class_token=False, reg_tokens=4, no_embed_class=True, img_size=256),
         'vit_base_patch16_reg4_gap_256'),
        ('base', dict(class_token=False, qkv_bias=False, res_post_norm=True),
         'vit_base_patch16_rpn_224'),
    )

    def __init__(self, arch: Union[str, dict] = 'base', *,
                 mlp_ratio: Optional[float] = None,
                 qkv_bias: Optional[bool] = None,
                 num_parallel: Optional[int] = None,
                 stem: Optional[str] = None,
                 stem_norm: Optional[str] = None,
                 no_embed_class: Optional[bool] = None,
                 reg_tokens: Optional[int] = None,
                 pos_embed: Optional[str] = None,
                 rope: Optional[str] = None,
                 rope_temperature: Optional[float] = None,
                 ref_feat_shape: Optional[tuple[int, int]] = None,
                 qk_norm: Optional[bool] = None,
                 swiglu_mlp: Optional[bool] = None,
                 scale_mlp: Optional[bool] = None,
                 act_layer: Optional[str] = None,
                 pre_norm: Optional[bool] = None,
                 class_token: Optional[bool] = None,
                 use_rel_pos_bias: Optional[bool] = None,
                 resample_patch_embed: Optional[bool] = None,
                 res_post_norm: Optional[bool] = None,
                 arch_overrides: Optional[dict] = None,
                 **kwargs) -> None:
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def build_patch_embed(self) -> nn.Module:
        if self.arch['stem'] not in STEMS:
            raise ValueError(f'unknown stem {self.arch["stem"]!r}; expected one of {STEMS}')
        if self.arch['stem'] == 'hmlp':
            return HMLPPatchEmbed(self.in_channels, self.embed_dims, self.patch_size,
                                  self.arch['stem_norm'])
        return PatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> Optional[nn.Module]:
        if self.arch['reg_tokens'] < 0:
            raise ValueError(f'reg_tokens must be >= 0, got {self.arch["reg_tokens"]}')
        if self.arch['pos_embed'] not in POS_EMBEDS:
            raise ValueError(f'unknown pos_embed {self.arch["pos_embed"]!r}; expected one of '
                             f'{POS_EMBEDS}')
        if self.arch['pos_embed'] == 'none':
            return None
        if self.arch['no_embed_class']:
            return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                            unpositioned_prefix_tokens=self.num_prefix_tokens,
                                            antialias=self.pos_antialias)
        return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                        num_prefix_tokens=self.num_prefix_tokens,
                                        checkpoint_prefix_tokens=int(self.arch['class_token'])
                                        + self.arch['reg_tokens'],
                                        antialias=self.pos_antialias)

    def place_class_token(self) -> int:
        if self.arch['class_token']:
            return 0
        if self.out_type == 'cls_token':
            raise ValueError("class_token=False builds no class token: read the model with "
                             "out_type='avg_featmap' or densely (out_type='featmap')")
        return self.num_layers

    def built_by_other_modes(self, key: str) -> bool:
        """As the base's, except that a model without class token keeps its registers."""
        if key == 'reg_token' and self.reg_token is not None:
            return False
        return super().built_by_other_modes(key)

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        arch, layout = self.arch, self.block_layouts[index]
        if arch['num_parallel'] < 1:
            raise ValueError(f'num_parallel must be >= 1, got {arch["num_parallel"]}')
        if arch['num_parallel'] > 1 and layout != AttentionLayout():
            raise ValueError('window attention and relative positions do not support '
                             'parallel blocks (num_parallel > 1)')
        mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, arch['qkv_bias'],
                                       num_branches=arch['num_parallel'],
                                       rel_pos_grid=layout.rel_pos_grid,
                                       qk_norm=arch['qk_norm'], norm_eps=self.norm_eps,
                                       rope=self._rotary_embedding(),
                                       rel_pos_bias=RelativePositionBias(
                                           self.num_heads, self.pretrain_grid)
                                       if arch['use_rel_pos_bias'] else None)
        return TransformerBlock(self.embed_dims, mixer, arch['mlp_ratio'], arch['layer_scale'],
                                drop_path, self.drop_rate, num_branches=arch['num_parallel'],
                                window_size=layout.window_size, norm_eps=self.norm_eps,
                                mlp=self._feed_forward(), res_post_norm=arch['res_post_norm'])

    def build_norm_pre(self) -> Optional[nn.Module]:
        return nn.LayerNorm(self.embed_dims, eps=self.norm_eps) if self.arch['pre_norm'] \
            else None

    def _rotary_embedding(self) -> Optional[RotaryPositionEmbedding]:
        """A block's rotary position embedding (``rope``), or None."""
        if self.arch['rope'] is None:
            return None
        return RotaryPositionEmbedding(self.embed_dims // self.num_heads, self.arch['rope'],
                                       self.arch['rope_temperature'],
                                       self.arch['ref_feat_shape'] or self.pretrain_grid)

    def _feed_forward(self) -> Optional[nn.Module]:
        """A block's SwiGLU FFN, or None for the default MLP (with ``act_layer``)."""
        arch = self.arch
        if not arch['swiglu_mlp']:
            if arch['scale_mlp']:
                raise ValueError('scale_mlp normalises the hidden units of a SwiGLU FFN: set '
                                 'swiglu_mlp=True')
            return None if arch['act_layer'] == 'gelu' else FeedForward(
                self.embed_dims, int(self.embed_dims * arch['mlp_ratio']), self.drop_rate,
                arch['num_parallel'], arch['act_layer'])
        if arch['num_parallel'] > 1:
            raise ValueError('swiglu_mlp does not support parallel blocks (num_parallel > 1)')
        return SwiGLU(self.embed_dims, int(self.embed_dims * arch['mlp_ratio']),
                      self.drop_rate, arch['scale_mlp'], self.norm_eps)

    def fit_checkpoint_tensors(self, converted: dict) -> dict:
        """BEiT's relative position tables of another grid resampled to the model's, as BEiT
        does (their modules' load hook does the same for our own layout); with
        ``resample_patch_embed`` the patch projection resampled to ``patch_size``."""
        kernel = converted.get('patch_embed.proj.weight')
        if self.arch['resample_patch_embed'] and kernel is not None and \
                kernel.shape[-2:] != (self.patch_size, self.patch_size):
            MMLogger.get_current_instance().info(
                f'{type(self).__name__}: patch projection of {tuple(kernel.shape[-2:])} kernels '
                f'resampled to {self.patch_size} (resample_patch_embed=True)')
            converted['patch_embed.proj.weight'] = resample_patch_embed(
                kernel, [self.patch_size, self.patch_size])
        for name, module in self.named_modules():
            if isinstance(module, RelativePositionBias) and f'{name}.table' in converted:
                converted[f'{name}.table'] = module.checkpoint_table(converted[f'{name}.table'])
        return self._take_class_token_norm(self._drop_computed_rotary_tables(converted))

    def _take_class_token_norm(self, converted: dict) -> dict:
        """DINOv3 L SAT-493M and 7B normalise the class and storage tokens by a norm of
        their own (``cls_norm``) and the patches by ``norm``: a model reading the class token
        takes ``cls_norm`` as its final norm; one reading the patches keeps ``norm`` and
        leaves ``cls_norm`` unused, logged."""
        untied = {key: converted.pop(key) for key in list(converted)
                  if key.startswith(UNTIED_CLASS_NORM)}
        if not untied:
            return converted
        reads_class_token = self.out_type == 'cls_token' and not self.fc_norm_after_pooling
        if reads_class_token:
            converted.update({'norm.' + key[len(UNTIED_CLASS_NORM):]: value
                              for key, value in untied.items()})
        read = ('the class token is read, normalised by cls_norm' if reads_class_token
                else 'the patches are read: cls_norm is unused')
        MMLogger.get_current_instance().info(
            f'{type(self).__name__}: the checkpoint normalises its class token by cls_norm and '
            f'its patches by norm (untied norms); {read}')
        return converted

    def _drop_computed_rotary_tables(self, converted: dict) -> dict:
        """EVA-02's rotary tables (``EVA_ROTARY_TABLE``) dropped, with a log line, where
        this model's rotary embedding computes each of them (within float rounding); else
        kept, so that the load is refused and the advice names the reference grid they are
        built for (``ref_feat_shape``)."""
        tables = {key: value for key, value in converted.items() if EVA_ROTARY_TABLE.match(key)}
        rope = self._rotary_embedding()
        if not tables or rope is None or rope.style != 'eva02':
            return converted
        for key, table in tables.items():
            rows, dims = table.shape[-2:]
            side = math.isqrt(rows)
            if table.dim() != 2 or side * side != rows or dims != rope.head_dim:
                return converted
            angles = rope.angles((side, side), table.device)
            computed = angles.cos() if key.endswith('cos') else angles.sin()
            if (table.float() - computed).abs().max() > ROTARY_TABLE_TOLERANCE:
                return converted
        for key in tables:
            del converted[key]
        MMLogger.get_current_instance().info(
            f'{type(self).__name__}: the checkpoint\'s {len(tables)} rotary tables (EVA-02\'s '
            f'buffers: {", ".join(sorted(tables)[:3])}, ...) are what this model computes '
            f'(reference grid {rope.ref_grid}): dropped')
        return converted

    def mechanisms_not_built(self, saved_keys: list[str]) -> list[str]:
        """Learned rotary frequencies (``rope.freqs``, ``freqs``: timm's and Naver's
        rope-mixed ViTs, Heo et al. 2024)."""
        if any(LEARNED_ROTARY.match(key) for key in saved_keys):
            return ["learned rotary frequencies (rope.freqs: the rope-mixed ViTs)"]
        return []

    def order_options(self, saved_keys: list[str]) -> list[str]:
        """``res_post_norm`` as the order of the first block's keys as saved shows it
        (timm's ``ResPostBlock`` and ours save ``attn`` before ``norm1``, pre-norm blocks
        ``norm1`` first), where this model's differs; a file whose keys are sorted (as
        safetensors writes them) shows no order."""
        first: dict[str, int] = {}
        for index, key in enumerate(saved_keys):
            match = BLOCK_MODULE_AS_SAVED.match(key)
            if match:
                first.setdefault(match.group(1), index)
        if saved_keys == sorted(saved_keys) or len(first) < 2:
            return []
        post_norm = first['attn'] < first['norm1']
        if post_norm == self.arch['res_post_norm']:
            return []
        return [f'res_post_norm={post_norm} (the file\'s blocks normalise the '
                f'{"outputs" if post_norm else "inputs"} of attention and FFN: its keys put '
                f'{"attn before norm1" if post_norm else "norm1 before attn"})']

    def options_to_load(self, found: dict, model: dict) -> list[str]:
        """As the base's, and EVA-02's rotary reference grid where the checkpoint's rotary
        tables show another than the model's (or, with ``rope`` advised, would have)."""
        options = super().options_to_load(found, model)
        grid = found['rotary_grid']
        if grid and found['family'] == model['family'] and \
                grid != tuple(self.arch['ref_feat_shape'] or self.pretrain_grid):
            options.append(f"ref_feat_shape={grid} (the reference grid of the checkpoint's "
                           f"EVA-02 rotary tables)")
        return options

    @classmethod
    def convert_checkpoint(cls, state_dict: dict) -> dict:
        """As the base's, for a file wrapped in ``module`` too (EVA-02's releases)."""
        if isinstance(state_dict.get('module'), dict):
            state_dict = state_dict['module']
        return super().convert_checkpoint(state_dict)
