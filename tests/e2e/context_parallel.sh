# Context-parallel attention across 4 real processes through `loom run`: the gtest cases
# ContextAttentionUnderLoomRun (Ulysses, ring and their hybrid at cp 4 and cp 2 against flash
# attention over the whole sequence, forward and backward; the ring of 4 on 1, 127 and 4096 tokens)
# run in every rank.
source "$(dirname "$0")/lib.bash"
TESTS=$(dirname "$LOOM")/loom_nn_tests
"$LOOM" run -n 4 -- "$TESTS" --gtest_filter='ContextAttentionUnderLoomRun.*' > "$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "a rank failed"; }
for rank in 0 1 2 3; do
  for test in ContextAttentionUnderLoomRun.UlyssesRingAndHybridAreTheWholeAttention \
      ContextAttentionUnderLoomRun.RingOfFourOnSequencesOf1And127And4096Tokens; do
    grep -q "^\[rank $rank\] \[       OK \] $test" "$WORK/run.log" ||
      { cat "$WORK/run.log"; fail "rank $rank did not pass $test (or skipped it)"; }
  done
done
echo "context parallel: Ulysses, ring and hybrid attention at cp 4 and cp 2 match flash attention over the whole sequence, forward and backward"
