#!/usr/bin/env python3
"""Decodes the latents that `wan-distill sample --output DIR` writes into PNG frames and MP4 videos.

DIR/latents.safetensors holds `noise`, `teacher` and (with a student) `student`, each
[B, C, F, H, W] in the normalised latent space of tools/prepare_data.py; DIR/trajectory.safetensors
(`--trajectory true`) holds `teacher.K` and `student.K` for every step K. Every tensor but `noise`
(add --noise to keep it) is decoded as diffusers' WanPipeline does it (pipelines/wan/pipeline_wan.py
of diffusers 0.42.1): z / (1 / latents_std) + latents_mean, AutoencoderKLWan.decode, then
VideoProcessor.postprocess_video to 8-bit RGB. A latent with F frames gives 4(F-1)+1 frames (the
Wan 2.1 VAE's temporal factor 4), each 8x its height and width.

Usage:
  decode_latents.py DIR_or_FILE --vae PATH [--out DIR] [--format png|mp4|both] [--fps 16]
                    [--tensors teacher,student] [--noise] [--device cpu] [--vae-dtype fp32]
                    [--condition DATA.h5 [--rows 0,1] | --image FILE[,FILE...]]

Writes OUT/NAME_I.mp4 and/or OUT/NAME_I/000.png ... per tensor NAME and batch row I (teacher_0.mp4,
student_0.mp4, teacher.40_0.mp4 from a trajectory). OUT defaults to DIR (or the file's folder).
Nothing is downloaded: --vae is a local AutoencoderKLWan folder or a pipeline folder with vae/.

Image-to-video samples (an i2v or ti2v teacher's, `sample` with a data set's /condition): the first
frame is the image. Both official samplers (Wan2.2's image2video.py and textimage2video.py, diffusers'
WanImageToVideoPipeline) decode the whole final latent, with no frame replaced in pixels:
  ti2v (TI2V-5B's image mode): latent frame 0 already is the image's clean latent (the sampler puts it
    back after every step), and the Wan VAE's decoder is causal in time, so frame 0 of the video is
    the image as the VAE decodes it; nothing is replaced. With --condition each tensor's latent frame
    0 is checked against its /condition row (a mismatch names both: wrong --rows?) and set to it.
  i2v (I2V-A14B): latent frame 0 is the model's own reproduction of the image; decoded as is it is
    the official output. Given the condition, frame 0 of the video is replaced by the image and the
    other frames are left as the pipeline decodes them (replacing the latent instead would change
    them too, through the decoder's causal cache).
The condition is --condition FILE (a data set's /condition, rows from --rows or from the `samples`
of report.json beside the input: the image as the VAE decodes the condition's first latent frame)
or --image FILE[,FILE...] (the image itself, resized and centre-cropped to the video's size as
tools/prepare_data.py does before encoding; one file for all batch rows, or one per row). `noise` is
never conditioned.
"""

import argparse
import json
import sys
from pathlib import Path

DTYPES = ("fp32", "bf16", "fp16")
# ti2v: how far (relative to the condition's largest value) a tensor's first latent frame may be
# from its /condition row and still be that image: a sampler run in bf16 rounds it by 2^-8.
FIRST_FRAME_TOLERANCE = 1e-2


class Failure(Exception):
    """A problem that stops the run; its message names the file (and the tensor) at fault."""


def input_file(path):
    """PATH itself, or PATH/latents.safetensors for a sample output folder."""
    path = Path(path)
    if path.is_dir():
        path = path / "latents.safetensors"
    if not path.is_file():
        raise Failure(f"{path}: no such file (expected the latents.safetensors of `wan-distill sample --output`)")
    return path


