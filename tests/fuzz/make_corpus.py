#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors (tests/fuzz/corpus/safetensors): a few small
valid files laid out as our writer lays them out, and one invalid file per validation rule, so
the fuzzer starts from inputs that reach every check. Deterministic; rerun after changing it."""
import json
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
         "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def raw(header_text, data=b"", length=None):
    """A file: 8-byte little-endian header length, the header bytes, the data section."""
    body = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack("<Q", len(body) if length is None else length) + body + data


def valid(tensors, metadata=None):
    """Like write_safetensors: sorted keys, data largest element first, header padded to 8."""
    order = sorted(tensors, key=lambda n: (-SIZES[tensors[n][0]], n))
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name in order:
        dtype, shape = tensors[name]
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        data += bytes((offset + i) % 251 for i in range(n))
        offset += n
    text = json.dumps(header, separators=(",", ":"), sort_keys=True)
    text += " " * ((8 - len(text) % 8) % 8)
    return raw(text, data)


def entry(name, dtype, shape, offsets):
    return json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": offsets}})[1:-1]


SEEDS = {
    # Valid files.
    "valid-empty": valid({}),
    "valid-one-f32": valid({"a": ("F32", [2])}, {"format": "pt"}),
    "valid-null-metadata": raw('{"__metadata__":null,' + entry("e", "I64", [0, 3], [0, 0]) + ","
                               + entry("s", "F32", [], [0, 4]) + "}", b"\0" * 4),
    "valid-every-dtype": valid({f"t.{d.lower()}": (d, [3]) for d in SIZES}),
    "valid-wan-block": valid({
        "blocks.0.self_attn.q.weight": ("BF16", [4, 4]),
        "blocks.0.self_attn.q.bias": ("BF16", [4]),
        "blocks.0.norm3.weight": ("F32", [4]),
        "patch_embedding.weight": ("F32", [4, 2, 1, 2, 2]),
        "time_embedding.0.bias": ("F16", [4]),
    }, {"format": "pt", "wan_distill_step": "12"}),
    # One rule broken each.
    "bad-short": b"\x05\0\0",
    "bad-length-past-end": raw("{}", length=100),
    "bad-huge-length": raw("{}", length=0xFFFFFFFFFFFFFFFF),
    "bad-json": raw('{"a": '),
    "bad-not-object": raw("[1, 2]"),
    "bad-leading-space": raw(" {}     "),
    "bad-duplicate": raw("{" + entry("a", "F32", [2], [0, 8]) + "," + entry("a", "F32", [2], [0, 8])
                         + "}", b"\0" * 8),
    "bad-metadata": raw('{"__metadata__":{"format":1}}'),
    "bad-dtype": raw("{" + entry("a", "F128", [2], [0, 8]) + "}", b"\0" * 8),
    "bad-shape": raw("{" + entry("a", "F32", [-2], [0, 8]) + "}", b"\0" * 8),
    "bad-reversed": raw("{" + entry("a", "F32", [2], [8, 0]) + "}", b"\0" * 8),
    "bad-size": raw("{" + entry("a", "F32", [3], [0, 8]) + "}", b"\0" * 8),
    "bad-overflow": raw("{" + entry("a", "F32", [4294967296, 4294967296, 0], [0, 0]) + "}"),
    "bad-bounds": raw("{" + entry("a", "F32", [4], [0, 16]) + "}", b"\0" * 8),
    "bad-overlap": raw("{" + entry("a", "F32", [2], [0, 8]) + "," + entry("b", "F32", [2], [4, 12])
                       + "}", b"\0" * 12),
    "bad-gap": raw("{" + entry("a", "F32", [2], [4, 12]) + "}", b"\0" * 12),
    "bad-trailing": raw("{" + entry("a", "F32", [2], [0, 8]) + "}", b"\0" * 12),
    "bad-deep": raw('{"a":' + "[" * 200 + "]" * 200 + "}"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, content in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(content)
    print(f"wrote {len(SEEDS)} seeds to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
