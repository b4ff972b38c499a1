#!/usr/bin/env python3
"""diffusers out and in, checked by diffusers itself.

1. diffusers -> ours: tiny random WanTransformer3DModels written by diffusers' own save_pretrained
   (a t2v-like model with a 1-D t, a ti2v-like one with per-token t, an i2v-like one with image
   channels and no cross-attention norm; fp32, and the t2v one also in bf16 and fp16) are run by
   `wan-distill forward` and by diffusers on the same inputs (context padded to text_len).
2. ours -> diffusers: a tiny student trained for 5 steps (launch/mpirun.sh -np 3 ... train) and
   exported with `wan-distill convert --layout diffusers` in fp32 (sharded), bf16 and fp16 (sharded)
   must load with WanTransformer3DModel.from_pretrained with no missing, unexpected or mismatched
   key, a config.json holding every argument of its constructor, every tensor equal bit for bit
   to the student's cast to that dtype, and diffusers' forward equal to ours.
3. Two experts: a diffusers pipeline folder (transformer/ = high-noise, transformer_2/ =
   low-noise, boundary_ratio in model_index.json), written by diffusers and by `init-teacher
   --experts 2 --layout diffusers`, is recognised by `wan-distill inspect` as a two-expert teacher
   with the file's boundary, and `train` runs 3 steps with the latter as its teacher.

Tolerances (max |ours - diffusers| over the output):
  fp32 weights, fp32 compute              1e-5 absolute. bf16 and fp16 files are compared this way
                                          too, both sides upcasting the stored weights to fp32, so
                                          the written bits are what is tested.
  bf16 / fp16 weights and compute         2e-2 / 4e-3 of max|diffusers| (about 5 and 8 units of
                                          the dtype's rounding, 2^-8 and 2^-11 relative: the two
                                          models round at different places, e.g. diffusers keeps
                                          time_proj and proj_out in the weight dtype where our
                                          fp32-island files keep them fp32).
One substitution is made in diffusers, as in test_reference_step.py: it computes the timestep
sinusoid in fp32, the official code (and ours, spec §5) in fp64; the official fp64 function
replaces it. Diffusers' own fp32 sinusoid is measured too and printed, checked only against 1e-4.

Usage: .venv/bin/python tests/python/test_diffusers_interop.py WAN_DISTILL MPIRUN_SH WORK_DIR
Exit status 0 when everything agrees, 1 otherwise (also when a package is missing).
"""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import inspect as pyinspect

    import torch
    from diffusers import WanTransformer3DModel
    from diffusers.utils import logging as diffusers_logging
    from safetensors.torch import load_file, save_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

import wan_keys  # noqa: E402  (tools/, after the path is set)
from wd_test_support import CPU_JOB, OfficialTimesteps  # noqa: E402  (shared with the other Python tests)

FP32_TOLERANCE = 1e-5
OWN_SINUSOID_TOLERANCE = 1e-4
DTYPE_TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}  # relative to max|diffusers output|
TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Checks:
    """Collects results; every check prints one line."""

    def __init__(self):
        self.failed = 0

    def expect(self, ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failed += 1
        return ok

    def close(self, what, ours, theirs, tolerance, relative=False):
        diff = (ours.double() - theirs.double()).abs().max().item()
        scale = theirs.double().abs().max().item()
        value = diff / scale if relative else diff
        kind = "max|d|/max|out|" if relative else "max|d|"
        self.expect(value <= tolerance, f"{what}: {kind} {value:.2e} (tolerance {tolerance:.0e}, max|out| {scale:.2f})")
        return value


# --- diffusers side -------------------------------------------------------------------------------


def load_diffusers(folder, dtype="fp32", official=True):
    model, info = WanTransformer3DModel.from_pretrained(folder, torch_dtype=TORCH_DTYPE[dtype], output_loading_info=True)
    if official:
        model.condition_embedder.timesteps_proj = OfficialTimesteps(model.config.freq_dim)
    return model.eval(), info


def diffusers_forward(model, inputs, text_len):
    """diffusers' forward on our inputs: x and y concatenated, context zero-padded to text_len."""
    dtype = next(model.proj_out.parameters()).dtype
    x = inputs["x"] if "y" not in inputs else torch.cat([inputs["x"], inputs["y"]], dim=1)
    context = torch.zeros(x.shape[0], text_len, inputs["context"].shape[2])
    for b, n in enumerate(inputs["context_lens"].tolist()):
        context[b, :n] = inputs["context"][b, :n]
    t = inputs["t_tokens"] if "t_tokens" in inputs else inputs["t"]
    with torch.no_grad():
        return model(x.to(dtype), t, context.to(dtype), return_dict=False)[0].float()


def random_diffusers_model(seed, **config):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**config)
    with torch.no_grad():
        for p in model.parameters():  # norm gains and biases away from 1 and 0 as well
            p.add_(0.1 * torch.randn_like(p))
    return model


