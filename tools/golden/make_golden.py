#!/usr/bin/python3
"""Generate golden test vectors for the wan-distill C++ port from the official Wan2.2 DiT code.

The official sources (Wan-Video/Wan2.2 `wan/modules/model.py` and `wan/modules/attention.py`) are NOT
part of this repository; fetch them separately and pass their folder with --wan-src.

What is replaced around the official code (spec wan-dit.md section 12):
  1. diffusers' ModelMixin / ConfigMixin / register_to_config -> small plain stand-ins (stub modules
     `diffusers.configuration_utils` and `diffusers.models.modeling_utils` in sys.modules);
  2. `flash_attention` -> exact fp32 softmax(q k^T / sqrt(d)) v with flash-varlen semantics: keys at
     index >= k_lens[b] are masked, q_lens is not used to mask queries (padded queries are computed);
  3. nothing else: the `autocast('cuda')` contexts are inactive on CPU, so everything runs in fp32.
model.py is loaded through importlib under a synthetic package name, so the `wan` package's
__init__ (and its heavy imports) is never executed.

Usage:
  /usr/bin/python3 tools/golden/make_golden.py --wan-src /tmp/wanref --out tests/fixtures \
      [--check-a /work/shared/golden/wan-tiny-a]

Writes <out>/wan-tiny-b and <out>/wan-tiny-i2v (config.json, weights/inputs/expected .safetensors,
README.md) and prints the verification numbers (round trip, batched vs per-sample, ...).
Needs only Debian's python3-torch (1.13) and the standard library.
"""

import argparse
import functools
import importlib.util
import inspect
import json
import math
import os
import struct
import sys
import types

# Matrix products must go through the netlib reference BLAS: its plain loops round the same way on
# every x86-64 CPU, whereas OpenBLAS picks CPU-specific kernels (their sums differ by an ulp or two,
# which moves `out` by ~2e-6). wan-tiny-a was made this way: with the reference BLAS this harness
# reproduces all its tensors bit-exactly. Debian installs it as libblas3 under the path below; the
# script re-executes itself once with LD_LIBRARY_PATH pointing there (before torch is loaded).
REF_BLAS_DIRS = ["/usr/lib/x86_64-linux-gnu/blas", "/usr/lib/x86_64-linux-gnu/lapack"]
_REEXEC_FLAG = "WAN_GOLDEN_REEXEC"


def _use_reference_blas():
    if os.environ.get(_REEXEC_FLAG) or "--system-blas" in sys.argv:
        return
    if not os.path.isfile(os.path.join(REF_BLAS_DIRS[0], "libblas.so.3")):
        return  # reported later by blas_in_use()
    env = dict(os.environ)
    env[_REEXEC_FLAG] = "1"
    env["LD_LIBRARY_PATH"] = ":".join(REF_BLAS_DIRS + [p for p in
                                                       env.get("LD_LIBRARY_PATH", "").split(":")
                                                       if p])
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


