// e^x over an array, in place, written so the compiler vectorises it at any x86-64 baseline (glibc's
// expf is a scalar call: it was a sixth of flash attention's time). Range reduction x = n ln2 + r with n
// rounded to nearest, a degree-6 polynomial for e^r on |r| <= ln2/2 (relative error under 2e-7),
// and 2^n built in the exponent bits. Inputs below -87 give 0 (e^-87 is below fp32's normal
// range); -inf gives 0; inputs above 88 are not expected (the kernels exponentiate scores minus
// their maximum, which are <= 0).
#pragma once
#include <cstdint>

namespace loom::kernels::cpu {

void exp_in_place(float* x, int64_t n);

}  // namespace loom::kernels::cpu
