#!/usr/bin/env python3
"""LoRA students out to diffusers and ComfyUI, and a diffusers LoRA in, checked by diffusers itself.

A tiny fp32 teacher (`init-teacher --preset tiny --dtype fp32`) and a LoRA student trained on it
for 5 steps (launch/mpirun.sh -np 2 ... train --train.objective guided --student.lora_rank 4 --student.lora_alpha 8, so
that the scale alpha / rank = 2 is exercised) are exported by `wan-distill convert`: the teacher
(BASE) and the merged student W' = W + (alpha / rank) up @ down in diffusers layout, fp32, and the
LoRA alone (--layout lora): DIR/pytorch_lora_weights.safetensors (diffusers / peft names, the scale
folded into lora_B) and DIR/wan_lora_comfyui.safetensors (ComfyUI names, comfyui_lora_keys.py).
a. diffusers' own loading of the first file (WanPipeline.lora_state_dict, then
   load_lora_into_transformer: what WanPipeline.load_lora_weights runs) onto from_pretrained(BASE)
   logs no warning and puts every lora_A / lora_B tensor of the file, bit for bit, into the peft
   layer of its linear, one layer per targeted linear, each at scale 1 (diffusers takes lora_alpha
   = rank when the file has no alpha). diffusers reports unexpected or missing adapter keys only
   as a warning (hidden at the error verbosity the tests otherwise run at, so captured here at
   warning level), and a missing lora_B is left unset (a meta tensor with load_lora_weights'
   low_cpu_mem_usage, zeros without it): hence the tensor-by-tensor count.
b. That model's forward equals the merged export's (from_pretrained(MERGED)) and differs from the
   base's by more than 100 times the tolerance (the LoRA is no no-op); diffusers' fuse_lora of it
   equals the merged export's tensors.
c. Every key of the ComfyUI file is read by ComfyUI's loader for the merged model's native keys,
   and the file holds exactly down, up and alpha of each targeted linear in the standard form;
   ComfyUI's merge of it (W + alpha / rank up @ down) on the teacher's weights equals the merged
   export's; diffusers, which reads this form too, gives the merged forward from it.
d. diffusers' own saver writes a LoRA (peft adapter r = lora_alpha = 4 on the base, random non-zero
   lora_B); `train --student.lora_init FILE` for one step and `convert --layout diffusers` of that
   student equal diffusers' fuse_lora of the adapter. train.lr must be > 0 (and train.min_lr <=
   train.lr), so the step runs at lr 1e-30 with min_lr 0: an AdamW update of at most 1e-30 per
   element leaves every factor unchanged in fp32.

e. The A14B pair: a two-expert tiny teacher (init-teacher --experts 2), one LoRA run per expert
   (--student.expert high, then low: each over its own expert, on its own side of t 875), the two
   RUN/student folders as a pair (high_noise_model/, low_noise_model/), `convert --layout lora` of
   the pair: one folder of files per expert. A WanPipeline holding the two experts (transformer =
   high, transformer_2 = low, boundary_ratio 0.875) loads them as its users do,
   load_lora_weights(high) and load_lora_weights(low, load_into_transformer_2=True), with no
   warning; each transformer's forward equals its expert's merged export, and the two LoRAs differ
   (each went to its own expert).
f. A LoRA student over a bf16 teacher (init-teacher's default dtype), as a new user trains one:
   `convert --dtype fp32` of it is the fp32 merge, base + (alpha / rank) up @ down from the folder's
   fp32 factors on the widened bf16 base, not that merge rounded to bf16 (about 1e-3 away, so the
   check tells them apart), and its forward equals diffusers' fuse_lora of the exported fp32
   LoRA on from_pretrained(BASE in fp32) within 1e-5 of the output's largest magnitude. The
   default bf16 convert is that fp32 merge rounded once, bit for bit.
g. The I2V LoRA: a LoRA student of a tiny i2v teacher (in_dim 36, y at every forward of its
   builtin data), the teacher and the merged student exported with `convert --layout pipeline`
   (WanImageToVideoPipeline folders) and the LoRA with --layout lora. a, b and c again on this
   model (forwards with y), and WanImageToVideoPipeline.from_pretrained(BASE).load_lora_weights
   (the I2V pipeline's own loader, its T2V-to-I2V expansion included) logs no warning, puts every
   tensor of the file into the pipeline transformer's peft layers, and gives the merged forward.

Tolerances (max |ours - diffusers| or |ours - ComfyUI's formula|, fp32 throughout):
  forward outputs                1e-5 absolute, as test_diffusers_interop.py (f: 1e-5 relative to
                                 max|out|, the issue's bound).
  weights of a merged model      1e-6 absolute: both sides add the same rank-4 product to the
                                 same weight and differ only in fp32 rounding (where the scale is
                                 applied, summation order): ~3e-8 for the tiny model's weights.

Usage: .venv/bin/python tests/python/test_lora_export.py WAN_DISTILL MPIRUN_SH WORK_DIR
Exit status 0 when everything agrees, 1 otherwise (also when a package is missing).
"""

