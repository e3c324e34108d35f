# ParallelState's process groups and Comm's collectives across 4 real processes through `loom run`:
# the gtest cases ParallelStateUnderLoomRun (tp 2 x dp 2, ep 2: each group's sums) and
# CollectivesUnderLoomRun (all-reduce sum and mean, reduce-scatter, all-gather, fp32 and bf16) and
# MappingsUnderLoomRun (each autograd-aware collective's forward and backward, the all-to-alls'
# too), SendRecvUnderLoomRun (a ring of sends in every dtype, several in flight under their tags)
# and AllToAllUnderLoomRun (unequal splits) run in every rank; so does ExpertsUnderLoomRun
# (expert parallelism's exchange: rows to the ranks holding their experts and back).
source "$(dirname "$0")/lib.bash"
TESTS=$(dirname "$LOOM")/loom_dist_tests
"$LOOM" run -n 4 -- "$TESTS" --gtest_filter='*UnderLoomRun.*' > "$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "a rank failed"; }
"$LOOM" run -n 4 -- "$(dirname "$LOOM")/loom_parallel_tests" --gtest_filter='*UnderLoomRun.*' > "$WORK/experts.log" 2>&1 ||
  { cat "$WORK/experts.log"; fail "a rank failed the experts' exchange"; }
for rank in 0 1 2 3; do
  grep -q "^\[rank $rank\] \[       OK \] ExpertsUnderLoomRun.ExchangeHasItsClosedForms" "$WORK/experts.log" ||
    { cat "$WORK/experts.log"; fail "rank $rank did not pass ExpertsUnderLoomRun (or skipped it)"; }
done
for rank in 0 1 2 3; do
  for test in ParallelStateUnderLoomRun.EachGroupSumsOverTheRanksOfItsAxes CollectivesUnderLoomRun.EachHasItsClosedForm \
      MappingsUnderLoomRun.ForwardAndBackwardHaveTheirClosedForms \
      MappingsUnderLoomRun.AllToAllsForwardAndBackwardHaveTheirClosedForms \
      SendRecvUnderLoomRun.MessagesArriveWithTheirClosedForms AllToAllUnderLoomRun.UnequalSplitsHaveTheirClosedForms; do
    grep -q "^\[rank $rank\] \[       OK \] $test" "$WORK/run.log" ||
      { cat "$WORK/run.log"; fail "rank $rank did not pass $test (or skipped it)"; }
  done
done
echo "parallel state: 4 ranks formed tp, dp, ep, edp, dp x cp and tp x pp groups with the right sums; collectives, sends, all-to-alls and the experts' exchange match their closed forms"
