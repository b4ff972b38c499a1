"""Replicated-teacher PyTorch distillation baseline for bench/bench_throughput.sh.

This is what wan-distill's users ran before it: a plain PyTorch script in which every rank holds
its own frozen bf16 Wan 2.2 DiT teacher and the fp32 students train data-parallel
(DistributedDataParallel over gloo, CPU). It exists only as the baseline that
`wan-distill train` is compared against; it is not part of the product.

    .venv/bin/torchrun --standalone --nproc_per_node 3 bench/replicated_baseline.py \\
        --config tiny-64|small [--steps 30] [--warmup-steps 3] [--threads 1]
        [--teacher-dtype bf16|fp32] [--out FILE.json]

Shapes, data, noise, loss and optimizer follow bench_throughput.sh and wan-distill's defaults:
- tiny-64: the `tiny` teacher preset (src/model/wan_config.cpp: dim 128, ffn 256, 4 heads,
  4 blocks, freq 64, text 16 x 64), the default student (src/student/student_config.hpp: dim 64,
  ffn 128, 4 heads, 2 blocks), latent 16x1x16x16, batch 4 per rank.
- small: the tiny preset widened to dim 512, ffn 1024, 8 heads, 8 blocks, text 32 x 256; student
  dim 256, ffn 512, 4 heads, 4 blocks; latent 16x2x32x32, batch 2 per rank.
- Noise as src/data/noiser.cpp with the default [noise]: sigma = sigmoid(N(0, 1)), shift 1,
  x_t = (1 - sigma) x0 + sigma eps, t = 1000 sigma. Loss: MSE(student, fp32 teacher output).
- AdamW with [train]'s defaults: lr 2e-3 (constant: no warmup or decay), betas (0.9, 0.99),
  weight decay 0, global grad-norm clip 1.0.

The DiT is written here (diffusers is not among the project's pinned packages) after
/work/shared/spec/wan-dit.md, with diffusers' conventions where they differ from the official
code: one timestep per sample (not per token) and the sinusoid in fp32. Matmuls run in the
weights' dtype; LayerNorms, RMSNorms, RoPE, modulation and the residual stream run in fp32.
"""

import argparse
import gc
import json
import math
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

PRESETS = {
    "tiny-64": {
        "teacher": {"dim": 128, "ffn_dim": 256, "num_heads": 4, "num_layers": 4},
        "student": {"dim": 64, "ffn_dim": 128, "num_heads": 4, "num_layers": 2},
        "freq_dim": 64, "text_len": 16, "text_dim": 64, "latent": (16, 1, 16, 16), "batch": 4,
    },
    "small": {
        "teacher": {"dim": 512, "ffn_dim": 1024, "num_heads": 8, "num_layers": 8},
        "student": {"dim": 256, "ffn_dim": 512, "num_heads": 4, "num_layers": 4},
        "freq_dim": 64, "text_len": 32, "text_dim": 256, "latent": (16, 2, 32, 32), "batch": 2,
    },
}
PATCH = (1, 2, 2)
EPS = 1e-6
POOL_SAMPLES = 16  # random samples per rank, cycled
SHIFT = 1.0  # wan-distill's default noise.shift
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 2e-3, (0.9, 0.99), 0.0, 1.0
TEACHER_SEED, STUDENT_SEED = 0, 1
INT_FIELDS = ("rank", "samples", "peak_rss_bytes", "pss_bytes")
FLOAT_FIELDS = ("wall_s", "cpu_s", "teacher_s_per_step", "student_s_per_step", "first_loss", "last_loss")


class CastLinear(nn.Linear):
    """Linear that casts its input to the weights' dtype (bf16 matmuls in the bf16 teacher)."""

    def forward(self, x):
        return super().forward(x.to(self.weight.dtype))