# --- our side -------------------------------------------------------------------------------------


class Cli:
    def __init__(self, binary, mpirun):
        self.binary, self.mpirun = binary, mpirun

    def run(self, *args, launcher=()):
        cmd = [*map(str, launcher), self.binary, *map(str, args)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
            sys.exit(1)
        return r.stdout + r.stderr

    def forward(self, weights, inputs, dtype, work):
        """`wan-distill forward` on `inputs` (a dict of tensors); returns `out`."""
        path_in, path_out = work / "inputs.safetensors", work / "out.safetensors"
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(path_in))
        self.run("forward", "--weights", weights, "--inputs", path_in, "--output", path_out, "--dtype", dtype,
                 "--runtime.threads", 1, "--log.level", "warn")
        return load_file(str(path_out))["out"].float()


def start(script):
    """How a test of the CLI against diffusers begins: its arguments WAN_DISTILL MPIRUN_SH WORK_DIR
    (the folder emptied), one intra-op thread, diffusers quiet. Returns the Cli, the Checks, the
    work folder and the start time."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {script} WAN_DISTILL MPIRUN_SH WORK_DIR")
    torch.set_num_threads(1)
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    work = Path(sys.argv[3]).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return Cli(sys.argv[1], sys.argv[2]), Checks(), work, time.time()


def finish(checks, measured, started):
    """Prints every measured value and the verdict; the exit status."""
    print(f"\nmeasured ({time.time() - started:.1f} s):")
    for name, value in measured.items():
        print(f"  {name:55s} {value:.2e}")
    print("PASS" if checks.failed == 0 else f"FAIL: {checks.failed} check(s)")
    return 1 if checks.failed else 0


def make_inputs(gen, in_dim, text_dim, y_dim=0, per_token=False, latent=(3, 8, 12), patch=(1, 2, 2)):
    """Two samples, fractional timesteps, contexts of 7 and 20 tokens (zero-padded by both models)."""
    B = 2
    inputs = {
        "x": torch.randn(B, in_dim - y_dim, *latent, generator=gen),
        "t": torch.tensor([937.5, 250.25]),
        "context": torch.randn(B, 20, text_dim, generator=gen),
        "context_lens": torch.tensor([7, 20]),
    }
    if y_dim:
        inputs["y"] = torch.randn(B, y_dim, *latent, generator=gen)
    if per_token:
        # TI2V: the first frame (the conditioning image) at t = 0 in sample 0, every token else at t.
        tokens = math.prod(latent[i] // patch[i] for i in range(3))
        t_tokens = inputs.pop("t")[:, None].repeat(1, tokens)
        t_tokens[0, : tokens // (latent[0] // patch[0])] = 0.0
        inputs["t_tokens"] = t_tokens
    return inputs


# --- the checks -----------------------------------------------------------------------------------

CASES = {
    # name: (WanTransformer3DModel arguments, y channels, per-token t)
    "t2v-like": (dict(num_attention_heads=2, attention_head_dim=24, in_channels=16, out_channels=16, text_dim=24,
                      freq_dim=32, ffn_dim=96, num_layers=2), 0, False),
    "ti2v-like": (dict(num_attention_heads=3, attention_head_dim=16, in_channels=48, out_channels=48, text_dim=24,
                       freq_dim=32, ffn_dim=96, num_layers=2), 0, True),
    "i2v-like, no cross-attn norm": (dict(num_attention_heads=2, attention_head_dim=32, in_channels=36, out_channels=16,
                                          text_dim=24, freq_dim=32, ffn_dim=96, num_layers=2, cross_attn_norm=False),
                                     20, False),
}


def diffusers_to_ours(cli, work, checks):
    print("\n1. diffusers save_pretrained -> wan-distill forward (512-token padded context, as diffusers' pipelines):")
    gen = torch.Generator().manual_seed(1)
    measured = {}
    for i, (name, (config, y_dim, per_token)) in enumerate(CASES.items()):
        folder = work / f"diffusers-{i}"
        random_diffusers_model(10 + i, **config).save_pretrained(folder)
        inputs = make_inputs(gen, config["in_channels"], config["text_dim"], y_dim, per_token)
        ours = cli.forward(folder, inputs, "fp32", work)
        model, _ = load_diffusers(folder)
        measured[f"{name} fp32"] = checks.close(f"{name}, fp32 file{', per-token t' if per_token else ''}",
                                                ours, diffusers_forward(model, inputs, 512), FP32_TOLERANCE)
        own, _ = load_diffusers(folder, official=False)
        measured[f"{name} fp32 (diffusers' fp32 sinusoid)"] = checks.close(
            f"{name}, fp32 file, diffusers' own fp32 sinusoid", ours, diffusers_forward(own, inputs, 512),
            OWN_SINUSOID_TOLERANCE)
        if i != 0:
            continue
        for dtype in ("bf16", "fp16"):
            # diffusers' own low-precision file: from_pretrained(torch_dtype) keeps its fp32 modules.
            low = work / f"diffusers-{i}-{dtype}"
            load_diffusers(folder, dtype, official=False)[0].save_pretrained(low)
            upcast, _ = load_diffusers(low, "fp32")
            measured[f"{name} {dtype} file, fp32 compute"] = checks.close(
                f"{name}, diffusers' {dtype} file, both upcast to fp32", cli.forward(low, inputs, "fp32", work),
                diffusers_forward(upcast, inputs, 512), FP32_TOLERANCE)
            native, _ = load_diffusers(low, dtype)
            measured[f"{name} {dtype} file, {dtype} compute"] = checks.close(
                f"{name}, diffusers' {dtype} file, {dtype} compute", cli.forward(low, inputs, "auto", work),
                diffusers_forward(native, inputs, 512), DTYPE_TOLERANCE[dtype], relative=True)
    return measured


def check_export_files(folder, student, dtype, checks):
    """The exported folder loads in diffusers with nothing missing or left over, its config holds
    every constructor argument, and every tensor is the student's cast to dtype (fp32 islands kept)."""
    _, info = load_diffusers(folder, "fp32")
    problems = {k: v for k, v in info.items() if v}
    checks.expect(not problems, f"{dtype}: from_pretrained: no missing, unexpected or mismatched keys {problems or ''}")
    config = json.loads((folder / "config.json").read_text())
    wanted = set(pyinspect.signature(WanTransformer3DModel.__init__).parameters) - {"self"}
    public = {k for k in config if not k.startswith("_")}
    checks.expect(public == wanted and config["_class_name"] == "WanTransformer3DModel",
                  f"{dtype}: config.json has exactly WanTransformer3DModel's {len(wanted)} arguments "
                  f"(missing {sorted(wanted - public)}, extra {sorted(public - wanted)})")
    shards = sorted(folder.glob("*.safetensors"))
    stored = {}
    for shard in shards:
        stored.update(load_file(str(shard)))
    if len(shards) > 1:
        index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
        checks.expect(set(index["weight_map"]) == set(stored) and {Path(s).name for s in index["weight_map"].values()}
                      == {s.name for s in shards}, f"{dtype}: {len(shards)} shards, index names each tensor's shard")
    mismatched = []
    islands = 0
    for native, tensor in student.items():
        got = stored.get(wan_keys.native_to_diffusers(native))
        island = tensor.dtype == torch.float32 and kept_in_fp32(native)
        islands += island
        want = tensor if island else tensor.to(TORCH_DTYPE[dtype])
        if got is None or got.dtype != want.dtype or not torch.equal(got, want):
            mismatched.append(native)
    checks.expect(not mismatched and len(stored) == len(student),
                  f"{dtype}: {len(stored)} tensors, each the student's cast to {dtype} bit for bit "
                  f"({islands if dtype != 'fp32' else 0} fp32 islands kept) {mismatched[:3] or ''}")


