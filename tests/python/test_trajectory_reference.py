#!/usr/bin/env python3
"""An independent reference for train.objective trajectory's batches.

tests/reference/dump_trajectory samples one round of 2 trajectories with the fixture teacher
tests/fixtures/wan-tiny-a (guided, 6 steps cut into 3 student intervals, shift 3), once with UniPC
and once with Euler, and dumps every (trajectory, interval) pair it would train on: the state x at
the interval's start, its t and the target velocity v. Here diffusers recomputes each trajectory
from the dump's own starting noise: WanTransformer3DModel with the same weights gives the
conditional and the negative (zero) velocity in two forwards, combined by hand, and diffusers'
UniPCMultistepScheduler (flow prediction, bh2, order 2) or FlowMatchEulerDiscreteScheduler steps
the sample along the same σ. Every dumped state must equal diffusers' state at that σ, and every
target must be the jump (x(σ_{i+1}) − x(σ_i)) / (σ_{i+1} − σ_i) of diffusers' path, to 1e-5
relative.

With an i2v TEACHER_DIR (dump_trajectory ... i2v writes it: a random i2v model, in_dim 2C + 4)
every forward takes [x; y] with the trajectory's dumped y, the mask and image latents, as
diffusers' WanImageToVideoPipeline passes them.

With a ti2v TEACHER_DIR, diffusers' TI2V image mode by hand: the trajectory's first frame is the
image (the dumped start's), its tokens get timestep 0 in a per-token timestep ([1, S], as
WanImageToVideoPipeline with expand_timesteps), and it is put back after every scheduler step.

With a two-expert TEACHER_DIR (high_noise_model/ + low_noise_model/, the dump's `boundary` and
two `guidance` scales, low then high), each step runs the expert whose side of the boundary its
timestep is on (trunc(t) >= boundary: the high-noise one, as the official A14B sampler), guided by
hand with that expert's scale: the official T2V-A14B's per-expert guidance.

usage: test_trajectory_reference.py DUMP_FILE [TEACHER_DIR]
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
    from safetensors.torch import load_file
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

from wd_test_support import check, diffusers_model, failures, padded_context, relative  # noqa: E402

TOLERANCE = 1e-5  # the bound for a trajectory round against diffusers (measured: 2.1e-6 at most)


def scheduler_for(solver, sigmas):
    """diffusers' scheduler for `solver`, set to the dump's σ (the teacher's schedule, ending at 0)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    steps = len(sigmas) - 1
    if solver == "euler":
        s = FlowMatchEulerDiscreteScheduler(shift=1.0)
        s.set_timesteps(sigmas=sigmas[:-1].tolist())  # it appends the final 0
    else:
        s = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=1.0,
                                    solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True,
                                    final_sigmas_type="zero")
        s.set_timesteps(steps)
        s.sigmas = sigmas.to(torch.float32)
        s.timesteps = (sigmas[:-1] * 1000).to(torch.float32)
    return s