class RMSNorm(nn.Module):
    """RMSNorm over all heads together (Wan's qk norm): fp32 compute, then times the gain."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * self.weight


class AffineLayerNorm(nn.LayerNorm):
    """LayerNorm with weight and bias (Wan's norm3), computed in fp32 whatever the weights' dtype."""

    def forward(self, x):
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), EPS)


def layer_norm(x):
    """Non-affine fp32 LayerNorm (Wan's norm1, norm2 and head norm)."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=EPS)


def rope_table(head_dim, grid):
    """cos and sin [L, 1, head_dim/2] of Wan's 3D RoPE for a (f, h, w) patch grid (spec section 4)."""
    half = head_dim // 2
    sizes = (half - 2 * (half // 3), half // 3, half // 3)
    angles = []
    for axis, (pairs, n) in enumerate(zip(sizes, grid)):
        theta = 10000.0 ** (-2.0 * torch.arange(pairs, dtype=torch.float64) / (2 * pairs))
        a = torch.outer(torch.arange(n, dtype=torch.float64), theta)
        shape = [1, 1, 1, pairs]
        shape[axis] = n
        angles.append(a.view(shape).expand(*grid, pairs))
    angle = torch.cat(angles, -1).reshape(-1, 1, half)
    return angle.cos().float(), angle.sin().float()


def apply_rope(x, cos, sin):
    """Rotates adjacent channel pairs of x [B, L, heads, head_dim] in fp32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)


class Attention(nn.Module):
    """Wan self- or cross-attention: q/k RMSNorm over the full width, RoPE on self-attention only."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (CastLinear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, context=None, rope=None):
        b, n, d = x.shape
        kv = x if context is None else context
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1)
        k = self.norm_k(self.k(kv)).view(b, kv.shape[1], self.heads, -1)
        v = self.v(kv).view(b, kv.shape[1], self.heads, -1)
        if rope is not None:
            q, k = apply_rope(q, *rope).type_as(v), apply_rope(k, *rope).type_as(v)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """One Wan attention block: modulated self-attention, cross-attention to text, modulated FFN."""

    def __init__(self, dim, ffn_dim, heads):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 6, dim))
        self.self_attn = Attention(dim, heads)
        self.norm3 = AffineLayerNorm(dim, eps=EPS)
        self.cross_attn = Attention(dim, heads)
        self.ffn = nn.Sequential(CastLinear(dim, ffn_dim), nn.GELU("tanh"), CastLinear(ffn_dim, dim))

    def forward(self, x, e0, context, rope):
        mods = (self.modulation.float() + e0).unsqueeze(2).unbind(1)  # six [B, 1, D]
        shift_sa, scale_sa, gate_sa, shift_ffn, scale_ffn, gate_ffn = mods
        x = x + self.self_attn(layer_norm(x) * (1 + scale_sa) + shift_sa, rope=rope) * gate_sa
        x = x + self.cross_attn(self.norm3(x), context=context)
        return x + self.ffn(layer_norm(x) * (1 + scale_ffn) + shift_ffn) * gate_ffn


class WanDiT(nn.Module):
    """Compact Wan 2.2 DiT (t2v): patch/text/time embeddings, blocks, modulated head, unpatchify."""

    def __init__(self, dim, ffn_dim, num_heads, num_layers, freq_dim, text_dim, channels=16):
        super().__init__()
        self.dim, self.freq_dim, self.head_dim = dim, freq_dim, dim // num_heads
        self.patch_embedding = nn.Conv3d(channels, dim, PATCH, stride=PATCH)
        self.text_embedding = nn.Sequential(CastLinear(text_dim, dim), nn.GELU("tanh"), CastLinear(dim, dim))
        self.time_embedding = nn.Sequential(CastLinear(freq_dim, dim), nn.SiLU(), CastLinear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), CastLinear(dim, 6 * dim))
        self.blocks = nn.ModuleList(Block(dim, ffn_dim, num_heads) for _ in range(num_layers))
        self.head_modulation = nn.Parameter(torch.zeros(1, 2, dim))
        self.head = CastLinear(dim, math.prod(PATCH) * channels)
        self.rope = {}  # grid -> (cos, sin); per model, so teacher tables never reach the student

    def forward(self, x, t, context):
        """x [B, C, F, H, W], t [B] on the 0..1000 scale, context [B, text_len, text_dim] -> fp32 like x."""
        b, c = x.shape[:2]
        tokens = self.patch_embedding(x.to(self.patch_embedding.weight.dtype))
        grid = tuple(tokens.shape[2:])
        if grid not in self.rope:
            self.rope[grid] = rope_table(self.head_dim, grid)
        h = tokens.flatten(2).transpose(1, 2).float()

        half = self.freq_dim // 2
        omega = torch.pow(10000.0, -torch.arange(half, dtype=torch.float32) / half)
        angle = torch.outer(t.float(), omega)
        e = self.time_embedding(torch.cat((angle.cos(), angle.sin()), 1)).float()
        e0 = self.time_projection(e).float().view(b, 6, self.dim)
        ctx = self.text_embedding(context)

        for block in self.blocks:
            h = block(h, e0, ctx, self.rope[grid])
        shift, scale = (self.head_modulation.float() + e.unsqueeze(1)).unsqueeze(2).unbind(1)
        out = self.head(layer_norm(h) * (1 + scale) + shift).float()
        f, hh, ww = grid
        out = out.view(b, f, hh, ww, *PATCH, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, -1, f * PATCH[0], hh * PATCH[1], ww * PATCH[2])


