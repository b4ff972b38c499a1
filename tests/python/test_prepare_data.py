#!/usr/bin/env python3
"""tools/prepare_data.py end to end, on tiny random models built here (nothing is downloaded).

A random AutoencoderKLWan (16 latent channels, the Wan 2.1 layout), a random UMT5 encoder of
width 64 and a Unigram tokenizer built from a word list are saved with save_pretrained; eight
5-frame clips (PNG folders, GIFs, MP4s, one wider than tall, one taller than wide) get captions.
  1. encode with 2 shards and --limit 1 stops with the shards part-done and nothing merged; the
     rerun carries on (it says so) and merges: 8 samples in list order, in the schema of
     docs/data-format.md; one shard killed with SIGKILL after a sample and rerun gives the same
     file;
  2. the file equals diffusers' own steps: VaeImageProcessor(resize_mode="crop") pixels, the VAE's
     posterior mode normalised as WanImageToVideoPipeline.prepare_latents does, and
     WanPipeline._get_t5_prompt_embeds for the context (float16 storage tolerance);
  3. wan-distill trains 3 steps on it with the builtin tiny teacher (in_dim 16, text_dim 64,
     text_len 16), which validates the file first;
  4. an undecodable video and an empty caption stop the run with the file and the list's line in
     the message; with --skip-bad both are left out and the other samples are merged;
  5. prompts alone (captions) train train.objective trajectory and are refused by velocity;
  6. --image-condition i2v (two shards stopped and resumed; a rerun with ti2v refused) and ti2v
     on three clips: /condition equals what WanImageToVideoPipeline.prepare_latents builds from
     the clip's first frame on the same VAE (i2v: its latent_condition, the 4 mask channels
     dropped; ti2v: expand_timesteps) within 1e-5 (stored as fp32); `wan-distill plan` validates
     each file for an i2v or ti2v teacher and a t2v teacher's refusal names the condition's
     shape; an i2v teacher trains 2 steps on the i2v file;
  7. images and prompts (--no-latents, PNG images, both modes): no /latents, latent_shape of a
     FRAMES clip, /condition as in 6; `wan-distill plan` validates them for their teacher, and
     each teacher's trajectory student trains 2 steps on them.

Usage: .venv/bin/python tests/python/test_prepare_data.py WAN_DISTILL
Exit status 0 when everything holds, 1 otherwise (also when a package is missing).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "prepare_data.py"
LAUNCHER = ROOT / "launch" / "mpirun.sh"

try:
    import av
    import h5py
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanPipeline
    from diffusers.image_processor import VaeImageProcessor
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, T5TokenizerFast, UMT5Config, UMT5EncoderModel
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

FRAMES, HEIGHT, WIDTH, TEXT_LEN = 5, 32, 32, 16
WORDS = "a cat dog runs walks on the grass red blue car in city at night over bridge slowly".split()
from wd_test_support import CPU_JOB, check, failures  # noqa: E402  (shared with the other Python tests)


def run(label, command, code=0):
    """Runs `command`, checks its exit code and returns its output (printed when the code is wrong)."""
    started = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"  {label}: exit {result.returncode} in {time.monotonic() - started:.1f} s")
    if os.environ.get("WD_VERBOSE"):
        print(result.stdout)
    if not check(result.returncode == code, f"{label}: exit {result.returncode}, expected {code}"):
        print(result.stdout[-4000:])
    return result.stdout


def build_models(root):
    """Saves a tiny VAE, text encoder and tokenizer; returns their folders."""
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    vae.save_pretrained(root / "vae")
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"\u2581{w}", -1.0 - i) for i, w in enumerate(WORDS)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    T5TokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                    extra_ids=0).save_pretrained(root / "tokenizer")
    config = UMT5Config(vocab_size=len(vocab), d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                        relative_attention_num_buckets=8)
    UMT5EncoderModel(config).save_pretrained(root / "text_encoder")
    return root / "vae", root / "text_encoder", root / "tokenizer"


def clip(seed, size):
    """FRAMES smooth RGB frames of `size` (w, h) moving from one to the next."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
    frames = []
    for t in range(FRAMES):
        phase = rng.uniform(0, 6, 3) + t * 0.4
        rgb = [np.sin(6 * xx + 4 * yy + p) for p in phase]
        frames.append(Image.fromarray((127.5 + 120 * np.stack(rgb, -1)).astype(np.uint8)))
    return frames