import json
import logging
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch
    from diffusers import WanPipeline
    from diffusers.utils import logging as diffusers_logging
    from peft import LoraConfig
    from peft.tuners.lora import LoraLayer
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

import comfyui_lora_keys as comfy  # noqa: E402  (this folder: ComfyUI's LoRA key rules)
import wan_keys  # noqa: E402  (tools/, after the path is set)
from test_diffusers_interop import diffusers_forward, finish, load_diffusers, make_inputs, start  # noqa: E402
from wd_test_support import CPU_JOB, OfficialTimesteps  # noqa: E402

RANK, ALPHA = 4, 8
TRAIN_LR = 0.01  # 5 AdamW steps without warmup move each lora_up entry by ~0.03: a visible LoRA
IMPORT_LR = 1e-30  # in place of 0, which train refuses (train.lr must be > 0)
FORWARD_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-6
NOT_A_NO_OP = 100  # the LoRA must move the forward by this many forward tolerances
LINEARS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
           "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
DIFFUSERS_FILE, COMFY_FILE = "pytorch_lora_weights.safetensors", "wan_lora_comfyui.safetensors"


class Warnings:
    """While open, collects what diffusers logs at warning level or above and Python's warnings."""

    def __enter__(self):
        self.messages, self.verbosity = [], diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_warning()
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        logging.getLogger("diffusers").addHandler(self.handler)
        self.catcher = warnings.catch_warnings(record=True)
        self.recorded = self.catcher.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.catcher.__exit__(*exc)
        logging.getLogger("diffusers").removeHandler(self.handler)
        diffusers_logging.set_verbosity(self.verbosity)
        self.messages += [f"{w.category.__name__}: {w.message}" for w in self.recorded]


def lora_targets(native_keys):
    """The native weight keys of the linears a LoRA student adapts (LINEARS in every block)."""
    return sorted(k for k in native_keys
                  if k.startswith("blocks.") and k.split(".", 2)[2] in {f"{n}.weight" for n in LINEARS})


def diffusers_module(native_weight_key):
    """The diffusers name of the linear a native weight key belongs to (a peft target)."""
    return wan_keys.native_to_diffusers(native_weight_key)[: -len(".weight")]


def with_lora(base, folder, weight_name, adapter):
    """from_pretrained(base) with the LoRA file loaded as WanPipeline.load_lora_weights does, and
    the warnings that logged; no model when diffusers refused the file."""
    model, _ = load_diffusers(base)
    with Warnings() as log:
        try:
            state = WanPipeline.lora_state_dict(str(folder), weight_name=weight_name)
            # low_cpu_mem_usage: load_lora_weights' default with peft and transformers > 4.45.2
            # (_LOW_CPU_MEM_USAGE_DEFAULT_LORA); its i2v expansion does nothing for a t2v model.
            WanPipeline.load_lora_into_transformer(state, transformer=model, adapter_name=adapter,
                                                   low_cpu_mem_usage=True)
        except Exception as e:  # noqa: BLE001  (diffusers raises ValueError, KeyError, IndexError, ...)
            model = None
            log.messages.append(f"raised {type(e).__name__}: {e}")
    return model, log.messages


def adapter_tensors(model, adapter):
    """The adapter's factors, named as diffusers' saver names them, and each peft layer's scale."""
    tensors, scales = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            tensors[f"transformer.{name}.lora_A.weight"] = module.lora_A[adapter].weight.detach()
            tensors[f"transformer.{name}.lora_B.weight"] = module.lora_B[adapter].weight.detach()
            scales[name] = module.scaling[adapter]
    return tensors, scales


