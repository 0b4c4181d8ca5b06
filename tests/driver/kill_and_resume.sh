#!/usr/bin/env bash
# Kill and resume, as Slurm does it: lather-train is sent SIGTERM in the middle of a run (every
# rank, as srun signals every task), writes a final checkpoint and exits with status 3; a second run with
# --resume finishes the job. Its final parameters and optimizer state must be bit for bit those
# of an uninterrupted run (h5diff without tolerance).
#   kill_and_resume.sh MPIEXEC RANKS LATHER-TRAIN WORK-DIR [mpiexec flags...]
set -euo pipefail
mpiexec=$1 ranks=$2 train=$3 work=$4
shift 4
launch=("$mpiexec" -n "$ranks" "$@" "$train")
fail() { echo "kill_and_resume: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
# 2 epochs of 100 steps, Shampoo with roots every 4 steps, a progress line every step.
run=(--epochs 2 --batch-size 64 --hidden 64,32 --train-samples 6400 --test-samples 512 --seed 7
     --log-every 1 --shampoo block_size=32,start_preconditioning_step=4,preconditioning_compute_steps=4)

"${launch[@]}" "${run[@]}" --checkpoint-dir "$work/straight" >"$work/straight.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -3 "$work/straight.log")"

"${launch[@]}" "${run[@]}" --checkpoint-dir "$work/killed" >"$work/killed.log" 2>&1 &
job=$!
for _ in $(seq 1200); do  # up to 120 s for the run to reach step 20
  grep -q "step 20/" "$work/killed.log" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
# SIGTERM to the lather-train processes themselves (not mpiexec), the way Slurm signals tasks.
pkill -TERM -f "^$train .*--checkpoint-dir $work/killed" || fail "no lather-train process to signal"
status=0
wait "$job" || status=$?
[ "$status" -eq 3 ] || fail "the signalled run exited with status $status, expected 3: $(tail -3 "$work/killed.log")"
grep -q "SIGTERM: checkpoint .* written at step" "$work/killed.log" ||
  fail "no SIGTERM checkpoint line (did the run end before the signal?): $(tail -3 "$work/killed.log")"
grep "SIGTERM" "$work/killed.log"

"${launch[@]}" "${run[@]}" --checkpoint-dir "$work/killed" --resume >"$work/resumed.log" 2>&1 ||
  fail "the resumed run failed: $(tail -3 "$work/resumed.log")"
grep -q "resumed from" "$work/resumed.log" || fail "the second run did not resume: $(head -5 "$work/resumed.log")"
grep "resumed from" "$work/resumed.log"

final=$(basename "$(ls "$work/straight"/checkpoint-*.h5 | tail -1)")
[ -f "$work/killed/$final" ] || fail "the resumed run has no $final (it has: $(ls "$work/killed"))"
for group in /parameters /optimizer; do
  h5diff "$work/straight/$final" "$work/killed/$final" "$group" ||
    fail "$group differs between the uninterrupted and the resumed run ($final)"
done
echo "kill_and_resume: $final identical in /parameters and /optimizer"