def write_mp4(path, frames):
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def write_clips(root):
    """Eight clips of three kinds and sizes; returns (relative path, caption) per list line."""
    entries = []
    sizes = [(32, 32), (48, 36), (36, 52), (40, 40)]
    for i in range(8):
        frames = clip(i, sizes[i % 4])
        kind = ("png", "gif", "mp4")[i % 3]
        if kind == "png":
            folder = root / f"clip{i}"
            folder.mkdir()
            for t, image in enumerate(frames):
                image.save(folder / f"{t:03d}.png")
            name = folder.name
        elif kind == "gif":
            name = f"clip{i}.gif"
            frames[0].save(root / name, save_all=True, append_images=frames[1:], duration=100, loop=0)
        else:
            name = f"clip{i}.mp4"
            write_mp4(root / name, frames)
        words = [WORDS[(i * 3 + k) % len(WORDS)] for k in range(2 + i)]
        entries.append((name, "  " + " ".join(words) + " &amp; more "))
    return entries


def write_list(path, entries):
    path.write_text("# clips for test_prepare_data\n" + "".join(f"{p}\t{c}\n" for p, c in entries))


def encode(models_, list_path, output, *extra):
    """The tool's command line; the models as a pipeline folder (vae/ inside it) and as the
    text_encoder/ subfolder, whose sibling tokenizer/ is found without --tokenizer."""
    vae, text_encoder, _ = models_
    return [sys.executable, str(TOOL), "encode", "--list", str(list_path), "--vae", str(vae.parent), "--text-encoder",
            str(text_encoder), "--output", str(output), "--frames", str(FRAMES), "--height", str(HEIGHT), "--width",
            str(WIDTH), "--text-len", str(TEXT_LEN), *extra]


def frames_of(path):
    """The clip's frames as the tool reads them (a PNG folder in name order, else through PyAV)."""
    if path.is_dir():
        return [Image.open(p).convert("RGB") for p in sorted(path.iterdir())]
    if path.suffix == ".png":
        return [Image.open(path).convert("RGB")]
    with av.open(str(path)) as c:
        return [f.to_image().convert("RGB") for f in c.decode(video=0)][:FRAMES]


def reference(models_, root, entries):
    """latents and context of every entry by diffusers' own code."""
    vae_path, text_path, tok_path = models_
    vae = AutoencoderKLWan.from_pretrained(vae_path).eval()
    pipe = WanPipeline(tokenizer=AutoTokenizer.from_pretrained(tok_path),
                       text_encoder=UMT5EncoderModel.from_pretrained(text_path).eval(), transformer=None, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler())
    processor = VaeImageProcessor(vae_scale_factor=8)
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    out = []
    with torch.no_grad():
        for name, caption in entries:
            frames = frames_of(root / name)
            pixels = processor.preprocess(frames, height=HEIGHT, width=WIDTH, resize_mode="crop")  # [F, 3, H, W]
            video = pixels.permute(1, 0, 2, 3).unsqueeze(0)
            latents = (vae.encode(video).latent_dist.mode() - mean) * inv_std
            context = pipe._get_t5_prompt_embeds(caption, max_sequence_length=TEXT_LEN, device=torch.device("cpu"),
                                                 dtype=torch.float32)
            lens = int(pipe.tokenizer(caption.strip(), return_tensors="pt").attention_mask.sum())
            out.append((latents[0].numpy(), context[0].numpy(), lens))
    return out


def condition_reference(models_, root, entries, mode):
    """Each entry's condition by WanImageToVideoPipeline.prepare_latents on the tool's VAE, from
    the first frame preprocessed as the tool crops it: [C, F', H', W'] for i2v (the mask
    channels dropped), [C, 1, H', W'] for ti2v (expand_timesteps)."""
    vae = AutoencoderKLWan.from_pretrained(models_[0]).eval()
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae,
                                   scheduler=FlowMatchEulerDiscreteScheduler(), expand_timesteps=mode == "ti2v")
    processor = VaeImageProcessor(vae_scale_factor=8)
    out = []
    with torch.no_grad():
        for name, _ in entries:
            image = processor.preprocess(frames_of(root / name)[0], height=HEIGHT, width=WIDTH, resize_mode="crop")
            made = pipe.prepare_latents(image, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32, torch.device("cpu"))
            condition = made[1][0]
            out.append((condition[4:] if mode == "i2v" else condition).numpy())
    return out