def load_vae(path, dtype, device):
    from diffusers import AutoencoderKLWan

    path = Path(path)
    if not path.is_dir():
        raise Failure(f"--vae {path}: not a folder; expected one that from_pretrained loads (no download here)")
    folder = path / "vae" if (path / "vae").is_dir() else path
    try:
        vae = AutoencoderKLWan.from_pretrained(folder, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as e:
        raise Failure(f"--vae {folder}: cannot load AutoencoderKLWan: {e}") from e
    return vae.to(device).eval()


def selected(names, wanted, keep_noise):
    """The tensor names to decode, in file order; `wanted` (comma list) must all be present."""
    if wanted:
        chosen = [n for n in wanted.split(",") if n]
        missing = [n for n in chosen if n not in names]
        if missing:
            raise Failure(f"--tensors: {', '.join(missing)} not in the file (it holds {', '.join(names)})")
        return chosen
    return [n for n in names if keep_noise or n != "noise"]


def batched(path, name, z, channels):
    """[B, C, F, H, W] from a [C, F, H, W] or [B, C, F, H, W] tensor, its channels checked against the VAE."""
    if z.dim() == 4:
        z = z.unsqueeze(0)
    if z.dim() != 5:
        raise Failure(f"{path}: tensor '{name}' has shape {list(z.shape)}; expected [C,F,H,W] or [B,C,F,H,W]")
    if z.shape[1] != channels:
        raise Failure(f"{path}: tensor '{name}' has {z.shape[1]} channels (shape {list(z.shape)}); "
                      f"the VAE's z_dim is {channels}")
    return z


def parse_rows(text):
    """Row indices from "0,3,7" or "100-103,7", in the given order."""
    rows = []
    for part in (p.strip() for p in text.split(",")):
        lo, dash, hi = part.partition("-")
        try:
            rows.extend(range(int(lo), int(hi) + 1) if dash else [int(part)])
        except ValueError:
            raise Failure(f"--rows {text}: expected data set row indices, e.g. 0,3 or 100-103") from None
    return rows


def sampled_rows(path, text):
    """The data set rows of the batch: --rows, else the `samples` that `wan-distill sample` and
    `evaluate` record in report.json beside their latents."""
    if text:
        return parse_rows(text)
    report = path.parent / "report.json"
    if not report.is_file():
        raise Failure(f"--condition: give --rows (there is no {report} to read the sampled rows from)")
    try:
        return [int(r) for r in json.loads(report.read_text())["samples"]]
    except (ValueError, KeyError, TypeError) as e:
        raise Failure(f"{report}: no list `samples` to take the data set rows from ({e!r}); give --rows") from e


def read_conditions(data, rows):
    """Rows `rows` of the data set's /condition, float32 [B, C, F, H, W]."""
    import h5py
    import numpy as np
    import torch

    data = Path(data)
    if not data.is_file():
        raise Failure(f"--condition {data}: no such file (expected the HDF5 data set the samples were drawn from)")
    with h5py.File(data, "r") as f:
        if "condition" not in f:
            raise Failure(f"{data}: /condition: missing; the data set holds no image conditions (tools/prepare_data.py "
                          "encode --image-condition i2v|ti2v writes them)")
        field = f["condition"]
        if field.ndim != 5:
            raise Failure(f"{data}: /condition has shape {list(field.shape)}; expected [N, C, F, H, W]")
        outside = [r for r in rows if not 0 <= r < field.shape[0]]
        if outside:
            raise Failure(f"{data}: /condition has {field.shape[0]} rows; rows {outside} are not among them")
        return torch.stack([torch.from_numpy(field[r].astype(np.float32)) for r in rows])


def condition_kind(data, cond, path, name, z):
    """How the sample of `z` [B, C, F, H, W] took `cond`: 'i2v' (F frames: the image and zero frames)
    or 'ti2v' (one frame, of several); any other shape is refused naming both."""
    b, c, f, h, w = z.shape
    if cond.shape[0] != b:
        raise Failure(f"{data}: {cond.shape[0]} rows of /condition (--rows) for the {b} rows of tensor '{name}' in {path}")
    if cond.shape[1] != c or tuple(cond.shape[3:]) != (h, w) or cond.shape[2] not in (f, 1):
        raise Failure(f"{data}: /condition has shape {list(cond.shape[1:])} a row; expected [{c}, {f} (i2v) or 1 (ti2v), "
                      f"{h}, {w}]: the C, F, H and W of tensor '{name}' in {path}")
    return "ti2v" if cond.shape[2] == 1 and f > 1 else "i2v"


def with_image_latent(data, rows, cond, path, name, z):
    """ti2v: `z` with latent frame 0 set to the condition, once checked that it already is it (within
    FIRST_FRAME_TOLERANCE): the official samplers' last step, which wan-distill's samplers also take."""
    diff = (z[:, :, :1] - cond).abs().amax(dim=(1, 2, 3, 4))
    scale = cond.abs().amax(dim=(1, 2, 3, 4)).clamp_min(1e-12)
    for i in range(z.shape[0]):
        if diff[i] > FIRST_FRAME_TOLERANCE * scale[i]:
            raise Failure(f"{path}: tensor '{name}' row {i}: its first latent frame differs from /condition row {rows[i]} "
                          f"of {data} by up to {float(diff[i]):.3g} (the condition's values reach {float(scale[i]):.3g}); "
                          "a ti2v sample keeps its image there: are --rows the rows it was sampled from?")
    z = z.clone()
    z[:, :, :1] = cond
    return z


def image_files(files, count, height, width, processor):
    """The first frame of each of `count` videos from --image (one file for all, or one each): each
    image resized and centre-cropped to height x width as tools/prepare_data.py makes the pixels it
    encodes, as 8-bit PIL images."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import prepare_data

    out = []
    for file in files:
        try:
            image = prepare_data.open_image(Path(file))
        except prepare_data.BadSample as e:
            raise Failure(f"--image {file}: {e}") from e
        pixels = prepare_data.to_pixels([image], height, width)  # [3, 1, H, W] in [-1, 1]
        out.append(processor.postprocess_video(pixels.unsqueeze(0), output_type="pil")[0][0])
    return out * count if len(out) == 1 else out


class FirstFrames:
    """The image each video starts with, from --condition (a data set's /condition rows) or --image."""

    def __init__(self, args, path):
        self.files = [x for x in (args.image or "").split(",") if x]
        self.data = Path(args.condition) if args.condition else None
        if self.data and self.files:
            raise Failure("--condition and --image: give one of them")
        missing = [f for f in self.files if not Path(f).is_file()]
        if missing:
            raise Failure(f"--image: no such file: {', '.join(missing)}")
        if args.rows and not self.data:
            raise Failure("--rows: the rows of --condition's /condition; give --condition")
        self.rows = sampled_rows(path, args.rows) if self.data else []
        self.latents = read_conditions(self.data, self.rows) if self.data else None
        self.images = {}  # (count, height, width) -> the --image frames at that size

    def prepare(self, path, name, z):
        """(z as it is decoded, how its first frame is made: None (as decoded), "i2v", "ti2v" or "image")."""
        if name == "noise" or (self.latents is None and not self.files):
            return z, None
        if self.latents is None:
            if len(self.files) not in (1, z.shape[0]):
                raise Failure(f"--image: {len(self.files)} files for the {z.shape[0]} rows of tensor '{name}' in {path}; "
                              "give one file for all rows, or one per row")
            return z, "image"
        kind = condition_kind(self.data, self.latents, path, name, z)
        if kind == "ti2v":
            z = with_image_latent(self.data, self.rows, self.latents, path, name, z)
        return z, kind

    def first(self, vae, processor, how, i, count, frames):
        """Row i's first frame (None: the decoded one stays) and what it is, for the log."""
        if how == "i2v":
            image = decode(vae, processor, self.latents[i:i + 1, :, :1])[0]
            return image, f"the image of /condition row {self.rows[i]} of {self.data} (i2v)"
        if how == "ti2v":
            return None, f"as decoded, latent frame 0 being /condition row {self.rows[i]} of {self.data} (ti2v)"
        if how == "image":
            size = (count, frames[0].height, frames[0].width)
            if size not in self.images:
                self.images[size] = image_files(self.files, *size, processor)
            return self.images[size][i], f"the image {self.files[i % len(self.files)]}"
        return None, ""


def decode(vae, processor, z):
    """Frames (list of PIL images) of one normalised latent [1, C, F, H, W], as WanPipeline decodes."""
    import torch

    with torch.no_grad():
        latents = z.to(vae.device, vae.dtype)
        cfg = vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(shape).to(latents.device, latents.dtype)
        # The pipeline's own arithmetic (divide by 1/std), so the pixels match it bit for bit.
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        return processor.postprocess_video(video, output_type="pil")[0]


def write_pngs(folder, frames):
    folder.mkdir(parents=True, exist_ok=True)
    for t, image in enumerate(frames):
        image.save(folder / f"{t:03d}.png")


def write_mp4(path, frames, fps):
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def run(args):
    import torch
    from diffusers.video_processor import VideoProcessor
    from safetensors import safe_open

    path = input_file(args.input)
    out = Path(args.out) if args.out else path.parent
    firsts = FirstFrames(args, path)
    vae = load_vae(args.vae, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.vae_dtype],
                   torch.device(args.device))
    processor = VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)
    with safe_open(str(path), framework="pt") as f:
        names = selected(list(f.keys()), args.tensors, args.noise)
        tensors = {name: batched(path, name, f.get_tensor(name), vae.config.z_dim) for name in names}
    prepared = {name: firsts.prepare(path, name, z) for name, z in tensors.items()}  # every check before writing
    out.mkdir(parents=True, exist_ok=True)
    for name, (z, how) in prepared.items():
        for i in range(z.shape[0]):
            frames = decode(vae, processor, z[i:i + 1])
            first, source = firsts.first(vae, processor, how, i, z.shape[0], frames)
            if first is not None:
                frames[0] = first
            stem = f"{name}_{i}"
            if args.format in ("png", "both"):
                write_pngs(out / stem, frames)
            if args.format in ("mp4", "both"):
                write_mp4(out / f"{stem}.mp4", frames, args.fps)
            print(f"{stem}: latent {list(z.shape[1:])} -> {len(frames)} frames of "
                  f"{frames[0].width}x{frames[0].height}" + (f"; frame 0: {source}" if source else ""))
    print(f"wrote {out}")


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input", help="a `wan-distill sample --output` folder, or a latents/trajectory safetensors file")
    p.add_argument("--vae", required=True, help="local AutoencoderKLWan folder (or a pipeline folder with vae/)")
    p.add_argument("--out", help="output folder (default: the input's folder)")
    p.add_argument("--format", choices=("png", "mp4", "both"), default="mp4", help="what to write per sample (default %(default)s)")
    p.add_argument("--fps", type=int, default=16, help="frame rate of the MP4s (default %(default)s, as Wan 2.1/2.2 A14B)")
    p.add_argument("--tensors", default="", help="comma list of tensors to decode (default: all but noise)")
    p.add_argument("--noise", action="store_true", help="also decode `noise` when --tensors is not given")
    p.add_argument("--device", default="cpu", help="torch device of the VAE (default %(default)s)")
    p.add_argument("--vae-dtype", choices=DTYPES, default="fp32", help="dtype of the VAE (default %(default)s)")
    p.add_argument("--condition", help="i2v/ti2v samples: the HDF5 data set whose /condition rows they were sampled "
                                       "with; the videos start with those images")
    p.add_argument("--rows", default="", help="with --condition: the data set rows of the batch, e.g. 6,7 or 100-291 "
                                              "(default: `samples` of report.json beside the input)")
    p.add_argument("--image", help="i2v/ti2v samples: the image file each video starts with (one file for all batch "
                                   "rows, or a comma list, one per row)")
    return p


def main():
    args = parser().parse_args()
    try:
        run(args)
    except Failure as e:
        sys.exit(f"decode_latents.py: error: {e}")


if __name__ == "__main__":
    main()
