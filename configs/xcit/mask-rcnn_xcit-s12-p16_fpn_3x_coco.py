# Mask R-CNN + FPN, COCO 3x, XCiT-S12/16 (the _base_ model, XCiT paper Tables 5-6).
_base_ = '../_base_/mask-rcnn_columnar_3x_coco.py'
# The official XCiT dense forward on inputs that are not multiples of 32 (ADE20k whole-image
# testing, e.g. 512 × 683): the stem pads itself, the pyramid pools in floor mode. Converted
# official dense checkpoints (tools/model_converters/xcit_dense_official.py) see exactly the
# features they were evaluated with.
model = dict(backbone=dict(padding='stem'))