def check_condition(path, mode, refs, latents):
    """/condition against prepare_latents (as fp32, to 1e-5); `latents`: whether the file also
    holds /latents (else the root attribute latent_shape)."""
    shape = (16, 2 if mode == "i2v" else 1, 4, 4)
    worst = 0.0
    with h5py.File(path, "r") as f:
        condition = f["condition"]
        check(condition.shape == (len(refs), *shape) and condition.dtype == np.float32,
              f"{mode}: /condition {condition.shape} {condition.dtype}, expected ({len(refs)}, {shape}) float32")
        check(("latents" in f) == latents, f"{mode}: /latents {'present' if 'latents' in f else 'absent'}")
        if not latents:
            check(list(f.attrs.get("latent_shape", [])) == [16, 2, 4, 4],
                  f"{mode}: latent_shape {list(f.attrs.get('latent_shape', []))}, expected [16, 2, 4, 4]")
        for i, want in enumerate(refs):
            got = condition[i] if condition.shape[1:] == want.shape else np.full(want.shape, np.inf)
            d = float(np.abs(got - want).max())
            worst = max(worst, d)
            check(d < 1e-5, f"{mode}: sample {i}: /condition differs from prepare_latents by {d:.2e} (< 1e-5)")
    print(f"  {mode}: /condition of {len(refs)} samples, max |difference| from prepare_latents {worst:.2e}")


def init_teacher(cli, folder, model_type):
    """A random tiny teacher of `model_type` for the 16-channel latents and the 64-wide context."""
    in_dim = 36 if model_type == "i2v" else 16  # i2v: noisy latents, 4 mask channels, the condition
    run(f"init-teacher {model_type}", [cli, "init-teacher", "--output", str(folder), "--model-type", model_type,
                                       "--in-dim", str(in_dim), "--out-dim", "16", "--text-dim", "64", "--text-len",
                                       str(TEXT_LEN)])
    return folder


def check_accepted(cli, path, teacher, mode, samples):
    """`wan-distill plan` validates the file for the teacher of its kind; the builtin t2v teacher
    refuses it, naming the condition's shape."""
    run(f"plan, {mode} teacher", [cli, "plan", "--teacher.checkpoint", str(teacher), "--data.path", str(path), "--cpu"])
    shape = f"[{samples},16,{2 if mode == 'i2v' else 1},4,4]"
    log = run("plan, t2v teacher", [cli, "plan", "--data.path", str(path), "--cpu"], code=3)
    check(f"/condition: holds image conditions {shape}" in log, f"a t2v teacher's refusal names the condition {shape}")


def check_schema(path, entries, refs):
    with h5py.File(path, "r") as f:
        n = len(entries)
        check(f.attrs["schema_version"] == 1 and f.attrs["latent_layout"] == "CFHW", "root attributes of the schema")
        check(f["latents"].shape == (n, 16, 2, 4, 4) and f["latents"].dtype == np.float16,
              f"/latents {f['latents'].shape} {f['latents'].dtype}, expected ({n}, 16, 2, 4, 4) float16")
        check(f["context"].shape == (n, TEXT_LEN, 64), f"/context {f['context'].shape}, expected ({n}, {TEXT_LEN}, 64)")
        check(f["latents"].chunks == (1, 16, 2, 4, 4), f"/latents chunks {f['latents'].chunks}: one sample each")
        prompts = [p.decode() for p in f["prompts"][:]]
        check(prompts == [" ".join(c.replace("&amp;", "&").split()) for _, c in entries],
              f"/prompts in list order, cleaned: {prompts}")
        for i, (lat, ctx, lens) in enumerate(refs):
            got_lat, got_ctx, got_len = f["latents"][i].astype(np.float32), f["context"][i].astype(np.float32), \
                int(f["context_lens"][i])
            d_lat = np.abs(got_lat - lat).max() / np.abs(lat).max()
            d_ctx = np.abs(got_ctx - ctx).max() / np.abs(ctx).max()
            check(d_lat < 2e-3, f"sample {i}: latents differ from diffusers' by {d_lat:.2e} of max|z| (float16: < 2e-3)")
            check(d_ctx < 2e-3, f"sample {i}: context differs from _get_t5_prompt_embeds by {d_ctx:.2e} (< 2e-3)")
            check(got_len == lens, f"sample {i}: context_lens {got_len}, the tokenizer gives {lens}")
            check(not got_ctx[got_len:].any(), f"sample {i}: context rows past {got_len} are zero")


