#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after tools/device/prepare.sh here:
#   tools/device/run.sh [tests] [sanitize] [train] [lm] [crash] [plan] [bench] [bench16] [w6] [numerics] [onnx]
#                       [onnx_models] [python] [scale] [ab] ...
#   (default: tests train)
# Writes a few logs under $OUT (or out/ when $OUT is unset; at most 8 files come back
# from the GPU machine) and prints a short summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/.cache}
# NCCL (gradient sums over GPUs) from PyTorch's wheel where CUDA's folder has none.
[ -z "${SEAM_NCCL:-}" ] && export SEAM_NCCL=$(find /opt/torch -name 'libnccl.so.2' 2>/dev/null | head -1)
bin=.deps/bin
[ -f .deps/bin.tar.xz ] && tar -C .deps -xJf .deps/bin.tar.xz  # packed by prepare.sh
data=.deps/fashion-mnist
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests train)
summary=()
note() { summary+=("$1"); echo "== $1"; }

{
  echo "commit: $(cat .deps/commit 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
  "$bin/seam" --version
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

for step in "${steps[@]}"; do
  case "$step" in
    tests)
      # The gpu-labelled tests (one binary holds all of them), against the CPU reference.
      "$bin/seam_gpu_tests" > "$out/gpu_tests.log" 2>&1
      rc=$?
      note "gpu tests: rc=$rc, $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \]' "$out/gpu_tests.log" | head -30
      ;;
    sanitize)
      # Both tools over the gpu tests (SEAM_SANITIZE_FILTER narrows them), each bounded in
      # time: the sanitizers slow kernels down by one or two orders of magnitude.
      # SEAM_SANITIZE_TOOLS picks the tools (default both).
      filter=${SEAM_SANITIZE_FILTER:-*}
      for tool in ${SEAM_SANITIZE_TOOLS:-memcheck racecheck}; do
        timeout "${SEAM_SANITIZE_SECONDS:-240}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
          "$bin/seam_gpu_tests" --gtest_filter="$filter" > "$out/sanitize_$tool.log" 2>&1
        rc=$?
        note "compute-sanitizer $tool: rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1)"
      done
      ;;
    train)
      # The examples on the GPU (SEAM_TRAIN_MODELS, at SEAM_TRAIN_PRECISION if set: the
      # model files' own otherwise); epoch lines (not step lines) go to train.log.
      prec_flag=()
      [ -n "${SEAM_TRAIN_PRECISION:-}" ] && prec_flag=(--precision "$SEAM_TRAIN_PRECISION")
      for model in ${SEAM_TRAIN_MODELS:-fmnist_mlp fmnist_cnn fmnist_resnet}; do
        run_dir=$(mktemp -d)
        echo "### $model ${SEAM_TRAIN_PRECISION:-}" >> "$out/train.log"
        "$bin/seam" train "examples/$model.json" --device cuda --data "$data" --out "$run_dir" --json "${prec_flag[@]}" \
          2> "$run_dir/stderr" | grep -v '"event":"step"' >> "$out/train.log"
        rc=${PIPESTATUS[0]}
        cat "$run_dir/stderr" >> "$out/train.log"
        note "train $model: rc=$rc $(grep '"event":"done"' "$out/train.log" | tail -1)"
        [ "$rc" -ne 0 ] && tail -5 "$run_dir/stderr"
        rm -rf "$run_dir"
      done
      ;;
    lm)
      # Language models on real text: the byte tokens of Debian's fortunes (prepare.sh
      # tokenizes them into .deps/fortunes), SEAM_LM_MODELS for their files' epochs or
      # SEAM_LM_EPOCHS; epoch lines go to lm.log, then a sample of each model's text.
      epochs=()
      [ -n "${SEAM_LM_EPOCHS:-}" ] && epochs=(--epochs "$SEAM_LM_EPOCHS")
      for model in ${SEAM_LM_MODELS:-gpt2_124m}; do
        run_dir=$(mktemp -d)
        echo "### $model ${SEAM_LM_EPOCHS:+$SEAM_LM_EPOCHS epochs}" >> "$out/lm.log"
        "$bin/seam" train "examples/$model.json" --device cuda --data .deps/fortunes --out "$run_dir" --json "${epochs[@]}" \
          2> "$run_dir/stderr" | grep -v '"event":"step"' >> "$out/lm.log"
        rc=${PIPESTATUS[0]}
        cat "$run_dir/stderr" >> "$out/lm.log"
        note "lm $model: rc=$rc $(grep '"event":"done"' "$out/lm.log" | tail -1)"
        [ "$rc" -eq 0 ] && "$bin/seam" sample "$run_dir/checkpoint.safetensors" --prompt "The " --tokens 300 \
          --temperature 0.8 --top-k 40 --seed 1 >> "$out/lm.log" 2>&1
        rm -rf "$run_dir"
      done
      ;;
    crash)
      # The kill, SIGTERM and Ctrl-C tests (tests/python/test_crash.py) on the GPU.
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      SEAM_BIN=$PWD/$bin/seam SEAM_CRASH_DEVICE=cuda SEAM_CRASH_DATA=$PWD/$data \
        "$py" -m pytest -q -p no:cacheprovider tests/python/test_crash.py > "$out/crash.log" 2>&1
      note "crash tests on cuda: rc=$?, $(tail -1 "$out/crash.log")"
      ;;
    python)
      # The Python package with its CUDA backend (the wheel prepare.sh python built for
      # this machine's Python), unpacked beside the tree: its tests on the GPU (DLPack with
      # torch CUDA tensors, W1 against PyTorch: tests/python/test_gpu.py; the CPU ones too)
      # and the cost of program.run() from Python over C++ (bench/python_overhead.py).
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      site=$(mktemp -d)
      # Installed by pip (offline, into a folder), which keeps the bundled CLI executable;
      # where there is no pip, unzipped, and the CLI's mode bits (which unzipping drops) set.
      if ! "$py" -m pip install -q --no-deps --no-index --target "$site" .deps/py/seam-*.whl > /dev/null 2>&1 &&
         ! { "$py" -m zipfile -e .deps/py/seam-*.whl "$site" 2>/dev/null && chmod +x "$site"/seam/bin/*; }; then
        note "python: no wheel in .deps/py (run tools/device/prepare.sh python)"
        continue
      fi
      PYTHONPATH=$site SEAM_BIN=$PWD/$bin/seam "$py" -m pytest -q -p no:cacheprovider \
        tests/python/test_gpu.py tests/python/test_package.py > "$out/python.log" 2>&1
      note "python tests: rc=$?, $(tail -1 "$out/python.log")"
      for w in "tiny --runs 5000" "W1 --runs 2000"; do
        read -r -a args <<< "$w"
        PYTHONPATH=$site "$py" bench/python_overhead.py --device cuda --workload "${args[@]}" >> "$out/python.log" 2>&1
        note "python overhead ${args[0]} on cuda: $(grep 'overhead' "$out/python.log" | tail -1)"
      done
      rm -rf "$site"
      ;;
    plan)
      # Each example's plan with every kernel's measured time beside its estimate.
      for model in fmnist_mlp fmnist_cnn; do
        echo "### $model" >> "$out/plan.log"
        "$bin/seam" plan "examples/$model.json" --device cuda --measure >> "$out/plan.log" 2>&1
        note "plan $model: rc=$?"
      done
      ;;
    bench)
      # seam (graph and eager) and PyTorch on the same workloads, then one ratio table.
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      csv=$(mktemp -d)
      {
        work=(W1 W2 W3 W4 W5 examples/fmnist_cnn.json examples/fmnist_resnet.json)
        "$bin/seam" bench "${work[@]}" --device cuda --csv "$csv/seam_graph.csv" --breakdown --explain
        "$bin/seam" bench "${work[@]}" --device cuda --no-graph --csv "$csv/seam_eager.csv"
        # The same step with fewer fusions: GEMM epilogues and the loss only, then none.
        "$bin/seam" bench "${work[@]}" --device cuda --fusion epilogues --csv "$csv/seam_graph_epilogues.csv"
        "$bin/seam" bench "${work[@]}" --device cuda --fusion none --csv "$csv/seam_graph_unfused.csv"
        [ -n "${SEAM_BENCH_STREAMS:-}" ] &&
          "$bin/seam" bench "${work[@]}" --device cuda --streams 1 --csv "$csv/seam_graph_1stream.csv"
        # The model files through their PyTorch twins (bench/twin), each first checked
        # against one seam step on the GPU.
        "$py" bench/compare_torch.py "${work[@]}" --check-first-step "$bin/seam" --check-device cuda --csv "$csv/torch.csv"
        "$py" bench/report.py "$csv"/seam_*.csv "$csv/torch.csv"
        for f in "$csv"/*.csv; do echo "### $(basename "$f")"; cat "$f"; done
      } > "$out/bench.log" 2>&1
      note "bench: rc=$?"
      sed -n '/seam best/,$p' "$out/bench.log"
      ;;
    numerics)
      # Every op at every precision against float64 (docs/numerics.md), on the GPU.
      "$bin/seam" numerics --device cuda --csv "$out/numerics.csv" > "$out/numerics.log" 2>&1
      note "numerics: rc=$?"
      ;;
    bench16)
      # The same at 16 bits (SEAM_BENCH_PRECISION: bf16 or f16; tf32 and f32 work too)
      # against PyTorch's variants (SEAM_TORCH_VARIANTS; max-autotune compiles for minutes,
      # so it is opt-in).
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      csv=$(mktemp -d)
      prec=${SEAM_BENCH_PRECISION:-bf16}
      read -r -a work <<< "${SEAM_BENCH_WORK:-W1 W2 W3 W4 W5 examples/fmnist_cnn.json examples/fmnist_resnet.json}"
      read -r -a variants <<< "${SEAM_TORCH_VARIANTS:-eager_fused compile_default cuda_graph_whole_step}"
      {
        "$bin/seam" bench "${work[@]}" --device cuda --precision "$prec" --csv "$csv/seam_graph.csv" --breakdown --explain
        # One stream: whether concurrent GEMMs on several streams cost the step more than they hide.
        "$bin/seam" bench "${work[@]}" --device cuda --precision "$prec" --streams 1 --csv "$csv/seam_graph_1stream.csv"
        # SEAM_BENCH_CHECK=1: each model file's PyTorch twin checked against one seam step first.
        check=()
        [ -n "${SEAM_BENCH_CHECK:-}" ] && check=(--check-first-step "$bin/seam" --check-device cuda)
        "$py" bench/compare_torch.py "${work[@]}" --precision "$prec" --variants "${variants[@]}" "${check[@]}" \
          --csv "$csv/torch.csv"
        "$py" bench/report.py "$csv"/seam_*.csv "$csv/torch.csv"
        for f in "$csv"/*.csv; do echo "### $(basename "$f")"; cat "$f"; done
      } > "$out/bench_$prec.log" 2>&1
      note "bench $prec: rc=$?"
      sed -n '/seam best/,$p' "$out/bench_$prec.log"
      ;;
    w6)
      # Issue 16's table in one window: W6 on one stream with its kernel table and the
      # variants chosen, then under a memory budget (SEAM_W6_BUDGET GiB, default 7.3: the
      # output layer in chunks, then the fewest GELU and layer norm outputs recomputed that
      # fit), beside PyTorch's
      # SEAM_TORCH_VARIANTS (default torch.compile's).
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      csv=$(mktemp -d)
      read -r -a variants <<< "${SEAM_TORCH_VARIANTS:-compile_default}"
      {
        "$bin/seam" bench W6 --device cuda --streams 1 --csv "$csv/seam_graph_1stream.csv" --breakdown --explain
        "$bin/seam" bench W6 --device cuda --streams 1 --memory-budget "${SEAM_W6_BUDGET:-7.3}" \
          --csv "$csv/seam_graph_budget.csv"
        "$py" bench/compare_torch.py W6 --variants "${variants[@]}" --csv "$csv/torch.csv"
        "$py" bench/report.py "$csv"/seam_*.csv "$csv/torch.csv"
        for f in "$csv"/*.csv; do echo "### $(basename "$f")"; cat "$f"; done
      } > "$out/w6.log" 2>&1
      note "w6: rc=$?"
      sed -n '/seam best/,$p' "$out/w6.log"
      ;;
    onnx)
      # The ONNX backend node tests through the importer on the GPU (docs/onnx.md); the
      # test data travels packed in .deps (prepare.sh).
      mkdir -p .deps/onnx && tar -C .deps/onnx -xzf .deps/onnx-node.tgz
      "$bin/seam" onnx-suite .deps/onnx/node --device cuda --markdown "$out/onnx_cuda.md" > "$out/onnx.log" 2>&1
      note "onnx suite on cuda: rc=$?, $(tail -1 "$out/onnx_cuda.md")"
      ;;
    onnx_models)
      # Exported torchvision models and a small GPT through the importer: agreement with
      # PyTorch and onnxruntime, 20 training steps, inference times (bench/onnx_models.py;
      # SEAM_ONNX_MODELS narrows the list).
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      read -r -a models <<< "${SEAM_ONNX_MODELS:-resnet18 mobilenet_v3_small vit_b_16 gpt2layer}"
      work=$(mktemp -d)
      read -r -a exports <<< "${SEAM_ONNX_EXPORTS-fmnist_mlp fmnist_cnn fmnist_resnet resnet18_cifar gpt_fortunes}"
      "$py" bench/onnx_models.py "$bin/seam" "$out" --work "$work" --models "${models[@]}" --exports "${exports[@]}" \
        > "$out/onnx_models.log" 2>&1
      note "onnx models: rc=$?"
      rm -rf "$work"
      cat "$out/onnx_models.md" 2>/dev/null || tail -20 "$out/onnx_models.log"
      ;;
    scale)
      # Data parallelism over this host's GPUs: seam bench --nproc N, plain and --zero 1,
      # beside PyTorch's DDP (bench/ddp_torch.py) at each N, every rank on the workload's
      # batch. SEAM_SCALE_WORK (default W6), SEAM_SCALE_RANKS (default 1 2 4 8; those above
      # the GPUs here are left out), SEAM_SCALE_STEPS timed steps (default 50, 3 repeats),
      # SEAM_SCALE_TORCH (DDP variants; default eager fused and compiled).
      py=${SEAM_PYTHON:-/opt/torch/.venv/bin/python3}
      [ -x "$py" ] || py=python3
      gpus=$(nvidia-smi -L | wc -l)
      read -r -a work <<< "${SEAM_SCALE_WORK:-W6}"
      read -r -a ranks <<< "${SEAM_SCALE_RANKS:-1 2 4 8}"
      read -r -a variants <<< "${SEAM_SCALE_TORCH:-ddp_eager_fused ddp_compile_default}"
      timing=(--steps "${SEAM_SCALE_STEPS:-50}" --repeats 3)
      csv=$(mktemp -d)
      {
        for n in "${ranks[@]}"; do
          [ "$n" -gt "$gpus" ] && { echo "--nproc $n: $gpus GPU(s) here, left out"; continue; }
          for w in "${work[@]}"; do
            # One GPU: the plain step, and the data-parallel paths through NCCL over a group of one.
            extra=()
            [ "$n" -eq 1 ] && extra=(--one-rank)
            "$bin/seam" bench "$w" --device cuda --nproc "$n" "${timing[@]}" --csv "$csv/seam_${w}_$n.csv"
            "$bin/seam" bench "$w" --device cuda --nproc "$n" "${extra[@]}" --zero 1 "${timing[@]}" \
              --csv "$csv/seam_${w}_${n}_zero.csv"
            if [ "$n" -eq 1 ]; then  # and the step without data parallelism, the figure to match
              "$bin/seam" bench "$w" --device cuda --one-rank "${timing[@]}" --csv "$csv/seam_${w}_1_one_rank.csv"
              "$bin/seam" bench "$w" --device cuda "${timing[@]}" --csv "$csv/seam_${w}_1_plain.csv"
            fi
          done
          "$py" bench/ddp_torch.py "${work[@]}" --nproc "$n" --variants "${variants[@]}" "${timing[@]}" \
            --csv "$csv/torch_$n.csv"
        done
        for f in "$csv"/*.csv; do echo "### $(basename "$f")"; cat "$f"; done
      } > "$out/scale.log" 2>&1
      note "scale: rc=$?"
      grep -E '^(W[0-9]|name|seam,|torch,)' "$out/scale.log" | grep -v '^framework' | tail -40
      ;;
    ab)
      # Builds compared in alternation, the way docs/perf.md compares two figures (the same
      # machine, one window, each build's rounds between the other's: the clock drifts with
      # the GPU's temperature and power): every pack of prepare.sh's (.deps/packs/NAME.tar.xz)
      # runs `seam bench` of SEAM_AB_WORK (default W6) with SEAM_AB_FLAGS in turn, for
      # SEAM_AB_ROUNDS rounds (default 2), each build with a tuning cache of its own. With
      # SEAM_AB_TESTS (a gtest filter), each build's GPU tests of it run first.
      work=${SEAM_AB_WORK:-W6}
      read -r -a flags <<< "${SEAM_AB_FLAGS:---streams 1 --steps 100 --repeats 3}"
      packs=()
      for p in .deps/packs/*.tar.xz; do [ -e "$p" ] && packs+=("$(basename "$p" .tar.xz)"); done
      if [ ${#packs[@]} -eq 0 ]; then
        note "ab: no packs in .deps/packs (tools/device/prepare.sh pack NAME)"
        continue
      fi
      for n in "${packs[@]}"; do mkdir -p ".deps/ab/$n" && tar -C ".deps/ab/$n" -xJf ".deps/packs/$n.tar.xz"; done
      {
        if [ -n "${SEAM_AB_TESTS:-}" ]; then
          for n in "${packs[@]}"; do
            echo "### $n tests: $(".deps/ab/$n/bin/seam_gpu_tests" --gtest_filter="$SEAM_AB_TESTS" 2>&1 |
              grep -E '^\[  (PASSED|FAILED)' | tr '\n' ' ')"
          done
        fi
        for r in $(seq "${SEAM_AB_ROUNDS:-2}"); do
          for n in "${packs[@]}"; do
            echo "### $n round $r ($(cat ".deps/packs/$n.commit" 2>/dev/null))"
            XDG_CACHE_HOME=$PWD/.cache-ab-$n ".deps/ab/$n/bin/seam" bench "$work" --device cuda "${flags[@]}"
          done
        done
      } > "$out/ab.log" 2>&1
      note "ab: rc=$?"
      # Each round's table row and clock line, under its build's name.
      awk '/^### /{what=$2" "$3" "$4; if ($3 == "tests:") print} /^name /{getline; print what": "$0}
           /in the timed steps/{print what": "$0}' "$out/ab.log"
      ;;
    *)
      note "unknown step '$step'"
      ;;
  esac
done

echo
echo "summary:"
for s in "${summary[@]}"; do echo "  $s"; done
