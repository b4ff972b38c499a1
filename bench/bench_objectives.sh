#!/usr/bin/env bash
# The objectives' bench (docs/objectives.md#the-bench): a classes data set, a teacher trained on it
# with train.objective flow, and `evaluate`'s rows on the held-out contexts: the teacher guided (the
# reference), unguided, and guided at k steps (what a user runs instead of a distilled student);
# a guidance-distilled student (train.objective guided) sampled with no guidance; a k-step
# trajectory student (train.objective trajectory) at each of its checkpoints. Writes
# OUT_DIR/summary.json and prints a table.
# Usage: bash bench/bench_objectives.sh [OUT_DIR]   (BUILD_DIR=build, STEPS=8000, GUIDANCE=2, K=4,
#        SHIFT_K=3, TEACHER_EMA=0 (the flow teacher's train.ema_decay), TEACHER_DROPOUT=0.1 (its train.cond_dropout),
#        GUIDED_STEPS=1500 (0: none), SKIP_TRAIN=1 to reuse OUT_DIR/teacher-run/student,
#        SKIP_GUIDED=1 to reuse OUT_DIR/guided-run/student, GUIDED_LR=3e-4, GUIDED_EMA=0 (train.ema_decay),
#        GUIDED_EVERY=0 (>0: the student of every such checkpoint is sampled too), TRAJ_STEPS=1500 (0: none), SKIP_TRAJ=1 to reuse
#        OUT_DIR/traj-run, TRAJ_EVERY=250: the student of every such checkpoint is sampled for the curve,
#        TRAJ_LR=2e-4, TRAJ_EMA=0 (train.ema_decay), TRAJ_CACHE=DIR (the teacher's trajectories generated once into DIR,
#        reused by later runs with the same keys: TRAJ_LR, TRAJ_EMA and the student's keys may differ;
#        the student trains from it with no teacher, docs/teacher-cache.md), TRAJ_SEED (train.seed: another draw of trajectories; unset: the default), TRAJ_ROLLOUT=0 (train.trajectory_rollout), TRAJ_BLOCKS=0,1,2,3 (the teacher's blocks the trajectory student starts from: 0,2
#        for a half-depth one), TRAJ_LORA=0 (r > 0: a LoRA student instead, rank r and alpha r over the
#        teacher's frozen weights; TRAJ_BLOCKS is then not used), TRAJ_EXPERTS=0 (1, with TRAJ_LORA: the
#        teacher as a two-expert folder of two copies of itself (boundary 875), one LoRA run per expert
#        (student.expert high, low: traj-run-high, traj-run-low, TRAJ_STEPS each), each checkpoint's
#        pair sampled as the student; pair, with TRAJ_LORA: the same two-expert folder, one job training
#        both experts' adapters as a LoRA pair, traj-run); DMD_STEPS=0 (train.objective dmd critic steps; 0: none), SKIP_DMD=1 to reuse
#        OUT_DIR/dmd-run, DMD_EVERY=250 (each such checkpoint's student is sampled), DMD_K=K, DMD_LR=2e-5,
#        DMD_CRITIC_LR=1e-4, DMD_RATIO=5 (train.critic_ratio), DMD_START=simulate, DMD_EMA=0,
#        DMD_GUIDANCE=GUIDANCE (the real score's teacher.guidance in dmd: a sharper target than the reference's),
#        DMD_REG=0 (train.dmd_regression_weight: the generator also regresses to the teacher's trajectories),
#        DMD_GAN=0 and DMD_GEN_GAN=0 (critic.gan_weight, train.gan_weight: DMD2's GAN term),
#        DMD_INIT=teacher-blocks:... (student.init: weights:PATH starts the generator from, e.g., a
#        trajectory run's checkpoint student) and DMD_CRITIC_INIT=student (critic.init; teacher with DMD_INIT);
#        the sizes: CLASSES=6 SAMPLES=4288 HELD_OUT=192 LATENT=16,1,16,16 DIM=128 FFN=512 LAYERS=4
#        BATCH=16 TEACHER_STEPS=40; COND=i2v|ti2v: the image-conditioned bench (the data set's /condition
#        is each video's first frame, the flow teacher a student.model_type COND model; evaluate adds
#        condition_accuracy and first_frame_rel_mse; give LATENT with F >= 4 frames, e.g. 16,4,8,8);
#        tests/CMakeLists.txt's bench.objectives_toy runs it at toy size)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${WAN_DISTILL:-$PWD/${BUILD_DIR:-build}/src/app/wan-distill}
out=${1:-${BUILD_DIR:-build}/bench-objectives}
steps=${STEPS:-8000}
g=${GUIDANCE:-2}
guided_steps=${GUIDED_STEPS:-1500}
k=${K:-4}
shift_k=${SHIFT_K:-3}
py=${PYTHON:-$PWD/.venv/bin/python}
classes=${CLASSES:-6}
samples=${SAMPLES:-4288}
held_out=${HELD_OUT:-192}
latent=${LATENT:-16,1,16,16}
dims="--student.dim ${DIM:-128} --student.ffn_dim ${FFN:-512} --student.num_heads 4 --student.num_layers ${LAYERS:-4}"
blocks=$(seq -s, 0 $((${LAYERS:-4} - 1)))
batch=${BATCH:-16}
teacher_steps=${TEACHER_STEPS:-40}
mkdir -p "$out"
cd "$out"

