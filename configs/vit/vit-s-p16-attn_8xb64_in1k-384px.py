# Attention-only fine-tuning of ViT-S/16 at 384x384 ("Three things" §4, Table 5): only the
# MHSA weights (plus norms, position embedding, class token and head) train, the FFNs stay
# frozen. The trainable-parameter count and the memory this saves are logged at start-up.
_base_ = ['./vit-s-p16_8xb64_in1k-384px.py']

model = dict(finetune='attention')
