"""Which LoRA keys ComfyUI's loader reads for a Wan DiT, and what it does with them.

ComfyUI cannot be installed here, so its rules are restated in plain Python from its source, as
read in the public repository Comfy-Org/ComfyUI (formerly comfyanonymous/ComfyUI), each file at
the commit its stored copy carries:
  comfy/sd.py                  033046cc4fac82d954c6daedccf1c8128433c4f1  load_lora_for_models:
                               key map = model_lora_keys_unet(model); lora = convert_lora(lora);
                               patches = load_lora(lora, key map)
  comfy/lora.py                17358c8f73b581a0d22facc3c385822f09b8bfb1  model_lora_keys_unet,
                               load_lora
  comfy/weight_adapter/lora.py 6f98b150e065f1ffc788558574a887835068bd40  LoRAAdapter.load (the
                               up/down suffix pairs), LoRAAdapter.calculate_weight (the merge)
  comfy/lora_convert.py        2bffe2f4ce5763dcb83df6a670657b6d5c8f85a5  convert_lora
  comfy/utils.py               09708eae709a992a5684bed3595ce4d07e705b4e  unet_to_diffusers
  comfy/model_base.py          094c74c1b7f9cd5cdd9015741e8eb26acff1142a  BaseModel, WAN21
  comfy/ldm/wan/model.py       0c9a69aefdb1fcf6b9c60478aa9e511b01f8e96f  WanModel's module names

What those files say, for a Wan model (WAN21 and its subclasses):
- The model's state dict is the official Wan one under "diffusion_model." (BaseModel keeps the
  DiT as self.diffusion_model; WanModel names its layers as the official code: blocks.N.self_attn.q,
  blocks.N.cross_attn.o, blocks.N.ffn.0, ...).
- model_lora_keys_unet gives every "diffusion_model.K.weight" two LoRA names, "diffusion_model.K"
  and "lora_unet_" + K with dots replaced by underscores, and maps every other "diffusion_model."
  key (biases, norms, modulation) to itself. Its diffusers-name block (unet_to_diffusers) is empty
  for a DiT (no num_res_blocks), and none of its model-specific blocks (SD3, Flux, HunyuanVideo,
  QwenImage, ...) is a Wan one: "transformer.<diffusers name>" keys and bare "blocks.N..." keys
  are NOT read for Wan (they end up as "lora key not loaded" warnings).
- convert_lora rewrites only four other layouts first; for Wan only the VideoX-Fun one applies
  ("lora_unet__blocks_0_cross_attn_k.lora_down.weight" present: prefix "lora_unet__" becomes
  "lora_unet_"). The others (BFL control, USO, Krea2 fused qkv) never match Wan names.
- load_lora walks the key map; for a name X it reads X.alpha and X.dora_scale when present, then
  the first LoRA pair present of LORA_FORMS below (X.lora_up.weight also takes X.lora_mid.weight);
  its diff forms (X.diff, X.diff_b for the bias, X.set_weight) are read too. LoHa, LoKr, GLoRA,
  OFT and BOFT tensors are outside this module: here they count as not loaded. Every tensor of
  the file that nothing read is logged as "lora key not loaded"; an up key without its down key
  raises KeyError in ComfyUI (reported in `errors` here).
- The merge (calculate_weight): W += strength * s * (up.flatten(1) @ down.flatten(1)), computed in
  float32 and cast to W's dtype, with s = alpha / down.shape[0] (alpha / rank) when X.alpha exists
  and s = 1 without it. alpha is read with .item(): any one-element tensor, any dtype.

The form chosen for wan-distill's ComfyUI file (standard_keys) puts kohya's suffixes (lora_down,
lora_up with the trainer's own factors, alpha, scaled alpha / rank) on the name ComfyUI derives
straight from its state dict: "diffusion_model.K.lora_down.weight" [rank, in],
"diffusion_model.K.lora_up.weight" [out, rank], "diffusion_model.K.alpha" (a 0-d float32 tensor).
Wan LoRAs of this form show in ComfyUI users' logs (e.g. Comfy-Org/ComfyUI issue #10222), and
diffusers 0.42.1 reads it for Wan too (lora_conversion_utils._convert_non_diffusers_wan_lora_to_
diffusers, with the same alpha / rank scale).
"""

import torch