# 6 classes of 16x1x16x16 latents, 8 context rows of 64; the last 192 samples are held out.
[[ -f classes.h5 ]] || "$bin" make-dataset --output classes.h5 --kind classes --classes "$classes" --samples "$samples" \
  --latent "$latent" --text-len 8 --text-dim 64 --seed 1 ${COND:+--image-condition "$COND"}
if [[ -z ${SKIP_TRAIN:-} ]]; then
  start=$SECONDS
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
    --run-dir teacher-run --data.path classes.h5 --train.objective flow --teacher.ranks 0 --train.cond_dropout "${TEACHER_DROPOUT:-0.1}" \
    ${COND:+--student.model_type "$COND"} \
    --train.ema_decay "${TEACHER_EMA:-0}" \
    $dims --train.batch_size "$batch" --train.eval_samples "$held_out" --train.steps "$steps" --train.lr 1e-3 \
    --train.warmup_steps $((steps < 2000 ? steps / 10 : 200)) \
    --train.log_every 200 --train.eval_every $((steps < 2000 ? steps : 2000)) --checkpoint.every $((steps < 2000 ? steps : 2000)) --runtime.threads 1 --student.device cpu \
    > teacher.log 2>&1
  echo "teacher trained in $((SECONDS - start)) s ($steps steps)"
fi
# Every row scored by `evaluate` on the 192 held-out samples (never trained on), from held-out
# noise (seed 7; the reference's second set: seed 8). The teacher's rows once, then each student
# against them (--reuse).
evaluate() {  # OUTPUT K [options]
  local dir=$1 steps=$2
  shift 2
  "$bin" evaluate --teacher.checkpoint teacher-run/student --data.path classes.h5 --count "$held_out" --seed 7 \
    --teacher.steps "$teacher_steps" --teacher.guidance "$g" --teacher.shift "$shift_k" --student.steps "$steps" --batch 64 \
    --runtime.threads 2 --log.level warn --output "$dir" "$@"
}
[[ -f eval/teacher/report.json ]] || evaluate eval/teacher "$k"
# Guidance distillation: a copy of the teacher (every block and tensor) learns the guided target,
# each of 2 ranks with its own teacher (colocated), and samples with one forward a step.
if ((guided_steps > 0)); then
  if [[ -z ${SKIP_GUIDED:-} ]]; then
    start=$SECONDS
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
      --run-dir guided-run --teacher.checkpoint teacher-run/student --data.path classes.h5 \
      --train.objective guided --teacher.guidance "$g" --teacher.placement colocated --teacher.compute fp32 \
      $dims --student.init "teacher-blocks:$blocks" --train.batch_size "$batch" --train.eval_samples "$held_out" \
      --train.steps "$guided_steps" --train.lr "${GUIDED_LR:-3e-4}" --train.ema_decay "${GUIDED_EMA:-0}" \
      --train.warmup_steps 50 --train.log_every 100 --train.eval_every 500 \
      $( ((${GUIDED_EVERY:-0} > 0)) && echo "--checkpoint.every ${GUIDED_EVERY} --checkpoint.keep 0") \
      --runtime.threads 1 --student.device cpu > guided.log 2>&1
    echo "guided student trained in $((SECONDS - start)) s ($guided_steps steps)"
  fi
  # 40 UniPC steps, no guidance: teacher_at_k becomes the teacher at 40 Euler steps here.
  evaluate eval/guided "$teacher_steps" --reuse eval/teacher --student guided-run/student --student.solver unipc
  if ((${GUIDED_EVERY:-0} > 0)); then
    for ck in guided-run/checkpoints/step-*; do
      evaluate "eval/guided-$((10#${ck##*step-}))" "$teacher_steps" --reuse eval/teacher --student "$ck/student" \
        --student.solver unipc
    done
  fi
