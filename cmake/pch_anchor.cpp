// Anchor translation unit that owns the precompiled <torch/torch.h> for all wd targets.
