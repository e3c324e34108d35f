# The trainer assumes no model family: the test-only MLP regression (tests/unit/train/toy_task.h)
# trains through the same Trainer on two ranks of `loom run -n 2` under data parallelism, ZeRO-1
# and FSDP, each with the one-process run's losses to 1e-6 (ToyTaskUnderLoomRun, asserted on rank 0
# and passed by both).
source "$(dirname "$0")/lib.bash"
TESTS=$(dirname "$LOOM")/loom_train_tests
"$LOOM" run -n 2 -- "$TESTS" --gtest_filter='ToyTaskUnderLoomRun.*' > "$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "a rank failed"; }
for rank in 0 1; do
  grep -q "^\[rank $rank\] \[       OK \] ToyTaskUnderLoomRun.DataParallelZero1AndFsdpGiveTheOneProcessLosses" "$WORK/run.log" ||
    { cat "$WORK/run.log"; fail "rank $rank did not pass (or skipped) the toy task under loom run"; }
done
echo "generic trainer: a test-only MLP task trained under dp=2, ZeRO-1 and FSDP with the one-process losses"