fi
# Trajectory distillation: a copy of the teacher learns the jumps of the guided teacher's 40-step
# UniPC paths between its own k σ (shift SHIFT_K), every trajectory from fresh noise, each of 2
# ranks sampling its own (colocated); sampled with k Euler steps and no guidance. Every
# TRAJ_EVERY steps a checkpoint's student is sampled too: the curve of error against trajectories.
traj_steps=${TRAJ_STEPS:-1500}
traj_every=${TRAJ_EVERY:-250}
traj_blocks=${TRAJ_BLOCKS:-$blocks}
traj_dims="--student.dim ${DIM:-128} --student.ffn_dim ${FFN:-512} --student.num_heads 4 --student.num_layers $(tr ',' '\n' <<<"$traj_blocks" | wc -l)"
traj_student="$traj_dims --student.init teacher-blocks:$traj_blocks"
if ((${TRAJ_LORA:-0} > 0)); then traj_student="--student.lora_rank $TRAJ_LORA --student.lora_alpha $TRAJ_LORA"; fi
train_trajectory() {  # RUN_DIR LOG [options]
  local dir=$1 log=$2
  shift 2
  mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
    --run-dir "$dir" --data.path classes.h5 \
    --train.objective trajectory --teacher.guidance "$g" --teacher.steps "$teacher_steps" --teacher.shift "$shift_k" \
    --student.steps "$k" --teacher.placement colocated --teacher.compute fp32 \
    --train.batch_size "$batch" --train.eval_samples "$held_out" \
    --train.steps "$traj_steps" --train.lr "${TRAJ_LR:-2e-4}" --train.ema_decay "${TRAJ_EMA:-0}" --train.warmup_steps 50 --train.log_every 50 \
    --checkpoint.every "$traj_every" --checkpoint.keep 0 --runtime.threads 1 --student.device cpu "$@" > "$log" 2>&1
}
traj_teacher=teacher-run/student
if ((traj_steps > 0)) && [[ ${TRAJ_EXPERTS:-0} != 0 ]]; then
  # The pair: both experts are the teacher (the trajectories are the single teacher's), each
  # expert's adapters learn the intervals that start on its side of t 875 over its own (frozen)
  # weights: one run per expert (1), or both in one job (pair).
  mkdir -p teacher-pair
  for e in high low; do [[ -e teacher-pair/${e}_noise_model ]] || ln -s "$PWD/teacher-run/student" "teacher-pair/${e}_noise_model"; done
  traj_teacher=teacher-pair
