#!/usr/bin/env bash
# bench_train.sh: times the end-to-end distillation job (1 teacher + 2 students) for the tiny
# default and a larger CPU teacher, and prints markdown tables (bench/train_report.py) from each
# run's summary.json and metrics.jsonl.
#
#   bench/bench_train.sh [tiny|large|placement|all]
#
# `placement` runs the large teacher with one student rank three ways: teacher.placement cpu on
# one teacher rank, shard over 2 teacher ranks (2 pipeline stages), and stream (host buffers
# filled ahead by the copy thread), for throughput and per-rank peak RSS.
#
# Environment:
#   WD_BIN      the wan-distill binary (default: build/src/app/wan-distill)
#   WORK_DIR    run directories, the large teacher checkpoint and data set (default
#               /tmp/wd-bench-train); the checkpoint and data set are made once and reused
#   NP          ranks (default 3: 1 teacher + 2 students)
#   TINY_STEPS  steps of the tiny run (default 200);  LARGE_STEPS  of the large one (default 60)
# The job starts through launch/mpirun.sh, which runs each rank with one BLAS/OpenMP thread
# unless OMP_NUM_THREADS / OPENBLAS_NUM_THREADS say otherwise.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
which=${1:-all}
bin=${WD_BIN:-$repo/build/src/app/wan-distill}
work=${WORK_DIR:-/tmp/wd-bench-train}
np=${NP:-3}
tiny_steps=${TINY_STEPS:-200}
large_steps=${LARGE_STEPS:-60}

case "$which" in
  tiny | large | placement | all) ;;
  *)
    echo "usage: bench/bench_train.sh [tiny|large|placement|all]" >&2
    exit 2
    ;;
esac
if [[ ! -x $bin ]]; then
  echo "bench_train.sh: $bin not found; build wan-distill first or set WD_BIN" >&2
  exit 1
fi
mkdir -p "$work"

# The larger CPU teacher: the tiny preset's t2v shapes (16 latent channels, text 16 x 64) with
# 8 blocks of dim 512, so the data set and the message size stay those of the tiny job.
large_teacher=$work/teacher-d512-l8
large_data=$work/data-16x3x16x16-t16x64.h5
teacher_args=(--preset tiny --dim 512 --ffn-dim 2048 --num-heads 8 --num-layers 8 --dtype bf16)
data_args=(--latent 16,3,16,16 --text-len 16 --text-dim 64 --samples 72 --seed 0)

made=()
make_large_assets() {
  if [[ ! -f $large_teacher/config.json ]]; then
    "$bin" init-teacher "${teacher_args[@]}" --output "$large_teacher" --log.level warn
    made+=("$bin init-teacher ${teacher_args[*]} --output $large_teacher")
  fi
  if [[ ! -f $large_data ]]; then
    "$bin" make-dataset "${data_args[@]}" --output "$large_data" --log.level warn
    made+=("$bin make-dataset ${data_args[*]} --output $large_data")
  fi
}

commands=()
dirs=()
# run_job NAME TEACHER-LABEL STUDENT-LABEL FLAGS...: one training run in $work/NAME; appends its
# command to `commands` and writes NAME/bench.json (labels, load before, wall time) for
# train_report.py.
run_job() {
  local name=$1 teacher=$2 student=$3
  shift 3
  local dir=$work/$name
  mkdir -p "$dir"
  # metrics.jsonl is appended to by the job: start from an empty one. cache/ (the builtin tiny
  # teacher and data) is kept.
  rm -rf "$dir/metrics.jsonl" "$dir/summary.json" "$dir/student"
  local cmd=(bash "$repo/launch/mpirun.sh" -np "${JOB_NP:-$np}" "$bin" train --run-dir "$dir" "$@")
  commands+=("${cmd[*]}")
  local load_before start end
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  echo "bench_train.sh: ${cmd[*]}" >&2
  start=$(date +%s.%N)
  if ! "${cmd[@]}" >"$dir/train.log" 2>&1; then
    echo "bench_train.sh: the $name run failed; last lines of $dir/train.log:" >&2
    tail -20 "$dir/train.log" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  python3 -c 'import json, sys; n, t, s, l, a, b = sys.argv[1:]; print(json.dumps({"name": n,
    "teacher": t, "student": s, "load_before": float(l), "wall_s": float(b) - float(a)}))' \
    "$name" "$teacher" "$student" "$load_before" "$start" "$end" >"$dir/bench.json"
  dirs+=("$dir")
}

if [[ $which == tiny || $which == all ]]; then
  run_job tiny "builtin:tiny (t2v, 4 blocks, dim 128, bf16)" "dim 64, 2 layers, ffn 128" \
    --train.steps "$tiny_steps"
fi
if [[ $which == large || $which == all ]]; then
  make_large_assets
  run_job large "d512 (t2v, 8 blocks, dim 512, ffn 2048, bf16)" "dim 128, 2 layers, ffn 256" \
    --teacher.checkpoint "$large_teacher" --data.path "$large_data" \
    --student.dim 128 --student.num_heads 4 --student.num_layers 2 --student.ffn_dim 256 \
    --train.steps "$large_steps" --train.log_every 5
fi

if [[ $which == placement ]]; then
  make_large_assets
  large=(--teacher.checkpoint "$large_teacher" --data.path "$large_data"
    --student.dim 128 --student.num_heads 4 --student.num_layers 2 --student.ffn_dim 256
    --train.steps "$large_steps" --train.log_every 5 --train.eval_samples 8)
  JOB_NP=2 run_job place-cpu "d512, placement cpu, 1 teacher rank" "dim 128, 1 student" \
    "${large[@]}" --teacher.placement cpu
  JOB_NP=3 run_job place-shard "d512, placement shard, 2 stages (blocks 0-3, 4-7)" "dim 128, 1 student" \
    "${large[@]}" --teacher.placement shard --teacher.ranks 2
  JOB_NP=2 run_job place-stream "d512, placement stream (host as device), ahead 2" "dim 128, 1 student" \
    "${large[@]}" --teacher.placement stream
fi

python3 "$repo/bench/train_report.py" "${dirs[@]}"
cat <<'EOF'

Definitions: samples/s steady = median over the logged windows of metrics.jsonl (student rank 0;
the first window, which holds start-up, left out) of samples trained per second by all students;
overall = the students' trained samples / the slowest student's seconds (which include the
held-out evaluations). Wait % = time blocked in the transport; teacher busy % = reading, noising
and the teacher forward. Wall s = the whole mpirun: start-up and checkpoint save included.

Commands:

EOF
for c in "${made[@]}" "${commands[@]}"; do echo "- \`$c\`"; done
if ((${#made[@]} == 0)) && [[ $which != tiny ]]; then
  echo "- (teacher $large_teacher and data $large_data reused from an earlier run; made with"
  echo "  \`wan-distill init-teacher ${teacher_args[*]}\` and"
  echo "  \`wan-distill make-dataset ${data_args[*]}\`)"
fi