def image_conditions(cli, models_, root, clips, entries):
    """Part 6: --image-condition i2v and ti2v on three clips; returns the tiny teachers it made."""
    print("6. --image-condition i2v and ti2v against WanImageToVideoPipeline.prepare_latents")
    few = entries[:3]  # a PNG folder, a GIF and an MP4; square, wider and taller
    few_list = clips / "few.tsv"
    write_list(few_list, few)
    teachers = {mode: init_teacher(cli, root / f"teacher-{mode}", mode) for mode in ("i2v", "ti2v")}
    for mode in ("i2v", "ti2v"):
        cond_out = root / f"{mode}.h5"
        extra = ["--image-condition", mode, "--dtype", "fp32"]
        if mode == "i2v":  # the shards carry /condition through a stop and a rerun
            run("encode i2v --procs 2 --limit 1", encode(models_, few_list, cond_out, *extra, "--procs", "2",
                                                         "--limit", "1"), code=3)
            extra += ["--procs", "2"]
        log = run(f"encode --image-condition {mode}", encode(models_, few_list, cond_out, *extra))
        if mode == "i2v":
            check(log.count("resuming: 1 of") == 2, "both i2v shards resume from their one finished sample")
            log = run("rerun a shard with ti2v", encode(models_, few_list, cond_out, "--image-condition", "ti2v",
                                                        "--dtype", "fp32", "--shard", "0/2"), code=2)
            check("written with image_condition=i2v, this run has ti2v" in log, "a shard refuses another condition")
        if not cond_out.exists():
            continue
        check_condition(cond_out, mode, condition_reference(models_, clips, few, mode), latents=True)
        if mode == "ti2v":  # the VAE is causal: the frame alone encodes to the clip's first latent frame
            with h5py.File(cond_out, "r") as f:
                d = float(np.abs(f["condition"][:] - f["latents"][:, :, :1]).max())
            check(d < 1e-5, f"ti2v: /condition differs from the first latent frame by {d:.2e} (< 1e-5)")
        check_accepted(cli, cond_out, teachers[mode], mode, len(few))
    if (root / "i2v.h5").exists():
        log = run("train i2v 2 steps", ["bash", str(LAUNCHER), "-np", "2", cli, "train", "--data.path",
                                        str(root / "i2v.h5"), "--teacher.checkpoint", str(teachers["i2v"]),
                                        "--run-dir", str(root / "run-i2v"), "--train.steps", "2",
                                        "--train.eval_samples", "1", "--train.batch_size", "1", "--log.level",
                                        "info", *CPU_JOB])
        check("student saved" in log, "an i2v teacher trains on the i2v file")
    return teachers


def images_and_prompts(cli, models_, root, clips, entries, teachers):
    """Part 7: --no-latents on three PNG images, both modes."""
    print("7. images and prompts (--no-latents)")
    images = []
    for i, size in enumerate([(32, 32), (48, 36), (36, 52)]):
        clip(20 + i, size)[0].save(clips / f"image{i}.png")
        images.append((f"image{i}.png", entries[i][1]))
    images_list = clips / "images.tsv"
    write_list(images_list, images)
    for mode in ("i2v", "ti2v"):
        images_out = root / f"images-{mode}.h5"
        log = run(f"encode --image-condition {mode} --no-latents",
                  encode(models_, images_list, images_out, "--image-condition", mode, "--no-latents", "--dtype",
                         "fp32"))
        check("no /latents" in log, f"{mode}: the merge says there are no /latents")
        if images_out.exists():
            check_condition(images_out, mode, condition_reference(models_, clips, images, mode), latents=False)
            run(f"plan on images, {mode} teacher", [cli, "plan", "--teacher.checkpoint", str(teachers[mode]),
                                                    "--data.path", str(images_out), "--cpu"])
            # The teacher samples each image's conditioned paths from noise: a few-step student.
            log = run(f"train trajectory on images, {mode}",
                      ["bash", str(LAUNCHER), "-np", "2", cli, "train", "--data.path", str(images_out),
                       "--teacher.checkpoint", str(teachers[mode]), "--run-dir", str(root / f"run-images-{mode}"),
                       "--train.objective", "trajectory", "--teacher.steps", "2", "--student.steps", "1",
                       "--train.steps", "2", "--train.eval_samples", "1", "--train.batch_size", "1",
                       "--log.level", "info", *CPU_JOB])
            check("student saved" in log, f"a {mode} teacher's trajectory student trains on images alone")
    log = run("--no-latents alone", encode(models_, images_list, root / "x.h5", "--no-latents"), code=2)
    check("give --image-condition" in log, "--no-latents without --image-condition is refused")


