#!/usr/bin/env python3
"""Image-to-video students out to diffusers: `convert --layout pipeline`, sampled by diffusers' own
pipeline, against `wan-distill sample`.

For each of an i2v student (model_type i2v, in_dim 36: the noisy latents, 4 mask channels and the
image latents) and a ti2v student (TI2V-5B's image mode: the image as the clean first latent frame,
its tokens at timestep 0):
1. A tiny fp32 teacher of that type (init-teacher), a data set (make-dataset --image-condition)
   whose /condition is replaced by what diffusers' WanImageToVideoPipeline.prepare_latents builds
   from one random image per sample with a tiny random AutoencoderKLWan made here, a student trained
   on them for 3 steps (launch/mpirun.sh -np 2 ... train), and `convert --layout pipeline --dtype
   fp32` of RUN_DIR/student.
2. The folder is what diffusers reads: DiffusionPipeline.from_pretrained(DIR) builds the class
   model_index.json names (i2v: WanImageToVideoPipeline; ti2v: WanPipeline, as
   Wan-AI/Wan2.2-TI2V-5B-Diffusers, with expand_timesteps true), with the VAE, text encoder,
   tokenizer and scheduler passed in (the tiny VAE, none, none, UniPC), from_pretrained leaves no
   key of transformer/ missing or unexpected, and the image pipeline
   (WanImageToVideoPipeline.from_pretrained(DIR, ...): for ti2v the way diffusers runs TI2V-5B's
   image mode) has the folder's expand_timesteps.
3. `wan-distill sample --student RUN_DIR/student --data.path D --steps 3 --shift 5 --solver
   unipc|euler --trajectory true` samples two rows; diffusers' pipeline __call__ samples each row's
   image with the same noise (latents=), the same context (prompt_embeds=, zero-padded to
   text_len), guidance 1 and UniPCMultistepScheduler (flow sigmas, shift 5, bh2: the official
   Wan 2.2 scheduler; of order 2, or of order 1 without its corrector, which is Euler), its
   latents taken after every step by callback_on_step_end. The scheduler is set to the σ and the
   fractional timesteps `sample` uses (SampleSchedule says why and how), checked equal; every
   step's state must agree to 1e-5 of its largest magnitude. For ti2v the state's first frame is
   the image on both sides (diffusers puts it back in the model input and at the end:
   (1 − first_frame_mask)·condition + first_frame_mask·latents).

The I2V-A14B LoRA pair as one merged pipeline (issue 44):
4. A tiny two-expert i2v teacher in bf16 (init-teacher --experts 2 --layout diffusers: a pipeline
   folder whose model_index.json is set to boundary_ratio 0.85, not the I2V default 0.9), a LoRA
   pair trained on it in one run for 3 guided steps (--student.lora_rank 4 --student.lora_alpha 8:
   RUN/student holds high_noise_model/ and low_noise_model/) and `convert --layout pipeline --dtype fp32` of it.
   DiffusionPipeline.from_pretrained builds a WanImageToVideoPipeline with transformer and
   transformer_2, boundary_ratio 0.85 (the teacher's), no key of either missing or unexpected.
   transformer/ is the high-noise expert and transformer_2/ the low-noise one, each its bf16 base
   widened plus (alpha / rank) up @ down in fp32 (1e-6 a weight; the merge rounded to bf16 lies
   ~1e-3 away, so the check tells them apart), and each one's forward (with y) equals `wan-distill
   forward --dtype fp32` of its expert's LoRA folder within 1e-5 of the output's largest
   magnitude; the two experts' outputs differ.
5. Bad pairs are refused before anything is written: --layout diffusers (exit 2, one
   WanTransformer3DModel holds one DiT), a pair whose teacher is gone (exit 3, naming the
   lora.json and its base field), a pair with one expert's folder missing (exit 3, naming it).

Usage: .venv/bin/python tests/python/test_convert_pipelines.py WAN_DISTILL MPIRUN_SH WORK_DIR
Exit status 0 when everything agrees, 1 otherwise (also when a package is missing).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import h5py
    import numpy as np
    import PIL.Image
    import torch
    from diffusers import (AutoencoderKLWan, DiffusionPipeline, UniPCMultistepScheduler, WanImageToVideoPipeline,
                           WanPipeline)
    from safetensors.torch import load_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

import wan_keys  # noqa: E402  (tools/, after the path is set)
from test_diffusers_interop import diffusers_forward, finish, make_inputs, start  # noqa: E402  (this folder)
from wd_test_support import CPU_JOB, OfficialTimesteps, padded_context  # noqa: E402

TOLERANCE = 1e-5  # the bound: max|ours - diffusers| / max|diffusers| of every state
LATENT = (16, 3, 8, 8)  # C, F, H, W: 9 video frames of 64 x 64 for a VAE of strides 4 and 8
SAMPLES, ROWS = 12, (0, 1)
STEPS, SHIFT = 3, 5.0  # the official Wan 2.2 image models' shift
PIPELINES = {"i2v": WanImageToVideoPipeline, "ti2v": WanPipeline}  # what model_index.json names
PAIR_BOUNDARY = 0.85  # the pair's teacher's boundary_ratio, not I2V-A14B's default 0.9
WEIGHT_TOLERANCE = 1e-6  # both sides add the same rank-4 product to the same widened weight
EXPERTS = {"high": ("high_noise_model", "transformer"), "low": ("low_noise_model", "transformer_2")}


def tiny_vae():
    """A random AutoencoderKLWan of 16 latent channels (the Wan 2.1 layout: strides 4, 8, 8)."""
    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=8, z_dim=LATENT[0], dim_mult=[1, 1, 1, 1], num_res_blocks=1).eval()


class SampleSchedule(UniPCMultistepScheduler):
    """diffusers' UniPC at the σ and timesteps `wan-distill sample` uses (docs/training.md):
    set_timesteps(N) shifts linspace(1 - 1/1000, 0, N + 1)[:-1], as the official Wan sampler
    (FlowUniPCMultistepScheduler, Wan2.2's wan/utils/fm_solvers_unipc.py), where diffusers' own
    shifts linspace(1, 1/1000, N + 1)[:-1]; and the model sees t = 1000·σ as a float, where both
    of those truncate it to an integer. The pipeline calls set_timesteps(N) and passes
    scheduler.timesteps to the model, so both are the scheduler's to choose; every other part of
    the sampling (the condition, expand_timesteps' per-token t, the model, the steps) is the
    pipeline's own."""

    def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None):
        if sigmas is None:
            sigmas = np.linspace(1 - 1 / self.config.num_train_timesteps, 0, num_inference_steps + 1)[:-1]
        super().set_timesteps(device=device, sigmas=sigmas, mu=mu)
        self.timesteps = self.sigmas[:-1].to(torch.float32) * self.config.num_train_timesteps


def scheduler(solver="unipc"):
    """The official Wan 2.2 scheduler (UniPC, bh2, order 2, flow sigmas) at SHIFT; for euler, UniPC
    of order 1 without its corrector: in x0 form that is x + (σ' − σ)·v, an Euler step."""
    order = {"unipc": 2, "euler": 1}[solver]
    return SampleSchedule(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=SHIFT,
                          solver_order=order, solver_type="bh2", predict_x0=True, lower_order_final=True,
                          final_sigmas_type="zero", disable_corrector=list(range(STEPS)) if order == 1 else [])


def video_size():
    """The pipeline's num_frames, height and width for LATENT (temporal stride 4, spatial 8)."""
    _, frames, height, width = LATENT
    return 4 * (frames - 1) + 1, 8 * height, 8 * width


def images(count):
    """`count` random smooth RGB images of the video's size."""
    _, height, width = video_size()
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
    out = []
    for _ in range(count):
        phase = rng.uniform(0, 6, (3, 1, 1))
        rgb = 127.5 + 120 * np.sin(phase + 5 * xx[None] + 3 * yy[None] * np.cos(phase))
        out.append(PIL.Image.fromarray(rgb.transpose(1, 2, 0).astype(np.uint8)))
    return out


def image_pipeline(folder, vae):
    """WanImageToVideoPipeline from the converted folder, the other components passed in."""
    return WanImageToVideoPipeline.from_pretrained(folder, vae=vae, text_encoder=None, tokenizer=None,
                                                   scheduler=scheduler())


def pipeline_conditions(pipe, kind, pictures):
    """Each image's condition as the pipeline's prepare_latents builds it, in /condition's form:
    the latent condition [C, F, H, W] for i2v (its 4 mask channels dropped), [C, 1, H, W] for ti2v."""
    frames, height, width = video_size()
    out = []
    with torch.no_grad():
        for picture in pictures:
            image = pipe.video_processor.preprocess(picture, height=height, width=width).to(torch.float32)
            made = pipe.prepare_latents(image, 1, LATENT[0], height, width, frames, torch.float32,
                                        torch.device("cpu"))
            out.append(made[1][0, 4:] if kind == "i2v" else made[1][0])
    return out


def make_student(cli, work, kind, vae, pictures):
    """The teacher, the data set with the pipeline's conditions, the trained student and its export."""
    teacher, data, run, folder = (work / f"{kind}-{n}" for n in ("teacher", "data.h5", "run", "pipeline"))
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--model-type", kind, "--in-dim", 36 if kind == "i2v" else 16,
            "--out-dim", LATENT[0], "--dtype", "fp32", "--seed", 3, "--output", teacher, *quiet)
    cli.run("make-dataset", "--output", data, "--samples", SAMPLES, "--latent", ",".join(map(str, LATENT)),
            "--image-condition", kind, *quiet)
    # A pipeline with no transformer yet builds the conditions: prepare_latents needs the VAE only.
    builder = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler(),
                                      expand_timesteps=kind == "ti2v")
    with h5py.File(data, "r+") as f:
        for i, condition in enumerate(pipeline_conditions(builder, kind, pictures)):
            f["condition"][i] = condition.numpy()
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--data.path", data, "--train.objective",
            "velocity", "--train.steps", 3, "--train.warmup_steps", 0, "--train.eval_samples", 4, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    cli.run("convert", "--input", run / "student", "--output", folder, "--layout", "pipeline", "--dtype", "fp32",
            *quiet)
    return teacher, data, run / "student", folder


