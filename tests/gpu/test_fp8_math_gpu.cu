// The kernels' scale arithmetic (cuda/sm90/fp8_math.cuh) against the host's formats rules over
// the whole domain: 2^e and 2^-e of every UE8M0 code, built from the code's bits. (The backward's
// sigma and tau are these of formats::scale_for_float_amax's code, which the CPU tests check
// against the double rule on every float exponent.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/sm90/fp8_math.cuh"
#include "forward_harness.h"
#include "formats/scales.h"

namespace flamia::gpu_test {
namespace {

bool same_float(float a, float b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, sizeof a) == 0; }

// The host's value of 2^(sign * e) for a code, as a float (exact: e in [-127, 127]).
float host_pow2(uint8_t code, int sign) {
  if (formats::ue8m0_is_nan(code)) return std::numeric_limits<float>::quiet_NaN();
  return float(std::ldexp(1.0, sign * formats::ue8m0_exponent(code)));
}

__global__ void powers_of_every_code(float* pow, float* inv) {
  const int code = threadIdx.x;
  pow[code] = cuda::sm90::pow2_of_scale(uint8_t(code));
  inv[code] = cuda::sm90::inv_pow2_of_scale(uint8_t(code));
}

TEST(Fp8Math, PowersOfTwoOfEveryScaleCode) {
  FLAMIA_REQUIRE_GPU();
  DeviceBuffer pow(256 * sizeof(float)), inv(256 * sizeof(float));
  powers_of_every_code<<<1, 256>>>(static_cast<float*>(pow.get()), static_cast<float*>(inv.get()));
  FLAMIA_CUDA_CHECK(cudaGetLastError());
  std::vector<float> p(256), q(256);
  FLAMIA_CUDA_CHECK(cudaMemcpy(p.data(), pow.get(), 256 * sizeof(float), cudaMemcpyDeviceToHost));
  FLAMIA_CUDA_CHECK(cudaMemcpy(q.data(), inv.get(), 256 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int code = 0; code < 256; ++code) {
    EXPECT_TRUE(same_float(p[code], host_pow2(uint8_t(code), +1))) << "2^e of code " << code << ": " << p[code];
    EXPECT_TRUE(same_float(q[code], host_pow2(uint8_t(code), -1))) << "2^-e of code " << code << ": " << q[code];
  }
}

}  // namespace
}  // namespace flamia::gpu_test
