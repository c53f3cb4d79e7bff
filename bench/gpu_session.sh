#!/usr/bin/env bash
# What docs/gpu.md measures on one GPU, in one command that fits a lent device: within SECONDS (default 480)
# in all, the decisive figures first, then the rest as time allows.
#
# First the feature matrix on CUDA (pytest -m gpu tests/training/test_feature_matrix.py: every training
# feature together, bf16 and fp32, captured steps, each resumed), then the decisive figures.
# Decisive, in this order (the Transformer base and big models, bf16-mixed, the paper's 25k tokens a step as
# 3,125 x 8 and 12,500 x 2 batches):
#   1. capture  eager against captured steps (bench_gpu.py --capture graphs): base and big at both sizes;
#   2. peers    attnx, HF MarianMTModel and torch.nn.Transformer on the same batches, both models and sizes;
#   3. fit      attnx fit configs/big.yaml at 12,500 x 2 with captured steps and a validation every 200
#               batches, for 2 minutes (--trainer.max_time).
# Then, as time allows: tests (pytest -m gpu), compile (fused kernels, torch.compile'd layers and
# reduce-overhead against eager, 12,500 x 2), profile_big, fit_base (200 steps) with test_base, decode and
# decode_bf16 on its checkpoint, bench_fp16.
#
#   bash bench/gpu_session.sh --check                  # here, before any device time: what the device lacks
#   bash bench/gpu_session.sh [RESULTS_DIR] [SECONDS]  # on the device (defaults gpu_results, 480)
#   ATTNX_GPU_STEPS="capture fit" bash bench/gpu_session.sh ...   # only the steps named
#   ATTNX_GPU_SMOKE=1 bash bench/gpu_session.sh ...    # every step at toy sizes on a CPU: checks the script
#
# Every row's JSON is appended to RESULTS_DIR/rows.jsonl as soon as it is measured (one line a row, a "table"
# field saying which: padding, training, peers, fit, decoding), so that a step cut by its time limit keeps
# the rows before the cut; RESULTS_DIR/NAME.log holds each step's output, session.log all of it, and
# $ATTNX_GPU_TAR (default RESULTS_DIR.tar) packs the folder after each step. Each step runs within
# min(its limit, what is left of SECONDS); a step that fails is said and the next one runs.
# Needs (--check says what is missing and what to carry): the prepared corpus ATTNX_GPU_DATA (default
# data/news), data/raw/multi30k for the tests, the wheels the machine lacks in .gpu/wheels (installed into
# /tmp/site, nothing else is touched).
set -u
python=${PYTHON:-python3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the tree; the results, runs/ and data/ are the cwd's
if [[ ${1:-} == --check ]]; then
  shift
  exec "$python" "$root/bench/gpu_preflight.py" "$@"
fi
results=${1:-gpu_results}
budget=${2:-480}
pack=${ATTNX_GPU_TAR:-$results.tar}
data=${ATTNX_GPU_DATA:-data/news}
start=$SECONDS
# never overwrite what is already there (a folder with files in it, or the pack)
if [[ -e $pack ]] || { [[ -d $results ]] && [[ -n $(ls -A "$results") ]]; }; then
  echo "gpu_session.sh: $results or $pack already exists; name a new RESULTS_DIR (or move them away)" >&2
  exit 2
fi
mkdir -p "$results"
log="$results/session.log"
rows="$results/rows.jsonl"
: >"$rows"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

say() { echo "$*" | tee -a "$log"; }
packed() { tar -cf "$pack" -C "$(dirname "$results")" "$(basename "$results")" 2>/dev/null; }

# step NAME LIMIT COMMAND...: runs COMMAND within min(LIMIT, what is left of the budget), its output to
# $results/NAME.log and the session log; then says how many rows the results hold and packs them.
step() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${ATTNX_GPU_STEPS:-} && " $ATTNX_GPU_STEPS " != *" $name "* ]]; then
    return 0
  fi
  local left=$((budget - (SECONDS - start) - 5))
  if ((left < 20)); then
    say "== $name: skipped, ${left}s left of the ${budget}s budget"
    return 0
  fi
  ((limit > left)) && limit=$left
  say "== $name (limit ${limit}s, at $((SECONDS - start))s): $*"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=5 "$limit" "$@" 2>&1 | tee "$results/$name.log" >>"$log"
  local rc=${PIPESTATUS[0]}
  say "== $name: exit $rc after $((SECONDS - t0))s; $(wc -l <"$rows") rows in $rows"
  tail -n 15 "$results/$name.log"
  packed
  return 0
}

if [[ -d .gpu/wheels ]] && compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$root/src:$root/bench:$root/plugins/restricted_attention/src:$root${PYTHONPATH:+:$PYTHONPATH}"
# the GPU tests prepare their corpus from multi30k/ under ATTNX_DATA_DIR: the carried data/raw/ where it is there
[[ -z ${ATTNX_DATA_DIR:-} && -d data/raw/multi30k ]] && export ATTNX_DATA_DIR=$PWD/data/raw
attnx=("$python" -m attnx)

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  lscpu | grep -E "Model name|^CPU\(s\)"
  $python - <<'EOF'
import importlib, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "available", torch.cuda.is_available())
for name in ["lightning", "jsonargparse", "sentencepiece", "sacrebleu", "torchmetrics", "numpy", "attnx"]:
    module = importlib.import_module(name)
    print(name, getattr(module, "__version__", "?"), module.__file__)
EOF
} 2>&1 | tee -a "$log"
[[ ${PIPESTATUS[0]} == 0 ]] || { say "the environment is not usable: stopping"; exit 3; }
[[ -f $data/meta.json ]] || say "== $data is not a prepared corpus: the benchmarks will fail (bash bench/gpu_session.sh --check)"

