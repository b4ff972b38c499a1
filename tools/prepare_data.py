#!/usr/bin/env python3
"""Encodes videos or images and their captions into wan-distill's HDF5 data set (docs/data-format.md).

The caption list holds one sample per line, `PATH<TAB>caption`, PATH relative to the list's
folder: a video (anything FFmpeg decodes through PyAV: .mp4, .webm, .mov, .gif, ...), an image
(one frame; use --frames 1), or a folder of images read in name order as the frames of one clip.
Blank lines and lines starting with '#' are ignored.

Each sample is encoded as diffusers' Wan pipelines do it (pipelines/wan/pipeline_wan.py and
pipeline_wan_i2v.py of diffusers 0.42.1): frames resized to cover HEIGHTxWIDTH and centre-cropped,
scaled to [-1, 1], encoded by AutoencoderKLWan (mode of the posterior), normalised with the VAE's
latents_mean/latents_std; the caption cleaned, tokenised to --text-len tokens and run through
UMT5EncoderModel, rows past the prompt's tokens set to zero.

Usage:
  prepare_data.py encode --list LIST --vae PATH --text-encoder PATH --output OUT.h5
                         [--frames F --height H --width W] [--procs N | --shard I/N]
                         [--device cuda:0,cuda:1] [--limit K] [--skip-bad]
                         [--image-condition i2v|ti2v [--no-latents]]
  prepare_data.py merge --output OUT.h5 --shards N
  prepare_data.py captions --list PROMPTS.txt --text-encoder PATH --output OUT.h5
                           (--latent C,F,H,W | --vae PATH [--frames F --height H --width W])

`captions` encodes prompts alone (one per line; blank lines and '#' lines ignored) into a data set
of contexts with no /latents: the root attribute latent_shape declares the latents a video of
the given size would have (from --latent, or from the VAE's channels and scale factors). It is
what `wan-distill train --train.objective trajectory` trains from (the teacher samples the
latents itself); the other objectives refuse it.

`encode` without --shard runs --procs shards (child processes, one device each, taken in turn
from --device) and merges them into OUT.h5. `encode --shard I/N` runs one shard only (for a
scheduler that starts the shards itself) and `merge` joins them afterwards. Shard I takes the
samples whose list position p has p % N == I and writes OUT.h5.shard-I-of-N.h5, recording every
finished and every skipped sample there, so a rerun after an interruption carries on where it
stopped.

`encode --image-condition i2v|ti2v` also writes /condition, each sample's image condition made
from the first frame of its clip (the same resized and cropped pixels as frame 0 of /latents) as
WanImageToVideoPipeline.prepare_latents makes latent_condition: i2v (I2V-A14B) encodes the frame
followed by F-1 zero frames and normalises it, [C, F', H', W'] (the pipeline's 4 mask channels are
left out: wan-distill makes them); ti2v (TI2V-5B, expand_timesteps) encodes the frame alone,
[C, 1, H', W']. With --no-latents the list may hold images (a video gives its first frame) and no
/latents is written: the file holds contexts, /condition and the root attribute latent_shape
(from the VAE and --frames/--height/--width), an images-and-prompts set for objectives whose
teacher samples the latents from noise.
"""

import argparse
import hashlib
import html
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    import h5py
    import numpy as np
    import torch
    from PIL import Image
