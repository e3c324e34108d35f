// The delta-rule fixture (tests/fixtures/delta-rule, written by transformers' own gated delta rule)
// for the kernels' tests: the CPU ones (delta_rule_test.cpp) and the CUDA ones (cuda_ops_test.cpp).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.h"

namespace loom::kernels::testing {

inline const checkpoint::SafetensorsReader& delta_rule_fixture() {
  static const checkpoint::SafetensorsReader reader(std::string(LOOM_SOURCE_DIR) +
                                                    "/tests/fixtures/delta-rule/delta_rule.safetensors");
  return reader;
}

// One case: inputs, transformers' chunked and recurrent outputs and final states; initial_state is
// undefined where the case starts from zero.
struct DeltaRuleCase {
  at::Tensor q, k, v, g, beta, initial_state, chunk, recurrent, final_state;
  std::vector<int64_t> cu_seqlens;
};

inline DeltaRuleCase load_delta_rule_case(const std::string& name) {
  const auto& f = delta_rule_fixture();
  DeltaRuleCase c;
  c.q = f.load(name + ".q");
  c.k = f.load(name + ".k");
  c.v = f.load(name + ".v");
  c.g = f.load(name + ".g");
  c.beta = f.load(name + ".beta");
  c.chunk = f.load(name + ".chunk");
  c.recurrent = f.load(name + ".recurrent");
  c.final_state = f.load(name + ".final_state");
  if (f.contains(name + ".initial_state")) c.initial_state = f.load(name + ".initial_state");
  const at::Tensor cu = f.load(name + ".cu_seqlens");
  c.cu_seqlens.assign(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  return c;
}

// Every case's name: lengths 1, 63, 64, 65, three packed samples, an initial state, 4096 tokens
// whole and as three packed samples.
inline const std::vector<std::string>& delta_rule_cases() {
  static const std::vector<std::string> names{"len1",   "len63",   "len64",   "len65",
                                              "packed", "initial", "len4096", "packed4096"};
  return names;
}

}  // namespace loom::kernels::testing
