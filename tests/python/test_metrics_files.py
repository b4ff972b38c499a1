#!/usr/bin/env python3
"""metrics.jsonl against the TensorBoard event files, and tools/plot_run.py's PNGs.

Trains the builtin tiny job on 3 ranks (launch/mpirun.sh) and reads RUN_DIR/tensorboard/ back
with the tensorboard package's own reader (EventAccumulator, which also checks every record's
CRCs). Every scalar of metrics.jsonl must be there, as a float32, at its step and under the tag
docs/metrics.md gives it, and nothing else:
  1. a straight run: loss, lr, samples/s and wait every 2 steps, evaluations, per-rank memory;
     one run directory each for train, eval and memory, one file each; the first loss is read
     while training still runs (records are written whole, not buffered);
  2. a run that fails after its checkpoint of step 4 (a thrown error in step 7) and is resumed
     with --resume auto: metrics.jsonl then holds steps 4-6 twice; TensorBoard must show each
     step once, with the resumed process's value (the SessionLog START of each new file);
  3. tools/plot_run.py on the straight run: five PNGs, each a real image with something drawn.

Usage: .venv/bin/python tests/python/test_metrics_files.py WAN_DISTILL
Exit status 0 when everything agrees, 1 otherwise (also when a package is missing).
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "launch" / "mpirun.sh"
PLOT_RUN = ROOT / "tools" / "plot_run.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

try:
    from tensorboard.backend.event_processing import event_accumulator
    import matplotlib.image
except ImportError as e:
    sys.exit(f"FAIL: {e}; install launch/requirements.txt into .venv/ (bash launch/setup.sh venv)")

from wd_test_support import CPU_JOB, check, failures  # noqa: E402  (shared with the other Python tests)


def float32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def train_command(cli, run_dir, *extra):
    return ["bash", str(LAUNCHER), "-np", "3", cli, "train", "--run-dir", str(run_dir),
            "--train.log_every", "2", "--train.eval_every", "4", "--memory.report_every", "2", *CPU_JOB, *extra]


def run(label, command, fails=False, env=None):
    """Runs `command` and checks that it fails (`fails`) or succeeds; prints its output if not."""
    started = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    print(f"  {label}: exit {result.returncode} in {time.monotonic() - started:.1f} s")
    if not check((result.returncode != 0) == fails, f"{label}: exit {result.returncode}"):
        print(result.stdout[-4000:])
    return result


# --- what metrics.jsonl says TensorBoard must show ------------------------------------------------

RUN_OF = (("step", "train"), ("eval_step", "eval"), ("memory_step", "memory"))


def scalars_of_line(line):
    """{tag: value} of one metrics.jsonl line and its step, by the rule of docs/metrics.md."""
    for key, run_name in RUN_OF:
        if key in line:
            break
    else:
        return None, {}
    out = {}

    def walk(path, value):
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return
        if isinstance(value, (int, float)):
            out[path] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                if not k.endswith("step"):
                    walk(path if isinstance(v, list) else f"{path}/{k}", v)
        elif isinstance(value, list):
            for i, element in enumerate(value):
                if isinstance(element, dict) and isinstance(element.get("rank"), int):
                    walk(f"{path}/rank{element['rank']}", {k: v for k, v in element.items() if k != "rank"})
                else:
                    walk(f"{path}/{i}", element)

    walk(run_name, line)
    return line[key], out


def expected_scalars(run_dir):
    """{tag: {step: float32}}: a step written again (after a resume) keeps its later value."""
    expected, lines, seen_twice = {}, 0, 0
    with open(run_dir / "metrics.jsonl") as f:
        for text in f:
            step, scalars = scalars_of_line(json.loads(text))
            lines += 1
            for tag, value in scalars.items():
                series = expected.setdefault(tag, {})
                seen_twice += step in series
                series[step] = float32(value)
    return expected, lines, seen_twice


def tensorboard_scalars(run_dir):
    """{run: {tag: [(step, value)]}} as TensorBoard's reader loads RUN_DIR/tensorboard/<run>/."""
    runs = {}
    for run_path in sorted((run_dir / "tensorboard").iterdir()):
        acc = event_accumulator.EventAccumulator(str(run_path), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        runs[run_path.name] = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return runs


def compare(run_dir, label):
    expected, lines, seen_twice = expected_scalars(run_dir)
    runs = tensorboard_scalars(run_dir)
    check(set(runs) == {"train", "eval", "memory"}, f"{label}: runs {sorted(runs)}")
    shown = {}
    for run_name, tags in runs.items():
        for tag, points in tags.items():
            check(tag.startswith(run_name + "/"), f"{label}: tag {tag} in run {run_name}")
            check(tag not in shown, f"{label}: tag {tag} in two runs")
            shown[tag] = points
    for tag in ["train/loss", "train/lr", "train/samples_per_s", "train/wait_fraction", "eval/rel_mse",
                "eval/rel_mse_before"] + [f"memory/rank{r}/{k}" for r in range(3) for k in
                                          ("rss_bytes", "peak_rss_bytes", "weights_bytes", "grads_bytes",
                                           "optimizer_state_bytes")]:
        check(tag in shown, f"{label}: no tag {tag}")
    check(set(shown) == set(expected),
          f"{label}: tags only in TensorBoard {sorted(set(shown) - set(expected))}, "
          f"only in metrics.jsonl {sorted(set(expected) - set(shown))}")
    mismatches = 0
    for tag in sorted(set(shown) & set(expected)):
        want = sorted(expected[tag].items())
        if shown[tag] != want:
            mismatches += 1
            check(False, f"{label}: {tag}: TensorBoard {shown[tag]} != metrics.jsonl {want}")
    points = sum(len(p) for p in shown.values())
    print(f"  {label}: {lines} metrics.jsonl lines ({seen_twice} scalars of a step written twice), "
          f"{len(shown)} tags, {points} points in TensorBoard, {mismatches} tags differ")
    return runs, seen_twice


def straight_run(cli, work):
    """Case 1, with the first loss read while the job still runs."""
    run_dir = work / "straight"
    command = train_command(cli, run_dir, "--train.steps", "30")
    started = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    live_at = None
    train_dir = run_dir / "tensorboard" / "train"
    while job.poll() is None and live_at is None:
        if train_dir.is_dir():
            acc = event_accumulator.EventAccumulator(str(train_dir))
            acc.Reload()
            if "train/loss" in acc.Tags()["scalars"] and job.poll() is None:
                live_at = acc.Scalars("train/loss")[-1].step
        time.sleep(0.05)
    output = job.communicate()[0]
    print(f"  train, 30 steps: exit {job.returncode} in {time.monotonic() - started:.1f} s")
    if not check(job.returncode == 0, f"straight run: exit {job.returncode}"):
        print(output[-4000:])
        return run_dir
    check(live_at is not None, "straight run: no loss in the event file while the job ran")
    print(f"  read the loss of step {live_at} of 30 while the job ran")
    runs, seen_twice = compare(run_dir, "straight run")
    check(seen_twice == 0, "straight run: a step written twice")
    for run_name in runs:
        files = list((run_dir / "tensorboard" / run_name).iterdir())
        check(len(files) == 1 and "tfevents" in files[0].name, f"straight run: {run_name}/ holds {files}")
    return run_dir


def resumed_run(cli, work):
    """Case 2: a failure after the checkpoint of step 4, then --resume auto."""
    run_dir = work / "resumed"
    common = ["--train.steps", "10", "--checkpoint.every", "4"]
    # mpirun waits twice this grace after a rank's error before it returns.
    env = dict(os.environ, WD_KILL_GRACE="2")
    run("train, failing in step 7", train_command(cli, run_dir, *common, "--inject-fault", "throw@student:1:7"),
        fails=True, env=env)
    if run("train --resume auto", train_command(cli, run_dir, *common, "--resume", "auto")).returncode != 0:
        return
    _, seen_twice = compare(run_dir, "resumed run")
    check(seen_twice > 0, "resumed run: metrics.jsonl holds no step twice (the case tests nothing)")
    for run_name in ("train", "eval", "memory"):
        files = list((run_dir / "tensorboard" / run_name).iterdir())
        check(len(files) == 2, f"resumed run: {run_name}/ holds {len(files)} files, expected one per process")


def plots(run_dir, work):
    """Case 3."""
    out = work / "plots"
    result = subprocess.run([sys.executable, str(PLOT_RUN), str(run_dir), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not check(result.returncode == 0, f"plot_run.py exit {result.returncode}"):
        print(result.stdout)
        return
    for name in ("loss", "eval", "throughput", "memory", "overview"):
        png = out / f"{name}.png"
        if not check(png.is_file(), f"no {png}"):
            continue
        data = png.read_bytes()
        check(data.startswith(PNG_SIGNATURE), f"{png} is not a PNG")
        width, height = struct.unpack(">II", data[16:24])  # IHDR, the first chunk
        image = matplotlib.image.imread(str(png))
        # Lines and labels on a white page: many pixels differ from the background.
        drawn = (abs(image[..., :3] - 1.0).sum(axis=-1) > 0.1).mean()
        check(width >= 400 and height >= 300 and len(data) > 10_000 and drawn > 0.01,
              f"{png}: {width}x{height}, {len(data)} bytes, {100 * drawn:.1f}% drawn")
        print(f"  {name}.png: {width}x{height}, {len(data)} bytes, {100 * drawn:.1f}% of pixels drawn")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    cli = str(Path(sys.argv[1]).resolve())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wd-metrics-") as tmp:
        work = Path(tmp)
        run_dir = straight_run(cli, work)
        resumed_run(cli, work)
        plots(run_dir, work)
    print(f"{'FAIL' if failures else 'PASS'}: {len(failures)} failure(s) in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
