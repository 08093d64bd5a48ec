# Mask R-CNN, COCO 3x, on a frozen XCiT-S12/16 (official IN-1k weights): the embeddings and all
# 12 blocks keep their weights and stay in eval mode (frozen_stages=12); the multi-layer
# pyramid, FPN and heads train. XCiT's dense trunk carries no class token, so nothing of the
# checkpoint trains.
_base_ = './mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'
model = dict(backbone=dict(frozen_stages=12))
