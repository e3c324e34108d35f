# ParallelState's process groups across 4 real processes through `loom run`: the gtest case
# ParallelStateUnderLoomRun runs in every rank (tp 2 x dp 2, ep 2) and checks each group's sums.
source "$(dirname "$0")/lib.bash"
TESTS=$(dirname "$LOOM")/loom_dist_tests
"$LOOM" run -n 4 -- "$TESTS" --gtest_filter='ParallelStateUnderLoomRun.*' > "$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "a rank failed"; }
for rank in 0 1 2 3; do
  grep -q "^\[rank $rank\] \[       OK \] ParallelStateUnderLoomRun.EachGroupSumsOverTheRanksOfItsAxes" "$WORK/run.log" ||
    { cat "$WORK/run.log"; fail "rank $rank did not pass (or skipped)"; }
done
echo "parallel state: 4 ranks formed tp, dp, ep, edp, dp x cp and tp x pp groups with the right sums"
