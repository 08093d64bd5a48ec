"""DeiT III's parallel blocks (two attention and two FFN branches a block) in checkpoints:
the official release's second-branch modules and timm's per-branch modules, read into our
branched parameters (one row per branch) and written back as timm's."""
import re

import torch

#: timm's per-branch modules of a parallel block (``attns.<b>.norm``, ...) -> ours
TIMM_PARALLEL_MODULES = {('attns', 'norm'): 'norm1', ('attns', 'attn'): 'attn',
                         ('attns', 'ls'): 'ls1', ('ffns', 'norm'): 'norm2',
                         ('ffns', 'mlp'): 'mlp', ('ffns', 'ls'): 'ls2'}
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