fi
if ((traj_steps > 0)) && [[ ${TRAJ_EXPERTS:-0} == 1 ]]; then
  if [[ -z ${SKIP_TRAJ:-} ]]; then
    start=$SECONDS
    for e in high low; do
      train_trajectory "traj-run-$e" "traj-$e.log" --teacher.checkpoint teacher-pair --student.expert "$e" $traj_student &
    done
    wait
    echo "the two experts' LoRA students trained in $((SECONDS - start)) s ($traj_steps steps each, side by side)"
  fi
  for ck in traj-run-high/checkpoints/step-*; do
    n=$((10#${ck##*step-}))
    mkdir -p "pairs/$n"
    for e in high low; do
      ln -sfn "$PWD/traj-run-$e/checkpoints/${ck##*/}/student" "pairs/$n/${e}_noise_model"
    done
    evaluate "eval/trajectory-$n" "$k" --reuse eval/teacher --student "pairs/$n"
  done
elif ((traj_steps > 0)); then
  # The keys that decide the teacher's batches (a cache's identity) and the student's own.
  traj_keys=(--teacher.checkpoint "$traj_teacher" --data.path classes.h5
    --train.objective trajectory --teacher.guidance "$g" --teacher.steps "$teacher_steps" --teacher.shift "$shift_k"
    --student.steps "$k" --teacher.compute fp32 --train.batch_size "$batch" --train.eval_samples "$held_out"
    --train.steps "$traj_steps" --train.trajectory_rollout "${TRAJ_ROLLOUT:-0}" ${TRAJ_SEED:+--train.seed "$TRAJ_SEED"})
  # TRAJ_CACHE=DIR: the two colocated teachers' trajectories generated once into DIR (kept: the
  # next variant with the same keys reuses it), and the students train from it with no teacher.
  traj_source=(--teacher.placement colocated)
  if [[ -n ${TRAJ_CACHE:-} ]]; then
    if [[ ! -f $TRAJ_CACHE/index.json ]]; then
      start=$SECONDS
      mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" generate --run-dir traj-generate \
        "${traj_keys[@]}" $traj_student --runtime.threads 1 --student.device cpu --students 2 \
        --output "$TRAJ_CACHE" > traj-generate.log 2>&1
      echo "the teacher's trajectories generated in $((SECONDS - start)) s into $TRAJ_CACHE ($traj_steps steps of 2 students)"
    fi
    traj_source=(--teacher.ranks 0 --data.teacher_cache "$TRAJ_CACHE")
  fi
  if [[ -z ${SKIP_TRAJ:-} ]]; then
    start=$SECONDS
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
      --run-dir traj-run "${traj_keys[@]}" "${traj_source[@]}" $traj_student \
      --train.lr "${TRAJ_LR:-2e-4}" --train.ema_decay "${TRAJ_EMA:-0}" --train.warmup_steps 50 --train.log_every 50 \
      --checkpoint.every "$traj_every" --checkpoint.keep 0 --runtime.threads 1 --student.device cpu > traj.log 2>&1
    echo "trajectory student trained in $((SECONDS - start)) s ($traj_steps steps${TRAJ_CACHE:+, from $TRAJ_CACHE})"
  fi
  for ck in traj-run/checkpoints/step-*; do
    evaluate "eval/trajectory-$((10#${ck##*step-}))" "$k" --reuse eval/teacher --student "$ck/student"
  done
fi
# Distribution matching: a copy of the teacher (the generator) samples in DMD_K Euler steps, a
# second copy (the critic) learns its samples' flow, each of 2 ranks asks its own teacher
# (colocated) for the guided score at the generator's re-noised samples.
dmd_steps=${DMD_STEPS:-0}
dmd_k=${DMD_K:-$k}
if ((dmd_steps > 0)); then
  if [[ -z ${SKIP_DMD:-} ]]; then
    start=$SECONDS
    mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train \
      --run-dir dmd-run --teacher.checkpoint teacher-run/student --data.path classes.h5 \
      --train.objective dmd --teacher.guidance "${DMD_GUIDANCE:-$g}" --teacher.shift "$shift_k" --student.steps "$dmd_k" \
      --train.dmd_start "${DMD_START:-simulate}" --train.critic_ratio "${DMD_RATIO:-5}" --critic.lr "${DMD_CRITIC_LR:-1e-4}" \
      --teacher.placement colocated --teacher.compute fp32 \
      $dims --student.init "${DMD_INIT:-teacher-blocks:$blocks}" --critic.init "${DMD_CRITIC_INIT:-student}" \
      --train.batch_size "$batch" --train.eval_samples "$held_out" \
      --train.steps "$dmd_steps" --train.lr "${DMD_LR:-2e-5}" --train.min_lr 0 --train.ema_decay "${DMD_EMA:-0}" \
      --train.dmd_regression_weight "${DMD_REG:-0}" --teacher.steps "$teacher_steps" \
      --critic.gan_weight "${DMD_GAN:-0}" --train.gan_weight "${DMD_GEN_GAN:-0}" \
      --train.warmup_steps 50 --train.log_every 50 \
      --checkpoint.every "${DMD_EVERY:-250}" --checkpoint.keep 0 --runtime.threads 1 --student.device cpu > dmd.log 2>&1
    echo "dmd student trained in $((SECONDS - start)) s ($dmd_steps critic steps)"
  fi
  for ck in dmd-run/checkpoints/step-*; do
    evaluate "eval/dmd-$((10#${ck##*step-}))" "$dmd_k" --reuse eval/teacher --student "$ck/student"
  done
fi
"$py" - "$g" "$k" "$batch" <<'PY'
import glob, json, re, sys

g, k, batch = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
teacher = json.load(open("eval/teacher/report.json"))
rows = dict(teacher["rows"])
summary = {"guidance": g, "k": k, "frechet_floor": teacher["frechet_floor"], "rows": rows, "trajectory_curve": []}
try:
    rows["guided_student (UniPC, g 1)"] = json.load(open("eval/guided/report.json"))["rows"]["student"]
except FileNotFoundError:
    pass
summary["guided_curve"] = []
for path in sorted(glob.glob("eval/guided-*/report.json"), key=lambda p: int(re.search(r"guided-(\d+)", p)[1])):
    summary["guided_curve"].append({"step": int(re.search(r"guided-(\d+)", path)[1]), **json.load(open(path))["rows"]["student"]})
runs = sorted(glob.glob("eval/trajectory-*/report.json"), key=lambda p: int(re.search(r"trajectory-(\d+)", p)[1]))
for path in runs:
    step = int(re.search(r"trajectory-(\d+)", path)[1])
    r = json.load(open(path))["rows"]["student"]
    # 2 ranks x batch trained samples a step, each trajectory giving k of them; a pair of
    # expert runs (TRAJ_EXPERTS) trains twice that at each step, one run per expert.
    runs_per_step = 2 if glob.glob("traj-run-high") else 1
    summary["trajectory_curve"].append({"step": step, "trajectories": runs_per_step * step * 2 * batch // k, **r})
if runs:
    rows[f"trajectory_student ({k} Euler steps, g 1)"] = summary["trajectory_curve"][-1]
summary["dmd_curve"] = []
for path in sorted(glob.glob("eval/dmd-*/report.json"), key=lambda p: int(re.search(r"dmd-(\d+)", p)[1])):
    summary["dmd_curve"].append({"step": int(re.search(r"dmd-(\d+)", path)[1]), **json.load(open(path))["rows"]["student"]})
if summary["dmd_curve"]:
    rows["dmd_student (last checkpoint, g 1)"] = summary["dmd_curve"][-1]
json.dump(summary, open("summary.json", "w"), indent=2)
at_k = rows["teacher_at_k"]["paired_rel_mse"]
# An image-conditioned bench (COND) adds how each row continues its images.
cond = lambda r: (f" {100 * r['condition_accuracy']:>7.1f} {r['first_frame_rel_mse']:>11.2e}"
                  if "condition_accuracy" in r else "")
print(f"{'row':<40} {'paired':>8} {'median':>8} {'Fréchet':>8} {'class %':>8} {'strict %':>9} {'collapsed':>9}"
      + (f" {'cond %':>7} {'frame 0 err':>11}" if "condition_accuracy" in rows["reference"] else ""))
for name, r in rows.items():
    if "paired_rel_mse" not in r:
        print(f"{name:<40} {'-':>8} {'-':>8} {'-':>8} {100 * r['class_accuracy']:>8.1f} {100 * r['strict_accuracy']:>9.1f} "
              f"{'-':>9}{cond(r)}")
        continue
    print(f"{name:<40} {r['paired_rel_mse']:>8.4f} {r['paired_rel_mse_median']:>8.4f} {r['frechet']:>8.4f} "
          f"{100 * r['class_accuracy']:>8.1f} {100 * r['strict_accuracy']:>9.1f} {str(r['collapsed']):>9}{cond(r)}")
print(f"Fréchet floor {teacher['frechet_floor']:.4f}")
unguided = rows["teacher_unguided"]["paired_rel_mse"]
for c in summary["guided_curve"]:
    print(f"guided student after {c['step']:>6} steps: paired {c['paired_rel_mse']:.4f} = "
          f"{c['paired_rel_mse'] / unguided:.2f}x teacher_unguided, median {c['paired_rel_mse_median']:.4f}, "
          f"strict {100 * c['strict_accuracy']:.1f}%")
for c in summary["dmd_curve"]:
    d = c.get("diversity", {})
    div = (f", diversity pos {d['positions']:.2f} amp {d['amplitude']:.2f} pair {d['pair_distance']:.2f}" if d else "")
    print(f"dmd student after {c['step']:>6} critic steps: paired {c['paired_rel_mse']:.4f}, Fréchet {c['frechet']:.4f} = "
          f"{c['frechet'] / teacher['frechet_floor']:.2f}x floor, strict {100 * c['strict_accuracy']:.1f}%{div}")
for c in summary["trajectory_curve"]:
    print(f"trajectory student after {c['trajectories']:>6} trajectories: paired {c['paired_rel_mse']:.4f} = "
          f"{c['paired_rel_mse'] / at_k:.2f}x teacher_at_k, strict {100 * c['strict_accuracy']:.1f}%, Fréchet {c['frechet']:.4f}"
          + (f", condition {100 * c['condition_accuracy']:.1f}%" if "condition_accuracy" in c else ""))
PY
