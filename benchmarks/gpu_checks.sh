#!/usr/bin/env bash
# Every check klaudit needs a GPU for, in one call of a lent GPU machine, most valuable first; each step
# has a time limit of its own and its output in a log under $OUT, so a step that fails or hangs costs
# only itself. Run from the repository root of a checkout (no install: klaudit is imported from here).
#
#   OUT=/tmp/gpu bash benchmarks/gpu_checks.sh [STEP ...]      (default: all steps, in this order)
#
# Steps, in the default order: tests (the CUDA tests of the kernel, check-grad, the Monte-Carlo sampler and
# the watch), tune (tune_token_kl.py), bench (bench_exact_token_kl.py --device cuda with the tuned launch
# parameters where the tune step ran, else the kernels' own), montecarlo (the audit of check-grad --samples auto --device cuda of verl's kl_penalty on a
# random-init Qwen2-shaped model, V = 151,936, in process: profile_montecarlo.py --profile), checkgrad
# (bench_check_grad_model.py --device cuda, V = 151,936), watch (bench_watch.py --device cuda, a small Llama
# and a 0.5B-sized one).
#
# Inputs, where the defaults do not hold: PYTHON (python3); WHEELS, a folder of wheels the machine lacks
# (libcst), installed into a scratch folder first; VERL_CORE_ALGOS, the file of verl's kl_penalty
# (benchmarks/real_packages.py fetches verl 0.9.1; .gpu/verl/trainer/ppo/core_algos.py by default).
set -u
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
VERL_CORE_ALGOS="${VERL_CORE_ALGOS:-.gpu/verl/trainer/ppo/core_algos.py}"
MODEL="$(mktemp -d)/qwen2-shaped"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/klaudit-wheels "$WHEELS"/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/klaudit-wheels"
fi

step() {  # step NAME LIMIT_S COMMAND...: the command's output appended to $OUT/NAME.log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout -k 10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/$name.log"
}

tests() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv
    "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)"
    "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_token_kl_kernel.py tests/audit/test_device.py \
        "tests/audit/test_montecarlo.py::test_the_sampler_keeps_every_tensor_on_the_models_device" \
        "tests/audit/test_montecarlo.py::test_the_models_draws_carry_the_importance_weights_of_their_whole_logits" \
        "tests/watch/test_watch.py::test_on_a_gpu_the_audit_runs_on_cpu_copies_unless_the_function_needs_the_gpu"
}

montecarlo() {
    "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_check_grad_model as bench
bench.build_model(sys.argv[1], 151936)" "$MODEL"
    "$PY" benchmarks/profile_montecarlo.py "$MODEL" --target "$VERL_CORE_ALGOS::kl_penalty" --device cuda --profile
}

watch() {
    "$PY" benchmarks/bench_watch.py --device cuda --batch 16 --response 256 --hidden 512 --layers 4 --repeats 5
    "$PY" benchmarks/bench_watch.py --device cuda --batch 16 --response 256 --hidden 896 --layers 24 --repeats 5
}

export -f tests montecarlo watch
export PY MODEL VERL_CORE_ALGOS OUT

run_step() {
    case "$1" in
        tests) step tests 60 bash -c tests ;;
        tune) step tune 45 "$PY" benchmarks/tune_token_kl.py --json "$OUT/tune.json" ;;
        bench) step bench 70 "$PY" benchmarks/bench_exact_token_kl.py --device cuda \
                   $([ -f "$OUT/tune.json" ] && echo --launch "$OUT/tune.json") ;;
        checkgrad) step checkgrad 120 "$PY" benchmarks/bench_check_grad_model.py --device cuda --repeats 2 --imports ;;
        montecarlo) step montecarlo 180 bash -c montecarlo ;;
        watch) step watch 50 bash -c watch ;;
        *) echo "unknown step $1" >&2; return 2 ;;
    esac
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests tune bench montecarlo checkgrad watch)
for name in "${steps[@]}"; do
    run_step "$name"
done

echo; echo "===== summary"
[ -f "$OUT/tests.log" ] && grep -E "^(NVIDIA|name|torch)|passed|failed|error|SKIPPED" "$OUT/tests.log" | tail -n 15
[ -f "$OUT/tune.log" ] && sed -n '/fastest right candidate/,$p' "$OUT/tune.log"
[ -f "$OUT/bench.log" ] && tail -n 22 "$OUT/bench.log"
[ -f "$OUT/checkgrad.log" ] && sed -n '/^target/,/slowest by own/p' "$OUT/checkgrad.log"
[ -f "$OUT/montecarlo.log" ] && sed -n '/rows, errors/q;p' "$OUT/montecarlo.log" | grep -v "same per-sample gradient" | tail -n 45
[ -f "$OUT/montecarlo.log" ] && grep -A 25 "rows, errors" "$OUT/montecarlo.log"
[ -f "$OUT/watch.log" ] && grep -E "^(device|bare|wrapper|one|overhead|==)" "$OUT/watch.log"
exit 0