def check_folder(checks, kind, folder, vae):
    """What diffusers builds from the folder: the class and flags of model_index.json, every key."""
    index = json.loads((folder / "model_index.json").read_text())
    print(f"  model_index.json: {json.dumps(index, sort_keys=True)}")
    pipe = DiffusionPipeline.from_pretrained(folder, vae=vae, text_encoder=None, tokenizer=None, scheduler=scheduler())
    want = PIPELINES[kind]
    checks.expect(type(pipe) is want and pipe.config.expand_timesteps == (kind == "ti2v")
                  and pipe.config.boundary_ratio is None and pipe.transformer_2 is None,
                  f"DiffusionPipeline.from_pretrained builds a {type(pipe).__name__} (want {want.__name__}), "
                  f"expand_timesteps {pipe.config.expand_timesteps}, boundary_ratio {pipe.config.boundary_ratio}, "
                  "one transformer")
    _, info = type(pipe.transformer).from_pretrained(folder, subfolder="transformer", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    checks.expect(not problems, f"transformer/ loads with no missing, unexpected or mismatched keys {problems or ''}")
    image = image_pipeline(folder, vae)
    checks.expect(image.config.expand_timesteps == (kind == "ti2v") and image.transformer.config.in_channels ==
                  (36 if kind == "i2v" else LATENT[0]),
                  f"WanImageToVideoPipeline.from_pretrained: expand_timesteps {image.config.expand_timesteps}, "
                  f"in_channels {image.transformer.config.in_channels}")
    return image


def ours(cli, work, kind, solver, teacher, data, student):
    """`wan-distill sample` of ROWS: the noise, σ and every step's student state."""
    out = work / f"{kind}-sample-{solver}"
    cli.run("sample", "--teacher.checkpoint", teacher, "--student", student, "--data.path", data, "--samples",
            ",".join(map(str, ROWS)), "--steps", STEPS, "--shift", SHIFT, "--solver", solver, "--trajectory", "true",
            "--output", out, "--runtime.threads", 1, "--log.level", "warn")
    trajectory = load_file(str(out / "trajectory.safetensors"))
    states = [trajectory[f"student.{i}"] for i in range(STEPS + 1)]
    report = json.loads((out / "report.json").read_text())
    return load_file(str(out / "latents.safetensors"))["noise"], torch.tensor(report["sigmas"]), states


def theirs(pipe, kind, picture, noise, context):
    """The pipeline's own sampling of one row: the state after every step (the image as frame 0
    for ti2v, as the pipeline's model input and output hold it)."""
    frames, height, width = video_size()
    steps = []

    def grab(_pipe, _i, _t, tensors):
        steps.append(tensors["latents"].detach().clone())
        return tensors

    with torch.no_grad():
        pipe(image=picture, prompt_embeds=context, guidance_scale=1.0, num_inference_steps=STEPS, height=height,
             width=width, num_frames=frames, latents=noise, output_type="latent", callback_on_step_end=grab)
    if kind == "ti2v":
        condition = pipeline_conditions(pipe, kind, [picture])[0][None]
        steps = [torch.cat([condition, s[:, :, 1:]], dim=2) for s in steps]
    return steps


def compare(checks, kind, solver, pipe, pictures, teacher, data, student, cli, work):
    noise, sigmas, states = ours(cli, work, kind, solver, teacher, data, student)
    pipe.scheduler = scheduler(solver)
    pipe.scheduler.set_timesteps(STEPS)
    theirs_sigmas = pipe.scheduler.sigmas.double()
    checks.expect(theirs_sigmas.shape == sigmas.shape and (theirs_sigmas - sigmas).abs().max() < 1e-6,
                  f"the same σ: ours {sigmas.tolist()}, diffusers' {theirs_sigmas.tolist()}")
    text_len = json.loads((student / "config.json").read_text())["text_len"]
    with h5py.File(data, "r") as f:
        contexts = torch.from_numpy(f["context"][list(ROWS)]).float()
        lens = torch.from_numpy(f["context_lens"][list(ROWS)].astype(np.int64))
    contexts = padded_context(contexts, lens, text_len)
    worst = 0.0
    for row, index in enumerate(ROWS):
        steps = theirs(pipe, kind, pictures[index], noise[row:row + 1], contexts[row:row + 1])
        for i, step in enumerate(steps, start=1):
            worst = max(worst, checks.close(f"{kind} {solver} row {index}, step {i} of {STEPS}: ours vs the pipeline's",
                                            states[i][row:row + 1], step, TOLERANCE, relative=True))
        if kind == "ti2v":
            checks.expect(torch.equal(states[STEPS][row, :, :1], steps[-1][0, :, :1]),
                          f"ti2v row {index}: the final first frame is the image on both sides")
    moved = (states[STEPS] - states[0]).abs().max().item()
    checks.expect(moved > 100 * TOLERANCE, f"{kind} {solver}: the sampler moved the latents (max|d| {moved:.2e})")
    return worst


def make_pair(cli, work):
    """The two-expert i2v teacher (a bf16 pipeline folder at PAIR_BOUNDARY), its LoRA pair trained in
    one run, and the pair's merged pipeline."""
    teacher, run, folder = work / "a14b-teacher", work / "a14b-run", work / "a14b-pipeline"
    quiet = ("--log.level", "warn")
    cli.run("init-teacher", "--preset", "tiny", "--experts", 2, "--layout", "diffusers", "--model-type", "i2v",
            "--in-dim", 36, "--out-dim", LATENT[0], "--dtype", "bf16", "--seed", 3, "--output", teacher, *quiet)
    index = json.loads((teacher / "model_index.json").read_text())
    index["boundary_ratio"] = PAIR_BOUNDARY
    (teacher / "model_index.json").write_text(json.dumps(index, indent=2))
    # The i2v teacher's builtin data set holds each sample's image condition: y at every forward.
    # guided (a LoRA starts as the teacher: velocity would teach it nothing) at Wan's training shift,
    # which puts ~37% of the draws on the high-noise expert's side.
    cli.run("train", "--run-dir", run, "--teacher.checkpoint", teacher, "--train.objective", "guided", "--noise.shift",
            5, "--student.lora_rank", 4, "--student.lora_alpha", 8, "--train.steps", 3, "--train.lr", 0.01,
            "--train.warmup_steps", 0, "--train.eval_samples", 4, *CPU_JOB, launcher=("bash", cli.mpirun, "-np", 2))
    cli.run("convert", "--input", run / "student", "--output", folder, "--layout", "pipeline", "--dtype", "fp32",
            *quiet)
    return teacher, run / "student", folder


def fp32_merge(teacher, lora):
    """An expert's weights as the fp32 merge, in diffusers' names: the bf16 base widened, plus
    (alpha / rank) up @ down of each adapted linear."""
    want = {k: v.float() for k, v in load_file(str(teacher / "diffusion_pytorch_model.safetensors")).items()}
    meta = json.loads((lora / "lora.json").read_text())
    factors = load_file(str(lora / "adapters.safetensors"))
    adapted = []
    for name in factors:
        if name.endswith(".lora_up"):
            linear = name[: -len(".lora_up")]
            key = wan_keys.native_to_diffusers(f"{linear}.weight")
            want[key] = want[key] + (meta["alpha"] / meta["rank"]) * (factors[name] @ factors[f"{linear}.lora_down"])
            adapted.append(key)
    return want, adapted


def check_pair(checks, cli, work, vae):
    print("\nthe I2V-A14B LoRA pair: convert --layout pipeline of RUN/student -> one two-expert pipeline:")
    teacher, pair, folder = make_pair(cli, work)
    print(f"  model_index.json: {json.dumps(json.loads((folder / 'model_index.json').read_text()), sort_keys=True)}")
    pipe = DiffusionPipeline.from_pretrained(folder, vae=vae, text_encoder=None, tokenizer=None, scheduler=scheduler())
    checks.expect(type(pipe) is WanImageToVideoPipeline and pipe.transformer_2 is not None and
                  pipe.config.boundary_ratio == PAIR_BOUNDARY,
                  f"DiffusionPipeline.from_pretrained builds a {type(pipe).__name__} with transformer_2 "
                  f"{type(pipe.transformer_2).__name__}, boundary_ratio {pipe.config.boundary_ratio} (the teacher's "
                  f"{PAIR_BOUNDARY})")
    measured, outputs = {}, {}
    config = json.loads((folder / "transformer" / "config.json").read_text())
    inputs = make_inputs(torch.Generator().manual_seed(6), config["in_channels"], config["text_dim"], y_dim=20)
    text_len = config["_wan_text_len"]
    inputs["context"], inputs["context_lens"] = inputs["context"][:, :text_len], torch.tensor([7, text_len])
    for expert, (lora, sub) in EXPERTS.items():
        _, info = type(pipe.transformer).from_pretrained(folder, subfolder=sub, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        checks.expect(not problems, f"{sub}/ loads with no missing, unexpected or mismatched keys {problems or ''}")
        want, adapted = fp32_merge(teacher / sub, pair / lora)
        got = getattr(pipe, sub).state_dict()
        worst = max((got[k].double() - want[k].double()).abs().max().item() for k in want)
        rounding = max((want[k] - want[k].bfloat16().float()).abs().max().item() for k in adapted)
        checks.expect(got.keys() == want.keys() and worst <= WEIGHT_TOLERANCE < rounding / 100,
                      f"{sub}/ is the {expert}-noise expert's fp32 merge: {len(want)} tensors ({len(adapted)} adapted), "
                      f"max|d| {worst:.2e} (tolerance {WEIGHT_TOLERANCE:.0e}; that merge rounded to bf16 is "
                      f"{rounding:.2e} away)")
        measured[f"pair: {sub}/ weights vs the fp32 merge"] = worst
        model = getattr(pipe, sub).eval()
        model.condition_embedder.timesteps_proj = OfficialTimesteps(config["freq_dim"])
        outputs[expert] = diffusers_forward(model, inputs, text_len)
        measured[f"pair: {sub}/ forward vs ours, relative"] = checks.close(
            f"forward with y, the pipeline's {sub} vs wan-distill forward of {lora}/ (merged in fp32)",
            cli.forward(pair / lora, inputs, "fp32", work), outputs[expert], TOLERANCE, relative=True)
    apart = (outputs["high"] - outputs["low"]).abs().max().item()
    checks.expect(apart > 100 * TOLERANCE, f"the two experts' outputs differ (max|d| {apart:.2e})")
    check_refusals(checks, cli, work, pair)
    return measured


def refused(checks, cli, work, what, code, text, *args):
    """`convert` of `args` exits with `code`, says `text` and writes nothing."""
    out = work / "refused"
    r = subprocess.run([cli.binary, "convert", *map(str, args), "--output", str(out)], capture_output=True, text=True)
    said = [line for line in (r.stdout + r.stderr).splitlines() if "[error]" in line]
    checks.expect(r.returncode == code and text in r.stdout + r.stderr and not out.exists(),
                  f"{what}: exit {r.returncode} (want {code}), nothing written: {said[0] if said else 'no error logged'}")


def check_refusals(checks, cli, work, pair):
    refused(checks, cli, work, "--layout diffusers of a pair", 2, "make no single diffusers WanTransformer3DModel",
            "--input", pair, "--layout", "diffusers")
    gone = work / "pair-teacher-gone"
    shutil.copytree(pair, gone, symlinks=True)
    for lora, _ in EXPERTS.values():
        meta = json.loads((gone / lora / "lora.json").read_text())
        meta["base"] = str(work / "moved-teacher" / Path(meta["base"]).name)
        (gone / lora / "lora.json").write_text(json.dumps(meta))
    refused(checks, cli, work, "a pair whose teacher is gone", 3,
            f"{gone / 'low_noise_model' / 'lora.json'}: base: names a base checkpoint that does not open",
            "--input", gone, "--layout", "pipeline")
    shutil.rmtree(gone / "low_noise_model")
    refused(checks, cli, work, "a pair without its low-noise expert", 3, f"{gone}: low_noise_model: is missing",
            "--input", gone, "--layout", "pipeline")


def main():
    cli, checks, work, started = start("test_convert_pipelines.py")
    vae, pictures = tiny_vae(), images(SAMPLES)
    measured = {}
    for kind in ("i2v", "ti2v"):
        print(f"\n{kind}: convert --layout pipeline of a trained {kind} student -> diffusers:")
        teacher, data, student, folder = make_student(cli, work, kind, vae, pictures)
        pipe = check_folder(checks, kind, folder, vae)
        pipe.set_progress_bar_config(disable=True)
        for solver in ("unipc", "euler"):
            measured[f"{kind}: {STEPS} {solver} steps, max relative"] = compare(
                checks, kind, solver, pipe, pictures, teacher, data, student, cli, work)
    measured.update(check_pair(checks, cli, work, vae))
    return finish(checks, measured, started)


if __name__ == "__main__":
    sys.exit(main())
