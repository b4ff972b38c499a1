"""Native Wan <-> diffusers (WanTransformer3DModel) names of the DiT's tensors.

The same table as src/model/wan_keys.cpp (spec §7, from diffusers'
scripts/convert_wan_to_diffusers.py); shapes are equal under both names.
"""

# Renames of the part of a key outside the blocks (patch_embedding.* keeps its name).
_TOP = (
    ("text_embedding.0.", "condition_embedder.text_embedder.linear_1."),
    ("text_embedding.2.", "condition_embedder.text_embedder.linear_2."),
    ("time_embedding.0.", "condition_embedder.time_embedder.linear_1."),
    ("time_embedding.2.", "condition_embedder.time_embedder.linear_2."),
    ("time_projection.1.", "condition_embedder.time_proj."),
    ("head.modulation", "scale_shift_table"),
    ("head.head.", "proj_out."),
)

# Renames of the part after "blocks.N."; the first matching prefix wins (o before q/k/v).
_BLOCK = (
    ("modulation", "scale_shift_table"),
    ("self_attn.o.", "attn1.to_out.0."),
    ("cross_attn.o.", "attn2.to_out.0."),
    ("self_attn.norm_", "attn1.norm_"),
    ("cross_attn.norm_", "attn2.norm_"),
    ("self_attn.", "attn1.to_"),
    ("cross_attn.", "attn2.to_"),
    ("norm3.", "norm2."),  # the affine cross-attention norm: diffusers swaps the norm names
    ("ffn.0.", "ffn.net.0.proj."),
    ("ffn.2.", "ffn.net.2."),
)


def _split_block(key):
    """("blocks.N.", rest) for a block key, ("", key) otherwise."""
    if key.startswith("blocks."):
        dot = key.find(".", len("blocks."))
        if dot > 0:
            return key[: dot + 1], key[dot + 1 :]
    return "", key


def native_to_diffusers(native):
    """The diffusers name of a native key; KeyError for a key the table does not know."""
    if native.startswith("patch_embedding."):
        return native
    block, rest = _split_block(native)
    for old, new in _BLOCK if block else _TOP:
        if rest.startswith(old):
            return block + new + rest[len(old) :]
    raise KeyError(f"no diffusers name for Wan key '{native}'")


def diffusers_to_native(name):
    """The native name of a diffusers key, or None when it is not one of the DiT's tensors."""
    if name.startswith("patch_embedding."):
        return name
    block, rest = _split_block(name)
    for old, new in _BLOCK if block else _TOP:
        if rest.startswith(new):
            native = block + old + rest[len(new) :]
            # "attn1.to_" is a prefix of "attn1.to_out.0.": accept exact inverses only.
            try:
                if native_to_diffusers(native) == name:
                    return native
            except KeyError:
                pass
    return None


def to_diffusers(state):
    """A native state dict renamed for WanTransformer3DModel.load_state_dict (same tensors)."""
    return {native_to_diffusers(k): v for k, v in state.items()}


def diffusers_config(native):
    """WanTransformer3DModel's constructor arguments for a native config.json (t2v / ti2v;
    i2v has the same DiT with in_dim counting the image channels)."""
    heads = native["num_heads"]
    return {
        "patch_size": tuple(native.get("patch_size", (1, 2, 2))),
        "num_attention_heads": heads,
        "attention_head_dim": native["dim"] // heads,
        "in_channels": native["in_dim"],
        "out_channels": native["out_dim"],
        "text_dim": native["text_dim"],
        "freq_dim": native["freq_dim"],
        "ffn_dim": native["ffn_dim"],
        "num_layers": native["num_layers"],
        "cross_attn_norm": native.get("cross_attn_norm", True),
        "qk_norm": "rms_norm_across_heads" if native.get("qk_norm", True) else None,
        "eps": native.get("eps", 1e-6),
    }
