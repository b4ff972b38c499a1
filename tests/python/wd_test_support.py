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


def relative(a, b):
    """max|a - b| / max|b| over the tensor (max|a - b| when b is all zeros), in float64."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


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


# --- diffusers with the official weights ---------------------------------------------------------


def diffusers_model(native_config, native_state):
    """diffusers' WanTransformer3DModel with a native (official-layout) config and state dict,
    its timestep sinusoid replaced by the official fp64 one (OfficialTimesteps)."""
    from diffusers import WanTransformer3DModel

    import wan_keys  # tools/: the caller puts it on sys.path

    model = WanTransformer3DModel(**wan_keys.diffusers_config(native_config))
    model.condition_embedder.timesteps_proj = OfficialTimesteps(native_config["freq_dim"])
    model.load_state_dict(wan_keys.to_diffusers(native_state), strict=True)
    return model


def padded_context(context, lens, text_len):
    """The context the official model embeds: each sample's first lens[b] rows, zeros after, up
    to text_len rows (spec §3.6)."""
    out = torch.zeros(context.shape[0], text_len, context.shape[2])
    for b, n in enumerate(lens.tolist()):
        out[b, :n] = context[b, :n]
    return out
