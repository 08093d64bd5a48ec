# Weight decay as timm's create_optimizer applies it in the DeiT and "Three things" code: none
# on 1-D parameters (norms, biases, LayerScale and gating vectors), the position embedding and
# the class token. The parallel blocks of "Three things" stack their branches' norms and
# LayerScale vectors into (branches, ...) tensors, so those are exempt by name ('.norm',
# '.gamma'). The schedules that use it set the optimizer and its decay. Our constructor under
# its 'custom_keys' rule applies mmengine's options alone, then merges the groups of equal
# options (one per tensor otherwise).
optim_wrapper = dict(
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(
        weight_decay_rule='custom_keys',
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
            '.norm': dict(decay_mult=0.0),
            '.gamma': dict(decay_mult=0.0),
        }),
)