def fused(model):
    """diffusers' own merge: fuse_lora, then the peft layers removed; the plain state dict."""
    model.fuse_lora()
    model.unload_lora()
    return model.state_dict()


def close_weights(checks, what, got, want, tolerance):
    """Both state dicts hold the same keys and every tensor agrees within tolerance."""
    worst, where = 0.0, ""
    for key in want.keys() & got.keys():
        diff = (got[key].double() - want[key].double()).abs().max().item()
        if diff > worst:
            worst, where = diff, key
    odd = sorted(map(str, got.keys() ^ want.keys()))
    checks.expect(not odd and worst <= tolerance, f"{what}: {len(want)} tensors, max|d| {worst:.2e} (tolerance "
                  f"{tolerance:.0e}{', at ' + where if where else ''}){f'; keys differ: {odd[:3]}' if odd else ''}")
    return worst


# --- the runs -------------------------------------------------------------------------------------


def make_runs(cli, work):
    """The tiny fp32 teacher, its diffusers export, a LoRA student trained on it and its exports."""
    teacher, base, run, lora, merged = (work / n for n in ("teacher", "base", "run", "lora", "merged"))
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--dtype", "fp32", "--output", teacher, *quiet)
    cli.run("convert", "--input", teacher, "--output", base, "--layout", "diffusers", "--dtype", "fp32", *quiet)
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--train.objective", "guided",
            "--student.lora_rank", RANK, "--student.lora_alpha", ALPHA, "--train.steps", 5, "--train.lr", TRAIN_LR, "--train.warmup_steps", 0,
            *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    cli.run("convert", "--input", run / "student", "--output", lora, "--layout", "lora", "--dtype", "fp32", *quiet)
    cli.run("convert", "--input", run / "student", "--output", merged, "--layout", "diffusers", "--dtype", "fp32",
            *quiet)
    return teacher, base, lora, merged


def check_diffusers_file(checks, base, lora, merged, targets, inputs, text_len):
    print(f"\na, b. DIR/{DIFFUSERS_FILE} in diffusers:")
    with safe_open(str(lora / DIFFUSERS_FILE), "pt") as f:
        metadata, stored = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    base_model, _ = load_diffusers(base)
    base_state = base_model.state_dict()
    wanted, bad = set(), []
    for target in targets:
        out_dim, in_dim = base_state[wan_keys.native_to_diffusers(target)].shape
        for factor, shape in (("lora_A", (RANK, in_dim)), ("lora_B", (out_dim, RANK))):
            key = f"transformer.{diffusers_module(target)}.{factor}.weight"
            wanted.add(key)
            if key in stored and (stored[key].shape != shape or stored[key].dtype != torch.float32):
                bad.append(f"{key} {tuple(stored[key].shape)} {stored[key].dtype}")
    odd = sorted(stored.keys() ^ wanted)
    checks.expect(not odd, f"{len(stored)} tensors: lora_A and lora_B of the {len(targets)} targeted linears, nothing "
                  f"else {odd[:3] or ''}")
    checks.expect(not bad, f"lora_A [{RANK}, in], lora_B [out, {RANK}], fp32 {bad[:2] or ''}")
    checks.expect(metadata.get("format") == "pt", f"safetensors metadata has format 'pt' ({metadata})")

    model, messages = with_lora(base, lora, DIFFUSERS_FILE, "exported")
    checks.expect(not messages, f"lora_state_dict + load_lora_into_transformer log no warning {messages[:2] or ''}")
    if model is None:
        return {}, diffusers_forward(load_diffusers(merged)[0], inputs, text_len)
    found, scales = adapter_tensors(model, "exported")
    equal = [k for k, v in stored.items() if k in found and torch.equal(found[k], v)]
    checks.expect(len(equal) == len(stored) == len(found) and len(scales) == len(targets),
                  f"{len(equal)} of the file's {len(stored)} tensors in the model's {len(scales)} peft LoRA layers "
                  f"bit for bit ({len(found)} factors there)")
    checks.expect(set(scales.values()) == {1.0}, f"every peft layer at scale 1 {sorted(set(scales.values()))}")

    merged_model, _ = load_diffusers(merged)
    want = diffusers_forward(merged_model, inputs, text_len)
    measured = {"a/b forward, base + LoRA file vs merged": checks.close(
        "forward, base + LoRA file vs the merged export", diffusers_forward(model, inputs, text_len), want,
        FORWARD_TOLERANCE)}
    effect = (diffusers_forward(base_model, inputs, text_len) - want).abs().max().item()
    measured["b forward, base vs merged (the LoRA's effect)"] = effect
    checks.expect(effect > NOT_A_NO_OP * FORWARD_TOLERANCE, f"forward, base vs the merged export: max|d| {effect:.2e} "
                  f"(must exceed {NOT_A_NO_OP * FORWARD_TOLERANCE:.0e}: the LoRA is no no-op)")
    measured["b weights, diffusers' fuse_lora vs merged"] = close_weights(
        checks, "diffusers' fuse_lora of the file vs the merged export", fused(model), merged_model.state_dict(),
        WEIGHT_TOLERANCE)
    return measured, want