def kept_in_fp32(key):
    """wd::kept_in_fp32 (src/model/wan_convert.cpp): what convert leaves fp32 by default."""
    if key.startswith(("time_embedding.", "time_projection.", "head.head.")) or key == "head.modulation":
        return True
    return key.startswith("blocks.") and (key.endswith(".modulation") or ".norm3." in key)


def ours_to_diffusers(cli, work, checks):
    print("\n2. a trained student -> wan-distill convert --layout diffusers -> diffusers from_pretrained:")
    run_dir = work / "run"
    cli.run("train", "--run-dir", run_dir, "--train.steps", 5, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 3))
    student_dir = run_dir / "student"
    student = load_file(str(student_dir / "diffusion_pytorch_model.safetensors"))
    text_len = json.loads((student_dir / "config.json").read_text())["text_len"]
    native = json.loads((student_dir / "config.json").read_text())
    gen = torch.Generator().manual_seed(2)
    inputs = make_inputs(gen, native["in_dim"], native["text_dim"])
    inputs["context"], inputs["context_lens"] = inputs["context"][:, :text_len], torch.tensor([7, text_len])
    reference = cli.forward(student_dir, inputs, "fp32", work)
    measured = {}
    for dtype, shard in (("fp32", "100KB"), ("bf16", "5GB"), ("fp16", "100KB")):
        folder = work / f"student-{dtype}"
        cli.run("convert", "--input", student_dir, "--output", folder, "--layout", "diffusers", "--dtype", dtype,
                "--shard-size", shard, "--log.level", "warn")
        check_export_files(folder, student, dtype, checks)
        # The student pads prompts to its own text_len (16), recorded as _wan_text_len: diffusers
        # ignores that field, so its inputs are padded to text_len here as the pipeline would.
        upcast, _ = load_diffusers(folder, "fp32")
        ours = cli.forward(folder, inputs, "fp32", work)
        if dtype == "fp32":
            checks.expect(torch.equal(ours, reference), "fp32: our forward on the export equals it on RUN_DIR/student")
        measured[f"student {dtype} export, fp32 compute"] = checks.close(
            f"{dtype}: diffusers vs ours, weights upcast to fp32", ours, diffusers_forward(upcast, inputs, text_len),
            FP32_TOLERANCE)
        if dtype != "fp32":
            model, _ = load_diffusers(folder, dtype)
            measured[f"student {dtype} export, {dtype} compute"] = checks.close(
                f"{dtype}: diffusers vs ours, {dtype} compute", cli.forward(folder, inputs, "auto", work),
                diffusers_forward(model, inputs, text_len), DTYPE_TOLERANCE[dtype], relative=True)
    return measured


