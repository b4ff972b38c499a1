#!/usr/bin/env python3
"""PNG plots of a training run, drawn from its RUN_DIR/metrics.jsonl (docs/metrics.md).

Writes, into --out (default RUN_DIR/plots):
  loss.png        the mean distillation loss over the students, and the learning rate
  eval.png        the held-out relative MSE at every evaluation
  throughput.png  samples/s and the fraction of time the students waited for batches
  memory.png      every rank's RSS (solid) and peak RSS since the previous report (dashed),
                  plus CUDA allocated memory where a rank used a device
  overview.png    the four side by side
A plot whose lines the run never wrote (memory.report_every 0, no held-out set) is left out,
with a note. After a resume, a step written twice (by the process that failed and by the one
that took over) is drawn once, with the later value, as TensorBoard shows it.

Usage: .venv/bin/python tools/plot_run.py RUN_DIR [--out DIR] [--dpi N]
"""

import argparse
import json
import sys
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError as e:
    sys.exit(f"plot_run: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

MIB = 1024.0 * 1024.0


def read_metrics(path):
    """Series from metrics.jsonl: train and eval {field: {step: value}}, memory {step: ranks}."""
    train, evals, memory = {}, {}, {}
    with open(path) as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_run: {path}:{n}: {e}")
            if "step" in line:
                for key in ("loss", "lr", "samples_per_s", "wait_fraction"):
                    if key in line:
                        train.setdefault(key, {})[line["step"]] = line[key]
            elif "eval_step" in line and "rel_mse" in line:
                evals.setdefault("rel_mse", {})[line["eval_step"]] = line["rel_mse"]
            elif "memory_step" in line:
                memory[line["memory_step"]] = line["ranks"]
    return train, evals, memory


def xy(series):
    steps = sorted(series)
    return steps, [series[s] for s in steps]


def draw_loss(ax, train):
    ax.plot(*xy(train["loss"]), marker=".", color="C0", label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("distillation loss (MSE)")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    if "lr" in train:
        lr = ax.twinx()
        lr.plot(*xy(train["lr"]), color="C1", alpha=0.6, label="learning rate")
        lr.set_ylabel("learning rate", color="C1")
        lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))


def draw_eval(ax, evals):
    ax.plot(*xy(evals["rel_mse"]), marker="o", color="C2")
    ax.set_xlabel("step")
    ax.set_ylabel("relative MSE")
    ax.set_title("held-out relative MSE")
    ax.grid(alpha=0.3)


def draw_throughput(ax, train):
    if "samples_per_s" in train:
        ax.plot(*xy(train["samples_per_s"]), marker=".", color="C0")
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s", color="C0")
    ax.set_title("throughput and waiting")
    ax.grid(alpha=0.3)
    if "wait_fraction" in train:
        wait = ax.twinx()
        steps, values = xy(train["wait_fraction"])
        wait.plot(steps, [100 * v for v in values], marker=".", color="C3", alpha=0.7)
        wait.set_ylabel("waiting for batches (%)", color="C3")
        wait.set_ylim(0, 100)


def draw_memory(ax, memory):
    steps = sorted(memory)
    ranks = sorted({r["rank"] for s in steps for r in memory[s]})
    roles = {r["rank"]: r.get("role", "") for s in steps for r in memory[s]}
    for i, rank in enumerate(ranks):
        colour = f"C{i % 10}"
        rows = [(s, next(r for r in memory[s] if r["rank"] == rank)) for s in steps
                if any(r["rank"] == rank for r in memory[s])]
        x = [s for s, _ in rows]
        ax.plot(x, [r["rss_bytes"] / MIB for _, r in rows], color=colour, marker=".",
                label=f"rank {rank} {roles[rank]}")
        ax.plot(x, [r["peak_rss_bytes"] / MIB for _, r in rows], color=colour, linestyle="--", alpha=0.6)
        device = [(s, r["device"]["allocated_bytes"] / MIB) for s, r in rows if r.get("device")]
        if device:
            ax.plot(*zip(*device), color=colour, linestyle=":", label=f"rank {rank} CUDA allocated")
    ax.set_xlabel("step")
    ax.set_ylabel("MiB")
    ax.set_title("memory per rank (dashed: peak RSS)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def save(fig, path, dpi):
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    print(f"plot_run: wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory (train --run-dir)")
    parser.add_argument("--out", type=Path, help="where the PNGs go (default RUN_DIR/plots)")
    parser.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100: 700x400 plots)")
    args = parser.parse_args()
    metrics = args.run_dir / "metrics.jsonl"
    if not metrics.is_file():
        sys.exit(f"plot_run: {metrics} does not exist (is {args.run_dir} a train --run-dir?)")
    train, evals, memory = read_metrics(metrics)
    out = args.out or args.run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)

    panels = [
        ("loss", "loss" in train, lambda ax: draw_loss(ax, train), "no step lines"),
        ("eval", bool(evals), lambda ax: draw_eval(ax, evals), "no evaluations (no held-out set)"),
        ("throughput", "samples_per_s" in train or "wait_fraction" in train,
         lambda ax: draw_throughput(ax, train), "no step lines"),
        ("memory", bool(memory), lambda ax: draw_memory(ax, memory), "no memory reports (memory.report_every 0)"),
    ]
    drawn = [p for p in panels if p[1]]
    for name, present, draw, why in panels:
        if not present:
            print(f"plot_run: {name}.png left out: {why}")
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        save(fig, out / f"{name}.png", args.dpi)
    if not drawn:
        sys.exit(f"plot_run: nothing to plot in {metrics}")
    cols = 2 if len(drawn) > 1 else 1
    rows = (len(drawn) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, (_, _, draw, _) in zip(axes.flat, drawn):
        draw(ax)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    fig.suptitle(str(args.run_dir.resolve().name))
    save(fig, out / "overview.png", args.dpi)


if __name__ == "__main__":
    main()