def check_comfy_file(checks, base, lora, merged, teacher_state, targets, inputs, text_len, want):
    print(f"\nc. DIR/{COMFY_FILE} by ComfyUI's rules (comfyui_lora_keys.py):")
    stored = load_file(str(lora / COMFY_FILE))
    merged_native = {wan_keys.diffusers_to_native(k): v for k, v in load_diffusers(merged)[0].state_dict().items()}
    patches, not_loaded, errors = comfy.load(set(stored), merged_native.keys())
    checks.expect(not not_loaded and not errors, f"ComfyUI's loader reads all {len(stored)} keys for the merged model "
                  f"{sorted(not_loaded)[:3] or ''}{errors[:1] or ''}")
    wanted = {k for target in targets for k in comfy.standard_keys(target)}
    odd = sorted(stored.keys() ^ wanted)
    checks.expect(not odd, f"exactly lora_down, lora_up and alpha of the {len(targets)} targeted linears, "
                  f"'diffusion_model.<native>' names {odd[:3] or ''}")
    patched = sorted(k[len(comfy.MODEL_PREFIX):] for k in patches)
    checks.expect(patched == targets, f"ComfyUI patches exactly the {len(targets)} targeted weights ({len(patched)})")
    bad = []
    for target in targets:
        down, up, alpha = (stored.get(k) for k in comfy.standard_keys(target))
        out_dim, in_dim = teacher_state[target].shape
        if down is None or up is None or alpha is None:
            continue
        if down.shape != (RANK, in_dim) or up.shape != (out_dim, RANK) or alpha.shape != () or \
                {down.dtype, up.dtype, alpha.dtype} != {torch.float32} or alpha.item() != ALPHA:
            bad.append(f"{target}: {tuple(down.shape)} {tuple(up.shape)} alpha {alpha}")
    checks.expect(not bad, f"lora_down [{RANK}, in], lora_up [out, {RANK}], alpha a 0-d tensor {ALPHA}, all fp32 "
                  f"(ComfyUI's scale alpha / rank = {ALPHA / RANK:g}) {bad[:2] or ''}")

    comfy_merged = dict(teacher_state)
    for target, patch in patches.items():
        key = target[len(comfy.MODEL_PREFIX):]
        if "up" in patch and key in comfy_merged:
            comfy_merged[key] = comfy.merge(comfy_merged[key], stored[patch["up"]], stored[patch["down"]],
                                            stored.get(patch.get("alpha")))
    measured = {"c weights, ComfyUI's merge vs merged": close_weights(
        checks, "ComfyUI's merge of the file on the teacher vs the merged export", comfy_merged, merged_native,
        WEIGHT_TOLERANCE)}
    model, messages = with_lora(base, lora, COMFY_FILE, "comfyui")
    checks.expect(not messages, f"diffusers reads the ComfyUI file too, with no warning {messages[:2] or ''}")
    if model is not None:
        measured["c forward, base + ComfyUI file (diffusers) vs merged"] = checks.close(
            "forward, base + ComfyUI file in diffusers vs the merged export",
            diffusers_forward(model, inputs, text_len), want, FORWARD_TOLERANCE)
    return measured


