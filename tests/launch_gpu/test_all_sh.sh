#!/usr/bin/env bash
# Checks launch/gpu/all.sh without a GPU: stand-ins for nvidia-smi, nvcc, Torch's python, cmake,
# ninja, ctest, mpirun, the build and the programs it makes exit with chosen codes, hang or print
# what the real ones print; every program copies summary.md when it starts, so the test sees the
# summary as it stood after each step. Also the toolkit shim of preflight.sh, the budget, a
# command killed mid-step, and the jobs a hung or killed step leaves behind.
# Usage: bash tests/launch_gpu/test_all_sh.sh   (CTest: gpu_script.all_sh; about 60 s)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wd-test-all-sh.XXXXXX")
fake=$tmp/bin
pids_file=$tmp/hung.pids
failures=0
checks=0

# The stand-ins that were told to hang, should any survive a failed check.
cleanup() {
  if [[ -f $pids_file ]]; then
    while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$pids_file"
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# alive PID: whether PID runs (a zombie, killed and waiting for its parent to reap it, does not).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}
# row FILE STEP: the status cell of STEP's row in the summary FILE.
row() { awk -F'|' -v s="$2" '$2 == " " s " " { sub(/^ /, "", $3); sub(/ $/, "", $3); print $3 }' "$1"; }
# expect FILE STEP REGEX: STEP's status in FILE matches REGEX.
expect() {
  checks=$((checks + 1))
  local got
  if [[ ! -f $1 ]]; then
    fail "$1 does not exist (looking for $2 ~ /$3/)"
    return
  fi
  got=$(row "$1" "$2")
  [[ $got =~ $3 ]] || fail "$(basename "$1"): step $2 is '$got', expected /$3/"
}
# expect_text FILE REGEX WHAT
expect_text() {
  checks=$((checks + 1))
  grep -qE -- "$2" "$1" 2>/dev/null || fail "$3: no /$2/ in $1"
}

# --- Stand-ins ---------------------------------------------------------------------------------
mkdir -p "$fake" "$tmp/cuda/bin" "$tmp/cuda/lib" "$tmp/cuda/include" "$tmp/nccl/lib" "$tmp/snap"
# A toolkit as pip's wheels leave it: libcudart.so.13 without libcudart.so.
: >"$tmp/cuda/lib/libcudart.so.13"
: >"$tmp/cuda/lib/libcublas.so.13"
ln -s libcublas.so.13 "$tmp/cuda/lib/libcublas.so"
: >"$tmp/nccl/lib/libnccl.so.2"
export FAKE_PIDS=$pids_file FAKE_SNAP=$tmp/snap

cat >"$tmp/cuda/bin/nvcc" <<'EOF'
#!/usr/bin/env bash
# nvcc: its version, or a "compile" that writes the object.
if [[ $* == *--version* ]]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
while (($#)); do [[ $1 == -o ]] && : >"$2"; shift; done
exit "${FAKE_NVCC_RC:-0}"
EOF

cat >"$fake/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# nvidia-smi: one H100; --query-gpu answers the fields asked for.
for a in "$@"; do
  if [[ $a == --query-gpu=* ]]; then
    line=
    IFS=, read -r -a fields <<<"${a#--query-gpu=}"
    for f in "${fields[@]}"; do
      case $f in
        name) v="NVIDIA H100 80GB HBM3" ;;
        driver_version) v=580.65.06 ;;
        memory.total) v="81559 MiB" ;;
        memory.used) v="0 MiB" ;;
        compute_mode) v=${FAKE_COMPUTE_MODE:-Default} ;;
        *) v=? ;;
      esac
      line+=${line:+, }$v
    done
    echo "$line"
    exit 0
  fi
done
echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |"
EOF

cat >"$fake/python" <<'EOF'
#!/usr/bin/env bash
# Torch's python: preflight's probe (on stdin) answered with FAKE_TORCH's version, or no torch.
[[ ${1:-} == -c ]] && exec python3 "$@"
cat >/dev/null
if [[ -z ${FAKE_TORCH:-} ]]; then echo "error=ModuleNotFoundError(\"No module named 'torch'\")"; exit 0; fi
echo "torch=$FAKE_TORCH"
echo "torch_cuda=13.0"
echo "cmake_prefix=/nonexistent/torch/share/cmake"
echo "wheel_libs="
echo "nccl=$FAKE_NCCL"
echo "cuda_available=True"
echo "device_count=1"
EOF

