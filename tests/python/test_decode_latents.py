#!/usr/bin/env python3
"""tools/decode_latents.py on a tiny random AutoencoderKLWan built here (nothing is downloaded).

  1. a latents.safetensors in `wan-distill sample`'s format (noise, teacher, student, each
     [2, 16, 3, 4, 4]) decodes to teacher_0..1 and student_0..1 (not noise): 4(3-1)+1 = 9 PNG
     frames of 32x32 each, and MP4s that PyAV opens with 9 frames of that size;
  2. a smooth clip encoded and normalised as tools/prepare_data.py does it, stored as one
     [C, F, H, W] tensor, decodes to exactly the pixels of WanPipeline's own decode lines
     (z / (1/std) + mean, vae.decode, VideoProcessor.postprocess_video);
  3. a tensor with 8 channels is refused, the message naming the file, the tensor and z_dim.

Usage: .venv/bin/python tests/python/test_decode_latents.py
Exit status 0 when everything holds, 1 otherwise (also when a package is missing).
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "decode_latents.py"

try:
    import av
    import numpy as np
    import torch
    from PIL import Image
    from diffusers import AutoencoderKLWan
    from diffusers.video_processor import VideoProcessor
    from safetensors.torch import save_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

from wd_test_support import check, failures  # noqa: E402  (shared with the other Python tests)

LATENT = (16, 3, 4, 4)  # C, F, H, W
FRAMES, SIZE = 4 * (LATENT[1] - 1) + 1, 8 * LATENT[2]


def run(label, args, code=0):
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(TOOL), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    print(f"  {label}: exit {result.returncode} in {time.monotonic() - started:.1f} s")
    if not check(result.returncode == code, f"{label}: exit {result.returncode}, expected {code}"):
        print(result.stdout[-4000:])
    return result.stdout


def png_frames(folder):
    return [np.asarray(Image.open(p).convert("RGB")) for p in sorted(folder.glob("*.png"))]


def mp4_frames(path):
    with av.open(str(path)) as f:
        return [frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)]


def smooth_clip():
    """[1, 3, FRAMES, SIZE, SIZE] in [-1, 1]: sine waves drifting from frame to frame."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    frames = [np.stack([np.sin(6 * xx + 4 * yy + p + 0.4 * t) for p in (0.0, 2.0, 4.0)]) for t in range(FRAMES)]
    return torch.from_numpy(0.9 * np.stack(frames, 1)).float().unsqueeze(0)


def pipeline_decode(vae, z):
    """pipelines/wan/pipeline_wan.py's decode lines (diffusers 0.42.1), as uint8 [F, H, W, 3]."""
    cfg = vae.config
    latents_mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(z.device, z.dtype)
    latents_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(z.device, z.dtype)
    with torch.no_grad():
        video = vae.decode(z / latents_std + latents_mean, return_dict=False)[0]
    frames = VideoProcessor(vae_scale_factor=cfg.scale_factor_spatial).postprocess_video(video, output_type="np")[0]
    return (frames * 255).round().astype(np.uint8)  # as VaeImageProcessor.numpy_to_pil


def main():
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wd-decode-") as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
        vae.save_pretrained(root / "vae")
        vae.eval()

        print("1. sample output, PNG and MP4")
        sample = root / "sample"
        sample.mkdir()
        save_file({name: torch.randn(2, *LATENT) for name in ("noise", "teacher", "student")},
                  str(sample / "latents.safetensors"), metadata={"producer": "wan-distill sample"})
        run("decode", [sample, "--vae", root / "vae", "--out", root / "out", "--format", "both"])
        written = sorted(p.name for p in (root / "out").iterdir())
        expected = sorted(f"{m}_{i}{ext}" for m in ("teacher", "student") for i in (0, 1) for ext in ("", ".mp4"))
        check(written == expected, f"written {written}, expected {expected}")
        for stem in ("teacher_0", "student_1"):
            pngs = png_frames(root / "out" / stem)
            check(len(pngs) == FRAMES, f"{stem}: {len(pngs)} PNG frames, expected {FRAMES}")
            check(all(p.shape == (SIZE, SIZE, 3) for p in pngs), f"{stem}: PNG shapes {[p.shape for p in pngs]}")
            video = mp4_frames(root / "out" / f"{stem}.mp4")
            check(len(video) == FRAMES, f"{stem}.mp4: {len(video)} frames, expected {FRAMES}")
            check(all(v.shape == (SIZE, SIZE, 3) for v in video), f"{stem}.mp4: shapes {[v.shape for v in video]}")

        print("2. encode -> normalise -> decode against the pipeline's decode")
        with torch.no_grad():
            mode = vae.encode(smooth_clip()).latent_dist.mode()
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(shape)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32).view(shape)
        z = (mode - mean) * inv_std  # tools/prepare_data.py Encoders.latents
        check(tuple(z.shape[1:]) == LATENT, f"encoded latent {list(z.shape)}, expected [1, {LATENT}]")
        save_file({"teacher": z[0].contiguous()}, str(root / "clip.safetensors"))
        run("decode clip", [root / "clip.safetensors", "--vae", root / "vae", "--out", root / "clip", "--format", "png"])
        ours = np.stack(png_frames(root / "clip" / "teacher_0"))
        reference = pipeline_decode(vae, z)
        check(ours.shape == reference.shape, f"clip: shape {ours.shape}, pipeline {reference.shape}")
        if ours.shape == reference.shape:
            diff = int(np.abs(ours.astype(int) - reference.astype(int)).max())
            check(diff == 0, f"clip: pixels differ from the pipeline's decode by up to {diff}")

        print("3. wrong channel count")
        bad = root / "bad.safetensors"
        save_file({"teacher": torch.randn(1, *LATENT), "student": torch.randn(1, 8, *LATENT[1:])}, str(bad))
        text = run("8 channels", [bad, "--vae", root / "vae", "--out", root / "bad"], code=1)
        for part in (str(bad), "'student'", "8 channels", "z_dim is 16"):
            check(part in text, f"wrong channels: '{part}' not in the message: {text.strip()[-400:]}")

    print(f"{len(failures)} failure(s) in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