if __name__ == "__main__":
    _use_reference_blas()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def blas_in_use():
    """Names of the BLAS shared objects mapped into this process (Linux only)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {ln.split()[-1] for ln in f if "blas" in ln.split()[-1]}
    except OSError:
        return []
    return sorted(libs)


GENERATOR_NOTE = ("official Wan2.2 wan/modules/model.py WanModel, fp32 CPU, 1 thread, torch %s "
                  "(Debian python3-torch), netlib reference BLAS, mkldnn off, fp32 softmax attention"
                  % torch.__version__)

# ----------------------------------------------------------------------------------------------
# minimal safetensors reader / writer (little-endian hosts only)
# ----------------------------------------------------------------------------------------------

_DT_TO_STR = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
              torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8"}
_STR_TO_DT = {v: k for k, v in _DT_TO_STR.items()}


def st_save(path, tensors, metadata=None):
    assert sys.byteorder == "little"
    header, blobs, off = {}, [], 0
    for key in sorted(tensors):
        t = tensors[key].detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        header[key] = {"dtype": _DT_TO_STR[t.dtype], "shape": list(t.shape),
                       "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)  # pad header to 8 bytes (safetensors convention)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def st_load(path):
    """Returns (dict key -> tensor, metadata dict)."""
    assert sys.byteorder == "little"
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for key, info in header.items():
        b, e = info["data_offsets"]
        dt = _STR_TO_DT[info["dtype"]]
        raw = bytearray(data[base + b:base + e])
        if dt == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16) if raw else \
                torch.empty(0, dtype=dt)
        else:
            t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[key] = t.reshape(info["shape"]).clone()
    return out, meta


# ----------------------------------------------------------------------------------------------
# loading the official model code
# ----------------------------------------------------------------------------------------------

def fp32_flash_attention(q, k, v, q_lens=None, k_lens=None, dropout_p=0., softmax_scale=None,
                         q_scale=None, causal=False, window_size=(-1, -1), deterministic=False,
                         dtype=torch.bfloat16, version=None):
    """Stand-in for the official flash_attention: same signature, exact fp32 math.

    q [B,Lq,N,D], k/v [B,Lk,N,D]. Keys j >= k_lens[b] are invisible to every query of sample b.
    q_lens would only restrict which query rows flash writes; it is None at every call site of
    WanModel, and padded query rows are computed like any other row.
    """
    assert dropout_p == 0 and q_scale is None and not causal
    assert tuple(window_size) == (-1, -1), "local window attention is not emulated"
    out_dtype = q.dtype
    b, lq, n, d = q.shape
    lk = k.size(1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qf = q.float().transpose(1, 2)  # [B,N,Lq,D]
    kf = k.float().transpose(1, 2)
    vf = v.float().transpose(1, 2)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # [B,N,Lq,Lk]
    if k_lens is not None:
        kl = torch.as_tensor(k_lens).to(torch.long).view(b, 1)
        masked = torch.arange(lk).view(1, lk) >= kl  # [B,Lk]
        s = s.masked_fill(masked.view(b, 1, 1, lk), float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, vf).transpose(1, 2)  # [B,Lq,N,D]
    return o.type(out_dtype)


def _install_diffusers_stubs():
    """Plain replacements for the three diffusers names model.py imports."""

    class ConfigMixin:
        config_name = "config.json"

    def register_to_config(init):
        @functools.wraps(init)
        def wrapper(self, *args, **kwargs):
            init(self, *args, **kwargs)
            bound = inspect.signature(init).bind(self, *args, **kwargs)
            bound.apply_defaults()
            cfg = dict(bound.arguments)
            cfg.pop("self")
            ignore = set(getattr(self, "ignore_for_config", []))
            object.__setattr__(self, "_stub_config", {k: v for k, v in cfg.items()
                                                      if k not in ignore})
        return wrapper

    class ModelMixin(nn.Module):
        pass

    root = types.ModuleType("diffusers")
    cu = types.ModuleType("diffusers.configuration_utils")
    models = types.ModuleType("diffusers.models")
    mu = types.ModuleType("diffusers.models.modeling_utils")
    cu.ConfigMixin = ConfigMixin
    cu.register_to_config = register_to_config
    mu.ModelMixin = ModelMixin
    root.configuration_utils = cu
    root.models = models
    models.modeling_utils = mu
    for name, mod in [("diffusers", root), ("diffusers.configuration_utils", cu),
                      ("diffusers.models", models), ("diffusers.models.modeling_utils", mu)]:
        sys.modules[name] = mod


def git_blob_id(path):
    """The id git gives this file's content (compare with `git ls-tree HEAD wan/modules/`)."""
    import hashlib
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def load_official(wan_src):
    """Import the official model.py/attention.py from wan_src without the wan package __init__."""
    pkg_name = "_wan_official"
    if pkg_name + ".model" in sys.modules:
        return sys.modules[pkg_name + ".model"]
    for fn in ("model.py", "attention.py"):
        if not os.path.isfile(os.path.join(wan_src, fn)):
            sys.exit("--wan-src %s lacks %s" % (wan_src, fn))
    _install_diffusers_stubs()
    pkg = types.ModuleType(pkg_name)
    pkg.__path__ = [os.path.abspath(wan_src)]
    sys.modules[pkg_name] = pkg

    def _load(sub):
        spec = importlib.util.spec_from_file_location(pkg_name + "." + sub,
                                                      os.path.join(wan_src, sub + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        setattr(pkg, sub, mod)
        return mod

    att = _load("attention")
    att.flash_attention = fp32_flash_attention  # must happen before model.py binds the name
    model = _load("model")
    assert model.flash_attention is fp32_flash_attention
    return model


# ----------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------

def init_params(model, gen):
    """Deterministic parameters, drawn from `gen` in state_dict order (spec section 12)."""
    with torch.no_grad():
        for key, p in model.state_dict(keep_vars=True).items():
            z = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            leaf = key.split(".")
            if leaf[-1] == "modulation":
                val = 0.1 * z
            elif leaf[-1] == "bias":
                val = 0.05 * z
            elif leaf[-1] == "weight" and leaf[-2] in ("norm_q", "norm_k", "norm3"):
                val = 1.0 + 0.1 * z
            elif leaf[-1] == "weight":
                fan_in = math.prod(p.shape[1:])
                val = z / math.sqrt(fan_in)
            else:
                raise RuntimeError("unexpected parameter " + key)
            p.copy_(val)


def build_model(wm, cfg):
    kw = {k: v for k, v in cfg.items() if not k.startswith("_")}
    kw["patch_size"] = tuple(kw["patch_size"])
    kw["window_size"] = tuple(kw["window_size"])
    m = wm.WanModel(**kw).float().eval()
    return m


def load_weights(model, sd):
    own = model.state_dict()
    assert sorted(own) == sorted(sd), "key mismatch"
    for k in own:
        assert tuple(own[k].shape) == tuple(sd[k].shape), k
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)


CONFIG_ORDER = ["_class_name", "model_type", "patch_size", "text_len", "in_dim", "dim", "ffn_dim",
                "freq_dim", "text_dim", "out_dim", "num_heads", "num_layers", "window_size",
                "qk_norm", "cross_attn_norm", "eps"]


def make_config(**kw):
    base = {"_class_name": "WanModel", "patch_size": [1, 2, 2], "window_size": [-1, -1],
            "qk_norm": True, "cross_attn_norm": True, "eps": 1e-06}
    base.update(kw)
    return {k: base[k] for k in CONFIG_ORDER}


# ----------------------------------------------------------------------------------------------
# running the model with captures
# ----------------------------------------------------------------------------------------------

def run(model, xs, t, ctx_list, seq_len, ys=None, capture=False):
    """One official forward. Returns (list of outputs, dict of captured intermediates)."""
    cap, hooks = {}, []
    if capture:
        d = model.dim

        def h_block0(mod, inp, out):
            cap["block0_out"] = out.detach().clone()

        def h_tproj(mod, inp, out):
            cap["time_proj_e0"] = out.detach().clone().unflatten(2, (6, d))

        def h_temb(mod, inp, out):
            cap["time_emb_e"] = out.detach().clone()

        def h_text(mod, inp, out):
            cap["context_emb"] = out.detach().clone()

        hooks = [model.blocks[0].register_forward_hook(h_block0),
                 model.time_projection.register_forward_hook(h_tproj),
                 model.time_embedding.register_forward_hook(h_temb),
                 model.text_embedding.register_forward_hook(h_text)]
    try:
        with torch.no_grad():
            out = model(xs, t=t, context=ctx_list, seq_len=seq_len, y=ys)
    finally:
        for h in hooks:
            h.remove()
    return out, cap


def maxdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item()


def write_fixture(dirname, cfg, weights, inputs, expected, readme):
    os.makedirs(dirname, exist_ok=True)
    name = os.path.basename(dirname.rstrip("/"))
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    meta = {"format": "pt", "config": name, "generator": GENERATOR_NOTE}
    st_save(os.path.join(dirname, "weights.safetensors"), weights, {"format": "pt"})
    st_save(os.path.join(dirname, "inputs.safetensors"), inputs, meta)
    st_save(os.path.join(dirname, "expected.safetensors"), expected, meta)
    with open(os.path.join(dirname, "README.md"), "w") as f:
        f.write(readme)
    # round trip: everything must come back bit-exactly
    worst = 0
    for fn, ref in [("weights", weights), ("inputs", inputs), ("expected", expected)]:
        back, _ = st_load(os.path.join(dirname, fn + ".safetensors"))
        assert sorted(back) == sorted(ref), fn
        for k in ref:
            a, b = ref[k].contiguous(), back[k]
            assert a.dtype == b.dtype and a.shape == b.shape, (fn, k)
            if not torch.equal(a, b) or a.numpy().tobytes() != b.numpy().tobytes():
                worst += 1
                print("  ROUND-TRIP MISMATCH", fn, k)
    with open(os.path.join(dirname, "config.json")) as f:
        assert json.load(f) == cfg
    print("  round trip %s: %s" % (name, "bit-exact" if worst == 0 else "%d MISMATCHES" % worst))
    return worst == 0


def fmt_shape(t):
    return "%s [%s]" % (_DT_TO_STR[t.dtype], ",".join(str(s) for s in t.shape))


# ----------------------------------------------------------------------------------------------
# sanity check against wan-tiny-a
# ----------------------------------------------------------------------------------------------

def check_tiny_a(wm, adir):
    print("== sanity check against", adir)
    with open(os.path.join(adir, "config.json")) as f:
        cfg = json.load(f)
    model = build_model(wm, cfg)
    w, _ = st_load(os.path.join(adir, "weights.safetensors"))
    load_weights(model, w)
    inp, _ = st_load(os.path.join(adir, "inputs.safetensors"))
    exp, _ = st_load(os.path.join(adir, "expected.safetensors"))
    x = inp["x"]
    cl = inp["context_lens"].tolist()
    ctx = [inp["context"][b, :cl[b]] for b in range(x.shape[0])]
    out, cap = run(model, [x[b] for b in range(x.shape[0])], inp["t_tokens"], ctx,
                   int(inp["seq_len"][0]), capture=True)
    res = {"out": maxdiff(torch.stack(out), exp["out"])}
    for k in ("block0_out", "time_proj_e0", "time_emb_e", "context_emb"):
        if k in exp:
            res[k] = maxdiff(cap[k], exp[k])
    for k, v in res.items():
        print("  max |mine - expected| %-13s %.3g" % (k, v))
    # does our parameter recipe reproduce the shipped weights? (informational)
    m2 = build_model(wm, cfg)
    g = torch.Generator().manual_seed(20250801)
    init_params(m2, g)
    wd = max(maxdiff(m2.state_dict()[k], w[k]) for k in w)
    print("  init recipe with seed 20250801 vs shipped weights: max diff %.3g" % wd)
    return res


# Wan-Video/Wan2.2 @ 42bf4cfaa384bc21833865abc2f9e6c0e67233dc (model.py last changed in d18200b8)
KNOWN_BLOBS = {"model.py": "6982fa15db1156dfcfc50d480ae9a42d8525f83d",
               "attention.py": "4dbbe03fc79e1eb1509dfd98720b60196144878d"}

# ----------------------------------------------------------------------------------------------
# fixture b: ti2v-like, different sizes, H != W, per-token t, padded tokens and contexts
# ----------------------------------------------------------------------------------------------

SEED_B = 20250901
SEED_I2V = 20250902


def frame_t(grid, seq_len, per_frame, pad):
    f, h, w = grid
    row = []
    for fi in range(f):
        row += [float(per_frame[fi])] * (h * w)
    row += [float(pad)] * (seq_len - f * h * w)
    return torch.tensor(row, dtype=torch.float32)


def make_b(wm, outdir, cmd):
    name = "wan-tiny-b"
    print("== generating", name)
    cfg = make_config(model_type="ti2v", text_len=10, in_dim=12, dim=96, ffn_dim=192, freq_dim=32,
                      text_dim=32, out_dim=12, num_heads=4, num_layers=2)
    model = build_model(wm, cfg)
    g = torch.Generator().manual_seed(SEED_B)
    init_params(model, g)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # inputs, drawn from the same generator after the parameters, in this order
    x0 = torch.randn(12, 3, 6, 4, generator=g)
    x1 = torch.randn(12, 2, 4, 8, generator=g)
    context = torch.randn(2, 10, 32, generator=g)
    context_lens = torch.tensor([6, 10], dtype=torch.long)
    for b in range(2):
        context[b, context_lens[b]:] = 0
    seq_len = 20
    grids = [(3, 3, 2), (2, 2, 4)]
    t_tokens = torch.stack([frame_t(grids[0], seq_len, [0, 700, 700], 700),
                            frame_t(grids[1], seq_len, [300, 900], 900)])
    # B=1 case with a 1-D timestep
    x1_0 = torch.randn(12, 2, 4, 4, generator=g)
    context1 = torch.randn(1, 10, 32, generator=g)
    context_lens1 = torch.tensor([4], dtype=torch.long)
    context1[0, 4:] = 0
    t1 = torch.tensor([450.0], dtype=torch.float32)
    seq_len1 = 8

    ctx_list = [context[b, :context_lens[b]] for b in range(2)]
    out, cap = run(model, [x0, x1], t_tokens, ctx_list, seq_len, capture=True)
    out1, cap1 = run(model, [x1_0], t1, [context1[0, :4]], seq_len1, capture=False)
    assert cap["block0_out"].shape == (2, seq_len, 96)
    assert cap["time_proj_e0"].shape == (2, seq_len, 6, 96)

    inputs = {"x.0": x0, "x.1": x1, "t_tokens": t_tokens, "context": context,
              "context_lens": context_lens, "seq_len": torch.tensor([seq_len]),
              "grid_sizes": torch.tensor(grids, dtype=torch.long),
              "x1.0": x1_0, "t1": t1, "seq_len1": torch.tensor([seq_len1]),
              "context1": context1, "context_lens1": context_lens1}
    expected = {"out.0": out[0], "out.1": out[1], "out1.0": out1[0],
                "block0_out": cap["block0_out"], "time_proj_e0": cap["time_proj_e0"],
                "time_emb_e": cap["time_emb_e"], "context_emb": cap["context_emb"]}

    # ---- verification
    print("  checks (official code):")
    # per-sample calls, each with exactly its own token count
    for b in range(2):
        L = math.prod(grids[b])
        o, _ = run(model, [[x0, x1][b]], t_tokens[b:b + 1, :L], [ctx_list[b]], L)
        print("    batched vs per-sample (seq_len=%d) out.%d: %.3g" % (L, b, maxdiff(o[0], out[b])))
        o, c = run(model, [[x0, x1][b]], t_tokens[b:b + 1], [ctx_list[b]], seq_len, capture=True)
        print("    batched vs per-sample (seq_len=%d) out.%d: %.3g, block0_out row: %.3g"
              % (seq_len, b, maxdiff(o[0], out[b]), maxdiff(c["block0_out"][0],
                                                            cap["block0_out"][b])))
    # context passed pre-padded (all text_len rows) gives the same result: padding is not masked
    o, _ = run(model, [x0, x1], t_tokens, [context[0], context[1]], seq_len)
    print("    trimmed vs zero-padded context list: %.3g"
          % max(maxdiff(o[i], out[i]) for i in range(2)))
    # t of padded tokens does not reach the real outputs
    tp = t_tokens.clone()
    tp[0, 18:] = 123.0
    tp[1, 16:] = 5.0
    o, c = run(model, [x0, x1], tp, ctx_list, seq_len, capture=True)
    print("    padded-token t changed: out diff %.3g, block0_out real rows %.3g, padded rows %.3g"
          % (max(maxdiff(o[i], out[i]) for i in range(2)),
             max(maxdiff(c["block0_out"][0, :18], cap["block0_out"][0, :18]),
                 maxdiff(c["block0_out"][1, :16], cap["block0_out"][1, :16])),
             maxdiff(c["block0_out"], cap["block0_out"])))
    # 1-D t (B=1) equals the explicit [1,S] path
    o, _ = run(model, [x1_0], t1.expand(1, seq_len1).clone(), [context1[0, :4]], seq_len1)
    print("    B=1: 1-D t vs [1,S] t: %.3g" % maxdiff(o[0], out1[0]))
    o, _ = run(model, [x1_0], t1, [context1[0, :4]], 12)
    print("    B=1: seq_len 8 vs 12 (padded): %.3g" % maxdiff(o[0], out1[0]))
    # per-token t really matters (sanity: frame-0 t=0 vs uniform 700)
    tu = t_tokens.clone()
    tu[0, :6] = 700.0
    o, _ = run(model, [x0, x1], tu, ctx_list, seq_len)
    print("    (effect of frame-0 t=0 vs 700 on out.0: %.3g)" % maxdiff(o[0], out[0]))
    stats = {k: (v.abs().max().item(), v.pow(2).mean().sqrt().item()) for k, v in expected.items()}

    readme = README_B.format(
        cmd=cmd, seed=SEED_B, gen=GENERATOR_NOTE,
        inputs_table="\n".join("| %s | %s | %s |" % (k, fmt_shape(inputs[k]), INPUTS_B[k])
                               for k in sorted(inputs)),
        expected_table="\n".join("| %s | %s | %s |" % (k, fmt_shape(expected[k]), EXPECTED_B[k])
                                 for k in sorted(expected)),
        stats="\n".join("- %s: max |.| %.4f, rms %.4f" % (k, *stats[k]) for k in sorted(stats)))
    write_fixture(os.path.join(outdir, name), cfg, weights, inputs, expected, readme)


INPUTS_B = {
    "x.0": "sample 0 latent [C,F,H,W]; grid (3,3,2) = 18 tokens",
    "x.1": "sample 1 latent; grid (2,2,4) = 16 tokens",
    "t_tokens": "per-token t passed as `t`. Row 0: tokens 0-5 (frame 0) 0, tokens 6-17 700, padding "
                "18-19 700. Row 1: tokens 0-7 (frame 0) 300, 8-15 900, padding 16-19 900",
    "context": "text features, zero rows beyond context_lens; the model got [context[0,:6], "
               "context[1,:10]]",
    "context_lens": "6, 10",
    "seq_len": "20 (both samples have padded tokens)",
    "grid_sizes": "(3,3,2), (2,2,4) (informational)",
    "x1.0": "B=1 case: latent, grid (2,2,2) = 8 tokens",
    "t1": "B=1 case: 1-D timestep 450 (model expands it to [1,seq_len1])",
    "seq_len1": "B=1 case: 8 (no padding)",
    "context1": "B=1 case: text features, rows 4-9 zero; the model got [context1[0,:4]]",
    "context_lens1": "B=1 case: 4",
}
EXPECTED_B = {
    "out.0": "model output for sample 0 [out_dim,F,H,W]",
    "out.1": "model output for sample 1",
    "out1.0": "B=1 case output",
    "block0_out": "hidden state after block 0, padded rows included (rows >= L_b are computed from "
                  "zero patch tokens; their values depend on the padded t)",
    "time_proj_e0": "e0 = time_projection(e) reshaped [B,S,6,D] (before adding block modulation)",
    "time_emb_e": "e = time_embedding(sinusoid(t)) per token (used by the head)",
    "context_emb": "text_embedding output for the zero-padded [B,text_len,text_dim] context "
                   "(padded rows are non-zero and are attended)",
}

README_B = """# wan-tiny-b — golden vectors for the Wan2.2 DiT (ti2v-like tiny config)

Produced by `tools/golden/make_golden.py` with the official Wan2.2 `WanModel`
(Wan-Video/Wan2.2 `wan/modules/model.py` + `attention.py`, unmodified, loaded outside the `wan`
package) in float32 on CPU, 1 thread. Around it only the three replacements of spec §12 were made:
plain stand-ins for diffusers' ModelMixin/ConfigMixin/register_to_config; flash_attention replaced by
exact fp32 softmax(q·kᵀ/√d)·v masking keys at index ≥ k_lens (padded queries are computed); the
`autocast('cuda')` regions are inactive on CPU. Matrix products use Debian's netlib reference BLAS
(libblas3), as for wan-tiny-a (the same harness reproduces every wan-tiny-a tensor bit-exactly);
with OpenBLAS instead the tensors below move by up to ~2e-6. Generator note: {gen}.

What this adds over wan-tiny-a: head_dim 24 (RoPE pairs 4/4/4 for frame/height/width), batch of two
samples with different grids and H ≠ W, token padding in both samples (seq_len 20), per-token timesteps
that differ per frame (TI2V path, frame 0 at t=0), padded text contexts (6 of 10 rows), and a B=1 call
with a 1-D timestep.

Model (config.json, native field names, all fields written): ti2v, dim 96, ffn_dim 192, freq_dim 32,
num_heads 4 (head_dim 24), num_layers 2, in_dim 12, out_dim 12, text_dim 32, text_len 10,
patch (1,2,2), eps 1e-6, qk_norm and cross_attn_norm true, window (-1,-1).

Seed {seed}: one `torch.Generator().manual_seed({seed})`; parameters drawn first in state_dict order
(`modulation` 0.1·N(0,1); biases incl. norm3.bias 0.05·N; norm_q/norm_k/norm3 weights 1 + 0.1·N;
other weights N(0,1)/sqrt(fan_in), fan_in = prod(shape[1:])), then inputs in the order x.0, x.1,
context, x1.0, context1 (all N(0,1); context rows beyond the length are zeroed afterwards).

Command:

    {cmd}

## weights.safetensors
All 69 tensors of the official state_dict (15 + 27 per block), native key names, F32, sorted keys,
`__metadata__` {{"format":"pt"}}.

## inputs.safetensors
| key | dtype, shape | meaning |
|---|---|---|
{inputs_table}

Batched call: `model([x.0, x.1], t=t_tokens, context=[context[0,:6], context[1,:10]], seq_len=20)`.
B=1 call: `model([x1.0], t=t1, context=[context1[0,:4]], seq_len=8)`.

## expected.safetensors
| key | dtype, shape | meaning |
|---|---|---|
{expected_table}

Magnitudes:
{stats}

## Checks done when generating (numbers printed by the script)
All files read back bit-exactly. Batched outputs equal per-sample calls bit-exactly (each sample
alone, seq_len = its own token count, and seq_len 20; with OpenBLAS they differ by ≤ 1.5e-6); the trimmed context list equals passing
the zero-padded rows; changing the t of padded tokens leaves `out.*` unchanged (it only changes padded
rows of block0_out); the 1-D t equals the explicit [1,S] row. Tolerance for an fp32 port: as in
wan-tiny-a, atol 2e-5 (sinusoid and RoPE in float64) or 1e-4 otherwise; for block0_out compare only
rows < L_b unless the port reproduces the official treatment of padded tokens (zero patch tokens,
per-token t of the padding, unrotated by RoPE, masked as keys).
"""


# ----------------------------------------------------------------------------------------------
# fixture i2v: channel-concatenated conditioning y, per-sample t, padded contexts
# ----------------------------------------------------------------------------------------------

def make_i2v(wm, outdir, cmd):
    name = "wan-tiny-i2v"
    print("== generating", name)
    cfg = make_config(model_type="i2v", text_len=8, in_dim=10, dim=64, ffn_dim=128, freq_dim=32,
                      text_dim=32, out_dim=4, num_heads=4, num_layers=2)
    model = build_model(wm, cfg)
    g = torch.Generator().manual_seed(SEED_I2V)
    init_params(model, g)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    xs = [torch.randn(4, 3, 4, 6, generator=g) for _ in range(2)]
    ys = []
    for _ in range(2):
        y = torch.zeros(6, 3, 4, 6)
        y[0:2, 0] = 1.0  # mask channels: 1 on latent frame 0
        y[2:6, 0] = torch.randn(4, 4, 6, generator=g)  # image latent on frame 0 only
        ys.append(y)
    context = torch.randn(2, 8, 32, generator=g)
    context_lens = torch.tensor([8, 3], dtype=torch.long)
    for b in range(2):
        context[b, context_lens[b]:] = 0
    seq_len = 18
    t = torch.tensor([100.0, 950.0])
    t_tokens = t.view(2, 1).expand(2, seq_len).contiguous()

    ctx_list = [context[b, :context_lens[b]] for b in range(2)]
    out, cap = run(model, xs, t_tokens, ctx_list, seq_len, ys=ys, capture=True)

    inputs = {"x.0": xs[0], "x.1": xs[1], "y.0": ys[0], "y.1": ys[1], "t": t,
              "t_tokens": t_tokens, "context": context, "context_lens": context_lens,
              "seq_len": torch.tensor([seq_len]),
              "grid_sizes": torch.tensor([[3, 2, 3], [3, 2, 3]], dtype=torch.long)}
    expected = {"out.0": out[0], "out.1": out[1], "block0_out": cap["block0_out"],
                "time_proj_e0": cap["time_proj_e0"], "context_emb": cap["context_emb"]}

    print("  checks (official code):")
    for b in range(2):
        o, _ = run(model, [xs[b]], t[b:b + 1], [ctx_list[b]], seq_len, ys=[ys[b]])
        print("    batched vs per-sample (1-D t) out.%d: %.3g" % (b, maxdiff(o[0], out[b])))
    o, _ = run(model, [torch.cat([xs[b], ys[b]]) for b in range(2)], t_tokens, ctx_list, seq_len,
               ys=[torch.zeros(0, 3, 4, 6)] * 2)
    print("    y given separately vs pre-concatenated into x: %.3g"
          % max(maxdiff(o[i], out[i]) for i in range(2)))
    o, _ = run(model, xs, t_tokens, [context[0], context[1]], seq_len, ys=ys)
    print("    trimmed vs zero-padded context list: %.3g"
          % max(maxdiff(o[i], out[i]) for i in range(2)))
    stats = {k: (v.abs().max().item(), v.pow(2).mean().sqrt().item()) for k, v in expected.items()}

    readme = README_I2V.format(
        cmd=cmd, seed=SEED_I2V, gen=GENERATOR_NOTE,
        inputs_table="\n".join("| %s | %s | %s |" % (k, fmt_shape(inputs[k]), INPUTS_I2V[k])
                               for k in sorted(inputs)),
        expected_table="\n".join("| %s | %s | %s |" % (k, fmt_shape(expected[k]),
                                                        EXPECTED_I2V[k]) for k in sorted(expected)),
        stats="\n".join("- %s: max |.| %.4f, rms %.4f" % (k, *stats[k]) for k in sorted(stats)))
    write_fixture(os.path.join(outdir, name), cfg, weights, inputs, expected, readme)


INPUTS_I2V = {
    "x.0": "sample 0 noisy latent [4,F,H,W]; grid (3,2,3) = 18 tokens",
    "x.1": "sample 1 noisy latent",
    "y.0": "sample 0 conditioning [6,F,H,W]: channels 0-1 mask (1 on frame 0, 0 elsewhere), "
           "channels 2-5 image latent (random on frame 0, zeros elsewhere); the model input is "
           "cat([x.0, y.0]) along channels (x first)",
    "y.1": "sample 1 conditioning, same layout",
    "t": "per-sample timestep 100, 950 (informational)",
    "t_tokens": "what was passed as `t`: each row constant (100 / 950)",
    "context": "text features, zero rows beyond context_lens; the model got [context[0,:8], "
               "context[1,:3]]",
    "context_lens": "8, 3",
    "seq_len": "18 (no token padding)",
    "grid_sizes": "(3,2,3) per sample (informational)",
}
EXPECTED_I2V = {
    "out.0": "model output for sample 0 [out_dim=4,F,H,W]",
    "out.1": "model output for sample 1",
    "block0_out": "hidden state after block 0",
    "time_proj_e0": "e0 = time_projection(e) reshaped [B,S,6,D] (before adding block modulation)",
    "context_emb": "text_embedding output for the zero-padded [B,text_len,text_dim] context "
                   "(padded rows are non-zero and are attended)",
}

README_I2V = """# wan-tiny-i2v — golden vectors for the Wan2.2 DiT (i2v-like tiny config)

Produced by `tools/golden/make_golden.py` with the official Wan2.2 `WanModel`
(Wan-Video/Wan2.2 `wan/modules/model.py` + `attention.py`, unmodified, loaded outside the `wan`
package) in float32 on CPU, 1 thread, with the three replacements of spec §12 (plain diffusers
stand-ins, exact fp32 attention with flash-varlen key masking, autocast inactive on CPU), and Debian's
netlib reference BLAS as for wan-tiny-a (with OpenBLAS the tensors move by up to ~1.5e-6).
Generator note: {gen}.

What this adds over wan-tiny-a: model_type "i2v" with the conditioning `y` concatenated to `x` along
channels (in_dim 10 = 4 noisy + 2 mask + 4 image-latent channels), out_dim ≠ in_dim, a non-square grid
(3,2,3), and a padded text context (sample 1 has 3 of 8 rows).

Model (config.json, native field names, all fields written): i2v, dim 64, ffn_dim 128, freq_dim 32,
num_heads 4 (head_dim 16), num_layers 2, in_dim 10, out_dim 4, text_dim 32, text_len 8,
patch (1,2,2), eps 1e-6, qk_norm and cross_attn_norm true, window (-1,-1).

Seed {seed}: one `torch.Generator().manual_seed({seed})`; parameters drawn first in state_dict order
(`modulation` 0.1·N(0,1); biases incl. norm3.bias 0.05·N; norm_q/norm_k/norm3 weights 1 + 0.1·N;
other weights N(0,1)/sqrt(fan_in)), then inputs in the order x.0, x.1, frame 0 of y.0's image
channels, frame 0 of y.1's image channels, context (N(0,1); context rows beyond the length zeroed).

Command:

    {cmd}

## weights.safetensors
All 69 tensors of the official state_dict, native key names, F32, sorted keys, `__metadata__`
{{"format":"pt"}}.

## inputs.safetensors
| key | dtype, shape | meaning |
|---|---|---|
{inputs_table}

Call: `model([x.0, x.1], t=t_tokens, context=[context[0,:8], context[1,:3]], seq_len=18,
y=[y.0, y.1])`.

## expected.safetensors
| key | dtype, shape | meaning |
|---|---|---|
{expected_table}

Magnitudes:
{stats}

## Checks done when generating
Files read back bit-exactly; batched outputs equal per-sample calls with a 1-D t (bit-exactly;
≤ 1.7e-6 with OpenBLAS); passing y equals
pre-concatenating it into x; the trimmed context list equals the zero-padded one. Tolerance for an
fp32 port: atol 2e-5 (sinusoid and RoPE in float64) or 1e-4 otherwise.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wan-src", required=True,
                    help="folder holding the official Wan2.2 model.py and attention.py")
    ap.add_argument("--out", required=True, help="fixtures folder (gets wan-tiny-b, wan-tiny-i2v)")
    ap.add_argument("--check-a", default=None,
                    help="optional: wan-tiny-a folder to re-run as a harness sanity check")
    ap.add_argument("--system-blas", action="store_true",
                    help="do not switch to the netlib reference BLAS (results move by ~1e-6)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.backends.mkldnn.enabled = False  # Conv3d via the (reference-BLAS) slow path
    libs = blas_in_use()
    print("BLAS libraries mapped:", ", ".join(libs) or "?")
    if not any(os.path.dirname(lib) == REF_BLAS_DIRS[0] for lib in libs):
        print("WARNING: netlib reference BLAS not in use; results will differ from the shipped "
              "fixtures by ~1e-6 (install Debian's libblas3)")
    import warnings
    warnings.filterwarnings("ignore", message=".*CUDA.*")
    warnings.filterwarnings("ignore", message=".*autocast.*")

    wm = load_official(args.wan_src)
    blobs = {fn: git_blob_id(os.path.join(args.wan_src, fn)) for fn in ("model.py", "attention.py")}
    print("official sources (git blob ids):", blobs)
    for fn, bid in blobs.items():
        if bid != KNOWN_BLOBS[fn]:
            print("WARNING: %s differs from the version the shipped fixtures were made with" % fn)
    global GENERATOR_NOTE
    GENERATOR_NOTE += "; model.py blob %s, attention.py blob %s" % (blobs["model.py"][:12],
                                                                     blobs["attention.py"][:12])
    cmd = ("/usr/bin/python3 tools/golden/make_golden.py --wan-src /tmp/wanref --out tests/fixtures"
           "\n\n(run from the repository root; /tmp/wanref holds model.py and attention.py of "
           "Wan-Video/Wan2.2 wan/modules/, see tools/golden/README.md)")
    if args.check_a:
        check_tiny_a(wm, args.check_a)
    make_b(wm, args.out, cmd)
    make_i2v(wm, args.out, cmd)


if __name__ == "__main__":
    main()