def build_model(shape, preset, seed, dtype):
    """A WanDiT of `shape` drawn from `seed` as wan-distill draws random weights, cast to dtype."""
    model = WanDiT(freq_dim=preset["freq_dim"], text_dim=preset["text_dim"], channels=preset["latent"][0], **shape)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = torch.randn(p.shape, generator=gen)
            if name.endswith("modulation"):
                n *= 0.1
            elif name.endswith("bias"):
                n *= 0.05
            elif "norm" in name:
                n = 1 + 0.1 * n
            else:
                n /= math.sqrt(math.prod(p.shape[1:]))
            p.copy_(n)
    return model.to(dtype)


def make_pool(preset, rank):
    """This rank's random samples: latents and zero-padded text contexts of varying length."""
    gen = torch.Generator().manual_seed(1000 + rank)
    latents = torch.randn(POOL_SAMPLES, *preset["latent"], generator=gen)
    length, width = preset["text_len"], preset["text_dim"]
    context = torch.randn(POOL_SAMPLES, length, width, generator=gen)
    lens = torch.randint(1, length + 1, (POOL_SAMPLES,), generator=gen)
    context *= (torch.arange(length).view(1, -1) < lens.view(-1, 1)).unsqueeze(-1)
    return latents, context


def noisy_batch(x0, gen):
    """Flow-matching inputs: logit-normal sigma with shift, x_t = (1-sigma) x0 + sigma eps, t = 1000 sigma."""
    sigma = torch.sigmoid(torch.randn(x0.shape[0], generator=gen))
    sigma = (SHIFT * sigma / (1 + (SHIFT - 1) * sigma)).clamp(0, 1)
    noise = torch.randn(x0.shape, generator=gen)
    s = sigma.view(-1, 1, 1, 1, 1)
    return (1 - s) * x0 + s * noise, sigma * 1000


def pss_bytes():
    """This process's proportional set size from /proc/self/smaps_rollup, in bytes."""
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