def check_import(cli, checks, work, teacher, base, targets):
    print("\nd. a LoRA saved by diffusers -> train --student.lora_init -> convert --layout diffusers:")
    model, _ = load_diffusers(base)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    config = LoraConfig(r=RANK, lora_alpha=RANK, target_modules=[diffusers_module(t) for t in targets])
    model.add_adapter(config, adapter_name="diffusers")
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:  # peft starts lora_B at zero: a no-op adapter would prove nothing
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    folder, run, exported = work / "diffusers-lora", work / "run-import", work / "imported-merged"
    layers = get_peft_model_state_dict(model, adapter_name="diffusers")
    WanPipeline.save_lora_weights(folder, transformer_lora_layers=layers)
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--train.objective", "guided",
            "--student.lora_init", folder / DIFFUSERS_FILE,
            "--student.lora_rank", RANK, "--student.lora_alpha", RANK, "--train.steps", 1, "--train.lr", IMPORT_LR,
            "--train.min_lr", 0, "--train.warmup_steps", 0, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    cli.run("convert", "--input", run / "student", "--output", exported, "--layout", "diffusers", "--dtype", "fp32",
            "--log.level", "warn")
    want = fused(model)
    effect = max((want[k] - base_state[k]).abs().max().item() for k in want)
    checks.expect(effect > NOT_A_NO_OP * WEIGHT_TOLERANCE, f"diffusers' fuse_lora moves the base by max|d| "
                  f"{effect:.2e} (must exceed {NOT_A_NO_OP * WEIGHT_TOLERANCE:.0e})")
    return close_weights(checks, "merged export of the imported student vs diffusers' fuse_lora",
                         load_diffusers(exported)[0].state_dict(), want, WEIGHT_TOLERANCE)


def check_pair(cli, checks, work, inputs, text_len):
    print("\ne. the A14B pair: one LoRA run per expert -> convert --layout lora of the pair -> WanPipeline:")
    a14b, pair, exported = work / "a14b", work / "pair", work / "pair-lora"
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--experts", 2, "--dtype", "fp32", "--seed", 5, "--output", a14b, *quiet)
    pair.mkdir()
    bases, merged = {}, {}
    for expert, folder in (("high", "high_noise_model"), ("low", "low_noise_model")):
        run = work / f"run-{expert}"
        cli.run("train", "--run-dir", run, "--teacher.checkpoint", a14b, "--student.expert", expert,
                "--train.objective", "guided", "--noise.shift", 5, "--student.lora_rank", RANK, "--student.lora_alpha",
                ALPHA, "--train.steps", 5, "--train.lr", TRAIN_LR, "--train.warmup_steps", 0, *CPU_JOB,
                launcher=("bash", cli.mpirun, "-np", 2))
        (pair / folder).symlink_to(run / "student", target_is_directory=True)
        bases[expert], merged[expert] = work / f"base-{expert}", work / f"merged-{expert}"
        cli.run("convert", "--input", a14b / folder, "--output", bases[expert], "--layout", "diffusers", "--dtype",
                "fp32", *quiet)
        cli.run("convert", "--input", run / "student", "--output", merged[expert], "--layout", "diffusers", "--dtype",
                "fp32", *quiet)
    cli.run("convert", "--input", pair, "--output", exported, "--layout", "lora", "--dtype", "fp32", *quiet)
    files = sorted(str(p.relative_to(exported)) for p in exported.rglob("*.safetensors"))
    checks.expect(files == sorted(f"{d}/{f}" for d in ("high_noise_model", "low_noise_model") for f in (COMFY_FILE, DIFFUSERS_FILE)),
                  f"one folder of files per expert: {files}")
    from diffusers import FlowMatchEulerDiscreteScheduler  # noqa: PLC0415  (only this check builds a pipeline)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=load_diffusers(bases["high"])[0], transformer_2=load_diffusers(bases["low"])[0],
                       boundary_ratio=0.875)
    with Warnings() as log:
        pipe.load_lora_weights(str(exported / "high_noise_model"), adapter_name="high", low_cpu_mem_usage=True)
        pipe.load_lora_weights(str(exported / "low_noise_model"), adapter_name="low", load_into_transformer_2=True,
                               low_cpu_mem_usage=True)
    checks.expect(not log.messages, f"load_lora_weights of both, the low one with load_into_transformer_2, log no "
                  f"warning {log.messages[:2] or ''}")
    measured = {}
    for expert, model in (("high", pipe.transformer), ("low", pipe.transformer_2)):
        want = diffusers_forward(load_diffusers(merged[expert])[0], inputs, text_len)
        measured[f"e forward, pipeline {expert} expert + its LoRA vs merged"] = checks.close(
            f"forward, the pipeline's {expert}-noise transformer with its LoRA vs that expert's merged export",
            diffusers_forward(model, inputs, text_len), want, FORWARD_TOLERANCE)
    high_file, low_file = (load_file(str(exported / d / DIFFUSERS_FILE)) for d in ("high_noise_model", "low_noise_model"))
    apart = max((high_file[k] - low_file[k]).abs().max().item() for k in high_file if "lora_B" in k)
    checks.expect(apart > NOT_A_NO_OP * WEIGHT_TOLERANCE, f"the two experts' LoRAs differ (max|d| of lora_B {apart:.2e}): "
                  "each run trained its own")
    return measured