cat >"$fake/cmake" <<'EOF'
#!/usr/bin/env bash
[[ ${1:-} == --version ]] && { echo "cmake version 3.28.3"; exit 0; }
echo "[1/1] Linking CXX executable ($*)"
EOF

cat >"$fake/ninja" <<'EOF'
#!/usr/bin/env bash
[[ ${1:-} == --version ]] && { echo 1.11.1; exit 0; }
printf 'tests/test_nccl_mpi: CXX_EXECUTABLE_LINKER__test_nccl_mpi_Release\nall: phony\n'
EOF

# Every program a step runs: the build tree's (wan-distill, the benchmarks), ctest, mpirun.
cat >"$fake/fake-prog" <<'EOF'
#!/usr/bin/env bash
# Behaves per step (WD_GPU_STEP, set by all.sh) as the FAKE_* variables say.
name=$(basename "$0")
args=" $* "
step=${WD_GPU_STEP:-none}
rank=${OMPI_COMM_WORLD_RANK:-0}
[[ " $* " == *" --help "* ]] && { echo "--student.device --device --comm.backend"; exit 0; }
# The summary as this step found it: after the previous step, with this one "running".
[[ $rank == 0 && ! -f $FAKE_SNAP/$step.md ]] && cp "$OUT/summary.md" "$FAKE_SNAP/$step.md"
var() { local v="FAKE_${1}_$step"; echo "${!v:-}"; }
if [[ -n $(var UNKNOWN) ]]; then echo "error: unrecognised option '$(var UNKNOWN)'"; exit 1; fi
run_dir=
while (($#)); do [[ $1 == --run-dir ]] && run_dir=$2; shift; done
case $name in
  wan-distill)
    echo "step 200/200 loss 0.01234 lr 1.00e-04 512.3 samples/s wait 3% ETA 0 s"
    echo "eval after training: relative MSE 0.04321 (at step 1: 0.98765)"
    if [[ -n $run_dir && $rank == 0 ]]; then
      echo '{"fake": true}' >"$run_dir/summary.json"
      [[ $step == oom ]] && echo "out of memory on cuda:0 (fake)" >"$run_dir/diagnosis.txt"
    fi
    ;;
  bench_forward)
    echo "| size | weights | threads | batch | tokens | ms/forward | min ms | tokens/s | GFLOP/forward | GFLOP/s | MFU |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    echo "| wan22-ti2v-5b | bf16 | 1 | 1 | 8190 | 250 | 248 | 32760 | 107000.0 | 428000.0 | 43.3% |"
    if [[ $args == *" --profile-top 25 "* ]]; then
      echo "### Kineto: top 25 CUDA kernels of one forward (device time)"
      echo "| # | kernel | category | calls | total ms | % of kernel time |"
      echo "|---:|---|---|---:|---:|---:|"
      echo "| 1 | \`nvjet_fake_gemm\` | GEMM | 240 | 78.0 | 31.2% |"
    fi
    ;;
  bench_stream)
    echo "pinned host-to-device: 53.2 GB/s (1 GiB from cudaHostAlloc, best of 5)"
    echo "| placement | ahead | forward ms (median of 3) | vs gpu | compute waited for copies ms/forward | copied per forward | device buffers | device peak | staging ms/block | upload ms/block | plan's ratio |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    echo "| gpu | - | 52.0 | 1.00 | - | - | - | 20 GiB | - | - | - |"
    [[ $args == *" --aheads 2 "* ]] || echo "| stream | 1 | 56.1 | 1.08 | 0.4 | 1.9 GiB | 982 MiB | 21 GiB | - | 6.40 | 1.02 |"
    echo "| stream | 2 | 54.9 | 1.06 | 0.2 | 1.9 GiB | 1.3 GiB | 21 GiB | - | 6.41 | 1.02 |"
    ;;
  nccl_bandwidth)
    echo "| size | cudaMemcpy D2D | NCCL self send/recv | NCCL rank 0 -> 1 |"
    echo "|---:|---:|---:|---:|"
    echo "| 64 MiB | 1400.1 | 1300.2 | - |"
    echo "| 1024 MiB | 1500.3 | 1450.4 | - |"
    ;;
  ctest)
    if [[ " $* " == *json-v1* ]]; then
      echo "{\"tests\": [{\"name\": \"t\", \"command\": [\"/usr/bin/mpiexec\", \"$BUILD_DIR/tests/test_nccl_mpi\"]}]}"
      exit 0
    fi
    echo "100% tests passed, 0 tests failed out of 1"
    ;;
