"""ViT's checkpoint layouts: the keys and tensors of the sources ViT loads (timm's ViT, EVA-02,
DINOv2 / v3, SAM, BEiT, OpenAI's CLIP, DeiT III, OpenMMLab's and detectron2's ViTDet) as
key tables and tensor rules, read by :class:`.vit.ViT` (``checkpoint_keys``) and its
checkpoint methods.
"""
import re

import torch

from ..layers.swiglu import merge_swiglu_tensors
from .checkpoint_keys import Alias, KeyTable, TensorRule

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


def convert_detectron2_vitdet(state_dict: dict) -> dict:
    """The ViT backbone and simple feature pyramid of a detectron2 ViTDet state dict in our
    layout (``backbone.*``, ``neck.*``); other tensors (its RPN and RoI heads) are left out."""
    converted = {DETECTRON2_VITDET_KEYS.key_to_ours(key): value
                 for key, value in state_dict.items()}
    return {key: value for key, value in converted.items()
            if key.startswith(('backbone.', 'neck.'))}


#: timm's ViT keys are ours (its bare position table: the shared table's); the sources'
#: layouts are read on load. The sources' tensors stored otherwise are merged, each
#: stored by timm's VisionTransformer as ours or refused by the export
#: (``timm_inexpressible``), but for parallel blocks, split back into timm's branches
VIT_KEYS = KeyTable(
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
