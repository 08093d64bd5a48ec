# Demo: the linear probe of the demo UperNet's small XCiT (trained on the demo
# ADE20k-layout set; load it with load_from), frozen.
_base_ = '../_base_/demo_linear-probe_ade.py'
