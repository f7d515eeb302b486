// The kernels' scale arithmetic (cuda/sm90/fp8_math.cuh) against the host's formats rules over
// the whole domain: 2^e and 2^-e of every UE8M0 code, built from the code's bits; the row scales of
// the backward's dS operands from a quad's max (the backward's sigma and tau are these of
// formats::scale_for_float_amax's code, which the CPU tests check against the double rule on every
// float exponent); and the E4M3 decode of every pair of codes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/sm90/fp8_math.cuh"
#include "forward_harness.h"
#include "formats/minifloat.h"
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

// ceil_row_scales over one warp: lane l holds lane_amax {in[2l], in[2l + 1]}; every lane writes
// its two rows' 2^s and 2^-s.
__global__ void row_scales_of_a_warp(const float* in, float* pow, float* inv) {
  const int lane = int(threadIdx.x);
  const float lane_amax[2] = {in[2 * lane], in[2 * lane + 1]};
  const cuda::sm90::RowScales rs = cuda::sm90::ceil_row_scales(lane_amax);
  for (int r = 0; r < 2; ++r) {
    pow[2 * lane + r] = rs.pow[r];
    inv[2 * lane + r] = rs.inv[r];
  }
}

// sigma's and tau's scales: the ceil rule of the quad's max |.|, where the four lanes of a quad
// (one accumulator row) hold the row's max in one lane and smaller values (or finite ones next to
// a NaN) in the others, so the quad max is the row's max. (A construction that gives the lanes of
// a quad different maxima would fail on its own terms.)
TEST(Fp8Math, CeilRowScalesFollowTheScaleRuleOfTheQuadMax) {
  FLAMIA_REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float maxima[] = {0.f,     1e-40f,  1.1754944e-38f, 1e-30f,   0.5f,     1.f,      1.75f,   1.7500001f,
                          3.5f,    448.f,   448.00003f,     449.f,    480.f,    512.f,    896.f,   1e10f,
                          3e38f,   inf,     nan,            0.0078125f, 2.9e-39f, 6.5e4f, 1.2e-7f, 7.f};
  constexpr int kRows = 16;  // 8 quads x 2 rows per launch
  DeviceBuffer in(64 * sizeof(float)), pow(64 * sizeof(float)), inv(64 * sizeof(float));
  for (size_t first = 0; first < std::size(maxima); first += kRows) {
    std::vector<float> lanes(64), expect_max(kRows);
    for (int q = 0; q < 8; ++q)
      for (int r = 0; r < 2; ++r) {
        const float m = maxima[(first + size_t(q * 2 + r)) % std::size(maxima)];
        expect_max[q * 2 + r] = m;
        for (int t = 0; t < 4; ++t) {
          // lane (q, t): the max at t = (q + r) % 4, elsewhere a smaller value (finite beside NaN).
          const float other = std::isnan(m) ? 1.f : t % 2 ? m * 0.5f : 0.f;
          lanes[size_t(2 * (4 * q + t) + r)] = t == (q + r) % 4 ? m : other;
        }
      }
    FLAMIA_CUDA_CHECK(cudaMemcpy(in.get(), lanes.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
    row_scales_of_a_warp<<<1, 32>>>(static_cast<const float*>(in.get()), static_cast<float*>(pow.get()),
                                    static_cast<float*>(inv.get()));
    FLAMIA_CUDA_CHECK(cudaGetLastError());
    std::vector<float> p(64), v(64);
    FLAMIA_CUDA_CHECK(cudaMemcpy(p.data(), pow.get(), 64 * sizeof(float), cudaMemcpyDeviceToHost));
    FLAMIA_CUDA_CHECK(cudaMemcpy(v.data(), inv.get(), 64 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 2; ++r) {
        const float m = expect_max[(lane / 4) * 2 + r];
        const uint8_t code = formats::scale_for_float_amax(m, formats::ScaleRule::kCeil);
        EXPECT_TRUE(same_float(p[size_t(2 * lane + r)], host_pow2(code, +1)))
            << "2^s, lane " << lane << " row " << r << ", max " << m << ": " << p[size_t(2 * lane + r)];
        EXPECT_TRUE(same_float(v[size_t(2 * lane + r)], host_pow2(code, -1)))
            << "2^-s, lane " << lane << " row " << r << ", max " << m << ": " << v[size_t(2 * lane + r)];
      }
  }
}

// decode_e4m3x2 (the backward prep's E4M3 decode, through the hardware's E4M3-to-half conversion)
// of every pair of codes: each value is the shared codec's formats::decode_e4m3, NaN for NaN.
__global__ void decode_every_pair(float2* out) {
  const int pair = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);  // low byte: the first code
  out[pair] = cuda::sm90::decode_e4m3x2(uint16_t(pair));
}

TEST(Fp8Math, DecodeOfEveryE4m3PairMatchesTheSharedCodec) {
  FLAMIA_REQUIRE_GPU();
  constexpr int kPairs = 1 << 16;
  DeviceBuffer out(kPairs * sizeof(float2));
  decode_every_pair<<<kPairs / 256, 256>>>(static_cast<float2*>(out.get()));
  FLAMIA_CUDA_CHECK(cudaGetLastError());
  std::vector<float2> got(kPairs);
  FLAMIA_CUDA_CHECK(cudaMemcpy(got.data(), out.get(), kPairs * sizeof(float2), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int pair = 0; pair < kPairs; ++pair) {
    const float2 g = got[size_t(pair)];
    const float want_lo = float(formats::decode_e4m3(uint8_t(pair)));
    const float want_hi = float(formats::decode_e4m3(uint8_t(pair >> 8)));
    if ((!same_float(g.x, want_lo) || !same_float(g.y, want_hi)) && ++wrong <= 8)
      ADD_FAILURE() << "codes 0x" << std::hex << (pair & 0xFF) << ", 0x" << (pair >> 8) << std::dec << ": got (" << g.x
                    << ", " << g.y << "), want (" << want_lo << ", " << want_hi << ")";
  }
  EXPECT_EQ(wrong, 0) << "pairs decoded differently from formats::decode_e4m3";
}

}  // namespace
}  // namespace flamia::gpu_test
