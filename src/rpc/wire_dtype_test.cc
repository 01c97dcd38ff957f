// The 16-bit wire dtypes against simple, independent references: every one of the 2^32 float32
// bit patterns rounded to bfloat16 and float16 (through the array loops the transports use), every
// 16-bit pattern widened, round trips, and error feedback.
#include "rpc/wire_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace psflow::rpc {
namespace {

// The nearest of the two bfloat16 values around |x| (its upper 16 bits, and the next one up,
// where the one past the largest finite value stands for 2^128), measured in double; ties to the
// even one. NaN is handled by the caller.
uint16_t ReferenceBFloat16(float x) {
  const uint32_t b = FloatBits(x);
  const uint32_t sign = b & 0x80000000u, a = b & 0x7fffffffu;
  if (a == 0x7f800000u) return static_cast<uint16_t>(b >> 16);
  const uint32_t lo = a & 0xffff0000u, hi = lo + 0x10000u;
  const double v = std::fabs(static_cast<double>(x));
  const double lo_v = FloatOfBits(lo);
  const double hi_v = hi == 0x7f800000u ? 0x1p128 : static_cast<double>(FloatOfBits(hi));
  const double d_lo = v - lo_v, d_hi = hi_v - v;
  const uint32_t pick = d_lo < d_hi ? lo : d_hi < d_lo ? hi : ((lo >> 16) & 1u) == 0 ? lo : hi;
  return static_cast<uint16_t>((sign | pick) >> 16);
}

double DoubleOfBits(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}

// The float16 value nearest x, as a double: |x| in units of the float16 spacing at its exponent
// (2^-24 below 2^-14) rounded to an integer by the default rounding mode (ties to even; adding and
// subtracting 2^52 rounds a double below 2^52 to an integer), infinite past 65504. NaN is handled
// by the caller.
double ReferenceHalfValue(float x) {
  const uint32_t a = FloatBits(x) & 0x7fffffffu;
  const double v = std::fabs(static_cast<double>(x));
  const int exponent = std::max(static_cast<int>(a >> 23) - 127, -14);                        // of |x|: [2^e, 2^(e+1))
  const double per_unit = DoubleOfBits(static_cast<uint64_t>(1023 - (exponent - 10)) << 52);  // 2^-(e-10)
  const double unit = DoubleOfBits(static_cast<uint64_t>(1023 + (exponent - 10)) << 52);
  const double units = v * per_unit;  // exact: a power of two
  double q = ((units + 0x1p52) - 0x1p52) * unit;
  if (q > 65504.0 || a == 0x7f800000u) q = std::numeric_limits<double>::infinity();
  return std::signbit(x) ? -q : q;
}

double ReferenceHalfToDouble(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

double ReferenceBFloat16ToDouble(uint16_t h) {
  const int e = (h >> 7) & 0xff, m = h & 0x7f;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0xff) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (e == 0) return sign * std::ldexp(m, -133);
  return sign * std::ldexp(128 + m, e - 134);
}

bool SameValue(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// Calls check(first_bits, floats, encoded) over every float32 bit pattern in blocks, on a few
// threads; returns the number of patterns check found wrong.
template <typename Check>
int64_t OverEveryFloat(WireDtype dtype, Check check) {
  constexpr uint64_t kBlock = 1 << 16;
  const int threads = std::max(2u, std::thread::hardware_concurrency());
  std::vector<int64_t> wrong(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<uint32_t> bits(kBlock);
      std::vector<float> x(kBlock);
      std::vector<uint16_t> h(kBlock);
      for (uint64_t first = static_cast<uint64_t>(t) * kBlock; first < (uint64_t{1} << 32);
           first += static_cast<uint64_t>(threads) * kBlock) {
        for (uint64_t i = 0; i < kBlock; ++i) bits[i] = static_cast<uint32_t>(first + i);
        std::memcpy(x.data(), bits.data(), kBlock * 4);
        EncodeFloats(dtype, x.data(), kBlock, h.data());
        for (uint64_t i = 0; i < kBlock; ++i) wrong[t] += !check(x[i], h[i]);
      }
    });
  }
  for (std::thread& t : pool) t.join();
  int64_t total = 0;
  for (int64_t w : wrong) total += w;
  return total;
}

TEST(WireDtypeTest, EveryFloatRoundsToTheNearestBFloat16) {
  const int64_t wrong = OverEveryFloat(WireDtype::kBFloat16, [](float x, uint16_t h) {
    if (std::isnan(x)) return std::isnan(BFloat16ToFloat(h)) && (h >> 15) == (FloatBits(x) >> 31);
    return h == ReferenceBFloat16(x) && h == FloatToBFloat16(x);
  });
  EXPECT_EQ(wrong, 0);
}

TEST(WireDtypeTest, EveryFloatRoundsToTheNearestFloat16) {
  const int64_t wrong = OverEveryFloat(WireDtype::kFloat16, [](float x, uint16_t h) {
    if (std::isnan(x)) return std::isnan(HalfToFloat(h)) && (h >> 15) == (FloatBits(x) >> 31);
    // HalfToFloat is checked against ReferenceHalfToDouble on every half below.
    return SameValue(HalfToFloat(h), ReferenceHalfValue(x)) && h == FloatToHalf(x);
  });
  EXPECT_EQ(wrong, 0);
}

