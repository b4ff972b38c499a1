#!/usr/bin/env python3
"""An independent reference for train.objective guided's target.

tests/reference/dump_guided runs the teacher stage with guidance on a fixture teacher
(tests/fixtures/wan-tiny-a, or wan-tiny-i2v with its image condition y: the official model's
weights and inputs) and a random 3-row negative context, in micro-batches. Here diffusers'
WanTransformer3DModel, with the same weights, computes the conditional and the negative velocity
in two separate forwards (an i2v model's input is [x; y] in both, as WanImageToVideoPipeline
concatenates it), and v_neg + g*(v_cond - v_neg) must equal the dump's target to 1e-5 relative
(max|a - b| / max|b|).

usage: test_guided_reference.py DUMP_FILE [FIXTURE]   (FIXTURE: wan-tiny-a, the default, or wan-tiny-i2v)
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

from wd_test_support import diffusers_model, padded_context  # noqa: E402

TOLERANCE = 1e-5


def main():
    torch.set_num_threads(1)
    dump = load_file(sys.argv[1])
    fixture = ROOT / "tests" / "fixtures" / (sys.argv[2] if len(sys.argv) > 2 else "wan-tiny-a")
    cfg = json.loads((fixture / "config.json").read_text())
    model = diffusers_model(cfg, load_file(fixture / "weights.safetensors"))
    x, t, g = dump["x"], dump["t"], float(dump["guidance"][0])
    if cfg["model_type"] == "i2v":
        if "y" not in dump:
            print(f"FAIL: {sys.argv[1]} has no y for the i2v fixture {fixture.name}")
            return 1
        x = torch.cat([x, dump["y"]], dim=1)
    batch = x.shape[0]
    negative = dump["negative"][None].expand(batch, -1, -1)
    with torch.no_grad():
        cond = model(x, t, padded_context(dump["context"], dump["context_lens"], cfg["text_len"]), return_dict=False)[0]
        neg = model(x, t, padded_context(negative, torch.full((batch,), negative.shape[1]), cfg["text_len"]),
                    return_dict=False)[0]
    want = neg + g * (cond - neg)
    got = dump["out"]
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    # The guided target is not the conditional one: a check that would pass for plain forwards fails.
    apart = ((cond.double() - want.double()).abs().max() / want.double().abs().max()).item()
    print(f"{fixture.name}: guided target (g = {g}) against diffusers' v_neg + g*(v_cond - v_neg): {err:.2e} relative "
          f"(the conditional velocity alone is {apart:.2e} away)")
    if not err <= TOLERANCE or not apart > 100 * TOLERANCE:
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