esac
if [[ -n $(var SLEEP) ]]; then
  [[ -n $(var IGNORE_TERM) ]] && trap '' TERM INT
  echo "$$" >>"$FAKE_PIDS"
  sleep "$(var SLEEP)" &
  echo "$!" >>"$FAKE_PIDS"
  wait
fi
rc_rank="FAKE_RC_${step}_RANK$rank"
rc_all="FAKE_RC_$step"
exit "${!rc_rank:-${!rc_all:-0}}"
EOF
cp "$fake/fake-prog" "$fake/ctest"

cat >"$fake/mpirun" <<'EOF'
#!/usr/bin/env bash
# mpirun: -np copies of the command with OMPI_COMM_WORLD_RANK; the highest exit code.
np=1
while (($#)); do
  case $1 in
    -np | -n) np=$2; shift 2 ;;
    --mca) shift 3 ;;
    -x | --bind-to) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
pids=()
for ((r = 0; r < np; r++)); do OMPI_COMM_WORLD_RANK=$r "$@" & pids+=($!); done
ignore="FAKE_IGNORE_TERM_${WD_GPU_STEP:-none}"
if [[ -n ${!ignore:-} ]]; then
  trap '' TERM INT
  echo "$$" >>"$FAKE_PIDS"
else
  trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
fi
rc=0
for p in "${pids[@]}"; do
  wait "$p"
  c=$?
  ((c > rc)) && rc=$c
done
exit $rc
EOF

cat >"$fake/fake-build" <<'EOF'
#!/usr/bin/env bash
# launch/gpu/build.sh: the programs of the build tree, as stand-ins.
echo "fake build: TARGETS=$TARGETS LOG_DIR=$LOG_DIR"
[[ -f $BUILD_DIR/preflight.env ]] || { echo "no preflight.env"; exit 1; }
for p in src/app/wan-distill bench/bench_forward bench/bench_stream bench/bench_checkpointing \
  bench/nccl_bandwidth tests/test_nccl_mpi; do
  mkdir -p "$BUILD_DIR/$(dirname "$p")"
  cp "$(dirname "$0")/fake-prog" "$BUILD_DIR/$p"