def check_inspect(cli, folder, boundary, source, checks):
    out = cli.run("inspect", folder)
    for line in (f"experts:     2 (transformer_2, transformer)", f"boundary {boundary} ({source})",
                 f"transformer_2 (low-noise):\n  path:        {folder}/transformer_2",
                 f"transformer (high-noise):\n  path:        {folder}/transformer", "architecture: shared"):
        if not checks.expect(line in out, f"inspect {folder.name}: '{line.splitlines()[0]}'"):
            print(out)


def two_experts(cli, work, checks):
    print("\n3. the A14B pair in diffusers pipeline layout:")
    config = CASES["t2v-like"][0]
    pipeline = work / "pipeline"
    random_diffusers_model(20, **config).save_pretrained(pipeline / "transformer")
    random_diffusers_model(21, **config).save_pretrained(pipeline / "transformer_2")
    # Wan-AI/Wan2.2-T2V-A14B-Diffusers' model_index.json, with boundary 0.9 instead of 0.875 so that
    # the file's value is told apart from t2v's default; the other components are not needed.
    (pipeline / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "_diffusers_version": "0.35.0.dev0", "boundary_ratio": 0.9,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"], "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"]}, indent=2))
    check_inspect(cli, pipeline, 0.9, "boundary_ratio of model_index.json", checks)

    ours = work / "pipeline-ours"
    cli.run("init-teacher", "--preset", "tiny", "--experts", 2, "--layout", "diffusers", "--dtype", "bf16",
            "--output", ours, "--log.level", "warn")
    check_inspect(cli, ours, 0.875, "boundary_ratio of model_index.json", checks)
    index = json.loads((ours / "model_index.json").read_text())
    checks.expect(index["boundary_ratio"] == 0.875 and index["transformer_2"] == ["diffusers", "WanTransformer3DModel"],
                  "init-teacher's model_index.json: boundary_ratio 0.875, transformer_2 a WanTransformer3DModel")
    for sub in ("transformer", "transformer_2"):
        _, info = load_diffusers(ours / sub, "bf16")
        problems = {k: v for k, v in info.items() if v}
        checks.expect(not problems, f"init-teacher's {sub}/ loads in diffusers with no key problems {problems or ''}")
    out = cli.run("train", "--run-dir", work / "run-pipeline", "--teacher.checkpoint", ours, "--train.steps", 3,
                  *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 3))
    line = "two experts, transformer for t >= 875 and transformer_2 below (boundary 0.875)"
    if not checks.expect(line in out, f"train takes the pipeline as its teacher: '{line}'"):
        print(out)


def main():
    cli, checks, work, started = start("test_diffusers_interop.py")
    measured = diffusers_to_ours(cli, work, checks)
    measured.update(ours_to_diffusers(cli, work, checks))
    two_experts(cli, work, checks)
    return finish(checks, measured, started)


if __name__ == "__main__":
    sys.exit(main())
