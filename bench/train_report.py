"""train_report.py: markdown tables of end-to-end training runs from their summary.json,
metrics.jsonl and bench.json (written by bench_train.sh). Usage: train_report.py RUN_DIR..."""
import json
import statistics
import sys


def load_run(d):
    meta = json.load(open(f"{d}/bench.json"))
    ranks = json.load(open(f"{d}/summary.json"))["ranks"]
    metrics = [json.loads(line) for line in open(f"{d}/metrics.jsonl") if line.strip()]
    steps = [m for m in metrics if "step" in m]
    evals = [m for m in metrics if "eval_step" in m]
    # The first logged window holds start-up (first batches, allocator warm-up): left out.
    steady = steps[1:] if len(steps) > 1 else steps
    students = [x for x in ranks if x["role"] == "student"]
    teachers = [x for x in ranks if x["role"] == "teacher"]
    n_steps = steps[-1]["step"] if steps else 0

    def per_step(seconds):
        return 1e3 * statistics.mean(seconds) / max(1, n_steps)

    return {
        **meta,
        "ranks": ranks,
        "steps": n_steps,
        "steady_samples_per_s": statistics.median(m["samples_per_s"] for m in steady),
        "steady_wait": statistics.median(m["wait_fraction"] for m in steady),
        "overall_samples_per_s": sum(x["samples"] for x in students)
        / max(x["seconds"] for x in students),
        "student_wait": statistics.mean(x["wait_fraction"] for x in students),
        "teacher_busy": statistics.mean(x["busy_fraction"] for x in teachers),
        "teacher_wait": statistics.mean(x["wait_fraction"] for x in teachers),
        # Per training step, the held-out batches' share included.
        "teacher_busy_ms": per_step(x["seconds"] * x["busy_fraction"] for x in teachers),
        "student_busy_ms": per_step(x["seconds"] * (1 - x["wait_fraction"]) for x in students),
        "student_wait_ms": per_step(x["seconds"] * x["wait_fraction"] for x in students),
        "rel_mse_before": evals[-1].get("rel_mse_before") if evals else None,
        "rel_mse_after": evals[-1]["rel_mse"] if evals else None,
    }


def mib(b):
    return f"{b / 2**20:.0f}"


def main(dirs):
    runs = [load_run(d) for d in dirs]
    print("## bench_train\n")
    print("| run | teacher | student | steps | wall s | samples/s steady (median) "
          "| samples/s overall | student wait % steady | student wait % run | teacher busy % "
          "| teacher wait % | peak RSS MiB (rank 0 / 1 / 2) | held-out rel MSE before → after "
          "| load before |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for r in runs:
        rss = " / ".join(mib(x["peak_rss_bytes"]) for x in r["ranks"])
        mse = (f"{r['rel_mse_before']:.4f} → {r['rel_mse_after']:.4f}"
               if r["rel_mse_after"] is not None else "n/a")
        print(f"| {r['name']} | {r['teacher']} | {r['student']} | {r['steps']} "
              f"| {r['wall_s']:.1f} | {r['steady_samples_per_s']:.1f} "
              f"| {r['overall_samples_per_s']:.1f} | {100 * r['steady_wait']:.0f} "
              f"| {100 * r['student_wait']:.0f} | {100 * r['teacher_busy']:.0f} "
              f"| {100 * r['teacher_wait']:.0f} | {rss} | {mse} | {r['load_before']:.2f} |")
    print("\nWhere the time goes, per training step (busy seconds / steps; the held-out batches "
          "and evaluations included):\n")
    print("| run | teacher busy ms/step | student busy ms/step (forward, backward, all-reduce, "
          "AdamW) | student wait ms/step |")
    print("|---|---:|---:|---:|")
    for r in runs:
        print(f"| {r['name']} | {r['teacher_busy_ms']:.1f} | {r['student_busy_ms']:.1f} "
              f"| {r['student_wait_ms']:.1f} |")
    print("\nPer rank (summary.json):\n")
    print("| run | rank | role | seconds | busy % | wait % | samples | peak RSS MiB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in runs:
        for x in r["ranks"]:
            print(f"| {r['name']} | {x['rank']} | {x['role']} | {x['seconds']:.1f} "
                  f"| {100 * x['busy_fraction']:.0f} | {100 * x['wait_fraction']:.0f} "
                  f"| {x['samples']:.0f} | {mib(x['peak_rss_bytes'])} |")


if __name__ == "__main__":
    main(sys.argv[1:])