done
echo "export WD_GPU_PREFIX=$BUILD_DIR/prefix" >"$BUILD_DIR/gpu-env.sh"
echo "[1/2] Building CXX object"
echo "[2/2] Linking CXX executable"
exit "${FAKE_RC_build:-0}"
EOF
chmod +x "$fake"/* "$tmp/cuda/bin/nvcc"

export PATH=$fake:$tmp/cuda/bin:$PATH
export PYTHON=$fake/python WD_GPU_BUILD=$fake/fake-build FAKE_NCCL=$tmp/nccl
export FAKE_TORCH=2.11.0+cu130 KILL_AFTER=2 MIN_STEP_S=5

# all_sh NAME [VAR=VALUE...]: runs all.sh with its own logs folder ($tmp/NAME), OUT (what the
# device tool returns, $tmp/NAME-out) and build tree.
all_sh() {
  local name=$1
  shift
  rm -rf "$tmp/snap" && mkdir -p "$tmp/snap"
  env OUT="$tmp/$name-out" LOGS_DIR="$tmp/$name" BUILD_DIR="$tmp/build-$name" "$@" bash "$repo/launch/gpu/all.sh" >"$tmp/$name.stdout" 2>&1
}

# --- 1. Every step, one hung past its timeout, one cut off by the budget. ----------------------
t0=$SECONDS
all_sh one GPU_BUDGET_S=45 FAKE_RC_train_mpi_RANK1=1 FAKE_RC_oom=4 \
  FAKE_SLEEP_train_stream=300 FAKE_IGNORE_TERM_train_stream=1 TRAIN_STREAM_TIMEOUT=3 \
  FAKE_UNKNOWN_train_ckpt=--student.checkpointing FAKE_SLEEP_forward=300 FORWARD_TIMEOUT=300
rc=$?
one=$tmp/one
sum=$one/summary.md
echo "run 1: $((SECONDS - t0)) s, exit $rc"
[[ $rc == 0 ]] || fail "all.sh exited $rc (expected 0 once the summary is written)"
# The summary each step found when it started: the one before it final, itself running.
prev=build
for s in smi nccl_init nccl train train_mpi oom train_stream train_ckpt train_bf16 colocated forward; do
  snap=$tmp/snap/$s.md
  [[ $s == smi ]] && snap=  # nvidia-smi is not a stand-in that copies
  if [[ -n $snap ]]; then
    expect "$snap" "$s" '^running \(up to [0-9]+ s'
    expect "$snap" "$prev" '^(ok|failed|timed out|unknown flag)'
  fi
  prev=$s
done
expect "$tmp/snap/nccl_init.md" smi '^ok$'
expect "$tmp/snap/nccl_init.md" train '^not reached$'
expect "$sum" preflight '^ok$'
expect "$sum" build '^ok$'
expect "$sum" smi '^ok$'
expect "$sum" nccl_init '^ok$'
expect "$sum" nccl '^ok$'
expect "$sum" train '^ok$'
expect "$sum" train_mpi '^failed$'
expect "$sum" oom '^ok \(exit 4 on every rank, as documented\)$'
expect "$sum" train_stream '^timed out after 3 s; [0-9]+ leftover process\(es\) killed$'
expect "$sum" train_ckpt "^unknown flag \(unrecognised option '--student.checkpointing'\)$"
expect "$sum" train_bf16 '^ok$'
expect "$sum" colocated '^ok$'
expect "$sum" forward '^timed out after [0-9]+ s$'
expect "$sum" stream '^not run \(budget'
expect "$sum" checkpointing '^not run \(budget'
expect "$sum" ctest_gpu '^not run \(budget'
expect_text "$sum" '\| nccl \| ok \| 0 \|.*1024 MiB: cudaMemcpy D2D 1500.3 GB/s, NCCL to self 1450.4 GB/s' "nccl's figures"
expect_text "$sum" '\| train_mpi \| failed \| 1 \|.*rank:exit 0:0 1:1' "train_mpi's figures"
expect_text "$sum" '\| train \| ok \| 0 \|.*step 200/200 loss 0.01234 512.3 samples/s; relative MSE 0.04321; rank:exit 0:0 1:0' "train's figures"
expect_text "$sum" '\| forward \|.*250 ms/forward, 428000.0 GFLOP/s, MFU 43.3%' "forward's figures, from a step cut off"
expect_text "$sum" '\| preflight \| ok \|.*torch 2.11.0\+cu130.*compute mode Default, libcudart: shim' "preflight's figures"
# shellcheck disable=SC2016  # backquotes of the markdown
expect_text "$sum" 'Not run here: `STEPS="stream checkpointing ctest_gpu" bash launch/gpu/all.sh`' "the next command"
expect_text "$sum" 'GPU: NVIDIA H100 80GB HBM3 x1, compute mode Default' "the GPU line"
expect_text "$one/build.log" 'TARGETS=bench_checkpointing bench_forward bench_stream nccl_bandwidth test_nccl_mpi wan-distill' "the build's targets"
expect_text "$one/oom.diagnosis.txt" 'out of memory' "oom's diagnosis copied"
expect_text "$one/train.summary.json" 'fake' "train's summary.json copied"
expect_text "$one/preflight.log" 'WARN|ok +libcudart +shim' "preflight's log"
for s in preflight build smi nccl_init nccl train train_mpi oom train_stream train_ckpt train_bf16 colocated forward; do
  checks=$((checks + 1))
  [[ -s $one/$s.log && ! -L $one/$s.log ]] || fail "no log $one/$s.log (or still a link into OUT)"
done
# OUT holds what the device tool returns (at most 8 files): the summary and the packed logs.
checks=$((checks + 1))
[[ $(cd "$one-out" && find . -type f | sort | paste -sd' ') == "./logs.tar.gz ./summary.md" ]] ||
  fail "OUT holds $(cd "$one-out" && find . | sort | paste -sd' '), not just summary.md and logs.tar.gz"
checks=$((checks + 1))
cmp -s "$sum" "$one-out/summary.md" || fail "OUT's summary.md differs from the logs folder's"
packed=$(tar -tzf "$one-out/logs.tar.gz" 2>/dev/null | sed 's|^\./||' | sort | paste -sd' ')
for f in build.log train.log train.summary.json oom.diagnosis.txt forward.log; do
  checks=$((checks + 1))
  [[ " $packed " == *" $f "* ]] || fail "logs.tar.gz lacks $f (has: $packed)"
done
# The toolkit shim: libcudart.so added, pointing at the versioned file; nvcc called through it.
shim=$tmp/build-one/cuda-shim
checks=$((checks + 1))
[[ $(realpath "$shim/lib/libcudart.so" 2>/dev/null) == "$(realpath "$tmp/cuda/lib/libcudart.so.13")" ]] ||
  fail "the shim's libcudart.so does not lead to the toolkit's libcudart.so.13"
checks=$((checks + 1))
[[ -x $shim/bin/nvcc && -L $shim/lib64 && -e $shim/lib/libcublas.so ]] || fail "the shim lacks bin/nvcc, lib64 or libcublas.so"
expect_text "$tmp/build-one/preflight.env" "^WD_NVCC=$shim/bin/nvcc\$" "preflight.env names the shim's nvcc"
# The hung job (setsid'd mpirun ignoring TERM, and its ranks) is gone.
sleep 0.5
while read -r pid; do
  checks=$((checks + 1))
  alive "$pid" && fail "process $pid of the hung step still runs: $(ps -o pid=,ppid=,pgid=,stat=,args= -p "$pid")"
done <"$pids_file"
: >"$pids_file"

# --- 2. The whole command killed mid-step (the device's 10-minute limit). ---------------------
# all.sh is killed outright once its summary shows train running; what the summary says then is
# what a cut-off command returns.
rm -rf "$tmp/snap" && mkdir -p "$tmp/snap"
sum=$tmp/two-out/summary.md
OUT=$tmp/two-out LOGS_DIR=$tmp/two BUILD_DIR=$tmp/build-two FAKE_SLEEP_train=300 FAKE_IGNORE_TERM_train=1 \
  bash "$repo/launch/gpu/all.sh" >"$tmp/two.stdout" 2>&1 &
two_pid=$!
for _ in $(seq 600); do
  [[ $(row "$sum" train 2>/dev/null) == running* ]] && break
  sleep 0.1
done
sleep 0.5
kill -KILL "$two_pid"
wait "$two_pid" 2>/dev/null
expect "$sum" nccl '^ok$'
expect "$sum" train '^running \(up to [0-9]+ s; if this stays, the command was cut off here\)$'
expect "$sum" oom '^not reached$'
# shellcheck disable=SC2016
expect_text "$sum" 'Not run here: `STEPS="train train_mpi oom' "the next command after a cut-off"
# What a cut-off command returns: the running step's log as it stood, and the steps before it.
expect_text "$tmp/two-out/train.log" '^# .*wan-distill train' "the running step's log in OUT"
checks=$((checks + 1))
# The listing is read whole first: `tar | grep -q` under pipefail fails whenever grep exits on
# its match before tar has written the rest (tar's SIGPIPE), which happened under load in CI.
packed=$(tar -tzf "$tmp/two-out/logs.tar.gz" 2>&1)
grep -qx '\./nccl\.log' <<<"$packed" || fail "run 2's logs.tar.gz lacks nccl.log (tar -tzf: $(paste -sd' ' <<<"$packed"))"
checks=$((checks + 1))
[[ -s $pids_file ]] || fail "run 2 left no hung process to find (the stand-in did not start?)"

# --- 3. No torch: preflight fails, nothing else runs; run 2's job is ended at the start. -------
all_sh three FAKE_TORCH=
sum=$tmp/three/summary.md
expect "$sum" preflight '^failed$'
expect "$sum" build '^not run$'
expect "$sum" train '^not run$'
expect_text "$tmp/three/preflight.log" 'FAIL +torch +.*cannot import torch' "preflight names the missing torch"
sleep 0.5
while read -r pid; do
  checks=$((checks + 1))
  alive "$pid" && fail "process $pid left by the killed command still runs after the next one started: $(ps -o pid=,ppid=,pgid=,stat=,args= -p "$pid")"
done <"$pids_file"
: >"$pids_file"

# --- 4. An exclusive compute mode: the multi-process steps are skipped, one-rank ones run. ----
all_sh four FAKE_COMPUTE_MODE=Exclusive_Process STEPS="smi train colocated"
sum=$tmp/four/summary.md
expect "$sum" smi '^ok$'
expect "$sum" train '^skipped$'
expect "$sum" colocated '^ok$'
expect_text "$sum" 'compute mode Exclusive_Process: 2 processes cannot share the GPU' "why train was skipped"
expect_text "$tmp/four/preflight.log" 'WARN +compute-mode +Exclusive_Process' "preflight warns about the compute mode"
# --- 4b. The i2v twins of trajectory and dmd: a tiny i2v teacher made first, each train step on it.
all_sh six STEPS="trajectory_i2v dmd_i2v"
sum=$tmp/six/summary.md
expect "$sum" trajectory_i2v '^ok$'
expect "$sum" dmd_i2v '^ok$'
expect_text "$tmp/six/trajectory_i2v.init.log" 'step 200/200' "the i2v teacher's init-teacher ran"
expect_text "$sum" 'teacher.checkpoint [^ ]*/i2v-teacher .*train.objective dmd' "dmd_i2v's command takes the i2v teacher"
# --- 4c. Sequence parallelism: a group of two sharing the one GPU (MPI); the NCCL twin needs two.
all_sh seven STEPS="sequence_parallel sequence_parallel_nccl"
sum=$tmp/seven/summary.md
expect "$sum" sequence_parallel '^ok$'
expect "$sum" sequence_parallel_nccl '^skipped$'
expect_text "$sum" 'needs 2 GPUs \(1 visible\)' "why sequence_parallel_nccl was skipped"
expect_text "$sum" 'student.sequence_parallel 2 --comm.backend mpi' "sequence_parallel's command"
# --- 4c'. ZeRO over NCCL needs the students on two GPUs: skipped with its reason on one.
all_sh seven_b STEPS="shard_optimizer_nccl shard_gradients_nccl"
sum=$tmp/seven_b/summary.md
expect "$sum" shard_optimizer_nccl '^skipped$'
expect "$sum" shard_gradients_nccl '^skipped$'
expect_text "$sum" 'shard_gradients_nccl \| skipped .*needs 2 GPUs \(1 visible\)' "why shard_gradients_nccl was skipped"
# --- 4d. The profile step (issue 46): kernels, blocks and streaming at real dims in one file.
all_sh eight STEPS="profile"
sum=$tmp/eight/summary.md
expect "$sum" profile '^ok$'
expect_text "$sum" '\| profile \| ok \| 0 \|.*H2D 53.2 GB/s; 5B forward 250 ms, MFU 43.3%; stream ahead 2 \(5B 480p, 5B 720p, 5B no arena, A14B\): 1.06x \(plan 1.02x\), 1.06x \(plan 1.02x\), 1.06x \(plan 1.02x\), 1.06x \(plan 1.02x\); top kernel nvjet_fake_gemm 31.2%' "profile's figures"
expect_text "$tmp/eight/build.log" 'TARGETS=bench_forward bench_stream LOG_DIR' "the profile step's targets"
prof=$tmp/eight/profile.md
# shellcheck disable=SC2016  # backquotes of the markdown
expect_text "$prof" '^`bench_forward --device cuda --sizes wan22-ti2v-5b .*--profile-top 25 --profile-trace .*/profile.trace.json`$' "the Kineto forward's command"
expect_text "$prof" '^## Stream: TI2V-5B blocks, 27,280 tokens \(720p\)' "the 720p stream part"
# shellcheck disable=SC2016
expect_text "$prof" '^`bench_stream .*--preset wan22-ti2v-5b --blocks 6 .*--arena-limit 0 --copy-threads 4 --aheads 2`$' "the fallback part"
expect_text "$prof" '^`bench_stream .*--preset wan22-t2v-a14b --blocks 4 ' "the A14B part"
# shellcheck disable=SC2016
expect_text "$prof" '^\| 1 \| `nvjet_fake_gemm` \| GEMM' "the kernel table in profile.md"
packed=$(tar -tzf "$tmp/eight-out/logs.tar.gz" 2>/dev/null | sed 's|^\./||' | sort | paste -sd' ')
checks=$((checks + 1))
[[ " $packed " == *" profile.md "* ]] || fail "logs.tar.gz lacks profile.md (has: $packed)"
checks=$((checks + 1))
env OUT="$tmp/five" STEPS="smi bogus" bash "$repo/launch/gpu/all.sh" >/dev/null 2>&1
[[ $? == 2 ]] || fail "an unknown step is not refused with exit 2"

echo "$checks checks, $failures failed ($SECONDS s)"
if ((failures)); then
  for f in one two three four seven eight; do
    [[ -f $tmp/$f/summary.md ]] && { echo "--- $f/summary.md"; cat "$tmp/$f/summary.md"; }
  done
  exit 1
fi
