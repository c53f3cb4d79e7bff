#!/usr/bin/env bash
# Everything docs/gpu.md measures on one GPU, in one command, in order of importance (its "Still to measure"):
#   1. the GPU tests (pytest -m gpu);
#   2. torch.compile'd layers and fused pointwise kernels against eager for base and big at 12,500 x 2 tokens
#      a step; then attnx against HF MarianMTModel and torch.nn.Transformer on the same batches (big, bf16,
#      3,125 x 8 and 12,500 x 2, 2 warm-up + 6 timed steps, two rounds in alternating order);
#   3. the profile of the big model's training step;
#   4. the main job at the configs' one-GPU setting (12,500 x 2): attnx fit configs/big.yaml for 100 steps,
#      configs/base.yaml for 200 steps, attnx test on newstest2014;
#   5. the decoding toolbox on the GPU (beam, n-best, greedy, sampling, forced scoring) with base's checkpoint,
#      in fp32 and under bf16 autocast;
#   6. bench_gpu.py in fp16-mixed, then in bf16-mixed at 3,125 x 8 and 12,500 x 2 (as measured before).
# Captured steps (steps capture_small, capture_large; run them alone with ATTNX_GPU_STEPS="capture_small
# capture_large"): eager vs CUDA graphs vs torch.compile(reduce-overhead) for base and big at 3,125 x 8 and
# 12,500 x 2, and the Lightning module with captured steps against the bench loop.
# What was measured once and settled is left to bench_gpu.py's own options: --cudnn_attention (2.3x slower),
# --nan_check batch (no difference), --lightning.
#
#   bash bench/gpu_session.sh [RESULTS_DIR] [SECONDS]
#   ATTNX_GPU_STEPS="tests fit_base_large" bash bench/gpu_session.sh ...   # only the steps named
#
# Every step has its own time limit and the whole script ends within SECONDS (default 520), so that what
# is done is kept when a later step runs long; a failing step is reported and the next one runs. Logs and
# results go to RESULTS_DIR (default gpu_results), packed into $ATTNX_GPU_TAR (default RESULTS_DIR.tar) after
# each step.
# Needs: a prepared data/news (docs/gpu.md, section 1); ATTNX_DATA_DIR for the tests' Multi30k; Python
# packages the machine lacks as wheels in .gpu/wheels (installed into /tmp/site, nothing else is touched).
# ATTNX_GPU_SMOKE=1 runs every step at toy sizes (on CPU: checks the script, measures nothing).
set -u
results=${1:-gpu_results}
budget=${2:-520}
pack=${ATTNX_GPU_TAR:-$results.tar}
start=$SECONDS
# never overwrite what is already there (a folder with files in it, or the pack)
if [[ -e $pack ]] || { [[ -d $results ]] && [[ -n $(ls -A "$results") ]]; }; then
  echo "gpu_session.sh: $results or $pack already exists; name a new RESULTS_DIR (or move them away)" >&2
  exit 2
fi
mkdir -p "$results"
log="$results/session.log"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python=${PYTHON:-python3}

say() { echo "$*" | tee -a "$log"; }

# step NAME LIMIT COMMAND...: runs COMMAND within min(LIMIT, what is left of the budget), output to
# $results/NAME.log and the session log, then packs the results.
step() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${ATTNX_GPU_STEPS:-} && " $ATTNX_GPU_STEPS " != *" $name "* ]]; then
    return 0
  fi
  local left=$((budget - (SECONDS - start) - 10))
  if ((left < 20)); then
    say "== $name: skipped, ${left}s left of the ${budget}s budget"
    return 0
  fi
  ((limit > left)) && limit=$left
  say "== $name (limit ${limit}s, at ${SECONDS}s): $*"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$results/$name.log" >>"$log"
  local rc=${PIPESTATUS[0]}
  say "== $name: exit $rc after $((SECONDS - t0))s"
  tail -n 25 "$results/$name.log"
  tar -cf "$pack" -C "$(dirname "$results")" "$(basename "$results")" 2>/dev/null
  return 0
}

if [[ -d .gpu/wheels ]] && compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/bench:$PWD/plugins/restricted_attention/src${PYTHONPATH:+:$PYTHONPATH}"
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

smoke=${ATTNX_GPU_SMOKE:-0}
if [[ $smoke == 1 ]]; then
  tests=(tests/data/test_batch.py)
  bench=(--precision bf16-mixed --steps 1 --warmup 1 --decode_sentences 4)
  short=(--steps 1 --warmup 1) big=tiny both=tiny large=512 small=256 capture=(graphs)
  fit_steps=2 big_fit_steps=1
  fit_tokens=(--data.max_tokens 256 --trainer.accelerator cpu --trainer.precision 32-true
    --trainer.num_sanity_val_steps 0)
  decode=(--sentences 16 --repeats 1 --batch_sizes 8 --sweep_sentences 16) device=cpu
