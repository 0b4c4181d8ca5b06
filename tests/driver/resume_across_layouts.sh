#!/usr/bin/env bash
# A transformer Shampoo checkpoint moves between weight-shard counts (docs/transformer.md):
#  1. written on 1 shard with --shampoo-block-size 32, it resumes on 2 and on 4 shards without the
#     flag (the run takes the checkpoint's block size): their parameters and optimizer state after
#     6 more steps are those of the same runs given the flag, bit for bit, and their parameters
#     match those of the 1-shard run continuing from the same checkpoint, to float tolerance;
#  2. written at the default block size (128 on one shard), it is refused on 2 shards before any
#     step, naming the block size and the flag that would have made the move possible;
#  3. a checkpoint whose --n-head differs is refused naming --n-head.
#   resume_across_layouts.sh MPIEXEC LATHER-TRAIN TEXT WORK-DIR [mpiexec flags...]
set -euo pipefail
mpiexec=$1 train=$2 text=$3 work=$4
shift 4
fail() { echo "resume_across_layouts: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
# Roots every 2 steps from step 2, so that the steps after the move precondition.
model=(--model transformer --text "$text" --n-layer 1 --d-model 128 --block-size 16 --batch-size 8
       --eval-every 0 --eval-windows 8 --log-every 2 --seed 3
       --shampoo-start-preconditioning-step 2 --shampoo-preconditioning-compute-steps 2)
launch() {  # launch RANKS LOG ARGS...: exit status of lather-train under mpiexec
  local ranks=$1 log=$2
  shift 2
  local heads=(--n-head 4)
  [[ " $* " == *" --n-head "* ]] && heads=()
  "$mpiexec" -n "$ranks" "${pre[@]}" "$train" "${model[@]}" "${heads[@]}" "$@" >"$log" 2>&1
}
pre=("$@")

# 1. The move at a block size that divides every layout's slices.
launch 1 "$work/written.log" --weight-shards 1 --shampoo-block-size 32 --max-steps 4 \
  --checkpoint-dir "$work/base" || fail "writing the 32-block checkpoint failed: $(tail -3 "$work/written.log")"
for shards in 1 2 4; do
  cp -r "$work/base" "$work/shards$shards"
  launch "$shards" "$work/shards$shards.log" --weight-shards "$shards" --max-steps 10 --resume \
    --checkpoint-dir "$work/shards$shards" ||
    fail "resuming on $shards shards failed: $(tail -3 "$work/shards$shards.log")"
  grep -q "resumed from" "$work/shards$shards.log" || fail "$shards shards did not resume"
done
grep -q "Shampoo block size 32 from the checkpoint" "$work/shards2.log" ||
  fail "the 2-shard run did not say it took the checkpoint's block size: $(head -5 "$work/shards2.log")"
final=checkpoint-000000000010.h5
for shards in 2 4; do
  # Float32 parameters of order 0.1 after 6 steps of lr <= 3e-3: the layouts sum the same products
  # in another order (shards split the heads' and the MLP's columns and reduce partial rows),
  # which moves results by a few float32 ulps per step (they agree to 2e-6 here); 1e-5 is above
  # that and far below a step's change (~1e-3). The key bias is left out: its gradient is zero in
  # exact arithmetic (a shift of every key's score by q.b cancels in the softmax), so what the
  # optimizer sees is rounding noise, which AdaGrad's normalisation turns into steps of the
  # learning rate's size in directions that depend on the summation order.
  h5diff -d 1e-5 --exclude-path /block0/attention/key/bias "$work/shards1/$final" "$work/shards$shards/$final" \
    /parameters || fail "the parameters after resuming on $shards shards differ from the 1-shard continuation"
done
# The same move with the block size given: the run the flagless one must be, bit for bit.
for shards in 2 4; do
  cp -r "$work/base" "$work/given$shards"
  launch "$shards" "$work/given$shards.log" --weight-shards "$shards" --max-steps 10 --resume \
    --shampoo-block-size 32 --checkpoint-dir "$work/given$shards" ||
    fail "resuming on $shards shards with --shampoo-block-size 32 failed: $(tail -3 "$work/given$shards.log")"
  for group in /parameters /optimizer; do
    h5diff "$work/given$shards/$final" "$work/shards$shards/$final" "$group" ||
      fail "$group differs between the runs on $shards shards with and without --shampoo-block-size 32"
  done
done
echo "resume_across_layouts: 1 -> 2 and 1 -> 4 shards match the 1-shard continuation within 1e-5," \
  "and the runs given --shampoo-block-size 32 bit for bit"

# 2. The default block size of one shard (128) does not divide the slices of 2 (64 each).
launch 1 "$work/default.log" --weight-shards 1 --max-steps 2 --checkpoint-dir "$work/default" ||
  fail "writing the default-block checkpoint failed: $(tail -3 "$work/default.log")"
status=0
launch 2 "$work/refused.log" --weight-shards 2 --max-steps 4 --resume --checkpoint-dir "$work/default" || status=$?
[ "$status" -eq 2 ] || fail "resuming the 128-block checkpoint on 2 shards exited with $status, expected 2"
grep -q "holds Shampoo blocks of 128.*--shampoo-block-size 64, 32, .* or 1" "$work/refused.log" ||
  fail "the refusal does not name the block size and the flag: $(cat "$work/refused.log")"
if grep -q "^step [0-9]" "$work/refused.log"; then fail "the refused run took a step"; fi
grep "holds Shampoo blocks" "$work/refused.log"

# 3. Another --n-head.
status=0
launch 1 "$work/heads.log" --weight-shards 1 --n-head 8 --max-steps 4 --resume --checkpoint-dir "$work/default" ||
  status=$?
[ "$status" -eq 2 ] || fail "resuming with another --n-head exited with $status, expected 2"
grep -q -- "--n-head 4 in the checkpoint (this run: 8)" "$work/heads.log" ||
  fail "the refusal does not name --n-head: $(cat "$work/heads.log")"
grep -- "--n-head" "$work/heads.log"
