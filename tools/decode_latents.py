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

Writes OUT/NAME_I.mp4 and/or OUT/NAME_I/000.png ... per tensor NAME and batch row I (teacher_0.mp4,
student_0.mp4, teacher.40_0.mp4 from a trajectory). OUT defaults to DIR (or the file's folder).
Nothing is downloaded: --vae is a local AutoencoderKLWan folder or a pipeline folder with vae/.
"""

import argparse
import sys
from pathlib import Path

DTYPES = ("fp32", "bf16", "fp16")


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
    vae = load_vae(args.vae, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.vae_dtype],
                   torch.device(args.device))
    processor = VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)
    with safe_open(str(path), framework="pt") as f:
        names = selected(list(f.keys()), args.tensors, args.noise)
        tensors = {name: batched(path, name, f.get_tensor(name), vae.config.z_dim) for name in names}
    out.mkdir(parents=True, exist_ok=True)
    for name, z in tensors.items():
        for i in range(z.shape[0]):
            frames = decode(vae, processor, z[i:i + 1])
            stem = f"{name}_{i}"
            if args.format in ("png", "both"):
                write_pngs(out / stem, frames)
            if args.format in ("mp4", "both"):
                write_mp4(out / f"{stem}.mp4", frames, args.fps)
            print(f"{stem}: latent {list(z.shape[1:])} -> {len(frames)} frames of "
                  f"{frames[0].width}x{frames[0].height}")
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
    return p


def main():
    args = parser().parse_args()
    try:
        run(args)
    except Failure as e:
        sys.exit(f"decode_latents.py: error: {e}")


if __name__ == "__main__":
    main()