def check_bf16_base(cli, checks, work, targets, inputs, text_len):
    print("\nf. a LoRA student over a bf16 teacher -> convert --dtype fp32 is the fp32 merge:")
    teacher, base, run, lora, merged, narrow = (work / f"bf16-{n}" for n in ("teacher", "base", "run", "lora",
                                                                            "merged", "merged-bf16"))
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--seed", 7, "--output", teacher, *quiet)
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--train.objective", "guided",
            "--student.lora_rank", RANK, "--student.lora_alpha", ALPHA, "--train.steps", 5, "--train.lr", TRAIN_LR,
            "--train.warmup_steps", 0, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    cli.run("convert", "--input", teacher, "--output", base, "--layout", "diffusers", "--dtype", "fp32", *quiet)
    cli.run("convert", "--input", run / "student", "--output", lora, "--layout", "lora", "--dtype", "fp32", *quiet)
    cli.run("convert", "--input", run / "student", "--output", merged, "--layout", "diffusers", "--dtype", "fp32",
            *quiet)
    cli.run("convert", "--input", run / "student", "--output", narrow, *quiet)
    stored = load_file(str(teacher / "diffusion_pytorch_model.safetensors"))
    checks.expect({v.dtype for v in stored.values()} == {torch.bfloat16}, "the teacher is stored in bf16")
    factors = load_file(str(run / "student" / "adapters.safetensors"))
    want = {k: v.float() for k, v in stored.items()}
    for target in targets:
        linear = target[: -len(".weight")]
        want[target] = want[target] + (ALPHA / RANK) * (factors[f"{linear}.lora_up"] @ factors[f"{linear}.lora_down"])
    merged_model, _ = load_diffusers(merged)
    got = {wan_keys.diffusers_to_native(k): v for k, v in merged_model.state_dict().items()}
    measured = {"f weights, --dtype fp32 vs the fp32 merge": close_weights(
        checks, "convert --dtype fp32 of the student vs base + (alpha/rank) up @ down in fp32", got, want,
        WEIGHT_TOLERANCE)}
    rounding = max((want[t] - want[t].bfloat16().float()).abs().max().item() for t in targets)
    measured["f weights, the fp32 merge vs it rounded to bf16"] = rounding
    checks.expect(rounding > NOT_A_NO_OP * WEIGHT_TOLERANCE, f"the fp32 merge is max|d| {rounding:.2e} from its bf16 "
                  f"rounding (must exceed {NOT_A_NO_OP * WEIGHT_TOLERANCE:.0e}: the check tells them apart)")
    bf16 = load_file(str(narrow / "diffusion_pytorch_model.safetensors"))
    odd = [t for t in targets if not torch.equal(bf16[t], want[t].bfloat16())]
    checks.expect(not odd, f"the default bf16 convert is the fp32 merge rounded once, bit for bit, in all "
                  f"{len(targets)} adapted weights {odd[:2] or ''}")

    model, messages = with_lora(base, lora, DIFFUSERS_FILE, "bf16-base")
    checks.expect(model is not None and not messages, f"diffusers loads the fp32 LoRA onto the fp32 base with no "
                  f"warning {messages[:2] or ''}")
    if model is not None:
        fused(model)
        measured["f forward, --dtype fp32 vs diffusers' fuse_lora, relative"] = checks.close(
            "forward, convert --dtype fp32 vs diffusers' fuse_lora of the fp32 LoRA",
            diffusers_forward(merged_model, inputs, text_len), diffusers_forward(model, inputs, text_len),
            FORWARD_TOLERANCE, relative=True)
    return measured