# (up, down) suffix pairs of a LoRA name, in the order LoRAAdapter.load tries them.
LORA_FORMS = (
    (".lora_up.weight", ".lora_down.weight"),  # kohya / LyCORIS; also reads .lora_mid.weight
    ("_lora.up.weight", "_lora.down.weight"),  # old diffusers attention processors
    (".lora_B.weight", ".lora_A.weight"),  # peft
    (".lora.up.weight", ".lora.down.weight"),
    (".lora_B", ".lora_A"),  # Mochi
    (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"),  # transformers
    (".lora_B.default.weight", ".lora_A.default.weight"),  # peft with its adapter name
)
MID_SUFFIX = ".lora_mid.weight"
SHARED_SUFFIXES = (".alpha", ".dora_scale")  # read for every name, whatever the form
DIFF_SUFFIXES = (".diff", ".set_weight", ".diff_b")  # whole-tensor patches; .diff_b patches the bias
STANDARD_SUFFIXES = (".lora_down.weight", ".lora_up.weight", ".alpha")
MODEL_PREFIX = "diffusion_model."
WAN_FUN_MARK = "lora_unet__blocks_0_cross_attn_k.lora_down.weight"


def lora_names(native_weight_key):
    """The LoRA names ComfyUI gives the native Wan weight "K.weight": diffusion_model.K, lora_unet_K_."""
    if not native_weight_key.endswith(".weight"):
        raise ValueError(f"'{native_weight_key}' is not a weight key")
    stem = native_weight_key[: -len(".weight")]
    return (MODEL_PREFIX + stem, "lora_unet_" + stem.replace(".", "_"))


def standard_keys(native_weight_key):
    """The three tensors wan-distill's ComfyUI file holds for one targeted weight (down, up, alpha)."""
    name = lora_names(native_weight_key)[0]
    return tuple(name + suffix for suffix in STANDARD_SUFFIXES)


def key_map(native_keys):
    """model_lora_keys_unet for a Wan model: LoRA name -> the model key it patches (native keys
    given without the "diffusion_model." prefix ComfyUI's model adds)."""
    names = {}
    for key in native_keys:
        if key.endswith(".weight"):
            for name in lora_names(key):
                names[name] = MODEL_PREFIX + key
        else:
            names[MODEL_PREFIX + key] = MODEL_PREFIX + key
    return names


def accepted_keys(native_keys):
    """Every file key ComfyUI reads for each native weight: {native weight key: set of keys}."""
    suffixes = [s for pair in LORA_FORMS for s in pair] + [MID_SUFFIX, *SHARED_SUFFIXES, *DIFF_SUFFIXES]
    return {key: {name + s for name in lora_names(key) for s in suffixes}
            for key in native_keys if key.endswith(".weight")}


def convert(keys):
    """convert_lora's renaming, as far as it concerns Wan: {key in the file: key load_lora sees}."""
    if WAN_FUN_MARK in keys:
        return {k: "lora_unet_" + k[len("lora_unet__"):] if k.startswith("lora_unet__") else k for k in keys}
    return {k: k for k in keys}


def load(keys, native_keys):
    """load_lora over a file holding `keys` for a model with `native_keys`.

    Returns (patches, not_loaded, errors): patches maps each patched model key to a dict with the
    file keys read for it ("up", "down", optional "alpha", "mid", "dora_scale", "diff", ...);
    not_loaded is the set of file keys nothing read (ComfyUI's "lora key not loaded" warnings);
    errors lists what makes ComfyUI raise (an up key without its down key)."""
    renamed = convert(keys)
    present = {seen: original for original, seen in renamed.items()}
    loaded, patches, errors = set(), {}, []

    def take(key):
        loaded.add(key)
        return present[key]

    for name, target in key_map(native_keys).items():
        shared = {s[1:]: take(name + s) for s in SHARED_SUFFIXES if name + s in present}
        for up, down in LORA_FORMS:
            if name + up not in present:
                continue
            if name + down not in present:
                errors.append(f"{present[name + up]} has no {name + down}: KeyError in ComfyUI")
                break
            patch = {"up": take(name + up), "down": take(name + down), **shared}
            if up == LORA_FORMS[0][0] and name + MID_SUFFIX in present:
                patch["mid"] = take(name + MID_SUFFIX)
            patches[target] = patch
            break
        for suffix in DIFF_SUFFIXES:
            if name + suffix in present:
                bias = suffix == ".diff_b"
                patched = target[: -len(".weight")] + ".bias" if bias else target
                patches.setdefault(patched, {})[suffix[1:]] = take(name + suffix)
    not_loaded = {original for original, seen in renamed.items() if seen not in loaded}
    return patches, not_loaded, errors


def scale(down, alpha=None):
    """The factor ComfyUI puts on up @ down: alpha / rank (rank = down.shape[0]), 1 without alpha."""
    return 1.0 if alpha is None else alpha.item() / down.shape[0]


def merge(weight, up, down, alpha=None, strength=1.0):
    """LoRAAdapter.calculate_weight without mid or DoRA: the patched weight, in weight's dtype."""
    diff = up.float().flatten(1) @ down.float().flatten(1)
    return (weight.float() + (strength * scale(down, alpha)) * diff.reshape(weight.shape)).to(weight.dtype)