def main():
    torch.set_num_threads(1)
    dump = load_file(sys.argv[1])
    def load(folder):  # a teacher folder: its config and its (one or more) safetensors files
        cfg = json.loads((folder / "config.json").read_text())
        state = {}
        for f in sorted(folder.glob("*.safetensors")):
            state.update(load_file(f))
        return cfg, diffusers_model(cfg, state)

    two = len(sys.argv) > 2 and (Path(sys.argv[2]) / "high_noise_model").is_dir()
    if two:
        cfg, high_model = load(Path(sys.argv[2]) / "high_noise_model")
        _, model = load(Path(sys.argv[2]) / "low_noise_model")
        boundary = float(dump["boundary"][0])
    elif len(sys.argv) > 2:
        cfg, model = load(Path(sys.argv[2]))
    else:
        fixture = ROOT / "tests" / "fixtures" / "wan-tiny-a"
        cfg = json.loads((fixture / "config.json").read_text())
        model = diffusers_model(cfg, load_file(fixture / "weights.safetensors"))
    i2v = cfg.get("model_type") == "i2v"
    ti2v = cfg.get("model_type") == "ti2v"
    if i2v and "unipc.y" not in dump:
        print(f"FAIL: {sys.argv[1]} has no y for the i2v teacher {sys.argv[2]}")
        return 1
    scales = dump["guidance"].tolist()  # one, or the low-noise and the high-noise expert's
    g = scales[0]
    cond_ctx = padded_context(dump["context"], dump["context_lens"], cfg["text_len"])
    neg_ctx = torch.zeros_like(cond_ctx)

    for solver in ("unipc", "euler"):
        x, t, v = dump[f"{solver}.x"], dump[f"{solver}.t"], dump[f"{solver}.v"]
        traj, interval = dump[f"{solver}.traj"].tolist(), dump[f"{solver}.interval"].tolist()
        sigmas, grid = dump[f"{solver}.teacher_sigmas"], dump[f"{solver}.student_sigmas"]
        k = len(grid) - 1
        stride = (len(sigmas) - 1) // k
        pairs = {(b, i): j for j, (b, i) in enumerate(zip(traj, interval))}
        check(len(pairs) == len(traj) == 2 * k, f"{solver}: the round deals {len(traj)} pairs, {len(pairs)} distinct")
        for b in sorted({b for b, _ in pairs}):
            sched = scheduler_for(solver, sigmas)
            sample = x[pairs[(b, 0)]][None].clone()  # the trajectory's starting noise
            states = [sample]
            # i2v: the trajectory's y beside the sample at every forward, the negative one too.
            joined = (lambda s, y=dump[f"{solver}.y"][pairs[(b, 0)]][None]: torch.cat([s, y], dim=1)) if i2v \
                else (lambda s: s)
            if i2v:
                for i in range(k):
                    check(torch.equal(dump[f"{solver}.y"][pairs[(b, i)]], dump[f"{solver}.y"][pairs[(b, 0)]]),
                          f"{solver} ({b},{i}): a trajectory's pairs carry its one y")
            image = sample[:, :, :1].clone()  # ti2v: the start's first frame is the image
            frame_tokens = sample.shape[3] * sample.shape[4] // 4
            with torch.no_grad():
                for n, step_t in enumerate(sched.timesteps):
                    tt = torch.tensor([float(sigmas[n]) * 1000], dtype=torch.float32)
                    if ti2v:  # per token, the image's tokens at 0
                        tt = tt.expand(1, sample.shape[2] * frame_tokens).clone()
                        tt[:, :frame_tokens] = 0
                    m, scale = model, g
                    if two and int(float(tt.reshape(-1)[0])) >= boundary:  # the high-noise expert and its scale
                        m, scale = high_model, scales[1]
                    cond = m(joined(sample), tt, cond_ctx[b:b + 1], return_dict=False)[0]
                    neg = m(joined(sample), tt, neg_ctx[b:b + 1], return_dict=False)[0]
                    velocity = neg + scale * (cond - neg)
                    sample = sched.step(velocity, step_t, sample, return_dict=False)[0]
                    if ti2v:
                        sample = torch.cat([image, sample[:, :, 1:]], dim=2)
                    if (n + 1) % stride == 0:
                        states.append(sample)
            for i in range(k):
                j = pairs[(b, i)]
                err_x = relative(x[j], states[i][0])
                want_v = (states[i + 1][0] - states[i][0]) / float(grid[i + 1] - grid[i])
                err_v = relative(v[j], want_v)
                if ti2v:  # per token: the image's at 0, the rest at 1000·σ_i
                    want_t = torch.full_like(t[j], 1000 * float(grid[i]))
                    want_t[:frame_tokens] = 0
                    err_t = float((t[j] - want_t).abs().max())
                    check(torch.equal(x[j][:, :1], image[0]), f"{solver} ({b},{i}): the state's first frame is the image")
                else:
                    err_t = abs(float(t[j]) - 1000 * float(grid[i]))
                print(f"{solver} trajectory {b} interval {i}: state {err_x:.2e}, jump {err_v:.2e} relative, "
                      f"t {float(t[j].reshape(-1)[-1]):.3f}")
                check(err_x <= TOLERANCE, f"{solver} ({b},{i}): the state is {err_x:.2e} from diffusers'")
                check(err_v <= TOLERANCE, f"{solver} ({b},{i}): the jump is {err_v:.2e} from diffusers'")
                check(err_t <= 1e-3, f"{solver} ({b},{i}): t {t[j].tolist()} is not 1000 * {float(grid[i])}")
    # Not by accident: the two samplers' paths differ, so each check above tells them apart.
    apart = relative(dump["unipc.v"], dump["euler.v"])
    check(apart > 1e-2, f"UniPC's and Euler's targets are only {apart:.2e} apart")
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