def check_i2v(cli, checks, work):
    print("\ng. a LoRA student of an i2v teacher (in_dim 36) -> WanImageToVideoPipeline.load_lora_weights:")
    teacher, run, base, lora, merged = (work / f"i2v-{n}" for n in ("teacher", "run", "base", "lora", "merged"))
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--model-type", "i2v", "--in-dim", 36, "--out-dim", 16, "--dtype",
            "fp32", "--seed", 9, "--output", teacher, *quiet)
    # The i2v teacher's builtin data set holds each sample's image condition: y at every forward.
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--train.objective", "guided",
            "--student.lora_rank", RANK, "--student.lora_alpha", ALPHA, "--train.steps", 5, "--train.lr", TRAIN_LR,
            "--train.warmup_steps", 0, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    for source, folder, layout in ((teacher, base, "pipeline"), (run / "student", lora, "lora"),
                                   (run / "student", merged, "pipeline")):
        cli.run("convert", "--input", source, "--output", folder, "--layout", layout, "--dtype", "fp32", *quiet)
    teacher_state, targets, config, inputs, text_len = model_inputs(teacher, 5, y_dim=20)
    # The checks of a, b and c on the i2v model (the base and merged DiTs are the pipelines' transformer/).
    measured, want = check_diffusers_file(checks, base / "transformer", lora, merged / "transformer", targets, inputs,
                                          text_len)
    measured.update(check_comfy_file(checks, base / "transformer", lora, merged / "transformer", teacher_state, targets,
                                     inputs, text_len, want))
    print("  the I2V pipeline's own loader:")
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline  # noqa: PLC0415  (only here)
    pipe = WanImageToVideoPipeline.from_pretrained(base, vae=None, text_encoder=None, tokenizer=None,
                                                   scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.transformer.condition_embedder.timesteps_proj = OfficialTimesteps(config["freq_dim"])
    with Warnings() as log:
        pipe.load_lora_weights(str(lora), adapter_name="i2v", low_cpu_mem_usage=True)
    checks.expect(not log.messages, f"WanImageToVideoPipeline.load_lora_weights logs no warning {log.messages[:2] or ''}")
    stored = load_file(str(lora / DIFFUSERS_FILE))
    found, scales = adapter_tensors(pipe.transformer, "i2v")
    equal = [k for k, v in stored.items() if k in found and torch.equal(found[k], v)]
    checks.expect(len(equal) == len(stored) == len(found) and len(scales) == len(targets) and
                  set(scales.values()) == {1.0}, f"{len(equal)} of the file's {len(stored)} tensors in the pipeline "
                  f"transformer's {len(scales)} peft layers bit for bit, each at scale 1 (nothing left over)")
    measured["forward, I2V pipeline + LoRA file vs merged"] = checks.close(
        "forward with y, the I2V pipeline's transformer with the LoRA vs the merged export",
        diffusers_forward(pipe.transformer.eval(), inputs, text_len), want, FORWARD_TOLERANCE)
    return {f"g (i2v) {k}": v for k, v in measured.items()}


def model_inputs(teacher, seed, y_dim=0):
    """The teacher's weights, its LoRA targets, and inputs for its forward (contexts of 7 and
    text_len rows); with y_dim, an i2v model's condition channels."""
    teacher_state = load_file(str(teacher / "diffusion_pytorch_model.safetensors"))
    config = json.loads((teacher / "config.json").read_text())
    inputs = make_inputs(torch.Generator().manual_seed(seed), config["in_dim"], config["text_dim"], y_dim=y_dim)
    text_len = config["text_len"]
    inputs["context"], inputs["context_lens"] = inputs["context"][:, :text_len], torch.tensor([7, text_len])
    return teacher_state, lora_targets(teacher_state), config, inputs, text_len


def main():
    cli, checks, work, started = start("test_lora_export.py")
    teacher, base, lora, merged = make_runs(cli, work)
    teacher_state, targets, _, inputs, text_len = model_inputs(teacher, 3)
    measured, want = check_diffusers_file(checks, base, lora, merged, targets, inputs, text_len)
    measured.update(check_comfy_file(checks, base, lora, merged, teacher_state, targets, inputs, text_len, want))
    measured["d weights, imported student vs diffusers' fuse_lora"] = check_import(cli, checks, work, teacher, base,
                                                                                   targets)
    measured.update(check_pair(cli, checks, work, inputs, text_len))
    measured.update(check_bf16_base(cli, checks, work, targets, inputs, text_len))
    measured.update(check_i2v(cli, checks, work))
    return finish(checks, measured, started)


if __name__ == "__main__":
    sys.exit(main())