else
  tests=(-m gpu)
  bench=(--precision bf16-mixed)  # the configs' precision
  short=() big=big both=both large=12500 small=3125 capture=(graphs compile)
  fit_steps=200 big_fit_steps=100 fit_tokens=()
  decode=(--sentences 1000 --repeats 3 --max_tokens 8000 --batch_sizes 64 256 --sweep_sentences 1000) device=cuda
fi
one_gpu=(--data.data_dir data/news --trainer.devices 1 --trainer.strategy auto
  --trainer.accumulate_grad_batches 8 --trainer.log_every_n_steps 10 "${fit_tokens[@]}")

# the newest run folder of configs/NAME.yaml (they log to runs/NAME/version_N)
newest_run() { ls -td runs/"$1"/version_* 2>/dev/null | head -n 1; }

step tests 150 $python -m pytest -p no:cacheprovider -n 0 -q -rfEs "${tests[@]}"
for budget in "$small" "$large"; do
  name=capture_small
  [[ $budget == "$large" ]] && name=capture_large
  step "$name" 200 $python bench/bench_gpu.py --data data/news --model "$both" --precision bf16-mixed \
    --max_tokens "$budget" --capture "${capture[@]}" --lightning --decode_sentences 0 "${short[@]}" \
    --json "$results/$name.json"
done
step compile 160 $python bench/bench_gpu.py --data data/news --model "$both" --precision bf16-mixed \
  --max_tokens "$large" --compile --fused --decode_sentences 0 "${short[@]}" --json "$results/compile.json"
step peers 150 $python bench/bench_gpu.py --data data/news --model "$big" --precision bf16-mixed \
  --max_tokens "$small" "$large" --peers --decode_sentences 0 --steps 6 --warmup 2 "${short[@]}" \
  --json "$results/peers.json"
step profile_big 80 $python bench/bench_gpu.py --data data/news --model "$big" --precision bf16-mixed \
  --max_tokens "$large" --steps 3 --decode_sentences 0 --profile "${short[@]}" --json "$results/profile_big.json"
# the configs' faster setting on one GPU (their headers): 12,500 x 2 tokens a step, the same 25,000
large_steps=(--data.max_tokens "$large" --trainer.accumulate_grad_batches 2)
step fit_big 100 "${attnx[@]}" fit --config configs/big.yaml "${one_gpu[@]}" "${large_steps[@]}" \
  --trainer.max_steps "$big_fit_steps"
run=$(newest_run big)
[[ -n $run ]] && cp "$run/metrics.csv" "$results/big_metrics.csv" 2>/dev/null
step fit_base 100 "${attnx[@]}" fit --config configs/base.yaml "${one_gpu[@]}" "${large_steps[@]}" \
  --trainer.max_steps "$fit_steps"
run=$(newest_run base)
[[ -n $run ]] && cp "$run/metrics.csv" "$results/base_metrics.csv" 2>/dev/null
base_ckpt=${run:+$run/checkpoints/averaged.ckpt}
if [[ -n $base_ckpt && -f $base_ckpt ]]; then
  step test_base 100 "${attnx[@]}" test --config configs/base.yaml "${one_gpu[@]}" "${large_steps[@]}" \
    --ckpt_path "$base_ckpt"
  step decode 120 $python bench/bench_decode.py --ckpt_path "$base_ckpt" --device "$device" \
    --no_cache_sentences 0 "${decode[@]}"
  # bf16 autocast against fp32 (speed, outputs equal, BLEU): the same runs, no batch-size sweep
  step decode_bf16 90 $python bench/bench_decode.py --ckpt_path "$base_ckpt" --device "$device" \
    --no_cache_sentences 0 "${decode[@]}" --precision bf16-mixed --batch_sizes
else
  say "== no averaged.ckpt from fit_base: test and decoding skipped"
fi
step bench_fp16 120 $python bench/bench_gpu.py --data data/news --precision fp16-mixed --decode_sentences 0 \
  "${short[@]}" --json "$results/gpu_fp16.json"
step bench 170 $python bench/bench_gpu.py --data data/news "${bench[@]}" --json "$results/gpu.json"
say "== done after $((SECONDS - start))s"
tar -cf "$pack" -C "$(dirname "$results")" "$(basename "$results")" 2>/dev/null
exit 0