if [[ ${ATTNX_GPU_SMOKE:-0} == 1 ]]; then
  models=tiny big=tiny small=256 large=512 timing=(--steps 1 --warmup 1) peer_timing=(--steps 1 --warmup 1)
  tests=("$root/tests/data/test_batch.py") capture=(graphs) config=$root/configs/tiny.yaml device=cpu
  fit_size=(--data.max_tokens "$large" --trainer.accelerator cpu --trainer.precision 32-true
    --trainer.max_steps 4 --trainer.val_check_interval 2 --trainer.log_every_n_steps 1)
  base_size=(--data.max_tokens "$large" --trainer.accelerator cpu --trainer.precision 32-true
    --trainer.max_steps 2)
  decode=(--sentences 16 --repeats 1 --batch_sizes 8 --sweep_sentences 16)
else
  models=both big=big small=3125 large=12500 timing=(--steps 5 --warmup 2) peer_timing=(--steps 4 --warmup 2)
  tests=(-m gpu "$root/tests") capture=(graphs compile) config=$root/configs/big.yaml device=cuda
  # the configs' faster setting on one GPU (their headers): 12,500 x 2 tokens a step, the same 25,000
  fit_size=(--data.max_tokens "$large" --trainer.accumulate_grad_batches 2 --trainer.val_check_interval 200
    --trainer.log_every_n_steps 10)
  base_size=(--data.max_tokens "$large" --trainer.accumulate_grad_batches 2 --trainer.max_steps 200
    --trainer.log_every_n_steps 10)
  decode=(--sentences 1000 --repeats 3 --max_tokens 8000 --batch_sizes 64 256 --sweep_sentences 1000)
fi
bench=("$python" "$root/bench/bench_gpu.py" --data "$data" --precision bf16-mixed --decode_sentences 0 --rows "$rows")
one_gpu=(--data.data_dir "$data" --trainer.devices 1 --trainer.strategy auto)  # each option given once: attnx refuses two values
say "== rows, in order: capture (base, big; plain and captured at $small and $large tokens), peers (attnx,"
say "   Marian, nn.Transformer at $small and $large), fit ($config, captured steps, validation, 2 minutes);"
say "   then tests, compile, profile_big, fit_base, test_base, decode, decode_bf16, bench_fp16"

# the newest run folder of configs/NAME.yaml (they log to runs/NAME/version_N)
newest_run() { ls -td runs/"$1"/version_* 2>/dev/null | head -n 1; }

# before any speed row: every training feature together on the GPU, in bf16 and fp32, each resumed
# (tests/training/test_feature_matrix.py's gpu cases; on a CPU they skip)
step matrix 150 $python -m pytest -p no:cacheprovider -n 0 -q -rfEs -m gpu "$root/tests/training/test_feature_matrix.py"
step capture 180 "${bench[@]}" --model "$models" --max_tokens "$small" "$large" --capture graphs \
  "${timing[@]}" --json "$results/capture.json"
step peers 120 "${bench[@]}" --model "$models" --max_tokens "$small" "$large" --no_training --peers \
  "${peer_timing[@]}" --json "$results/peers.json"
name=$(basename "$config" .yaml)
step fit 160 "${attnx[@]}" fit --config "$config" "${one_gpu[@]}" "${fit_size[@]}" --cuda_graphs true \
  --trainer.max_time 00:00:02:00 --trainer.limit_val_batches 20 --evaluation.bleu_samples 0
run=$(newest_run "$name")
[[ -n $run ]] && $python "$root/bench/fit_row.py" "fit $name" "$run" "$results/fit.log" "$rows" >/dev/null && packed

# the rest, as time allows
step tests 200 $python -m pytest -p no:cacheprovider -n 0 -q -rfEs "${tests[@]}"
step compile 150 "${bench[@]}" --model "$models" --max_tokens "$large" --fused --compile \
  --capture "${capture[@]}" "${timing[@]}" --json "$results/compile.json"
step profile_big 80 "${bench[@]}" --model "$big" --max_tokens "$large" --steps 3 --profile \
  --json "$results/profile_big.json"
step fit_base 100 "${attnx[@]}" fit --config "$root/configs/base.yaml" "${one_gpu[@]}" "${base_size[@]}"
run=$(newest_run base)
[[ -n $run ]] && $python "$root/bench/fit_row.py" "fit base" "$run" "$results/fit_base.log" "$rows" >/dev/null && packed
base_ckpt=${run:+$run/checkpoints/averaged.ckpt}
if [[ -n $base_ckpt && -f $base_ckpt ]]; then
  step test_base 100 "${attnx[@]}" test --config "$root/configs/base.yaml" "${one_gpu[@]}" "${base_size[@]}" \
    --ckpt_path "$base_ckpt"
  step decode 120 $python "$root/bench/bench_decode.py" --ckpt_path "$base_ckpt" --device "$device" \
    --no_cache_sentences 0 "${decode[@]}"
  # bf16 autocast against fp32 (speed, outputs equal, BLEU): the same runs, no batch-size sweep
  step decode_bf16 90 $python "$root/bench/bench_decode.py" --ckpt_path "$base_ckpt" --device "$device" \
    --no_cache_sentences 0 "${decode[@]}" --precision bf16-mixed --batch_sizes
else
  say "== no averaged.ckpt from fit_base: test and decoding skipped"
fi
step bench_fp16 120 "${bench[@]/bf16-mixed/fp16-mixed}" --model "$models" "${timing[@]}" \
  --json "$results/gpu_fp16.json"
say "== done after $((SECONDS - start))s: $(wc -l <"$rows") rows in $rows"
packed
exit 0