def cpu_seconds():
    """User + system CPU seconds of this process (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def train(args, rank):
    """Runs warm-up and timed steps on this rank; returns its measurements."""
    preset = PRESETS[args.config]
    batch = preset["batch"]
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.teacher_dtype]
    teacher = build_model(preset["teacher"], preset, TEACHER_SEED, dtype).eval().requires_grad_(False)
    student = DistributedDataParallel(build_model(preset["student"], preset, STUDENT_SEED, torch.float32))
    opt = torch.optim.AdamW(student.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    latents, context = make_pool(preset, rank)
    noise_gen = torch.Generator().manual_seed(2000 + rank)

    def step(i):
        idx = torch.arange(i * batch, (i + 1) * batch) % POOL_SAMPLES
        x_t, t = noisy_batch(latents[idx], noise_gen)
        start = time.perf_counter()
        with torch.no_grad():  # not inference_mode: the target is saved by the loss's backward
            target = teacher(x_t, t, context[idx]).float()
        mid = time.perf_counter()
        loss = F.mse_loss(student(x_t, t, context[idx]), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), GRAD_CLIP)
        opt.step()
        return mid - start, time.perf_counter() - mid, loss.item()

    for i in range(args.warmup_steps):
        step(i)
    dist.barrier()
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    times = [step(args.warmup_steps + i) for i in range(args.steps)]
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    return {
        "rank": rank,
        "wall_s": wall,
        "samples": batch * args.steps,
        "cpu_s": cpu,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "pss_bytes": pss_bytes(),
        "teacher_s_per_step": sum(t for t, _, _ in times) / args.steps,
        "student_s_per_step": sum(s for _, s, _ in times) / args.steps,
        "first_loss": times[0][2],
        "last_loss": times[-1][2],
    }


def gather(measured):
    """Every rank's measurements, on every rank (as a float64 tensor: all_gather_object needs numpy)."""
    fields = INT_FIELDS + FLOAT_FIELDS
    mine = torch.tensor([float(measured[k]) for k in fields], dtype=torch.float64)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [{k: int(v) if k in INT_FIELDS else v for k, v in zip(fields, row.tolist())} for row in rows]


def summarize(args, ranks):
    """The job's result from every rank's measurements."""
    samples = sum(r["samples"] for r in ranks)
    return {
        "config": args.config,
        "ranks": len(ranks),
        "threads": args.threads,
        "teacher_dtype": args.teacher_dtype,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "batch_per_rank": PRESETS[args.config]["batch"],
        "samples_per_s": samples / max(r["wall_s"] for r in ranks),
        "cpu_s_per_sample": sum(r["cpu_s"] for r in ranks) / samples,
        "peak_rss_bytes_sum": sum(r["peak_rss_bytes"] for r in ranks),
        "pss_bytes_sum": sum(r["pss_bytes"] for r in ranks),
        "teacher_s_per_step": sum(r["teacher_s_per_step"] for r in ranks) / len(ranks),
        "student_s_per_step": sum(r["student_s_per_step"] for r in ranks) / len(ranks),
        "torch_version": torch.__version__,
        "per_rank": ranks,
    }


def main():
    """Parses the options, trains on every rank, and has rank 0 print and write the result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(PRESETS), required=True)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--teacher-dtype", choices=("bf16", "fp32"), default="bf16",
                        help="the teacher's weights and matmuls (bf16: what the users' scripts held)")
    parser.add_argument("--out", help="JSON result file (written by rank 0)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 0 or args.threads < 1:
        parser.error("--steps and --threads must be >= 1, --warmup-steps >= 0")

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ranks = gather(train(args, rank))
    if rank == 0:
        result = summarize(args, ranks)
        mib = 2**20
        print(f"replicated baseline {args.config} ({args.teacher_dtype} teacher): {result['ranks']} ranks x {args.threads} threads, "
              f"{args.steps} steps: {result['samples_per_s']:.3f} samples/s, "
              f"{result['cpu_s_per_sample']:.3f} CPU s/sample, teacher {result['teacher_s_per_step']:.3f} s/step, "
              f"student {result['student_s_per_step']:.3f} s/step, summed peak RSS "
              f"{result['peak_rss_bytes_sum'] / mib:.0f} MiB, PSS {result['pss_bytes_sum'] / mib:.0f} MiB, "
              f"loss {ranks[0]['first_loss']:.4f} -> {ranks[0]['last_loss']:.4f}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
    # Free the DDP student (it sits in reference cycles) while the interpreter is alive: left to
    # the final collection, its gloo work items are released by a worker thread after Python
    # finalization began, and the process aborts ("terminate called without an active exception").
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
