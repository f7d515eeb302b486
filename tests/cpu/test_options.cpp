// The core options (core/options.h): the names of every option enum, one table each, and the
// rules that refuse options which cannot be honoured together (the C API and the emulation share them).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "core/options.h"

namespace flamia {
namespace {

template <OptionEnum E>
void expect_table_round_trips() {
  std::set<std::string_view> names;
  std::set<int> values;
  for (const EnumName<E>& e : enum_names<E>()) {
    EXPECT_EQ(to_string(e.value), e.name);
    EXPECT_EQ(parse_option<E>(e.name), e.value) << e.name;
    EXPECT_TRUE(names.insert(e.name).second) << "duplicate name " << e.name;
    EXPECT_TRUE(values.insert(int(e.value)).second) << "duplicate value for " << e.name;
    EXPECT_NE(option_names<E>().find(e.name), std::string::npos) << e.name;
  }
  EXPECT_FALSE(parse_option<E>("").has_value());
  EXPECT_FALSE(parse_option<E>("no such name").has_value());
}

TEST(OptionNames, EveryNameRoundTrips) {
  expect_table_round_trips<Route>();
  expect_table_round_trips<Isolation>();
  expect_table_round_trips<ScaleGeometry>();
  expect_table_round_trips<ScaleRule>();
  expect_table_round_trips<UScaleGeometry>();
  expect_table_round_trips<DqReduction>();
}

// The spellings the CLI, JSON and the Python API use.
TEST(OptionNames, NamesAsTheInterfacesSpellThem) {
  EXPECT_EQ(option_names<Route>(), "mxfp8 or nvfp4_mixed");
  EXPECT_EQ(option_names<Isolation>(), "document or prefix");
  EXPECT_EQ(option_names<ScaleGeometry>(), "block32 or token");
  EXPECT_EQ(option_names<ScaleRule>(), "ceil or floor");
  EXPECT_EQ(option_names<UScaleGeometry>(), "rowcol or square32");
  EXPECT_EQ(option_names<DqReduction>(), "deterministic or fp16_partials");
  EXPECT_FALSE(parse_option<ScaleGeometry>("Block32").has_value()) << "names are case-sensitive";
}

// Only the enums flamia_options carries have C constants; the emulation-only ones have none.
TEST(OptionNames, CConstantsOnlyForTheCApiEnums) {
  for (const auto& e : enum_names<Isolation>()) EXPECT_FALSE(e.c_name.empty());
  for (const auto& e : enum_names<ScaleGeometry>()) EXPECT_FALSE(e.c_name.empty());
  for (const auto& e : enum_names<ScaleRule>()) EXPECT_FALSE(e.c_name.empty());
  for (const auto& e : enum_names<Route>()) EXPECT_TRUE(e.c_name.empty());
  for (const auto& e : enum_names<UScaleGeometry>()) EXPECT_TRUE(e.c_name.empty());
  for (const auto& e : enum_names<DqReduction>()) EXPECT_TRUE(e.c_name.empty());
}

// The error for options, or "" when they are valid.
std::string error_of(const AttentionOptions& o, int head_dim) { return options_error(o, head_dim).value_or(""); }

TEST(OptionsCheck, DefaultsAreValid) {
  for (int d : {16, 64, 96, 128}) EXPECT_EQ(error_of({}, d), "") << d;
  EXPECT_NO_THROW(check_options({}, 64));
  EXPECT_EQ(NumericsOptions{}.p_boost_log2, kPBoostLog2Default);
}

// flash_attn's window_size on document-local positions: i - left <= j <= i + right, -1 unbounded,
// causal capping the right side at i, and the document's ends capping both.
TEST(AttentionShapeKeys, WindowsAsFlashAttentionDefinesThem) {
  const auto keys = [](AttentionShape s, int p, int len) {
    const KeyRange r = s.keys_of(p, len);
    return std::pair{r.first, r.last};
  };
  EXPECT_EQ(keys({.causal = true}, 5, 10), std::pair(0, 5));
  EXPECT_EQ(keys({.causal = false}, 5, 10), std::pair(0, 9));
  EXPECT_EQ(keys({.causal = true, .window_left = 2}, 5, 10), std::pair(3, 5));
  EXPECT_EQ(keys({.causal = true, .window_left = 2}, 1, 10), std::pair(0, 1));
  EXPECT_EQ(keys({.causal = true, .window_left = 0}, 5, 10), std::pair(5, 5));
  EXPECT_EQ(keys({.causal = true, .window_left = 2, .window_right = 3}, 5, 10), std::pair(3, 5));  // causal caps
  EXPECT_EQ(keys({.causal = false, .window_left = 2, .window_right = 3}, 5, 10), std::pair(3, 8));
  EXPECT_EQ(keys({.causal = false, .window_left = 2, .window_right = 3}, 8, 10), std::pair(6, 9));
  EXPECT_EQ(keys({.causal = false, .window_left = -1, .window_right = 0}, 8, 10), std::pair(0, 8));
  EXPECT_TRUE((AttentionShape{.causal = true, .window_left = 4}).windowed());
  EXPECT_FALSE((AttentionShape{.causal = true, .window_right = 4}).windowed());  // causal: no bound added
  EXPECT_TRUE((AttentionShape{.causal = false, .window_right = 4}).windowed());
  EXPECT_FALSE(AttentionShape{}.windowed());
}

TEST(AttentionShapeScores, SoftcapAndItsSlope) {
  const AttentionShape capped{.softcap = 2.0}, raw{};
  EXPECT_EQ(raw.score(7.5), 7.5);
  EXPECT_EQ(raw.score_slope(7.5), 1.0);
  EXPECT_DOUBLE_EQ(capped.score(1.0), 2.0 * std::tanh(0.5));
  EXPECT_LT(capped.score(5.0), 2.0);
  EXPECT_LE(capped.score(1000.0), 2.0);
  const double x = 0.7, h = 1e-6;  // the slope is d score / dx, at the capped score
  EXPECT_NEAR(capped.score_slope(capped.score(x)), (capped.score(x + h) - capped.score(x - h)) / (2 * h), 1e-9);
}

TEST(OptionsCheck, RefusesWhatCannotBeHonouredTogether) {
  for (auto [left, right] : {std::pair{-2, 0}, std::pair{0, -5}}) {
    AttentionOptions o;
    o.shape.window_left = left, o.shape.window_right = right;
    EXPECT_NE(error_of(o, 64).find("window must be (left, right) with each >= 0, or -1"), std::string::npos);
  }
  for (double cap : {-1.0, double(INFINITY), double(NAN)}) {
    AttentionOptions o;
    o.shape.softcap = cap;
    EXPECT_NE(error_of(o, 64).find("softcap must be finite and > 0, or 0"), std::string::npos) << cap;
  }
  {
    AttentionOptions o;
    o.shape.window_left = 0, o.shape.softcap = 30.0;
    o.numerics.isolation = Isolation::kPrefix;
    EXPECT_EQ(error_of(o, 64), "");  // a window and a cap keep prefix isolation's contract
  }

  AttentionOptions prefix_non_causal;
  prefix_non_causal.shape.causal = false;
  prefix_non_causal.numerics.isolation = Isolation::kPrefix;
  EXPECT_NE(error_of(prefix_non_causal, 64).find("isolation=prefix needs causal=true"), std::string::npos);
  prefix_non_causal.shape.causal = true;
  EXPECT_EQ(error_of(prefix_non_causal, 64), "");

  AttentionOptions squares;
  squares.numerics.isolation = Isolation::kPrefix;
  squares.numerics.u_scale = UScaleGeometry::kSquare32;
  EXPECT_NE(error_of(squares, 64).find("isolation=prefix needs u_scale=rowcol"), std::string::npos);
  squares.numerics.isolation = Isolation::kDocument;
  EXPECT_EQ(error_of(squares, 64), "");

  for (int boost : {-1, kPBoostLog2Max + 1}) {
    AttentionOptions o;
    o.numerics.p_boost_log2 = boost;
    EXPECT_NE(error_of(o, 64).find("p_boost_log2 must lie in [0, 8]"), std::string::npos) << boost;
  }
  for (int boost : {0, kPBoostLog2Max}) {
    AttentionOptions o;
    o.numerics.p_boost_log2 = boost;
    EXPECT_EQ(error_of(o, 64), "") << boost;
  }

  AttentionOptions mixed;
  mixed.numerics.route = Route::kNvfp4Mixed;
  EXPECT_EQ(error_of(mixed, 48), "");
  EXPECT_EQ(error_of(mixed, 24), "route=nvfp4_mixed needs head_dim a multiple of 16 (NVFP4 block scales), got 24");

  AttentionOptions rotated;
  rotated.numerics.hadamard = true;
  EXPECT_EQ(error_of(rotated, 64), "");
  EXPECT_EQ(error_of(rotated, 192), "");
  EXPECT_EQ(error_of(rotated, 96), "hadamard=true needs head_dim a multiple of 64, got 96");
  EXPECT_THROW(check_options(rotated, 96), std::invalid_argument);

  // 0 is the default 1/sqrt(head_dim); a negative or non-finite scale is refused, as in the C API.
  for (double scale : {0.0, 0.125, 3.0}) {
    AttentionOptions o;
    o.shape.softmax_scale = scale;
    EXPECT_EQ(error_of(o, 64), "") << scale;
  }
  for (double scale : {-0.125, std::nan(""), HUGE_VAL}) {
    AttentionOptions o;
    o.shape.softmax_scale = scale;
    EXPECT_NE(error_of(o, 64).find("softmax_scale must be finite and > 0"), std::string::npos) << scale;
  }
}

}  // namespace
}  // namespace flamia
