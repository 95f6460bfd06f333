#!/usr/bin/env bash
# One call on the GPU machine: environment, GPU tests, then the named benchmarks.
# Full logs go under $OUT (or ./out); a short summary is printed last.
#   bash tools/gpu_run.sh tests            # all `gpu` tests
#   TEST_PATHS="tests/test_torch_gpu.py tests/test_engine_gpu.py" bash tools/gpu_run.sh tests  # some
#   bash tools/gpu_run.sh tests bench      # tests, then AlexNet/ResNet-18 bench at 64 MiB
#   NETS=vgg16 bash tools/gpu_run.sh train # tools/train_bench.py (PyTorch training, native vs mucudnn.torch)
#   FRONTIER_ARGS="--precisions fp32" bash tools/gpu_run.sh frontier  # tools/frontier.py (time vs workspace limit)
#   bash tools/gpu_run.sh cold2 ddp        # two GPUs (nvidia-h200-x2): cold start on 2 vs 1, DDP
#   ZOO_MODELS="mobilenet_v2 convnext_tiny" bash tools/gpu_run.sh zoo   # tools/zoo_bench.py
#   ZOO_PRECISIONS=fp32cl bash tools/gpu_run.sh zoo-heldout   # the zoo on models never measured here
#   ZOO_MODELS="regnet_y_1_6gf resnet18" bash tools/gpu_run.sh zoo-ab  # default vs replay vs find_host
#   PARITY_MODELS="mobilenet_v2" bash tools/gpu_run.sh parity           # tools/search_parity.py
#   PARITY_ARGS="--over-limit 64MiB" PARITY_MODELS="convnext_tiny" bash tools/gpu_run.sh parity
#   COLD_ARGS="--jit-cache fresh" bash tools/gpu_run.sh cold  # cold start as on a never-used machine
#   STOP_ON_FAIL=1 TEST_PATHS=tests/test_torch_standin.py bash tools/gpu_run.sh tests zoo-cold
#       # a converted model's cold first steps (zoo_bench.py --cold), only if the tests pass
#   MUCUDNN_TORCH_NATIVE=0 PROFILE_MODELS=regnet_y_1_6gf bash tools/gpu_run.sh profile  # step_profile.py
#   PIN_CPUS=2-5 ZOO_ARGS="--with-control" bash tools/gpu_run.sh zoo  # on CPUs 2-5 alone
set -u -o pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/out}; OUT=$FINAL/logs; mkdir -p "$OUT"  # packed into logs.tgz at the end
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
# PIN_CPUS=2-5: every stage runs on those CPUs alone, every side of a benchmark
# alike (Note [pinned CPUs] in tools/train_steps.py; the result files record it)
if [ -n "${PIN_CPUS:-}" ]; then taskset -cp "$PIN_CPUS" $$ > /dev/null || exit 2; fi
# The benchmark cache comes back in logs.tgz; a copy placed at .carry/cache.sqlite
# (and named in the run's carry) starts the next machine warm.
export MUCUDNN_CACHE=$OUT/cache.sqlite
# Seed it: a carried cache, else the H200 measurements shipped as test data (same device
# name and cuDNN version: warm; anything else is measured and added).
if [ -f .carry/cache.sqlite ]; then cp .carry/cache.sqlite "$MUCUDNN_CACHE"
else gunzip -c tests/data/h200-benchmark-cache.sqlite.gz > "$MUCUDNN_CACHE"; fi
summary=()
# the name of a stage's files under $OUT: a second run of the stage (another call of
# this script under the same $OUT) keeps the first's files
fresh() { local run=$1 n=2; while [ -e "$OUT/$run.json" ]; do run=$1-$n; n=$((n + 1)); done; echo "$run"; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  python3 -c "import torch, numpy, cuda.bindings, mucudnn._cudnn as c; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__, 'cudnn', c.get_version())"
} > "$OUT/env.txt" 2>&1
summary+=("env: $(tr '\n' ' ' < "$OUT/env.txt")")
for stage in "$@"; do
  case "$stage" in
    tests)
      # -v: a hang or crash shows which test it was in (faulthandler dumps the stacks)
      timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -v -m gpu -p no:cacheprovider \
        -o faulthandler_timeout=60 ${PYTEST_ARGS:-} ${TEST_PATHS:-tests} > "$OUT/gpu-tests.log" 2>&1
      rc=$?
      summary+=("gpu tests (rc $rc): $(tail -1 "$OUT/gpu-tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -30 > "$OUT/gpu-failures.txt"
      # STOP_ON_FAIL=1: no benchmark of a tree whose GPU tests fail
      if [ "${STOP_ON_FAIL:-0}" = 1 ] && [ "$rc" != 0 ]; then summary+=("stopped: the GPU tests failed"); break; fi
      ;;
    bench|bench-graph|gbench)
      flag=""; [ "$stage" = bench-graph ] && flag="--graph"
      [ "$stage" = gbench ] && flag="--backend cudnn-graph"
      for net in ${NETS:-alexnet resnet18}; do
        timeout 300 python3 -m mucudnn bench --net "$net" --workspace 64MiB --no-progress $flag \
          --json "$OUT/$stage-$net.json" > "$OUT/$stage-$net.txt" 2>&1
        summary+=("$stage $net (rc $?): $(grep -E '^TOTAL|optimisation' "$OUT/$stage-$net.txt" | tr -s ' ' | tr '\n' ' ')")
      done
      ;;
    torch)
      timeout 300 python3 tools/pytorch_anchor.py --net ${NETS:-alexnet resnet18} \
        --json "$OUT/pytorch.json" > "$OUT/pytorch.txt" 2>&1
      summary+=("pytorch (rc $?): $(tr '\n' ' ' < "$OUT/pytorch.txt")")
      ;;
    paper)
      timeout "${PAPER_TIMEOUT:-540}" python3 tools/paper_experiment.py ${PAPER_ARGS:-} \
        --json "$OUT/paper.json" > "$OUT/paper.txt" 2>&1
      summary+=("paper (rc $?): $(grep -c '^|' "$OUT/paper.txt") table rows; last: $(grep '^\[' "$OUT/paper.txt" | tail -1)")
      ;;
    overhead)
      timeout "${OVERHEAD_TIMEOUT:-420}" python3 tools/bench_call_overhead.py ${OVERHEAD_ARGS:-} \
        --json "$OUT/overhead.json" > "$OUT/overhead.txt" 2>&1
      summary+=("overhead (rc $?):" "$(grep ' | ' "$OUT/overhead.txt")")
      ;;
    zoo|zoo-heldout)  # tools/zoo_bench.py: native vs converted, one child per model
      # zoo: the eleven models the issue's targets are read on; zoo-heldout: one or two of each
      # family that no run here has measured (a result counts where it holds on those too)
      if [ "$stage" = zoo ]; then
        models="mobilenet_v2 efficientnet_b0 resnext50_32x4d regnet_y_1_6gf densenet121 inception_v3 convnext_tiny resnet18 resnet50 alexnet vgg16"
      else
        models="mobilenet_v3_large efficientnet_v2_s mnasnet1_0 shufflenet_v2_x1_0 regnet_x_3_2gf resnext101_32x8d wide_resnet50_2 densenet169 googlenet convnext_small squeezenet1_1 deeplabv3_mobilenet_v3_large"
      fi
      run=$(fresh "$stage")
      timeout "${ZOO_TIMEOUT:-560}" python3 tools/zoo_bench.py --isolate --no-progress \
        --models ${ZOO_MODELS:-$models} \
        --precisions ${ZOO_PRECISIONS:-fp32cl amp} --execution eager graph ${ZOO_ARGS:-} \
        --max-seconds "${ZOO_MAX_S:-480}" --json "$OUT/$run.json" > "$OUT/$run.txt" 2> "$OUT/$run.log"
      summary+=("$run (rc $?):" "$(grep -E '^\||geometric' "$OUT/$run.txt")")
      ;;
    zoo-cold)  # tools/zoo_bench.py --cold: each side's first steps in fresh processes, medians
      # of COLD_REPEAT pairs (Note [cold steps] in tools/zoo_cold.py); no step timing
      run=$(fresh zoo-cold)
      timeout "${ZOO_TIMEOUT:-560}" python3 tools/zoo_bench.py --isolate --no-progress --cold \
        --no-steps --cold-repeat "${COLD_REPEAT:-2}" \
        --models ${ZOO_MODELS:-resnext50_32x4d convnext_tiny densenet121 resnet18 regnet_y_1_6gf} \
        --precisions ${ZOO_PRECISIONS:-fp32cl} ${ZOO_ARGS:-} --max-seconds "${ZOO_MAX_S:-480}" \
        --json "$OUT/$run.json" > "$OUT/$run.txt" 2> "$OUT/$run.log"
      summary+=("$run (rc $?):" "$(grep -E '^\||geometric' "$OUT/$run.txt")")
      ;;
    zoo-ab)  # the zoo on a few models, converted three ways: the default, replayed
      # launches (MUCUDNN_TORCH_REPLAY=1) and a find that counts the host
      # (find_host=True); each run has its own native side, so ratios compare
      models=${ZOO_MODELS:-regnet_y_1_6gf resnet18 resnext50_32x4d}
      for way in ${AB_WAYS:-default replay host}; do
        extra=(); replay=0
        case "$way" in
          replay) replay=1 ;;
          host) extra=(--backend-option find_host=True) ;;
        esac
        MUCUDNN_TORCH_REPLAY=$replay timeout "${ZOO_TIMEOUT:-170}" python3 tools/zoo_bench.py \
          --isolate --no-progress --models $models --precisions ${ZOO_PRECISIONS:-fp32cl amp} \
          --execution eager ${ZOO_ARGS:-} "${extra[@]}" --max-seconds "${ZOO_MAX_S:-140}" \
          --json "$OUT/zoo-ab-$way.json" > "$OUT/zoo-ab-$way.txt" 2> "$OUT/zoo-ab-$way.log"
        summary+=("zoo-ab $way (rc $?):" "$(grep -E '^\||geometric' "$OUT/zoo-ab-$way.txt")")
      done
      ;;
    parity)  # tools/search_parity.py: PyTorch's kernels per layer among mucudnn's candidates
      timeout "${PARITY_TIMEOUT:-400}" python3 tools/search_parity.py \
        --models ${PARITY_MODELS:-mobilenet_v2} --max-seconds 300 ${PARITY_ARGS:-} \
        --json "$OUT/parity.json" \
        > "$OUT/parity.txt" 2> "$OUT/parity.log"
      summary+=("parity (rc $?): $(grep -E '^[a-z0-9_]+: [0-9]+ of [0-9]+ held' "$OUT/parity.txt" | tr '\n' ' ')")
      ;;
    profile)  # tools/step_profile.py: where a step's GPU time goes, native vs converted
      for m in ${PROFILE_MODELS:-resnet18}; do
        timeout "${PROFILE_TIMEOUT:-300}" python3 tools/step_profile.py --model "$m" \
          ${PROFILE_ARGS:---precision fp32cl --modes native wr} --json "$OUT/profile-$m.json" \
          > "$OUT/profile-$m.txt" 2>&1
        summary+=("profile $m (rc $?):" "$(sed -n '1,/^Convolution ops/p' "$OUT/profile-$m.txt" | grep -E '^\|')")
      done
      ;;
    cold)  # tools/cold_start.py: cold optimisation per network, with PyTorch's first iteration
      timeout "${COLD_TIMEOUT:-560}" python3 tools/cold_start.py --torch ${COLD_ARGS:-} \
        --json "$OUT/cold.json" > "$OUT/cold.txt" 2>&1
      summary+=("cold (rc $?):" "$(grep '^|' "$OUT/cold.txt")")
      ;;
    train)  # tools/train_bench.py, one model per call (TRAIN_ARGS e.g. "--precisions amp")
      for net in ${NETS:-resnet50}; do
        timeout "${TRAIN_TIMEOUT:-560}" python3 tools/train_bench.py --models "$net" \
          --max-seconds "${TRAIN_MAX_S:-400}" ${TRAIN_ARGS:-} --json "$OUT/train-$net.json" \
          > "$OUT/train-$net.txt" 2>&1
        summary+=("train $net (rc $?): $(tail -25 "$OUT/train-$net.txt" | tr -s ' ' | tr '\n' ';')")
      done
      ;;
    frontier)  # tools/frontier.py: executed time per workspace limit, PyTorch's point; JSON, .md, PNG
      # SIGTERM from timeout stops the run in progress and still writes the figure and table
      timeout -k 30 "${FRONTIER_TIMEOUT:-560}" python3 tools/frontier.py \
        --max-seconds "${FRONTIER_MAX_S:-420}" ${FRONTIER_ARGS:-} --json "$OUT/frontier.json" \
        --figure "$OUT/frontier.png" > "$OUT/frontier.txt" 2>&1
      rc=$?; cp "$OUT"/frontier.png "$OUT"/frontier.md "$FINAL"/ 2>/dev/null  # also outside logs.tgz
      summary+=("frontier (rc $rc): $(grep -E '^\[' "$OUT/frontier.txt" | tail -1)" "$(grep '^|' "$OUT/frontier.txt")")
      ;;
    cold2)  # tools/cold_start.py on two GPUs (nvidia-h200-x2), then on one, in one call
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      for devs in 0,1 ""; do
        timeout "${COLD_TIMEOUT:-280}" python3 tools/cold_start.py --configs default \
          --nets ${NETS:-alexnet resnet18 resnet50} ${devs:+--devices $devs} \
          --json "$OUT/cold2-${devs:-one}.json" > "$OUT/cold2-${devs:-one}.txt" 2>&1
        summary+=("cold devices ${devs:-one GPU} (rc $?):" "$(grep -E '^\[|^\|' "$OUT/cold2-${devs:-one}.txt")")
      done
      ;;
    ddp)  # tools/ddp_bench.py under torchrun on every GPU of the host (nvidia-h200-x2)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      timeout "${DDP_TIMEOUT:-500}" python3 -m torch.distributed.run --standalone \
        --nproc-per-node "$(nvidia-smi -L | wc -l)" tools/ddp_bench.py ${DDP_ARGS:-} \
        --json "$OUT/ddp.json" > "$OUT/ddp.txt" 2>&1
      summary+=("ddp (rc $?):" "$(grep -E '^ddp|^  ' "$OUT/ddp.txt")")
      ;;
    *) echo "unknown stage $stage" ;;
  esac
done
printf '%s\n' "${summary[@]}" > "$OUT/summary.txt"
tar czf "$FINAL/logs.tgz" -C "$FINAL" logs && rm -rf "$OUT"
echo "==== failures"; tar xzOf "$FINAL/logs.tgz" logs/gpu-failures.txt 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
