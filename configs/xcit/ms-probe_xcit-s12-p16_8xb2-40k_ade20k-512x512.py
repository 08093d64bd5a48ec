# Multi-layer probe (DINOv2 "+ms": the last four blocks' patch tokens concatenated; report it
# with tools/test.py --tta), ADE20k 40k, frozen XCiT-S12/16 (official IN-1k weights).
_base_ = './linear-probe_xcit-s12-p16_8xb2-40k_ade20k-512x512.py'
model = dict(
    backbone=dict(out_indices=(-4, -3, -2, -1)),
    decode_head=dict(in_channels=[384] * 4, in_index=[0, 1, 2, 3]))
