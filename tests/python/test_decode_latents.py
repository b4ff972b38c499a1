#!/usr/bin/env python3
"""tools/decode_latents.py on a tiny random AutoencoderKLWan built here (nothing is downloaded).

  1. a latents.safetensors in `wan-distill sample`'s format (noise, teacher, student, each
     [2, 16, 3, 4, 4]) decodes to teacher_0..1 and student_0..1 (not noise): 4(3-1)+1 = 9 PNG
     frames of 32x32 each, and MP4s that PyAV opens with 9 frames of that size;
  2. a smooth clip encoded and normalised as tools/prepare_data.py does it, stored as one
     [C, F, H, W] tensor, decodes to exactly the pixels of WanPipeline's own decode lines
     (z / (1/std) + mean, vae.decode, VideoProcessor.postprocess_video);
  3. a tensor with 8 channels is refused, the message naming the file, the tensor and z_dim;
  4. i2v with --condition (a data set's /condition, the rows from report.json): frame 0 of each
     video is the pipeline's decode of its condition's first latent frame, frames 1.. the
     pipeline's decode of the sample, exactly (PNG frames, before the codec); the MP4's first
     frame is the image within the codec's error;
  5. --image (one at the video's size, one resized and cropped as tools/prepare_data.py does):
     frame 0 is exactly the image's pixels, the other frames untouched;
  6. ti2v with --condition --rows: latent frame 0 is the condition already, so the video is the
     pipeline's decode as it is (its frame 0 the decode of the condition alone: the decoder is
     causal), a frame 0 off by bf16-sized rounding is put back, the wrong rows are refused by name;
  7. bad input named, nothing written: no /condition, a /condition of another H, no rows to take,
     more images than rows.

Usage: .venv/bin/python tests/python/test_decode_latents.py
Exit status 0 when everything holds, 1 otherwise (also when a package is missing).
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "decode_latents.py"
sys.path.insert(0, str(ROOT / "tools"))

try:
    import av
    import h5py
    import numpy as np
    import torch
    from PIL import Image
    from diffusers import AutoencoderKLWan
    from diffusers.video_processor import VideoProcessor
    from safetensors.torch import save_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

from prepare_data import to_pixels  # noqa: E402  (the pixels tools/prepare_data.py encodes)
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


def smooth_clip(phase=0.0):
    """[1, 3, FRAMES, SIZE, SIZE] in [-1, 1]: sine waves drifting from frame to frame."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    frames = [np.stack([np.sin(6 * xx + 4 * yy + p + 0.4 * t + phase) for p in (0.0, 2.0, 4.0)]) for t in range(FRAMES)]
    return torch.from_numpy(0.9 * np.stack(frames, 1)).float().unsqueeze(0)


def normalised_mode(vae, pixels):
    """tools/prepare_data.py Encoders.latents: the posterior's mode, normalised, [1, C, F', H', W']."""
    with torch.no_grad():
        mode = vae.encode(pixels).latent_dist.mode()
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(shape)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32).view(shape)
    return (mode - mean) * inv_std


def conditions(vae, kind, count):
    """`count` rows of /condition as prepare_data.py encode --image-condition `kind` writes them,
    each from the first frame of a clip of its own phase."""
    rows = []
    for r in range(count):
        first = smooth_clip(1.3 * r)[:, :, :1]
        if kind == "i2v":  # the frame, then zero frames, encoded together
            first = torch.cat([first, first.new_zeros(1, 3, FRAMES - 1, SIZE, SIZE)], dim=2)
        rows.append(normalised_mode(vae, first)[0])
    return torch.stack(rows)


def write_conditioned_sample(folder, tensors, rows):
    """A `wan-distill sample --output` folder: latents.safetensors and report.json's `samples`."""
    folder.mkdir()
    save_file(tensors, str(folder / "latents.safetensors"), metadata={"producer": "wan-distill sample"})
    (folder / "report.json").write_text(json.dumps({"samples": rows}))


def write_dataset(path, **fields):
    with h5py.File(path, "w") as f:
        for name, value in fields.items():
            f[name] = value.numpy()


