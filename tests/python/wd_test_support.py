"""What several of the Python tests share (they run as scripts; their folder is on sys.path)."""

import torch

# --- a launched job's pins ---------------------------------------------------------------------

# What every `wan-distill train` a test launches assumes, as tests/launch/launch_util.hpp pins it, so
# that a GPU host runs the same job as this one: one intra-op thread per rank, the students and
# the teacher on the host even where a GPU is visible (`auto` would take it).
CPU_JOB = ["--runtime.threads", "1", "--student.device", "cpu", "--teacher.placement", "cpu",
           "--teacher.device", "cpu"]

# --- checks ------------------------------------------------------------------------------------

failures = []


def check(ok, message):
    """Records a failed expectation and goes on, so one run reports every mismatch."""
    if not ok:
        failures.append(message)
        print(f"FAIL: {message}")
    return ok


# --- the official timestep embedding -----------------------------------------------------------


def official_sinusoid(freq_dim, t):
    """Wan's sinusoidal_embedding_1d (wan/modules/model.py): fp64, cos half first."""
    half = freq_dim // 2
    position = t.to(torch.float64)
    omega = torch.pow(10000, -torch.arange(half, dtype=torch.float64).div(half))
    sinusoid = torch.outer(position, omega)
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1)


class OfficialTimesteps(torch.nn.Module):
    """Stands in for diffusers' fp32 `Timesteps` (the official code and ours compute the sinusoid
    in fp64); its caller casts the result to the time MLP's dtype."""

    def __init__(self, freq_dim):
        super().__init__()
        self.freq_dim = freq_dim

    def forward(self, t):
        return official_sinusoid(self.freq_dim, t)
