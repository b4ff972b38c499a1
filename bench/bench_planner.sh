#!/usr/bin/env bash
# bench_planner.sh: the memory planner's accuracy. For each CPU job below, `wan-distill plan
# --cpu` predicts every rank's peak host memory before the run, then `train` runs on 3 ranks
# (1 teacher + 2 students) and each rank's lifetime peak RSS is read from summary.json. Prints
# a markdown table (predicted, measured, error per rank) and the commands.
#
#   bench/bench_planner.sh [STEPS]        (default 30 steps per job)
#
# Environment: WD_BIN (default build/src/app/wan-distill), WORK_DIR (default /tmp/wd-bench-planner).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-planner}
steps=${1:-30}
if [[ ! -x $bin ]]; then
  echo "bench_planner.sh: $bin not found; build wan-distill first or set WD_BIN" >&2
  exit 1
fi
mkdir -p "$work"

# Teachers larger than the builtin tiny one, on the tiny preset's t2v shapes (16 latent
# channels, text 16 x 64), so the builtin data set fits them all.
make_teacher() {  # NAME DIM FFN HEADS LAYERS
  local dir=$work/ckpt-$1  # not a job name: job directories are removed before each run
  if [[ ! -f $dir/config.json ]]; then
    "$bin" init-teacher --preset tiny --dim "$2" --ffn-dim "$3" --num-heads "$4" --num-layers "$5" \
      --dtype bf16 --output "$dir" --log.level warn >&2
  fi
  [[ -f $dir/config.json ]] || { echo "bench_planner.sh: no teacher in $dir" >&2; exit 1; }
  echo "$dir"
}
t256=$(make_teacher d256 256 1024 4 4)
t512=$(make_teacher d512 512 2048 8 8)
s256="--student.dim 256 --student.ffn_dim 1024 --student.num_heads 4 --student.num_layers 4"
s512="--student.dim 512 --student.ffn_dim 2048 --student.num_heads 8 --student.num_layers 8"

jobs=(
  "tiny|"
  "tiny-fp32-teacher|--teacher.dtype fp32"
  "student-d256|$s256"
  "student-d256-ckpt-all|$s256 --student.checkpointing all"
  "student-d256-ckpt-every2|$s256 --student.checkpointing every:2"
  "student-d256-batch4|$s256 --train.batch_size 4"
  "teacher-d256-student-d256|--teacher.checkpoint $t256 $s256"
  "teacher-d512|--teacher.checkpoint $t512"
  "student-d512|$s512"
)

rows=$work/rows.jsonl
: >"$rows"
for job in "${jobs[@]}"; do
  name=${job%%|*}
  read -r -a args <<<"${job#*|}"
  dir=$work/$name
  rm -rf "$dir"
  common=(--run-dir "$dir" --train.steps "$steps" --memory.report_every 0)
  "$bin" plan --cpu --np 3 --json "${common[@]}" "${args[@]}" >"$work/$name.plan.json"
  cmd=(bash "$repo/launch/mpirun.sh" -np 3 "$bin" train "${common[@]}" "${args[@]}")
  echo "bench_planner.sh: ${cmd[*]}" >&2
  start=$(date +%s.%N)
  if ! "${cmd[@]}" >"$work/$name.log" 2>&1; then
    echo "bench_planner.sh: $name failed; last lines of $work/$name.log:" >&2
    tail -20 "$work/$name.log" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  python3 - "$name" "$work/$name.plan.json" "$dir/summary.json" "$start" "$end" "${job#*|}" >>"$rows" <<'EOF'
import json, sys
name, plan_file, summary_file, start, end, flags = sys.argv[1:7]
plan = json.load(open(plan_file))
cpu = next(p for p in plan["placements"] if p["placement"] == "cpu")
ranks = json.load(open(summary_file))["ranks"]
print(json.dumps({"name": name, "flags": flags, "seconds": float(end) - float(start),
                  "teacher": cpu["teacher"], "student": cpu["student"], "ranks": ranks}))
EOF
done

python3 - "$rows" "$steps" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
mib = lambda b: b / 2**20
# The two measured constants (docs/placement.md, "Measured constants") were fitted on these
# ranks: the framework overhead on the tiny job's teacher, the backward transient on the
# dim-256 and dim-512 students. Every other rank checks the formulas around them.
fitted = {("tiny", "teacher"), ("student-d256", "student"), ("student-d512", "student")}
print("Formulas: the prediction less the fixed per-process constant (framework overhead), against the "
      "measured peak less the rank's RSS at the end of start-up (summary.json `start_rss_bytes`, before "
      "any model). Checked where the formulas predict at least half of the rank's total.\n")
print("| job | rank | role | fitted a constant | predicted MiB | measured peak RSS MiB | error | formulas MiB | measured peak - start-up MiB | formulas error |")
print("|---|---|---|---|---|---|---|---|---|---|")
worst = {True: 0.0, False: 0.0}
worst_formulas = {True: 0.0, False: 0.0}
for r in rows:
    for k in r["ranks"]:
        role = r[k["role"]]
        pred = role["host_bytes"]
        meas = k["peak_rss_bytes"]
        err = (pred - meas) / meas
        fit = (r["name"], k["role"]) in fitted
        worst[fit] = max(worst[fit], abs(err))
        formulas = pred - sum(i["host_bytes"] for i in role["items"] if i["name"] == "framework overhead")
        grown = meas - k.get("start_rss_bytes", 0)
        part = "-"
        if formulas >= 0.5 * pred and k.get("start_rss_bytes"):
            ferr = (formulas - grown) / grown
            worst_formulas[fit] = max(worst_formulas[fit], abs(ferr))
            part = f"{100*ferr:+.1f}%"
        print(f"| {r['name']} | {k['rank']} | {k['role']} | {'yes' if fit else 'no'} | {mib(pred):.1f} | {mib(meas):.1f} "
              f"| {100*err:+.1f}% | {mib(formulas):.1f} | {mib(grown):.1f} | {part} |")
n = sum(len(r["ranks"]) for r in rows)
print(f"\nlargest |error| of the total: {100*worst[False]:.1f}% on the ranks that fitted no constant, "
      f"{100*worst[True]:.1f}% on those that did ({n} ranks, {len(rows)} jobs of {sys.argv[2]} steps); "
      f"of the formulas alone: {100*worst_formulas[False]:.1f}% and {100*worst_formulas[True]:.1f}%\n")
print("Predicted breakdown (MiB) of the cpu placement:\n")
cats = ["teacher weights", "teacher activations", "transport buffers", "student weights", "gradients",
        "optimizer state", "student activations", "framework overhead"]
print("| job | role | " + " | ".join(cats) + " |")
print("|---|---|" + "---|" * len(cats))
for r in rows:
    for role in ("teacher", "student"):
        items = {i["name"]: i["host_bytes"] for i in r[role]["items"]}
        print(f"| {r['name']} | {role} | " + " | ".join(f"{mib(items[c]):.1f}" if items.get(c) else "-" for c in cats) + " |")
print("\nFlags of each job (after `train --run-dir DIR --train.steps N --memory.report_every 0`):\n")
for r in rows:
    print(f"- {r['name']} ({r['seconds']:.0f} s): `{r['flags'] or '(none: the tiny default)'}`")
EOF
