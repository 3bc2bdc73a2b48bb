#!/usr/bin/env bash
# The one prepared run for a lent GPU machine (at most 9.5 minutes: each step has its own limit):
#
#   bash benchmarks/gpu_session.sh [OUT]        # OUT: $OUT if set (the device machine's), else results/gpu
#
# 1. training samples/s and select_action latency of the CPU recipes' policies on CUDA, in fp32,
#    bf16 autocast and with a compiled loss (benchmarks/policy_speed.py);
# 2. the attention benchmark on CUDA in float32 and bfloat16 (benchmarks/attention.py; time only:
#    its memory subprocesses would each start CUDA again);
# 3. the impl=auto thresholds those support (benchmarks/calibrate_auto.py), to copy into
#    AUTO_MIN_TOKENS["..."]["cuda"] of policies/vision/sparse/dispatch.py.
# Every step runs even when an earlier one failed, under its own time limit; each writes
# OUT/<step>.log beside its JSON and Markdown. A dry run on the CPU:
#   DEVICE=cpu SIZES=81 ROUNDS=1 TASKS=pusht POLICIES=bc bash benchmarks/gpu_session.sh /tmp/gpu_dry
set -u
OUT=${1:-${OUT:-results/gpu}}
PY=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
SIZES=${SIZES:-81,256,576,1024,4096}
ROUNDS=${ROUNDS:-10}
TASKS=${TASKS:-pusht lift}
POLICIES=${POLICIES:-bc diffusion}
mkdir -p "$OUT"

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, output to OUT/NAME.log
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit} s)"
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (exit $?), see $OUT/$name.log"; fi
}

$PY -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', c, torch.cuda.get_device_name(0) if c else '')" \
    | tee "$OUT/device.txt"
speed=(benchmarks/policy_speed.py --device "$DEVICE" --recipe cpu --threads 1 --rounds "$ROUNDS" --warmup 3
       --latency-calls 20 --out "$OUT")
step policy_fp32 90 $PY "${speed[@]}" --tasks $TASKS --policies $POLICIES --name policy_fp32
step policy_bf16 90 $PY "${speed[@]}" --tasks $TASKS --policies $POLICIES --precision bf16 --name policy_bf16
# compiling costs tens of seconds per policy: the Lift BC recipe's three encoders only
step policy_compile 120 $PY "${speed[@]}" --tasks lift --policies bc --compile --name policy_compile
attention=(-m benchmarks.attention --device "$DEVICE" --sizes "$SIZES" --repeats 5
           --no-memory --impls full,fibottention-dense,fibottention-sparse,lookhere-dense,lookhere-efficient,lookhere45-efficient)
step attention_float32 120 $PY "${attention[@]}" --dtype float32 --json "$OUT/attention_float32.json" --markdown "$OUT/attention_float32.md"
step attention_bfloat16 120 $PY "${attention[@]}" --dtype bfloat16 --json "$OUT/attention_bfloat16.json" --markdown "$OUT/attention_bfloat16.md"
step calibrate 30 $PY -m benchmarks.calibrate_auto "$OUT"/attention_float32.json "$OUT"/attention_bfloat16.json --json "$OUT/auto_thresholds.json"
cat "$OUT/calibrate.log"