def differs(a, b):
    """The largest difference of two uint8 frame stacks (a large number when their shapes differ)."""
    return int(np.abs(a.astype(int) - b.astype(int)).max()) if a.shape == b.shape else 1 << 30


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
        z = normalised_mode(vae, smooth_clip())
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

        image_conditioned(vae, root)
        bad_conditions(vae, root)

    print(f"{len(failures)} failure(s) in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


def image_conditioned(vae, root):
    torch.manual_seed(1)
    print("4. i2v: the first frame is the image of the data set's /condition row")
    cond = conditions(vae, "i2v", 3)
    write_dataset(root / "i2v.h5", condition=cond)
    z = torch.randn(2, *LATENT)
    write_conditioned_sample(root / "i2v", {"noise": torch.randn(2, *LATENT), "teacher": z}, [2, 0])
    text = run("i2v --condition", [root / "i2v", "--vae", root / "vae", "--condition", root / "i2v.h5",
                                   "--format", "both"])
    check("frame 0: the image of /condition row 2" in text, f"i2v: the log names the image's row: {text[-600:]}")
    for i, row in enumerate((2, 0)):
        ours = np.stack(png_frames(root / "i2v" / f"teacher_{i}"))
        image = pipeline_decode(vae, cond[row:row + 1, :, :1])[0]
        decoded = pipeline_decode(vae, z[i:i + 1])
        check(differs(ours[0], image) == 0, f"i2v row {i}: frame 0 is not the decode of /condition row {row}")
        check(differs(ours[1:], decoded[1:]) == 0, f"i2v row {i}: frames 1.. differ from the pipeline's decode")
        video = np.stack(mp4_frames(root / "i2v" / f"teacher_{i}.mp4"))
        # A 32x32 frame through yuv420p and the codec: within a few levels on average.
        error = float(np.abs(video[0].astype(float) - image.astype(float)).mean()) if len(video) == FRAMES else 1e9
        print(f"    teacher_{i}.mp4: frame 0 {error:.2f} levels from the image on average")
        check(error < 8, f"i2v row {i}: the MP4's first frame is {error:.2f} levels from the image on average")
    check(not (root / "i2v" / "noise_0.mp4").exists(), "i2v: noise decoded without --noise")

    print("5. --image: the first frame is the image file")
    exact = ((smooth_clip(0.5)[0, :, 0].permute(1, 2, 0).numpy() + 1) * 127.5).round().astype(np.uint8)
    Image.fromarray(exact).save(root / "exact.png")
    wide = np.random.default_rng(5).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    Image.fromarray(wide).save(root / "wide.png")
    run("--image", [root / "i2v" / "latents.safetensors", "--vae", root / "vae", "--image",
                    f"{root / 'exact.png'},{root / 'wide.png'}", "--out", root / "images", "--format", "png"])
    resized = to_pixels([Image.fromarray(wide)], SIZE, SIZE)[:, 0].permute(1, 2, 0).numpy()
    expected = [exact, ((resized + 1) * 127.5).round().astype(np.uint8)]
    for i in range(2):
        ours = np.stack(png_frames(root / "images" / f"teacher_{i}"))
        check(differs(ours[0], expected[i]) <= (0 if i == 0 else 1), f"--image row {i}: frame 0 is not the image")
        check(differs(ours[1:], pipeline_decode(vae, z[i:i + 1])[1:]) == 0, f"--image row {i}: frames 1.. changed")

    print("6. ti2v: latent frame 0 is the condition; decoded as it is")
    cond = conditions(vae, "ti2v", 3)
    write_dataset(root / "ti2v.h5", condition=cond)
    teacher, student = torch.randn(2, *LATENT), torch.randn(2, *LATENT)
    teacher[:, :, :1] = cond[1:3]
    student[:, :, :1] = cond[1:3] + 1e-3 * cond[1:3].abs().max() * torch.randn_like(cond[1:3])  # bf16-sized rounding
    save_file({"teacher": teacher, "student": student}, str(root / "ti2v.safetensors"))
    run("ti2v --condition", [root / "ti2v.safetensors", "--vae", root / "vae", "--condition", root / "ti2v.h5",
                             "--rows", "1,2", "--out", root / "ti2v", "--format", "png"])
    put_back = student.clone()
    put_back[:, :, :1] = cond[1:3]
    for i in range(2):
        ours = np.stack(png_frames(root / "ti2v" / f"teacher_{i}"))
        check(differs(ours, pipeline_decode(vae, teacher[i:i + 1])) == 0, f"ti2v row {i}: not the pipeline's decode")
        image = pipeline_decode(vae, cond[i + 1:i + 2])[0]
        check(differs(ours[0], image) == 0, f"ti2v row {i}: frame 0 is not the decode of the condition alone")
        ours = np.stack(png_frames(root / "ti2v" / f"student_{i}"))
        check(differs(ours, pipeline_decode(vae, put_back[i:i + 1])) == 0,
              f"ti2v row {i}: the student's first latent frame was not put back to the condition")
    text = run("ti2v, rows swapped", [root / "ti2v.safetensors", "--vae", root / "vae", "--condition",
                                      root / "ti2v.h5", "--rows", "2,1", "--out", root / "swapped"], code=1)
    for part in (str(root / "ti2v.safetensors"), "row 0: its first latent frame differs",
                 f"/condition row 2 of {root / 'ti2v.h5'}", "--rows"):
        check(part in text, f"ti2v rows swapped: '{part}' not in the message: {text.strip()[-500:]}")
    check(not (root / "swapped").exists(), "ti2v rows swapped: an output folder was written")


def bad_conditions(vae, root):
    print("7. bad input: named, nothing written")
    z = torch.randn(2, *LATENT)
    write_conditioned_sample(root / "bad-sample", {"teacher": z}, [0, 1])
    write_dataset(root / "plain.h5", latents=torch.randn(2, *LATENT))
    write_dataset(root / "taller.h5", condition=torch.randn(2, LATENT[0], LATENT[1], LATENT[2] + 1, LATENT[3]))
    save_file({"teacher": z}, str(root / "alone.safetensors"))
    cases = [
        ("no /condition", [root / "bad-sample", "--condition", root / "plain.h5"],
         [str(root / "plain.h5"), "/condition: missing", "--image-condition"]),
        ("another H", [root / "bad-sample", "--condition", root / "taller.h5"],
         [str(root / "taller.h5"), "/condition has shape [16, 3, 5, 4]", "expected [16, 3 (i2v) or 1 (ti2v), 4, 4]",
          "'teacher'"]),
        ("no rows", [root / "alone.safetensors", "--condition", root / "taller.h5"], ["give --rows", "report.json"]),
        ("three images", [root / "bad-sample", "--image", ",".join([str(root / "exact.png")] * 3)],
         ["--image: 3 files for the 2 rows of tensor 'teacher'"]),
    ]
    for label, args, parts in cases:
        out = root / f"bad-{label.replace(' ', '-')}"
        text = run(label, [*args, "--vae", root / "vae", "--out", out], code=1)
        for part in parts:
            check(part in text, f"{label}: '{part}' not in the message: {text.strip()[-500:]}")
        check(not out.exists(), f"{label}: {out} was written")


if __name__ == "__main__":
    sys.exit(main())
