#!/usr/bin/env bash
# A signal during a long evaluation (3,000 validation windows, 10 s and more on one core) stops the
# run within one evaluation batch: the checkpoint of the last step is written and lather-train
# exits with status 3 within 5 seconds of the signal, without finishing the evaluation.
#   signal_during_evaluation.sh LATHER-TRAIN TEXT WORK-DIR [TERM|INT]
set -euo pipefail
train=$1 text=$2 work=$3 signal=${4:-TERM}
fail() { echo "signal_during_evaluation: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
"$train" --model transformer --text "$text" --batch-size 32 --max-steps 3 --log-every 1 --eval-every 1 \
  --eval-windows 3000 --checkpoint-dir "$work/checkpoints" >"$work/run.log" 2>&1 &
job=$!
for _ in $(seq 1200); do  # up to 120 s for the first step (a busy machine)
  grep -q "^step 1/3" "$work/run.log" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
grep -q "^step 1/3" "$work/run.log" || fail "the run did not reach step 1: $(tail -3 "$work/run.log")"
sleep 1  # well into the evaluation
kill -"$signal" "$job"
signalled=$(date +%s%N)
status=0
wait "$job" || status=$?
elapsed_ms=$((($(date +%s%N) - signalled) / 1000000))
cat "$work/run.log"
[ "$status" -eq 3 ] || fail "exit status $status after SIG$signal, expected 3"
grep -q "SIG$signal: checkpoint .*checkpoint-000000000001.h5 written at step 1" "$work/run.log" ||
  fail "no checkpoint line for step 1"
[ -f "$work/checkpoints/checkpoint-000000000001.h5" ] || fail "no checkpoint file"
if grep -q "^step 1: validation loss" "$work/run.log"; then fail "the evaluation ran to its end"; fi
((elapsed_ms < 5000)) || fail "exited ${elapsed_ms} ms after SIG$signal, more than 5 s"
echo "signal_during_evaluation: exit 3 ${elapsed_ms} ms after SIG$signal, checkpoint of step 1 written"
