#!/usr/bin/env python3
"""An independent reference for train.objective dmd's math (src/student/dmd.cpp).

tests/reference/dump_dmd builds two small random students (a generator and a critic: the same
config, different weights, fp32, no projections) and a batch of 2 contexts, and runs dmd's pieces
as DmdTrainer does for one generator update: generate() samples x0 by k = 2 Euler jumps from seeded
noise on the shift-3 schedule, renoise() draws σ and noise and forms x, a seeded random velocity
stands in for the teacher's guided answer, the critic predicts x0 at (x, t), dmd_gradient() and
dmd_loss() give the generator's loss, whose backward reaches the generator's parameters through
the last jump only; the critic's flow-matching step (micro_step) trains on the same x with target
noise - x0. The dump holds the weights, the batch, the given draws (noise0, σ, t, noise, the
stand-in velocity) and every result.

Here PyTorch recomputes the results from the given draws alone, with diffusers'
WanTransformer3DModel loaded with the same weights (names mapped by tools/wan_keys.py; the
timestep sinusoid in fp64 as in the official code, see test_reference_step.py) and autograd:
  x0          x <- x + (σ_{i+1} - σ_i) * generator(x, 1000 σ_i) from noise0, σ the official
              shifted schedule (computed here, and checked against the dump's)
  x           (1 - σ) x0 + σ noise, with σ in [shift(t_min), shift(t_max)] and t = 1000 σ
  fake_x0     x - σ critic(x, t)
  grad        (fake_x0 - real_x0) / mean|x0 - real_x0| per sample, real_x0 = x - σ v_real (DMD2)
  loss        0.5 mse(x0, sg(x0 - grad))
  gradients   of that loss in the generator's parameters, the earlier jumps under no_grad
  critic      mse(critic(x, t), noise - x0) and its gradients in the critic's parameters
Errors are relative, max|a - b| / max|b| per tensor (|a - b| / |b| for a loss), b the dump's,
and all must be <= 1e-5. Two more checks make sure the comparisons can fail: the generator's
gradients backpropagated through every jump, and the gradient without DMD2's normaliser, must be
more than 100x the tolerance away from the dump's. For information, the script also says whether
PyTorch's CPU generator, seeded as dmd.cpp seeds it, draws the dump's noise0, σ and noise.

With a dump of image-conditioned students (reference.json's mode; condition.safetensors holds the
batch's condition) the same recomputation takes the image as the official models do: i2v's y
(mask and image latents) concatenated after x at every forward (WanImageToVideoPipeline); ti2v's
image as the clean first latent frame (TI2V-5B's image mode, expand_timesteps): put back at the
start and after every jump, in the re-noised and fake samples, its tokens at timestep 0 (per-token
timesteps into diffusers' model), and left out of the DMD gradient, its normaliser and the critic's
loss (the frame is given, not generated).

usage: test_dmd_reference.py DUMP_DIR
Exit status 0 when everything agrees, 1 otherwise (also when a package is missing).
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

import wan_keys  # noqa: E402  (tools/, after the path is set)
from wd_test_support import check, diffusers_model, failures, padded_context, relative  # noqa: E402

TOLERANCE = 1e-5


def shift_sigma(sigma, shift):
    return shift * sigma / (1 + (shift - 1) * sigma)


def sampling_sigmas(steps, shift):
    """The official schedule (FlowUniPCMultistepScheduler.set_timesteps): linspace(1 - 1/1000, 0,
    steps + 1) without its last point, shifted, and a final 0."""
    top = 1 - 1 / 1000
    return [shift_sigma(top - top * i / steps, shift) for i in range(steps)] + [0.0]


class Condition:
    """The batch's image condition as the official models take it (none for t2v)."""

    def __init__(self, mode, folder, cfg):
        self.mode = mode
        batch = load_file(folder / "condition.safetensors") if mode != "t2v" else {}
        self.y = batch.get("batch.y")
        self.image = batch["batch.x_t"][:, :, :1] if mode == "ti2v" else None
        self.batch_t = batch.get("batch.t")
        self.patch = cfg["patch_size"]

    def inputs(self, x):
        """The model's hidden_states: i2v: [x; y] over channels."""
        if self.y is None:
            return x
        # A forward of several batches' worth (the classifier's real and fake halves) takes y each time.
        return torch.cat([x, self.y.repeat(x.shape[0] // self.y.shape[0], 1, 1, 1, 1)], dim=1)

    def keep(self, x):
        """ti2v: x with the image as its first latent frame (the rest keeps its graph)."""
        return torch.cat([self.image, x[:, :, 1:]], dim=2) if self.image is not None else x

    def timesteps(self, t, x):
        """Each sample's t [B] as the model takes it: ti2v per token, the image's tokens at 0."""
        if self.image is None:
            return t
        frame = (x.shape[3] // self.patch[1]) * (x.shape[4] // self.patch[2])
        tokens = (x.shape[2] // self.patch[0]) * frame
        out = t.float().view(-1, 1).expand(-1, tokens).clone()
        out[:, :frame] = 0
        return out

    def weights(self, x):
        """1 on the generated frames, 0 on ti2v's image frame ([B, 1, F, 1, 1])."""
        w = torch.ones(x.shape[0], 1, x.shape[2], 1, 1)
        if self.image is not None:
            w[:, :, 0] = 0
        return w


class Student:
    """One of the dumped students as diffusers' model, its parameters in the dump's order."""

    def __init__(self, config, weights, names, condition):
        self.model = diffusers_model(config, weights)
        self.names = names
        self.condition = condition
        self.params = [self.model.get_parameter(wan_keys.native_to_diffusers(n)) for n in names]
        back = [wan_keys.diffusers_to_native(k) for k in self.model.state_dict()]
        assert sorted(back) == sorted(names), "diffusers' tensors differ from the trainable ones"

    def __call__(self, x, t, context):
        return self.model(self.condition.inputs(x), t, context, return_dict=False)[0]

    def grads(self):
        return {n: p.grad.detach().clone() for n, p in zip(self.names, self.params)}

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def simulate(generator, noise, sigmas, context, grad_from):
    """The k Euler jumps from `noise`; jumps i >= grad_from keep their graph. A ti2v image is the
    first frame from the start and after every jump."""
    cond = generator.condition
    x = cond.keep(noise)
    batch = noise.shape[0]
    for i in range(len(sigmas) - 1):
        t = cond.timesteps(torch.full((batch,), 1000 * sigmas[i], dtype=torch.float32), x)
        with torch.set_grad_enabled(i >= grad_from):
            x = cond.keep(x + (sigmas[i + 1] - sigmas[i]) * generator(x, t, context))
    return x


# dmd.cpp's seed domains (generate's noise, the generator request's re-noising) and data::hash_keys
# (src/data/splitmix64.hpp), for the information line on the draws.
SAMPLE_SALT, DMD_SALT = 0xD3D05A3E, 0xD3D00D3D
MASK = (1 << 64) - 1


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def hash_keys(seed, *rest):
    for key in rest:
        seed = mix64(seed) ^ key
    return mix64(seed)


def same_draws(dump, spec):
    """Whether the dump's noise0, σ and noise are PyTorch's CPU generator's draws under dmd.cpp's
    seeds (mt19937, as LibTorch's CPU generator)."""
    g = torch.Generator().manual_seed(hash_keys(spec["seed"], SAMPLE_SALT, spec["key"], spec["student"]))
    noise0 = torch.randn(dump["noise0"].shape, generator=g)
    g = torch.Generator().manual_seed(hash_keys(spec["seed"], DMD_SALT, spec["cycle"], spec["student"]))
    u = torch.rand(dump["noise0"].shape[0], generator=g, dtype=torch.float64) * (spec["t_max"] - spec["t_min"])
    sigma = shift_sigma(u + spec["t_min"], spec["shift"]).float()
    noise = torch.randn(dump["noise"].shape, generator=g)
    return (torch.equal(noise0, dump["noise0"]) and torch.equal(sigma, dump["sigma"].flatten())
            and torch.equal(noise, dump["noise"]))


def dmd_gradient(x0, real_x0, fake_x0, w, normalise=True):
    """DMD2's gradient: (p_real - p_fake) / mean|p_real| per sample, p = x0 - prediction, over the
    elements of frame weight `w` 1 (0 elsewhere)."""
    p_real, p_fake = x0 - real_x0, x0 - fake_x0
    w = w.expand_as(x0)
    dims = tuple(range(1, x0.dim()))
    weight = (p_real.abs() * w).sum(dim=dims, keepdim=True) / w.sum(dim=dims, keepdim=True) if normalise else 1.0
    return torch.nan_to_num((p_real - p_fake) * w / weight, nan=0.0, posinf=0.0, neginf=0.0)


def report(name, err, limit=TOLERANCE):
    print(f"  {name:44s} {err:.2e}")
    check(err <= limit, f"{name} differs by {err:.2e} relative (tolerance {limit:.0e})")


def worst(errors):
    name = max(errors, key=errors.get)
    return errors[name], name


class Classifier:
    """The critic with DMD2's realism classifier: diffusers' model with the critic's weights, the
    hidden states after block `block` (a forward hook) averaged over the tokens, layer-normalised
    without affine, Linear(dim, dim), SiLU, Linear(dim, 1)."""

    def __init__(self, cfg, weights, names, heads, block, condition):
        self.critic = Student(cfg, weights, names, condition)
        self.heads = {n: t.clone().requires_grad_(True) for n, t in heads.items()}
        self.hidden = None
        self.hook = self.critic.model.blocks[block].register_forward_hook(self._keep)

    def _keep(self, module, inputs, output):
        self.hidden = output

    def __call__(self, x, t, context):
        self.critic(x, t, context)
        h = self.hidden.float().mean(1)
        h = F.layer_norm(h, (h.shape[-1],))
        w = self.heads
        h = F.silu(F.linear(h, w["distill_heads.gan_in.weight"], w["distill_heads.gan_in.bias"]))
        return F.linear(h, w["distill_heads.gan_out.weight"], w["distill_heads.gan_out.bias"]).squeeze(-1)

    def grads(self):
        out = {n: p.grad for n, p in zip(self.critic.names, self.critic.params)}
        out.update({n: p.grad for n, p in self.heads.items()})
        return out


def gan_checks(folder, meta, cfg, dump, context, cond):
    """DMD2's GAN term: the classifier's logits, loss and gradients, and the generator's GAN
    gradient in x0, from the dump's real stand-in, noise and t."""
    info = meta["gan"]
    gan = load_file(folder / "gan.safetensors")
    names = [n for n in info["critic_trainable"] if not n.startswith("distill_heads.")]
    weights = load_file(folder / "critic.safetensors")
    heads = load_file(folder / "gan_heads.safetensors")
    classifier = Classifier(cfg, weights, names, heads, info["block"], cond)
    x0, t, noise = dump["x0"], gan["t"], gan["noise"]
    report("GAN t (the re-noised sample's)", relative(t, dump["t"]))
    sigma = ((t.max(dim=1).values if t.dim() == 2 else t) / 1000).view(-1, 1, 1, 1, 1)
    fake = cond.keep((1 - sigma) * x0 + sigma * noise)
    report("fake = (1 - t/1000) x0 + t/1000 noise", relative(fake, gan["fake"]))
    both = torch.cat([gan["real"], fake])
    t2, context2 = torch.cat([t, t]), torch.cat([context, context])
    logits = classifier(both, t2, context2)
    report(f"classifier logits (block {info['block']})", relative(logits.detach(), gan["logits"]))
    b = x0.shape[0]
    loss = F.softplus(logits[b:]).mean() + F.softplus(-logits[:b]).mean()
    report("classifier loss", abs(loss.item() - info["loss"]) / abs(info["loss"]))
    loss.backward()
    want = load_file(folder / "critic_gan_grads.safetensors")
    got = classifier.grads()
    err, name = worst({n: relative(got[n], want[n]) for n in want})
    report(f"classifier gradients, {len(want)} tensors (worst: {name})", err)
    unreached = [n for n, g in got.items() if n not in want and g is not None and g.abs().max() > 0]
    check(not unreached, f"PyTorch reaches {unreached[:3]} which the dump's classifier loss does not")
    leaf = x0.clone().requires_grad_(True)
    gen_loss = F.softplus(-classifier(cond.keep((1 - sigma) * leaf + sigma * noise), t, context)).mean()
    (grad,) = torch.autograd.grad(gen_loss, leaf)
    report("generator GAN gradient d mean softplus(-D)/dx0", relative(grad, gan["grad"]))
    # The hook point matters: the classifier after the last block is far from the dump's.
    last = Classifier(cfg, weights, names, heads, cfg["num_layers"] - 1, cond)
    apart = relative(last(both, t2, context2).detach(), gan["logits"])
    print(f"  (the classifier after the last block is {apart:.2e} away)")
    check(apart > 100 * TOLERANCE, f"the classifier after the last block is only {apart:.2e} away")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: test_dmd_reference.py DUMP_DIR")
    torch.set_num_threads(1)
    folder = Path(sys.argv[1])
    meta = json.loads((folder / "reference.json").read_text())
    cfg, spec = meta["model"], meta["spec"]
    dump = load_file(folder / "dmd.safetensors")
    cond = Condition(meta.get("mode", "t2v"), folder, cfg)
    generator = Student(cfg, load_file(folder / "generator.safetensors"), meta["generator_trainable"], cond)
    critic = Student(cfg, load_file(folder / "critic.safetensors"), meta["critic_trainable"], cond)
    want_gen_grads = load_file(folder / "generator_grads.safetensors")
    want_critic_grads = load_file(folder / "critic_grads.safetensors")
    context = padded_context(dump["context"], dump["context_lens"], cfg["text_len"])
    k = spec["steps"]

    print(f"train.objective dmd (k = {k} jumps, shift {spec['shift']}, {cond.mode} students) against PyTorch "
          f"{torch.__version__} autograd + diffusers; max|a-b|/max|b|:")
    sigmas = sampling_sigmas(k, spec["shift"])
    report("sampling σ (the official schedule)", relative(dump["sigmas"], torch.tensor(sigmas, dtype=torch.float64)))

    # The generator's sample: k Euler jumps from the dump's noise, the last with its graph.
    x0_graph = simulate(generator, dump["noise0"], sigmas, context, grad_from=k - 1)
    x0 = x0_graph.detach()
    report("x0 (k Euler jumps of the generator)", relative(x0, dump["x0"]))

    # The re-noised sample from the dump's σ and noise.
    sigma, t, noise = dump["sigma"], dump["t"], dump["noise"]
    lo, hi = shift_sigma(spec["t_min"], spec["shift"]), shift_sigma(spec["t_max"], spec["shift"])
    s = sigma.flatten().double()
    check(bool(((s >= lo - 1e-6) & (s <= hi + 1e-6)).all()),
          f"re-noising σ {s.tolist()} outside [shift(t_min), shift(t_max)] = [{lo:.4f}, {hi:.4f}]")
    report("t = 1000 σ" + (" (per token, the image's at 0)" if t.dim() == 2 else ""),
           relative(t.double(), cond.timesteps(1000 * s, x0).double()))
    if cond.batch_t is not None:
        check(torch.equal(cond.batch_t.eq(0), t.eq(0)), "the re-noised t's zero tokens are not the batch's")
    x = cond.keep((1 - sigma) * x0 + sigma * noise)
    report("x = (1 - σ) x0 + σ noise", relative(x, dump["x"]))

    # The critic's and the teacher's x0 predictions, the DMD gradient and the generator's loss.
    real_x0 = x - sigma * dump["real_velocity"]
    with torch.no_grad():
        fake_x0 = x - sigma * critic(x, t, context)
    report("fake_x0 = x - σ critic(x, t)", relative(fake_x0, dump["fake_x0"]))
    w = cond.weights(x0)
    grad = dmd_gradient(x0, real_x0, fake_x0, w)
    report("DMD gradient", relative(grad, dump["grad"]))
    loss = 0.5 * F.mse_loss(x0_graph, (x0_graph - grad).detach())
    want_loss = float(dump["loss"][0])
    check(abs(meta["generator_loss"] - want_loss) <= 1e-7 * abs(want_loss), "reference.json's loss is not the dump's")
    report("generator loss 0.5 mse(x0, sg(x0 - grad))", abs(loss.item() - want_loss) / abs(want_loss))
    generator.zero_grad()
    loss.backward()
    err, name = worst({n: relative(g, want_gen_grads[n]) for n, g in generator.grads().items()})
    report(f"generator gradients (worst: {name})", err)

    # The critic's flow-matching step on the same sample.
    critic.zero_grad()
    we = w.expand_as(x0)
    critic_loss = ((critic(x, t, context) - (noise - x0)) ** 2 * we).sum() / we.sum()
    critic_loss.backward()
    report("critic loss mse(critic(x, t), noise - x0)",
           abs(critic_loss.item() - meta["critic_loss"]) / abs(meta["critic_loss"]))
    err, name = worst({n: relative(g, want_critic_grads[n]) for n, g in critic.grads().items()})
    report(f"critic gradients (worst: {name})", err)

    gan_checks(folder, meta, cfg, dump, context, cond)

    # The checks above tell the alternatives apart: backpropagation through every jump, and the
    # gradient without DMD2's normaliser.
    generator.zero_grad()
    x0_all = simulate(generator, dump["noise0"], sigmas, context, grad_from=0)
    (0.5 * F.mse_loss(x0_all, (x0_all - grad).detach())).backward()
    apart_jumps = max(relative(g, want_gen_grads[n]) for n, g in generator.grads().items())
    apart_norm = relative(dmd_gradient(x0, real_x0, fake_x0, w, normalise=False), dump["grad"])
    print(f"  (the gradients through every jump are {apart_jumps:.2e} away, "
          f"the unnormalised DMD gradient {apart_norm:.2e})")
    check(apart_jumps > 100 * TOLERANCE, f"the gradients through every jump are only {apart_jumps:.2e} away")
    check(apart_norm > 100 * TOLERANCE, f"the unnormalised DMD gradient is only {apart_norm:.2e} away")
    # For information only (LibTorch's and PyTorch's generators need not agree across versions).
    print(f"  (the dump's noise0, σ and noise are PyTorch's own draws under dmd.cpp's seeds: "
          f"{'yes' if same_draws(dump, spec) else 'no'})")
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