def main():
    transformers.logging.disable_progress_bar()
    if len(sys.argv) != 2:
        sys.exit("usage: test_prepare_data.py WAN_DISTILL")
    cli = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="wd-prepare-") as tmp:
        root = Path(tmp)
        models_ = build_models(root / "models")
        clips = root / "clips"
        clips.mkdir()
        entries = write_clips(clips)
        list_path = clips / "list.tsv"
        write_list(list_path, entries)
        out = root / "data.h5"

        print("1. two shards, stopped after one sample each, then resumed and merged")
        log = run("encode --procs 2 --limit 1", encode(models_, list_path, out, "--procs", "2", "--limit", "1"), code=3)
        check(not out.exists() and "not merged" in log, "a part-done run merges nothing and says so")
        for i in range(2):
            with h5py.File(f"{out}.shard-{i}-of-2.h5", "r") as f:
                check(list(f["sample_index"][:]) == [i], f"shard {i} holds its first sample after --limit 1")
        log = run("encode --procs 2 (resume)", encode(models_, list_path, out, "--procs", "2"))
        check(log.count("resuming: 1 of 4") == 2, "both shards resume from their one finished sample")
        check("ETA" in log, "progress lines with an ETA")
        check(out.exists(), f"{out} merged")

        print("1b. one shard killed (SIGKILL) after its first sample, then resumed")
        killed = root / "killed.h5"
        child = subprocess.Popen(encode(models_, list_path, killed), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        for line in child.stdout:
            if "1/8 samples" in line:
                child.kill()
                break
        child.wait()
        check(child.returncode == -9 and not killed.exists(), f"killed in the middle (exit {child.returncode})")
        log = run("encode (resume after SIGKILL)", encode(models_, list_path, killed))
        check("resuming:" in log, "the rerun resumes after the kill")
        if killed.exists() and out.exists():
            with h5py.File(killed, "r") as a, h5py.File(out, "r") as b:
                same = all(np.array_equal(a[k][:], b[k][:]) for k in ("latents", "context", "context_lens", "prompts"))
                check(same, "one killed-and-resumed shard gives the file of two shards")

        print("2. the file against diffusers' steps")
        if out.exists():
            check_schema(out, entries, reference(models_, clips, entries))

        print("3. wan-distill trains on it")
        log = run("train 3 steps", ["bash", str(LAUNCHER), "-np", "3", cli, "train", "--data.path", str(out),
                                    "--run-dir", str(root / "run"), "--train.steps", "3", "--train.eval_samples", "4",
                                    "--log.level", "info", *CPU_JOB])
        metrics = root / "run" / "metrics.jsonl"
        steps = [json.loads(l).get("step") for l in metrics.read_text().splitlines()] if metrics.exists() else []
        check(3 in steps and "student saved" in log, f"train reaches step 3 and saves the student (steps {steps})")

        print("4. a bad video and an empty caption")
        (clips / "broken.mp4").write_bytes(b"not a video at all" * 10)
        bad = entries[:3] + [("broken.mp4", "a car at night")] + entries[3:5] + [(entries[5][0], "   ")]
        bad_list = clips / "bad.tsv"
        write_list(bad_list, bad)
        bad_out = root / "bad.h5"
        log = run("encode, bad video", encode(models_, bad_list, bad_out), code=2)
        check(f"{clips / 'broken.mp4'} ({bad_list}:5)" in log, "the message names the video and its list line")
        Path(f"{bad_out}.shard-0-of-1.h5").unlink()  # its list changes below, so it cannot resume
        no_video = [e for e in bad if e[0] != "broken.mp4"]
        write_list(bad_list, no_video)
        log = run("encode, empty caption", encode(models_, bad_list, bad_out), code=2)
        check(f"{clips / entries[5][0]} ({bad_list}:7): empty caption" in log, "the message names the empty caption's file and line")
        Path(f"{bad_out}.shard-0-of-1.h5").unlink(missing_ok=True)
        write_list(bad_list, bad)
        log = run("encode --skip-bad", encode(models_, bad_list, bad_out, "--skip-bad"))
        check(log.count("skipped ") == 2, "two samples skipped, each named")
        if bad_out.exists():
            with h5py.File(bad_out, "r") as f:
                check(list(f["sample_index"][:]) == [0, 1, 2, 4, 5], f"the good samples merged: {list(f['sample_index'][:])}")

        print("5. prompts alone: captions, then train.objective trajectory on them")
        prompts = clips / "prompts.txt"
        prompts.write_text("# a comment\n" + "\n".join(c for _, c in entries) + "\n\n", encoding="utf-8")
        ctx_out = root / "contexts.h5"
        _, text_encoder, _ = models_
        log = run("captions", [sys.executable, str(TOOL), "captions", "--list", str(prompts), "--text-encoder",
                               str(text_encoder), "--output", str(ctx_out), "--latent", "16,1,4,4", "--text-len",
                               str(TEXT_LEN)])
        check("no /latents" in log and "ETA" in log, "captions reports its progress and what it wrote")
        if ctx_out.exists():
            pipe = WanPipeline(tokenizer=AutoTokenizer.from_pretrained(models_[2]),
                               text_encoder=UMT5EncoderModel.from_pretrained(text_encoder).eval(), transformer=None,
                               vae=None, scheduler=FlowMatchEulerDiscreteScheduler())
            with h5py.File(ctx_out, "r") as f, torch.no_grad():
                check("latents" not in f, "a contexts-only file has no /latents")
                check(list(f.attrs["latent_shape"]) == [16, 1, 4, 4], f"latent_shape {list(f.attrs['latent_shape'])}")
                check(f["context"].shape == (len(entries), TEXT_LEN, 64), f"/context {f['context'].shape}")
                for i, (_, caption) in enumerate(entries):
                    want = pipe._get_t5_prompt_embeds(caption, max_sequence_length=TEXT_LEN, device=torch.device("cpu"),
                                                      dtype=torch.float32)[0].numpy()
                    got = f["context"][i].astype(np.float32)
                    d = np.abs(got - want).max() / np.abs(want).max()
                    check(d < 2e-3, f"prompt {i}: context differs from _get_t5_prompt_embeds by {d:.2e} (< 2e-3)")
            log = run("train trajectory on prompts", ["bash", str(LAUNCHER), "-np", "2", cli, "train", "--data.path",
                                                      str(ctx_out), "--run-dir", str(root / "run-prompts"),
                                                      "--train.objective", "trajectory", "--teacher.steps", "2",
                                                      "--student.steps", "1", "--train.steps", "2",
                                                      "--train.eval_samples", "2", "--train.batch_size", "2",
                                                      "--log.level", "info", *CPU_JOB])
            check("student saved" in log, "train.objective trajectory trains from the prompts alone")
            log = run("train velocity on prompts", ["bash", str(LAUNCHER), "-np", "2", cli, "train", "--data.path",
                                                    str(ctx_out), "--run-dir", str(root / "run-prompts-v"),
                                                    "--train.steps", "2", "--train.eval_samples", "2", *CPU_JOB], code=3)
            check("train.objective velocity needs the latents" in log, "velocity refuses the prompts alone, saying why (bad input: exit 3)")
        no_list = root / "empty.txt"
        no_list.write_text("# nothing\n")
        log = run("captions, no prompts", [sys.executable, str(TOOL), "captions", "--list", str(no_list),
                                           "--text-encoder", str(text_encoder), "--output", str(root / "x.h5"),
                                           "--latent", "16,1,4,4"], code=2)
        check("no prompts" in log, "an empty prompt list is refused")

        teachers = image_conditions(cli, models_, root, clips, entries)
        images_and_prompts(cli, models_, root, clips, entries, teachers)

    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