TEST(WireDtypeTest, EverySixteenBitValueWidensExactlyAndRoundTrips) {
  std::vector<uint16_t> all(1 << 16), back(1 << 16);
  for (uint32_t i = 0; i < (1u << 16); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(1 << 16);
  for (WireDtype dtype : {WireDtype::kBFloat16, WireDtype::kFloat16}) {
    DecodeFloats(dtype, all.data(), 1 << 16, wide.data());
    EncodeFloats(dtype, wide.data(), 1 << 16, back.data());
    int64_t wrong = 0;
    for (uint32_t i = 0; i < (1u << 16); ++i) {
      const double want =
          dtype == WireDtype::kFloat16 ? ReferenceHalfToDouble(all[i]) : ReferenceBFloat16ToDouble(all[i]);
      const float scalar = dtype == WireDtype::kFloat16 ? HalfToFloat(all[i]) : BFloat16ToFloat(all[i]);
      wrong += !SameValue(wide[i], want) || FloatBits(scalar) != FloatBits(wide[i]);
      // Every value the format holds comes back as itself; NaN as a NaN of the same sign.
      wrong += std::isnan(want) ? !(std::isnan(wide[i]) && back[i] >> 15 == all[i] >> 15) : back[i] != all[i];
    }
    EXPECT_EQ(wrong, 0) << WireDtypeName(dtype);
  }
}

TEST(WireDtypeTest, EdgesByName) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie rounds to even, past the largest: Inf
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // half of it: a tie, to even zero
  EXPECT_EQ(FloatToHalf(0x1.8p-25f), 0x0001);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(0x1.ff8p-15f), 0x03ff);  // the largest subnormal
  EXPECT_EQ(FloatToHalf(0x1.ffcp-15f), 0x0400);  // a tie: up into the smallest normal (even)
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16(inf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBFloat16(FloatOfBits(0x00018000u)), 0x0002);                         // a subnormal tie, to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);                                   // tie to even (down)
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f + 0x1p-7f), 0x3f82);                         // tie to even (up)
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(FloatOfBits(0x7f800001u)))));  // a NaN whose payload is low
  EXPECT_EQ(ParseWireDtype("bfloat16").value(), WireDtype::kBFloat16);
  EXPECT_EQ(ParseWireDtype("").value(), WireDtype::kFloat32);
  EXPECT_FALSE(ParseWireDtype("fp16").ok());
}

// A gradient 16-bit formats cannot hold, pushed many times: with error feedback the values sent
// add up to the gradients' sum within one rounding (without it, the error grows with each push).
TEST(WireDtypeTest, ErrorFeedbackCarriesTheRoundingIntoTheNextPush) {
  for (WireDtype dtype : {WireDtype::kBFloat16, WireDtype::kFloat16}) {
    const std::vector<float> grad = {1.0f + 0x1p-12f, 3.3e-3f, -7.77e-5f, 0x1p-20f, 0.0f};
    std::vector<float> residual(grad.size(), 0.0f), out(grad.size());
    std::vector<double> sent(grad.size(), 0.0), plain(grad.size(), 0.0);
    constexpr int kPushes = 1000;
    for (int k = 0; k < kPushes; ++k) {
      RoundWithFeedback(dtype, grad.data(), residual.data(), out.data(), static_cast<int64_t>(grad.size()));
      for (size_t i = 0; i < grad.size(); ++i) {
        uint16_t h;
        EncodeFloats(dtype, &out[i], 1, &h);
        float back;
        DecodeFloats(dtype, &h, 1, &back);
        EXPECT_EQ(FloatBits(back), FloatBits(out[i])) << "the value sent is exact in the format";
        sent[i] += out[i];
        EncodeFloats(dtype, &grad[i], 1, &h);
        DecodeFloats(dtype, &h, 1, &back);
        plain[i] += back;
      }
    }
    for (size_t i = 0; i < grad.size(); ++i) {
      const double want = static_cast<double>(grad[i]) * kPushes;
      EXPECT_LE(std::fabs(sent[i] - want), std::fabs(static_cast<double>(grad[i])) * 0x1p-6 + 1e-30)
          << WireDtypeName(dtype) << " " << grad[i];
    }
    // Rounding without feedback loses 2^-12 of 1 + 2^-12 every push.
    EXPECT_GT(std::fabs(plain[0] - static_cast<double>(grad[0]) * kPushes), 0.2);
  }
  // A NaN or an infinity resets the residual instead of keeping it forever.
  std::vector<float> g = {std::nanf(""), 1e6f}, r = {0.25f, 0.0f}, out(2);
  RoundWithFeedback(WireDtype::kFloat16, g.data(), r.data(), out.data(), 2);
  EXPECT_EQ(r[0], 0.0f);
  EXPECT_EQ(r[1], 0.0f);
  EXPECT_TRUE(std::isinf(out[1]));
}

}  // namespace
}  // namespace psflow::rpc