except ImportError as e:
    sys.exit(f"prepare_data: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STORE_DTYPES = {"fp32": np.float32, "fp16": np.float16}
# Settings a shard records; a rerun must use the same ones to carry on.
SHARD_SETTINGS = ("list_sha256", "total", "frames", "height", "width", "frame_stride", "text_len", "dtype",
                  "image_condition", "no_latents")
# What a shard written before a setting existed did: no condition, latents stored.
SETTING_DEFAULTS = {"image_condition": "none", "no_latents": False}
IMAGE_CONDITIONS = ("none", "i2v", "ti2v")


class BadSample(Exception):
    """A sample that cannot be used: the message names its file and its line of the list."""


class Failure(Exception):
    """A problem with the run as a whole (arguments, models, shard files)."""


# --- the caption list ------------------------------------------------------------------------------


class Sample:
    def __init__(self, position, line, path, caption, tab):
        self.position, self.line, self.path, self.caption, self.tab = position, line, path, caption, tab


def read_list(list_path):
    """Every sample of the list in order; a line without a TAB is a BadSample when its turn comes."""
    samples = []
    base = list_path.parent
    for number, text in enumerate(list_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        path, tab, caption = text.partition("\t")
        samples.append(Sample(len(samples), number, base / path.strip(), caption, bool(tab)))
    return samples


def where(sample, list_path):
    return f"{sample.path} ({list_path}:{sample.line})"


# The caption cleaning of diffusers' prompt_clean (pipeline_wan.py): HTML entities unescaped
# twice, runs of whitespace made one space, ends stripped. diffusers also runs ftfy.fix_text when
# ftfy is installed; it is not pinned here, so mojibake is left as it is.
def clean_caption(text):
    return re.sub(r"\s+", " ", html.unescape(html.unescape(text)).strip()).strip()


# --- frames ----------------------------------------------------------------------------------------


def read_frames(path, count, stride):
    """The first `count` frames (every `stride`-th) of a video, image or image folder, as RGB PIL images."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        frames = [open_image(p) for p in files[: (count - 1) * stride + 1 : stride]]
    elif path.suffix.lower() in IMAGE_SUFFIXES:
        frames = [open_image(path)]
    else:
        frames = decode_video(path, count, stride)
    if len(frames) < count:
        raise BadSample(f"has {len(frames)} frames at stride {stride}, expected at least {count}")
    return frames


def open_image(path):
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError) as e:
        raise BadSample(f"cannot read the image {path.name}: {e}") from e


def decode_video(path, count, stride):
    import av  # only videos need it

    frames = []
    try:
        with av.open(str(path)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if index % stride == 0:
                    frames.append(frame.to_image().convert("RGB"))
                    if len(frames) == count:
                        break
    except (av.FFmpegError, OSError, ValueError, IndexError) as e:
        raise BadSample(f"cannot decode the video: {e}") from e
    return frames


def to_pixels(frames, height, width):
    """[3, F, H, W] float32 in [-1, 1], as diffusers' VaeImageProcessor with resize_mode="crop".

    Its _resize_and_crop scales each frame to cover HxW (integer sizes, its default resample
    "lanczos") and centre-crops the excess; pil_to_numpy then divides by 255 and normalize()
    maps x to 2x - 1. The same integer arithmetic is kept here, so the pixels are equal.
    """
    out = np.empty((len(frames), height, width, 3), np.float32)
    for i, image in enumerate(frames):
        wider = width / height > image.width / image.height
        w = width if wider else image.width * height // image.height
        h = height if not wider else image.height * width // image.width
        image = image.resize((w, h), Image.LANCZOS)
        left, top = w // 2 - width // 2, h // 2 - height // 2
        out[i] = np.asarray(image.crop((left, top, left + width, top + height)), np.float32) / 255.0
    return torch.from_numpy(2.0 * out - 1.0).permute(3, 0, 1, 2)


# --- the encoders ----------------------------------------------------------------------------------


def model_folder(path, sub):
    """PATH itself, or PATH/sub when PATH is a diffusers pipeline folder (vae/, text_encoder/, ...)."""
    path = Path(path)
    if not path.is_dir():
        raise Failure(f"{path}: not a folder; expected one that from_pretrained loads (no download here)")
    return path / sub if (path / sub).is_dir() else path


def tokenizer_folder(text_encoder):
    """The tokenizer beside a pipeline's text_encoder/ (PATH/tokenizer or ../tokenizer), else PATH."""
    path = model_folder(text_encoder, "tokenizer")
    sibling = Path(text_encoder).parent / "tokenizer"
    return sibling if path == Path(text_encoder) and sibling.is_dir() else path


class Encoders:
    def __init__(self, args, text_only=False):
        """The VAE and the text encoder; `text_only`: the text encoder alone (and, with --vae, the
        VAE's config, without its weights)."""
        from diffusers import AutoencoderKLWan
        from transformers import AutoTokenizer, UMT5EncoderModel

        self.device = torch.device(args.device)
        self.text_len = args.text_len
        tokenizer_path = args.tokenizer or tokenizer_folder(args.text_encoder)
        try:
            if text_only:
                self.vae = None
                vae_config = AutoencoderKLWan.load_config(model_folder(args.vae, "vae"), local_files_only=True) \
                    if args.vae else None
            else:
                self.vae = AutoencoderKLWan.from_pretrained(model_folder(args.vae, "vae"),
                                                            torch_dtype=DTYPES[args.vae_dtype], local_files_only=True)
            self.text_encoder = UMT5EncoderModel.from_pretrained(
                model_folder(args.text_encoder, "text_encoder"), dtype=DTYPES[args.text_dtype], local_files_only=True)
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
        except (OSError, ValueError) as e:
            raise Failure(f"cannot load a model: {e}") from e
        self.text_encoder.to(self.device).eval()
        self.text_dim = self.text_encoder.config.d_model
        if text_only:
            if vae_config is not None:
                self.channels = vae_config["z_dim"]
                self.temporal = vae_config.get("scale_factor_temporal", 4)
                self.spatial = vae_config.get("scale_factor_spatial", 8)
            return
        self.vae.to(self.device).eval()
        if args.vae_tiling:
            self.vae.enable_tiling()
        cfg = self.vae.config
        self.channels = cfg.z_dim
        # pipeline_wan_i2v.py prepare_latents: z = (mode - latents_mean) * (1 / latents_std); the
        # pipelines' decode step undoes it with z * latents_std + latents_mean.
        shape = (1, cfg.z_dim, 1, 1, 1)
        self.mean = torch.tensor(cfg.latents_mean, dtype=torch.float32).view(shape).to(self.device)
        self.inv_std = 1.0 / torch.tensor(cfg.latents_std, dtype=torch.float32).view(shape).to(self.device)
        self.temporal = cfg.scale_factor_temporal
        self.spatial = cfg.scale_factor_spatial
        self.text_dim = self.text_encoder.config.d_model

    def check_size(self, frames, height, width):
        # pipeline_wan.py rounds num_frames to 4n+1 (n: the VAE's temporal factor) and H/W to
        # multiples of the VAE's spatial factor times the DiT's patch (2); here they are refused.
        if frames % self.temporal != 1:
            raise Failure(f"--frames {frames}: expected {self.temporal}n+1 (the VAE's temporal factor is {self.temporal})")
        multiple = self.spatial * 2
        if height % multiple or width % multiple:
            raise Failure(f"--height {height} --width {width}: expected multiples of {multiple} "
                          f"(the VAE's spatial factor {self.spatial} times the DiT's patch 2)")

    @torch.no_grad()
    def latents(self, pixels):
        """[C, F', H', W'] float32: the normalised mode of the VAE's posterior (the i2v pipeline's argmax)."""
        x = pixels.unsqueeze(0).to(self.device, self.vae.dtype)
        mode = self.vae.encode(x).latent_dist.mode().float()
        return ((mode - self.mean) * self.inv_std)[0].cpu()

    def condition(self, first, kind, frames):
        """The image condition of a clip from its first frame's pixels [3, 1, H, W], as
        WanImageToVideoPipeline.prepare_latents builds latent_condition: i2v encodes the frame
        followed by frames - 1 zero frames ([C, F', H', W']; the VAE is causal in time, so the zero
        frames' latents depend on the image and are encoded with it), ti2v (expand_timesteps)
        the frame alone ([C, 1, H', W'])."""
        if kind == "i2v":
            first = torch.cat([first, first.new_zeros(first.shape[0], frames - 1, *first.shape[2:])], dim=1)
        return self.latents(first)

    @torch.no_grad()
    def context(self, caption):
        """([text_len, text_dim] float32 with zero rows past the prompt, its token count): _get_t5_prompt_embeds."""
        tokens = self.tokenizer([caption], padding="max_length", max_length=self.text_len, truncation=True,
                                add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        length = int(mask.gt(0).sum())
        hidden = self.text_encoder(ids, mask).last_hidden_state[0].float().cpu()
        hidden[length:] = 0.0  # Wan pads with zeros, not with the encoder's output at pad tokens
        return hidden, length


# --- one shard -------------------------------------------------------------------------------------


def shard_path(output, index, count):
    return Path(f"{output}.shard-{index}-of-{count}.h5")


def settings_of(args, list_path, total):
    return {"list_sha256": hashlib.sha256(list_path.read_bytes()).hexdigest(), "total": total, "frames": args.frames,
            "height": args.height, "width": args.width, "frame_stride": args.frame_stride,
            "text_len": args.text_len, "dtype": args.dtype, "image_condition": args.image_condition,
            "no_latents": args.no_latents}


def setting(f, key):
    """A shard's recorded setting, as text (what an older shard did when it has none)."""
    return str(f.attrs.get(key, SETTING_DEFAULTS.get(key)))


def row_shapes(enc, args, text_dim):
    """The row of each float dataset a shard holds: /latents (unless --no-latents), /condition
    (with --image-condition) and /context."""
    c, fr, h, w = latent_shape(enc, args)
    rows = {} if args.no_latents else {"latents": (c, fr, h, w)}
    if args.image_condition != "none":
        rows["condition"] = (c, fr if args.image_condition == "i2v" else 1, h, w)
    rows["context"] = (args.text_len, text_dim)
    return rows


def open_shard(path, settings, rows, shape, store):
    """The shard file, created or reopened; rows past its recorded count (a sample cut off) are
    dropped. `rows`: each float dataset's row shape; `shape`: the latent C,F,H,W, recorded as the
    root attribute latent_shape (what merge declares when there are no /latents)."""
    if path.exists():
        try:
            f = h5py.File(path, "a")
        except OSError as e:
            why = "another process has it open (is this shard running twice?)" if "lock" in str(e) else \
                "delete it to encode the shard again"
            raise Failure(f"{path}: cannot reopen the shard ({e}); {why}") from e
        for key in SHARD_SETTINGS:
            written = setting(f, key)
            if written != str(settings[key]):
                f.close()
                raise Failure(f"{path}: written with {key}={written}, this run has {settings[key]}; "
                              "use the same list and settings, or delete the shard")
        for name, row in rows.items():
            held = list(f[name].shape[1:])
            if held != list(row):
                f.close()
                raise Failure(f"{path}: /{name} rows are {held}, these models give {list(row)}; "
                              "use the same models, or delete the shard")
        done, skipped = int(f.attrs["done"]), int(f.attrs["skipped"])
        for name in (*rows, "context_lens", "prompts", "sample_index"):
            f[name].resize(done, axis=0)
        f["skipped"].resize(skipped, axis=0)
        return f
    f = h5py.File(path, "w")
    for key, value in settings.items():
        f.attrs[key] = value
    f.attrs["latent_shape"] = np.array(shape, dtype=np.int64)
    f.attrs["done"] = 0
    f.attrs["skipped"] = 0
    for name, row in rows.items():
        f.create_dataset(name, (0, *row), store, maxshape=(None, *row), chunks=(1, *row))
    f.create_dataset("context_lens", (0,), np.int32, maxshape=(None,), chunks=(1024,))
    f.create_dataset("prompts", (0,), h5py.string_dtype(), maxshape=(None,), chunks=(1024,))
    f.create_dataset("sample_index", (0,), np.int64, maxshape=(None,), chunks=(1024,))
    f.create_dataset("skipped", (0,), np.int64, maxshape=(None,), chunks=(1024,))
    return f


def append(f, name, value):
    d = f[name]
    d.resize(d.shape[0] + 1, axis=0)
    d[-1] = value


def latent_shape(enc, args):
    return (enc.channels, (args.frames - 1) // enc.temporal + 1, args.height // enc.spatial, args.width // enc.spatial)


def encode_shard(args, index, count):
    """Encodes shard index/count; returns 0 when every one of its samples is done or skipped."""
    list_path = Path(args.list)
    everything = read_list(list_path)
    samples = [s for s in everything if s.position % count == index]
    torch.set_grad_enabled(False)
    enc = Encoders(args)
    enc.check_size(args.frames, args.height, args.width)
    path = shard_path(args.output, index, count)
    rows = row_shapes(enc, args, enc.text_dim)
    f = open_shard(path, settings_of(args, list_path, len(everything)), rows, latent_shape(enc, args),
                   STORE_DTYPES[args.dtype])
    # --no-latents needs the first frame only: an image, or a video's first frame.
    frames_read = 1 if args.no_latents else args.frames
    tag = f"[shard {index}/{count}]"
    try:
        finished = set(f["sample_index"][:].tolist()) | set(f["skipped"][:].tolist())
        todo = [s for s in samples if s.position not in finished]
        if finished:
            print(f"{tag} resuming: {len(finished)} of {len(samples)} samples already done or skipped", flush=True)
        if args.limit is not None:
            todo = todo[: args.limit]
        progress = Progress(tag, len(todo), len(finished), len(samples))
        for sample in todo:
            try:
                caption = clean_caption(sample.caption)
                if not sample.tab:
                    raise BadSample("no TAB between the path and the caption")
                if not caption:
                    raise BadSample("empty caption")
                pixels = to_pixels(read_frames(sample.path, frames_read, args.frame_stride), args.height, args.width)
                values = {}
                if "latents" in rows:
                    values["latents"] = enc.latents(pixels).numpy()
                if "condition" in rows:
                    values["condition"] = enc.condition(pixels[:, :1], args.image_condition, args.frames).numpy()
                ctx, length = enc.context(caption)
            except BadSample as e:
                message = f"{where(sample, list_path)}: {e}"
                if not args.skip_bad:
                    raise Failure(message + " (--skip-bad leaves such samples out)") from e
                print(f"{tag} skipped {message}", flush=True)
                append(f, "skipped", sample.position)
                f.attrs["skipped"] = f["skipped"].shape[0]  # last, as "done" below
                f.flush()
                progress.step(skipped=True)
                continue
            values.update(context=ctx.numpy(), context_lens=length, prompts=caption, sample_index=sample.position)
            for name, value in values.items():
                append(f, name, value)
            # The count is written last and flushed: a run stopped before this line left a row that
            # the next run drops, one stopped after it left a complete sample.
            f.attrs["done"] = f["sample_index"].shape[0]
            f.flush()
            progress.step()
        skipped = f["skipped"].shape[0]
        left = len(samples) - f["sample_index"].shape[0] - skipped
    finally:
        f.close()
    print(f"{tag} {path}: {len(samples) - left} of {len(samples)} samples finished ({skipped} skipped)"
          + (f", {left} left (rerun to carry on)" if left else ""), flush=True)
    return 0 if left == 0 else 3


class Progress:
    """One line per sample (or per 10 s when faster): count, rate and the time left."""

    def __init__(self, tag, todo, before, total):
        self.tag, self.todo, self.before, self.total = tag, todo, before, total
        self.count, self.skipped, self.start, self.last = 0, 0, time.monotonic(), 0.0

    def step(self, skipped=False):
        self.count += 1
        self.skipped += skipped
        now = time.monotonic()
        if now - self.last < 10 and self.count < self.todo and self.count > 3:
            return
        self.last = now
        rate = self.count / max(now - self.start, 1e-9)
        eta = (self.todo - self.count) / rate
        print(f"{self.tag} {self.before + self.count}/{self.total} samples ({self.skipped} skipped), "
              f"{rate:.2f} samples/s, ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}", flush=True)


# --- merge -----------------------------------------------------------------------------------------


def merge(output, count):
    """Joins the shards, in list order, into OUTPUT (written as OUTPUT.tmp, then renamed)."""
    output = Path(output)
    shards = []
    for i in range(count):
        path = shard_path(output, i, count)
        if not path.exists():
            raise Failure(f"{path}: missing; run encode --shard {i}/{count} first")
        shards.append(h5py.File(path, "r"))
    try:
        first = shards[0]
        rows = [name for name in ("latents", "condition", "context") if name in first]
        for path_index, f in enumerate(shards):
            for key in SHARD_SETTINGS:
                if setting(f, key) != setting(first, key):
                    raise Failure(f"{shard_path(output, path_index, count)}: {key}={setting(f, key)}, shard 0 has "
                                  f"{setting(first, key)}; the shards come from different runs")
            for name in rows:
                if name not in f or f[name].shape[1:] != first[name].shape[1:]:
                    held = f"rows are {f[name].shape[1:]}" if name in f else "is missing"
                    raise Failure(f"{shard_path(output, path_index, count)}: /{name} {held}, "
                                  f"shard 0 has {first[name].shape[1:]}")
        check_complete(output, shards, count)
        order = sorted((int(p), s, r) for s, f in enumerate(shards) for r, p in enumerate(recorded(f, "sample_index")))
        if not order:
            raise Failure(f"{output}: every sample was skipped; nothing to write")
        write_merged(output, shards, order, rows)
        described = ", ".join(f"{name} {list(first[name].shape[1:])}" for name in rows) + f" {first['context'].dtype}"
        if "latents" not in first:
            described += f"; no /latents, latent_shape {list(first.attrs['latent_shape'])}"
    finally:
        for f in shards:
            f.close()
    print(f"merge: {output}: {len(order)} samples, {described}", flush=True)


def recorded(f, name):
    """The rows of a shard's /sample_index or /skipped up to its recorded count (a killed run may
    have left one more, unfinished)."""
    return f[name][: int(f.attrs["done" if name == "sample_index" else "skipped"])]


def check_complete(output, shards, count):
    """Every position of the list (its length recorded by each shard) is in its own shard, done or skipped."""
    seen = {}
    for i, f in enumerate(shards):
        for p in list(recorded(f, "sample_index")) + list(recorded(f, "skipped")):
            if int(p) % count != i or int(p) in seen:
                raise Failure(f"{shard_path(output, i, count)}: holds sample {int(p)}, which is not its own")
            seen[int(p)] = i
    total = int(shards[0].attrs["total"])
    missing = [p for p in range(total) if p not in seen]
    if missing:
        raise Failure(f"shard {missing[0] % count}/{count} ({shard_path(output, missing[0] % count, count)}) is not "
                      f"finished: {len(missing)} samples of the list are neither encoded nor skipped; rerun encode")


def write_merged(output, shards, order, rows):
    """Writes the merged file; `rows`: the float datasets the shards hold (latents, condition, context)."""
    first = shards[0]
    n = len(order)
    tmp = Path(f"{output}.tmp")
    with h5py.File(tmp, "w") as out:
        out.attrs["schema_version"] = 1
        out.attrs["latent_layout"] = "CFHW"
        if "latents" not in first:  # images and prompts: the teacher samples latents of this shape
            out.attrs["latent_shape"] = np.array(first.attrs["latent_shape"], dtype=np.int64)
        data = {name: out.create_dataset(name, (n, *first[name].shape[1:]), first[name].dtype,
                                         chunks=(1, *first[name].shape[1:])) for name in rows}
        lens = out.create_dataset("context_lens", (n,), np.int32)
        prompts = out.create_dataset("prompts", (n,), h5py.string_dtype())
        index = out.create_dataset("sample_index", (n,), np.int64)  # provenance: the list position
        for row, (position, s, r) in enumerate(order):
            f = shards[s]
            for name, d in data.items():
                d[row] = f[name][r]
            lens[row] = f["context_lens"][r]
            prompts[row] = f["prompts"][r]
            index[row] = position
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, output)


# --- prompts alone --------------------------------------------------------------------------------


def read_prompts(path):
    """The prompts of a list, one per line (blank lines and '#' lines ignored), cleaned."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise Failure(f"{path}: cannot read the prompt list ({e})") from e
    prompts = [clean_caption(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise Failure(f"{path}: no prompts (one per line; blank lines and '#' lines are ignored)")
    return prompts


def parse_latent(text):
    m = re.fullmatch(r"(\d+),(\d+),(\d+),(\d+)", text or "")
    if not m or min(int(g) for g in m.groups()) < 1:
        raise Failure(f"--latent {text}: expected C,F,H,W, four positive integers")
    return tuple(int(g) for g in m.groups())


def captions(args):
    """Encodes the prompts of --list into a contexts-only data set (no /latents)."""
    if not args.latent and not args.vae:
        raise Failure("captions: give --latent C,F,H,W or --vae (with --frames/--height/--width) for the latent shape")
    prompts = read_prompts(Path(args.list))
    torch.set_grad_enabled(False)
    enc = Encoders(args, text_only=True)
    if args.latent:
        shape = parse_latent(args.latent)
    else:
        enc.check_size(args.frames, args.height, args.width)
        shape = latent_shape(enc, args)
    output = Path(args.output)
    tmp = Path(f"{output}.tmp")
    n, L, store = len(prompts), args.text_len, STORE_DTYPES[args.dtype]
    start = time.monotonic()
    with h5py.File(tmp, "w") as out:
        out.attrs["schema_version"] = 1
        out.attrs["latent_layout"] = "CFHW"
        out.attrs["latent_shape"] = np.array(shape, dtype=np.int64)
        ctx = out.create_dataset("context", (n, L, enc.text_dim), store, chunks=(1, L, enc.text_dim))
        lens = out.create_dataset("context_lens", (n,), np.int32)
        out.create_dataset("prompts", data=prompts, dtype=h5py.string_dtype())
        for i, prompt in enumerate(prompts):
            hidden, length = enc.context(prompt)
            ctx[i] = hidden.numpy().astype(store)
            lens[i] = max(1, length)
            if (i + 1) % 100 == 0 or i + 1 == n:
                rate = (i + 1) / max(1e-9, time.monotonic() - start)
                print(f"captions: {i + 1}/{n} prompts, {rate:.1f}/s, ETA {(n - i - 1) / rate:.0f} s", flush=True)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, output)
    print(f"captions: {output}: {n} prompts, context [{L}, {enc.text_dim}] {args.dtype}, declared latents "
          f"{list(shape)} (no /latents: train.objective trajectory)", flush=True)
    return 0


# --- running the shards ----------------------------------------------------------------------------


def launch(args):
    """Runs --procs shards as child processes (devices from --device in turn), then merges them."""
    devices = args.device.split(",")
    children = []
    for i in range(args.procs):
        command = [sys.executable, __file__, "encode", "--shard", f"{i}/{args.procs}", "--device", devices[i % len(devices)]]
        command += forwarded(args)
        children.append(subprocess.Popen(command))
    try:
        codes = [child.wait() for child in children]
    except KeyboardInterrupt:
        for child in children:  # each closes its shard file at the sample it was on
            child.send_signal(signal.SIGINT)
        for child in children:
            child.wait()
        raise
    failed = [f"shard {i}/{args.procs} (exit {c})" for i, c in enumerate(codes) if c]
    if failed:
        print(f"prepare_data: not merged: {', '.join(failed)} did not finish; rerun to carry on", file=sys.stderr)
        return max(codes)
    merge(args.output, args.procs)
    return 0


def forwarded(args):
    """The encode options of `args` as a child's command line."""
    out = []
    for key in ("list", "vae", "text_encoder", "tokenizer", "output", "frames", "height", "width", "frame_stride",
                "text_len", "dtype", "vae_dtype", "text_dtype", "limit", "image_condition"):
        value = getattr(args, key)
        if value is not None:
            out += [f"--{key.replace('_', '-')}", str(value)]
    flags = ("skip_bad", "vae_tiling", "no_latents")
    return out + [f"--{key.replace('_', '-')}" for key in flags if getattr(args, key)]


def parse_shard(text):
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or int(m[1]) >= int(m[2]):
        raise Failure(f"--shard {text}: expected I/N with 0 <= I < N")
    return int(m[1]), int(m[2])


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("encode", help="encode the list's samples into shard files (and merge them)")
    e.add_argument("--list", required=True, help="caption list: PATH<TAB>caption per line")
    e.add_argument("--vae", required=True, help="AutoencoderKLWan folder (or a pipeline folder with vae/)")
    e.add_argument("--text-encoder", required=True, help="UMT5EncoderModel folder (or a pipeline folder with text_encoder/)")
    e.add_argument("--tokenizer", help="tokenizer folder (default: the text encoder's pipeline tokenizer/, else the same folder)")
    e.add_argument("--output", required=True, help="the merged HDF5 file; shards are OUTPUT.shard-I-of-N.h5")
    e.add_argument("--frames", type=int, default=81, help="frames per clip, 4n+1 (default 81)")
    e.add_argument("--height", type=int, default=480, help="pixel height (default 480)")
    e.add_argument("--width", type=int, default=832, help="pixel width (default 832)")
    e.add_argument("--frame-stride", type=int, default=1, help="take every S-th frame (default 1)")
    e.add_argument("--text-len", type=int, default=512, help="text tokens, padded with zeros (default 512, Wan's)")
    e.add_argument("--dtype", choices=STORE_DTYPES, default="fp16", help="stored dtype (default fp16)")
    e.add_argument("--vae-dtype", choices=DTYPES, default="fp32", help="VAE compute dtype (default fp32)")
    e.add_argument("--text-dtype", choices=DTYPES, default="fp32", help="text encoder compute dtype (default fp32)")
    e.add_argument("--vae-tiling", action="store_true", help="encode in spatial tiles (large frames, less memory)")
    e.add_argument("--device", default="cpu", help="torch device; with --procs a comma list used in turn (cuda:0,cuda:1)")
    e.add_argument("--procs", type=int, default=1, help="shards to run as child processes, then merge (default 1)")
    e.add_argument("--shard", help="I/N: run only shard I of N, no merge")
    e.add_argument("--limit", type=int, help="encode at most K more samples per shard, then stop (resumable)")
    e.add_argument("--skip-bad", action="store_true", help="leave out unreadable videos and empty captions")
    e.add_argument("--image-condition", choices=IMAGE_CONDITIONS, default="none",
                   help="also write /condition from each clip's first frame: i2v (I2V-A14B: the frame, then zero "
                        "frames, encoded) or ti2v (TI2V-5B: the frame alone) (default none)")
    e.add_argument("--no-latents", action="store_true",
                   help="with --image-condition: images and prompts, no /latents; the root attribute latent_shape "
                        "declares the latents of a --frames clip (the teacher samples them)")
    c = sub.add_parser("captions", help="encode prompts alone into a contexts-only data set (train.objective trajectory)")
    c.add_argument("--list", required=True, help="prompt list: one prompt per line")
    c.add_argument("--text-encoder", required=True, help="UMT5EncoderModel folder (or a pipeline folder with text_encoder/)")
    c.add_argument("--tokenizer", help="tokenizer folder (default: the text encoder's pipeline tokenizer/, else the same folder)")
    c.add_argument("--output", required=True, help="the HDF5 file to write")
    c.add_argument("--latent", help="C,F,H,W of the latents the teacher samples (or --vae and the video size)")
    c.add_argument("--vae", help="AutoencoderKLWan folder: its config gives C and the scale factors (weights not loaded)")
    c.add_argument("--frames", type=int, default=81, help="with --vae: frames per clip, 4n+1 (default 81)")
    c.add_argument("--height", type=int, default=480, help="with --vae: pixel height (default 480)")
    c.add_argument("--width", type=int, default=832, help="with --vae: pixel width (default 832)")
    c.add_argument("--text-len", type=int, default=512, help="text tokens, padded with zeros (default 512, Wan's)")
    c.add_argument("--dtype", choices=STORE_DTYPES, default="fp16", help="stored dtype (default fp16)")
    c.add_argument("--text-dtype", choices=DTYPES, default="fp32", help="text encoder compute dtype (default fp32)")
    c.add_argument("--device", default="cpu", help="torch device")
    m = sub.add_parser("merge", help="join finished shards into the file train reads")
    m.add_argument("--output", required=True, help="the merged HDF5 file")
    m.add_argument("--shards", type=int, required=True, help="N of the shards' -of-N")
    return p


def stop(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (a scheduler's preemption) stops like Ctrl-C: the shard is closed


def main():
    signal.signal(signal.SIGTERM, stop)
    args = parser().parse_args()
    try:
        if args.command == "merge":
            merge(args.output, args.shards)
            return 0
        if args.command == "captions":
            return captions(args)
        if args.no_latents and args.image_condition == "none":
            raise Failure("--no-latents: give --image-condition i2v|ti2v (prompts alone: the captions command)")
        if args.shard:
            return encode_shard(args, *parse_shard(args.shard))
        if args.procs < 1:
            raise Failure(f"--procs {args.procs}: expected >= 1")
        if args.procs == 1 and "," not in args.device:
            code = encode_shard(args, 0, 1)
            if code == 0:
                merge(args.output, 1)
            return code
        return launch(args)
    except Failure as e:
        print(f"prepare_data: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prepare_data: interrupted; rerun the same command to carry on", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
