#include "reference/mxfp8_route.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dq_partials.h"
#include "core/parallel.h"
#include "core/tiling.h"
#include "formats/minifloat.h"

namespace flamia::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// max that lets NaN win, so a non-finite input poisons every result it reaches.
double nan_max(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? double(NAN) : std::max(a, b); }

const std::array<double, 256>& e4m3_values() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = formats::decode_e4m3(uint8_t(c));
    return t;
  }();
  return table;
}

// The unscaled E4M3 values of one document and head of an operand, [len, D], plus per-token
// scale exponents: the form every product below reads.
struct DocOperand {
  int dim = 0;
  std::vector<double> values;
  std::vector<double> exponents;
  const double* row(int p) const { return values.data() + size_t(p) * dim; }
};

// The first `len` rows of a document (all of it, or a prefix that holds every row a task reads).
DocOperand load(const Mxfp8Tensor& x, int begin, int len, int head) {
  const auto& lut = e4m3_values();
  DocOperand out;
  out.dim = x.dim;
  out.values.resize(size_t(len) * x.dim);
  out.exponents.resize(len);
  for (int p = 0; p < len; ++p) {
    const uint8_t* c = x.code_row(begin + p, head);
    for (int f = 0; f < x.dim; ++f) out.values[size_t(p) * x.dim + f] = lut[c[f]];
    out.exponents[p] = x.exponent(begin + p, head);
  }
  return out;
}

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int f = 0; f < n; ++f) s += a[f] * b[f];
  return s;
}
void axpy(double a, const double* x, double* y, int n) {
  for (int f = 0; f < n; ++f) y[f] += a * x[f];
}

// Rounds a fresh operand value to E4M3 and counts saturation (|x| > 448 clips).
double round_fresh(double x, int64_t& saturated) {
  if (std::fabs(x) > formats::kE4M3Max) ++saturated;
  return formats::round_e4m3(x);
}

// The last key that document-local query p of q_len queries sees among k_len keys
// (AttentionShape::keys_of; -1 or less when it sees none).
int last_visible_key(int p, int q_len, int k_len, const AttentionShape& shape) {
  return shape.keys_of(p, q_len, k_len).last;
}
// How many of a document's first keys the queries up to p see (0 when they see none).
int keys_seen_up_to(int p, int q_len, int k_len, const AttentionShape& shape) {
  return std::max(0, last_visible_key(p, q_len, k_len, shape) + 1);
}

// A base-2 logit soft-capped as the natural-log score is (AttentionShape::score), and the cap's
// derivative at it (AttentionShape::score_slope).
double capped_logit2(const AttentionShape& shape, double logit2) {
  return shape.softcap > 0 ? shape.score(logit2 / std::numbers::log2e) * std::numbers::log2e : logit2;
}
double logit2_slope(const AttentionShape& shape, double capped2) {
  return shape.score_slope(capped2 / std::numbers::log2e);
}

// Base-2 logit of query p and key j with the Q and K scales factored out of the dot product.
double logit2(const DocOperand& q, int p, const DocOperand& k, int j, double scale_log2e) {
  return dot(q.row(p), k.row(j), q.dim) * std::exp2(q.exponents[p] + k.exponents[j]) * scale_log2e;
}

// An NVFP4 score operand of one document and head (the mixed route): E2M1 values, the E4M3 block
// scales' values and the FP32 token scales.
struct Nvfp4DocOperand {
  int dim = 0, blocks = 0;
  std::vector<double> values;        // [len, D]
  std::vector<double> block_scales;  // [len, D / 16]
  std::vector<double> token_scales;  // [len]
  const double* row(int p) const { return values.data() + size_t(p) * dim; }
  const double* block_row(int p) const { return block_scales.data() + size_t(p) * blocks; }
};

Nvfp4DocOperand load_nvfp4(const Nvfp4Tensor& x, int begin, int len, int head) {
  Nvfp4DocOperand out;
  out.dim = x.dim, out.blocks = x.dim / Nvfp4Tensor::kBlock;
  out.values.resize(size_t(len) * x.dim);
  out.block_scales.resize(size_t(len) * out.blocks);
  out.token_scales.resize(len);
  for (int p = 0; p < len; ++p) {
    const uint8_t* c = x.code_row(begin + p, head);
    const uint8_t* b = x.block_row(begin + p, head);
    for (int f = 0; f < x.dim; ++f) out.values[size_t(p) * x.dim + f] = formats::decode(formats::kE2M1, c[f]);
    for (int i = 0; i < out.blocks; ++i) out.block_scales[size_t(p) * out.blocks + i] = formats::decode(formats::kE4M3, b[i]);
    out.token_scales[p] = double(x.token_scale(begin + p, head));
  }
  return out;
}

// Base-2 logit of the mixed route: the block scales vary along the contraction, so they apply
// inside the sum, block by block, as a block-scaled MMA applies them; the token scales are constant
// along it and are factored out. Each block's code sum is exact (E2M1 products are multiples of
// 1/4, at most 36 in magnitude), and so is its product with the two E4M3 scales; the blocks are
// summed in feature order.
double nvfp4_logit2(const Nvfp4DocOperand& q, int p, const Nvfp4DocOperand& k, int j, double scale_log2e) {
  const double *qc = q.row(p), *kc = k.row(j), *qb = q.block_row(p), *kb = k.block_row(j);
  double s = 0.0;
  for (int b = 0; b < q.blocks; ++b) {
    double block = 0.0;
    for (int f = b * Nvfp4Tensor::kBlock; f < (b + 1) * Nvfp4Tensor::kBlock; ++f) block += qc[f] * kc[f];
    s += block * (qb[b] * kb[b]);
  }
  return s * (q.token_scales[p] * k.token_scales[j]) * scale_log2e;
}

int kv_head_of(int q_head, int q_heads, int kv_heads) { return q_head / (q_heads / kv_heads); }

// K or V of one document and head as the pairs read it: the frontier's codes, and with interior
// codes (prefix isolation, block32) the block32 codes that interior pairs read instead.
struct PairOperand {
  DocOperand frontier, interior;
  bool has_interior = false;
  const DocOperand& at(int query, int key) const {
    return has_interior && tiling::interior_pair(query, key) ? interior : frontier;
  }
};
PairOperand load_pairs(const Mxfp8Tensor& x, const Mxfp8Tensor& x_interior, int begin, int len, int head) {
  PairOperand out;
  out.frontier = load(x, begin, len, head);
  out.has_interior = x_interior.tokens > 0;
  if (out.has_interior) out.interior = load(x_interior, begin, len, head);
  return out;
}


// q_docs and k_docs: cu_seqlens_q and cu_seqlens_k (the same object for self-attention), against
// the tokens of q, k and v.
void check_documents(int q_tokens, int k_tokens, int v_tokens, const Documents& q_docs, const Documents& k_docs,
                     const NumericsOptions& options) {
  if (&q_docs == &k_docs) {
    if (q_tokens != q_docs.total_tokens() || k_tokens != q_tokens || v_tokens != q_tokens)
      throw std::invalid_argument("q, k, v and cu_seqlens must cover the same number of tokens");
    return;
  }
  if (q_tokens != q_docs.total_tokens())
    throw std::invalid_argument("q has " + std::to_string(q_tokens) + " tokens but cu_seqlens_q covers " +
                                std::to_string(q_docs.total_tokens()));
  if (k_tokens != k_docs.total_tokens() || v_tokens != k_docs.total_tokens())
    throw std::invalid_argument("k and v have " + std::to_string(k_tokens) + " and " + std::to_string(v_tokens) +
                                " tokens but cu_seqlens_k covers " + std::to_string(k_docs.total_tokens()));
  if (q_docs.count() != k_docs.count())
    throw std::invalid_argument("cu_seqlens_q holds " + std::to_string(q_docs.count()) + " documents but cu_seqlens_k " +
                                std::to_string(k_docs.count()));
  // Interior pairs are a property of one token position shared by queries and keys (core/tiling.h).
  if (options.isolation == Isolation::kPrefix && q_docs.cu_seqlens() != k_docs.cu_seqlens())
    throw std::invalid_argument(
        "isolation=prefix needs the same documents for queries and keys (cu_seqlens_k equal to cu_seqlens_q)");
}

void check_inputs(const QuantizedInputs& in, const Documents& q_docs, const Documents& k_docs,
                  const NumericsOptions& options) {
  check_documents(in.q.tokens, in.k.tokens, in.v.tokens, q_docs, k_docs, options);
  if (in.k.heads != in.v.heads || in.k.heads == 0 || in.q.heads % in.k.heads != 0)
    throw std::invalid_argument("q heads (" + std::to_string(in.q.heads) + ") must be a multiple of k/v heads (" +
                                std::to_string(in.k.heads) + ")");
  if (in.k.dim != in.q.dim) throw std::invalid_argument("q and k must share the head dim");  // v may have its own
  if (in.route == Route::kNvfp4Mixed && (in.q_score.tokens != in.q.tokens || in.k_score.tokens != in.k.tokens))
    throw std::invalid_argument("the nvfp4_mixed route needs the NVFP4 score codes of q and k");
}

void check_route_matches(const QuantizedInputs& in, const NumericsOptions& options) {
  if (in.route != options.route)
    throw std::invalid_argument("the inputs were quantized for route=" + std::string(to_string(in.route)) +
                                " but the call asks for route=" + std::string(to_string(options.route)));
}

}  // namespace

double RouteStats::row_residual_rms() const { return rows ? std::sqrt(row_residual_sum_sq / double(rows)) : 0.0; }

void RouteStats::merge(const RouteStats& o) {
  saturated_q += o.saturated_q, saturated_k += o.saturated_k, saturated_v += o.saturated_v;
  saturated_g += o.saturated_g, saturated_p += o.saturated_p, saturated_u += o.saturated_u;
  u_nonzero += o.u_nonzero, u_zeroed += o.u_zeroed, rows += o.rows;
  row_residual_max = nan_max(row_residual_max, o.row_residual_max);
  row_residual_sum_sq += o.row_residual_sum_sq;
  dq_u_ratio_max = std::max(dq_u_ratio_max, o.dq_u_ratio_max);
  dq_acc_max = std::max(dq_acc_max, o.dq_acc_max);
}

QuantizedInputs quantize_inputs(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                const Documents& docs, const NumericsOptions& options) {
  return quantize_inputs(q, k, v, docs, docs, options);
}

QuantizedInputs quantize_inputs(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                const Documents& q_docs, const Documents& k_docs, const NumericsOptions& options) {
  check_documents(q.tokens, k.tokens, v.tokens, q_docs, k_docs, options);
  const ScaleGeometry geometry = options.effective_geometry();
  QuantizedInputs out;
  out.hadamard = options.hadamard;
  out.route = options.route;
  // Q and K rotated once (with Hadamard), read in place otherwise.
  PackedTensor q_rotated, k_rotated;
  if (options.hadamard) {
    q_rotated = q, k_rotated = k;
    hadamard_rotate(q_rotated);
    hadamard_rotate(k_rotated);
  }
  const PackedTensor& q_in = options.hadamard ? q_rotated : q;
  const PackedTensor& k_in = options.hadamard ? k_rotated : k;
  out.q = quantize_mxfp8(q_in, q_docs, geometry, options.scale_rule);
  out.k = quantize_mxfp8(k_in, k_docs, geometry, options.scale_rule);
  out.v = quantize_mxfp8(v, k_docs, geometry, options.scale_rule);
  if (options.route == Route::kNvfp4Mixed) {  // per (token, head) scales: no geometry, no document boundary to mind
    out.q_score = quantize_nvfp4(q_in);
    out.k_score = quantize_nvfp4(k_in);
  }
  if (options.interior_codes()) {
    out.k_interior = quantize_mxfp8(k_in, k_docs, ScaleGeometry::kBlock32, options.scale_rule);
    out.v_interior = quantize_mxfp8(v, k_docs, ScaleGeometry::kBlock32, options.scale_rule);
  }
  return out;
}

ForwardOutputs mxfp8_forward(const QuantizedInputs& in, const Documents& docs, const AttentionShape& shape,
                             const NumericsOptions& options, RouteStats* stats) {
  return mxfp8_forward(in, docs, docs, shape, options, stats);
}

ForwardOutputs mxfp8_forward(const QuantizedInputs& in, const Documents& docs, const Documents& k_docs,
                             const AttentionShape& shape, const NumericsOptions& options, RouteStats* stats) {
  check_inputs(in, docs, k_docs, options);
  check_options({shape, options}, in.q.dim);
  check_route_matches(in, options);
  const int T = in.q.tokens, Hq = in.q.heads, Hkv = in.k.heads, D = in.q.dim, Dv = in.v.dim;
  const double scale_log2e = shape.scale_for(D) * std::numbers::log2e;
  const bool mixed = in.route == Route::kNvfp4Mixed;
  const int boost = options.p_boost_log2;
  ForwardOutputs out{PackedTensor(T, Hq, Dv), HeadTokenTensor(Hq, T), HeadTokenTensor(Hq, T)};
  // Rows are independent: one task per (document, head, block of query rows), so a long document
  // spreads over every core. Each row's arithmetic is the same whatever the split.
  constexpr int kRowBlock = tiling::kFwdQueryTile;
  const std::vector<RowBlock> tasks = row_blocks(docs, Hq, kRowBlock);
  std::vector<RouteStats> task_stats(tasks.size());

  parallel_for(int(tasks.size()), [&](int t) {
    const auto [doc, h, p0] = tasks[t];
    const int begin = docs.begin(doc), len = docs.length(doc), p1 = std::min(len, p0 + kRowBlock);
    const int k_begin = k_docs.begin(doc), k_len = k_docs.length(doc);
    const int kvh = kv_head_of(h, Hq, Hkv);
    const int keys = keys_seen_up_to(p1 - 1, len, k_len, shape);  // the keys these rows can see
    // The score operands: E4M3 Q and K (MXFP8 route) or their NVFP4 codes (mixed route).
    const DocOperand q = mixed ? DocOperand{} : load(in.q, begin, p1, h);
    const PairOperand k = mixed ? PairOperand{} : load_pairs(in.k, in.k_interior, k_begin, keys, kvh);
    const Nvfp4DocOperand q4 = mixed ? load_nvfp4(in.q_score, begin, p1, h) : Nvfp4DocOperand{};
    const Nvfp4DocOperand k4 = mixed ? load_nvfp4(in.k_score, k_begin, keys, kvh) : Nvfp4DocOperand{};
    auto logit = [&](int p, int j) {
      return capped_logit2(shape, mixed ? nvfp4_logit2(q4, p, k4, j, scale_log2e)
                                        : logit2(q, p, k.at(p, j), j, scale_log2e));
    };
    const PairOperand v = load_pairs(in.v, in.v_interior, k_begin, k_len, kvh);
    RouteStats& st = task_stats[t];

    // Mask-aware fold reference: the running max of the V exponents over the keys up to the row's
    // last visible one, all keys without the causal mask (the per-token ones with interior codes: a
    // block32 exponent is its group's largest per-token one).
    std::vector<double> v_exponent_max(k_len);
    double running = -kInf;
    for (int j = 0; j < k_len; ++j) v_exponent_max[j] = running = nan_max(running, v.frontier.exponents[j]);
    auto rho_of = [&](const KeyRange& seen) { return shape.causal ? v_exponent_max[seen.last] : running; };

    std::vector<double> s(tiling::kFwdKeyTile), acc(Dv);
    for (int p = p0; p < p1; ++p) {
      const KeyRange seen = shape.keys_of(p, len, k_len);
      double* o = out.o.row(begin + p, h);
      if (seen.last < seen.first) {  // a causal query before its document's first key: O = 0, LSE = -inf
        std::fill_n(o, Dv, 0.0);
        out.lse.at(h, begin + p) = -kInf;
        out.row_max_prob.at(h, begin + p) = 0.0;
        continue;
      }
      const double rho = rho_of(seen);
      double m = -kInf, l = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int kt = seen.last / tiling::kFwdKeyTile; kt >= seen.first / tiling::kFwdKeyTile; --kt) {  // diagonal first
        const int j0 = std::max(kt * tiling::kFwdKeyTile, seen.first);
        const int j1 = std::min(kt * tiling::kFwdKeyTile + tiling::kFwdKeyTile, seen.last + 1);
        double m_new = m;
        for (int j = j0; j < j1; ++j) m_new = nan_max(m_new, s[j - j0] = logit(p, j));
        const double alpha = m == -kInf ? 0.0 : std::exp2(m - m_new);
        l *= alpha;
        for (double& a : acc) a *= alpha;
        for (int j = j0; j < j1; ++j) {
          const double pj = std::exp2(s[j - j0] - m_new);
          l += pj;  // the row sum uses unrounded p
          const DocOperand& vj = v.at(p, j);
          const double pt = round_fresh(pj * std::exp2(boost + vj.exponents[j] - rho), st.saturated_p);
          if (pt != 0.0) axpy(pt, vj.row(j), acc.data(), Dv);
        }
        m = m_new;
      }
      const double o_scale = std::exp2(rho - boost) / l;
      for (int f = 0; f < Dv; ++f) o[f] = formats::round_to_bf16(acc[f] * o_scale);
      out.lse.at(h, begin + p) = double(float((m + std::log2(l)) / std::numbers::log2e));
      // l is the row sum relative to the final max m, whose own term is 1: p_max = 2^(m - m) / l.
      out.row_max_prob.at(h, begin + p) = double(float(1.0 / l));
    }
  });
  if (stats) {
    for (const auto& st : task_stats) stats->merge(st);
    stats->saturated_q += in.q.saturated, stats->saturated_k += in.k.saturated, stats->saturated_v += in.v.saturated;
    stats->saturated_k += in.k_interior.saturated, stats->saturated_v += in.v_interior.saturated;
    stats->saturated_q += in.q_score.saturated, stats->saturated_k += in.k_score.saturated;
  }
  return out;
}

Gradients mxfp8_backward(const QuantizedInputs& in, const ForwardOutputs& fwd, const PackedTensor& dout,
                         const Documents& docs, const AttentionShape& shape, const NumericsOptions& options,
                         RouteStats* stats) {
  return mxfp8_backward(in, fwd, dout, docs, docs, shape, options, stats);
}

Gradients mxfp8_backward(const QuantizedInputs& in, const ForwardOutputs& fwd, const PackedTensor& dout,
                         const Documents& docs, const Documents& k_docs, const AttentionShape& shape,
                         const NumericsOptions& options, RouteStats* stats) {
  check_inputs(in, docs, k_docs, options);
  check_options({shape, options}, in.q.dim);
  check_route_matches(in, options);
  const int T = in.q.tokens, Hq = in.q.heads, Hkv = in.k.heads, D = in.q.dim, Dv = in.v.dim;
  const bool mixed = in.route == Route::kNvfp4Mixed;
  if (dout.tokens != T || dout.heads != Hq || dout.dim != Dv)
    throw std::invalid_argument("dout must have the shape of q with v's head dim");
  if (fwd.o.tokens != T || fwd.o.heads != Hq || fwd.o.dim != Dv || fwd.lse.tokens != T || fwd.lse.heads != Hq)
    throw std::invalid_argument("the saved forward outputs (o, lse) must match q");
  const bool partials = options.uses_fp16_partials(shape.causal);
  if (partials && (fwd.row_max_prob.tokens != T || fwd.row_max_prob.heads != Hq))
    throw std::invalid_argument(
        "dq_reduction=fp16_partials needs the forward's row_max_prob (p_max = 1/l per row, [Hq, T]); this forward "
        "did not save it (pass it, or ask for dq_reduction=deterministic)");
  const double scale = shape.scale_for(D), scale_log2e = scale * std::numbers::log2e;
  const int boost = options.p_boost_log2, group = Hq / Hkv;
  const Mxfp8Tensor g_codes = quantize_mxfp8(dout, docs, options.effective_geometry(), options.scale_rule);
  const int Tk = in.k.tokens;
  Gradients out{PackedTensor(T, Hq, D), PackedTensor(Tk, Hkv, D), PackedTensor(Tk, Hkv, Dv)};
  constexpr int kQT = tiling::kBwdQueryTile, kKT = tiling::kBwdKeyTile;
  // Work item (document, KV head). Inside a long one, each query head runs two parallel phases:
  // (A) per query tile, P and U rows, the rounded dV operand and the finished dQ rows (rows are
  // independent); (B) per block of keys, dK and dV of those keys, summed over rows in the order a
  // single thread would use (heads, then rows ascending), so the split changes no bit. Items of one
  // query tile or less have nothing to split and run side by side instead.
  std::vector<RouteStats> item_stats(size_t(docs.count()) * Hkv);
  const bool squares = options.u_scale == UScaleGeometry::kSquare32;

  auto run_item = [&](int item) {
    const int doc = item / Hkv, kvh = item % Hkv, begin = docs.begin(doc), len = docs.length(doc);
    const int k_begin = k_docs.begin(doc), k_len = k_docs.length(doc);
    if (len == 0 || k_len == 0) return;  // no pair: the item's dq, dk and dv rows stay 0
    RouteStats& st = item_stats[item];
    const PairOperand k = load_pairs(in.k, in.k_interior, k_begin, k_len, kvh);
    const PairOperand v = load_pairs(in.v, in.v_interior, k_begin, k_len, kvh);
    const Nvfp4DocOperand k4 = mixed ? load_nvfp4(in.k_score, k_begin, k_len, kvh) : Nvfp4DocOperand{};
    std::vector<double> dk(size_t(k_len) * D, 0.0), dv(size_t(k_len) * Dv, 0.0);
    // FP16 partials: the largest K and V scale exponents over the keys up to each one and whether one
    // of those scales is NaN, as prefix maxima over the document (document isolation: no interior
    // codes); a row reads them at its last visible key.
    std::vector<int> ek_max, ev_max;
    std::vector<char> kv_nan;
    if (partials) {
      ek_max.resize(k_len), ev_max.resize(k_len), kv_nan.resize(k_len);
      int ek = formats::kMinScaleExponent, ev = formats::kMinScaleExponent;
      bool nan = false;
      for (int j = 0; j < k_len; ++j) {
        const double xk = k.frontier.exponents[j], xv = v.frontier.exponents[j];
        nan = nan || std::isnan(xk) || std::isnan(xv);
        if (!std::isnan(xk)) ek = std::max(ek, int(xk));
        if (!std::isnan(xv)) ev = std::max(ev, int(xv));
        ek_max[j] = ek, ev_max[j] = ev, kv_nan[j] = nan;
      }
    }
    // U_ij (or its 32x32-square rounding) and the rounded dV operand for a chunk of rows x all keys
    // (0 where masked); chunks of rows keep the memory at kChunkRows x k_len.
    constexpr int kChunkRows = 16 * kQT;
    const int chunk_rows = std::min(len, kChunkRows);
    std::vector<double> U(size_t(chunk_rows) * k_len), PT(size_t(chunk_rows) * k_len), residual(len);
    std::vector<dq_partials::RowFactors> factors(partials ? chunk_rows : 0);  // per row of the chunk

    // dV fold reference: the largest dO exponent in the document over the query heads of this KV
    // group (they all sum into this dV, so one reference serves them all).
    double gamma = -kInf;
    for (int h = kvh * group; h < (kvh + 1) * group; ++h)
      for (int p = 0; p < len; ++p) gamma = nan_max(gamma, g_codes.exponent(begin + p, h));

    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
     const DocOperand q = load(in.q, begin, len, h), g = load(g_codes, begin, len, h);
     // S from the forward's score codes: NVFP4 in the mixed route, where q and k (E4M3) serve dQ and dK only.
     const Nvfp4DocOperand q4 = mixed ? load_nvfp4(in.q_score, begin, len, h) : Nvfp4DocOperand{};
     auto logit = [&](int p, int j) {
       return capped_logit2(shape, mixed ? nvfp4_logit2(q4, p, k4, j, scale_log2e)
                                         : logit2(q, p, k.at(p, j), j, scale_log2e));
     };
     for (int c0 = 0; c0 < len; c0 += kChunkRows) {
      const int c1 = std::min(len, c0 + kChunkRows), tiles = (c1 - c0 + kQT - 1) / kQT;
      const int keys = keys_seen_up_to(c1 - 1, len, k_len, shape);  // the keys the chunk's rows see
      for (int r = 0; r < c1 - c0; ++r) {
        std::fill_n(&U[size_t(r) * k_len], keys, 0.0);
        std::fill_n(&PT[size_t(r) * k_len], keys, 0.0);
      }
      std::vector<RouteStats> tile_stats(tiles);
      auto u_at = [&](int p, int j) -> double& { return U[size_t(p - c0) * k_len + j]; };

      // (A) one task per query tile of the chunk.
      parallel_for(tiles, [&](int tile) {
        RouteStats& ts = tile_stats[tile];
        const int p0 = c0 + tile * kQT, rows = std::min(kQT, len - p0);
        for (int p = p0; p < p0 + rows; ++p) {
          const KeyRange seen = shape.keys_of(p, len, k_len);
          const double lse2 = fwd.lse.at(h, begin + p) * std::numbers::log2e;
          const double* o = fwd.o.row(begin + p, h);
          double Di = 0.0;  // D_i from the reconstructed dO and the saved O
          for (int f = 0; f < Dv; ++f) Di += g.row(p)[f] * o[f];
          Di *= std::exp2(g.exponents[p]);
          if (partials) {  // sigma_i and beta_i from the row's bounds, before any U is formed
            // |cg_i|^2 is exact in double in any order (E4M3 squares are multiples of 2^-18 and the
            // sum stays below 2^25), so a kernel that sums exactly (e.g. in integers) gets the same float.
            double code_sq = 0.0;
            for (int f = 0; f < Dv; ++f) code_sq += g.row(p)[f] * g.row(p)[f];
            const bool g_nan = std::isnan(g.exponents[p]);
            const bool sees_keys = seen.last >= seen.first;  // else no U: any valid factors
            const int ek = sees_keys ? ek_max[seen.last] : formats::kMinScaleExponent;
            const int ev = sees_keys ? ev_max[seen.last] : formats::kMinScaleExponent;
            const dq_partials::RowInputs ri{float(std::sqrt(code_sq)), g_nan ? 0 : int(g.exponents[p]), float(Di),
                                            float(fwd.row_max_prob.at(h, begin + p)), ek, ev,
                                            g_nan || (sees_keys && kv_nan[seen.last] != 0)};
            factors[p - c0] = dq_partials::row_factors(ri, Dv);  // |cv_j|'s bound: V's features
          }
          double row_residual = 0.0;
          double* u_row = &u_at(p, 0);
          double* pt_row = &PT[size_t(p - c0) * k_len];
          for (int j = seen.first; j <= seen.last; ++j) {
            const DocOperand& vj = v.at(p, j);
            const double s2 = logit(p, j), pij = std::exp2(s2 - lse2);
            const double eij = dot(g.row(p), vj.row(j), Dv) * std::exp2(g.exponents[p] + vj.exponents[j]);
            const double uij = pij * (eij - Di) * logit2_slope(shape, s2);
            u_row[j] = uij;
            row_residual += uij * scale;
            pt_row[j] = round_fresh(pij * std::exp2(boost + g.exponents[p] - gamma), ts.saturated_p);
          }
          residual[p] = row_residual;
        }

        if (squares) {
          // Blackwell layout: one U code set with 32x32 square scales serves both products, and
          // the K and Q scales stay with their operands (block-scaled MMA), so nothing is folded.
          // The tile's rows over the keys the chunk sees (squares start at key 0; the rest is 0).
          std::vector<double> block(size_t(rows) * keys);
          for (int r = 0; r < rows; ++r) std::copy_n(&u_at(p0 + r, 0), keys, &block[size_t(r) * keys]);
          const SquareQuantized uq = quantize_squares(block, rows, keys, tiling::kUSquare);
          ts.u_nonzero += uq.nonzero, ts.u_zeroed += uq.zeroed;
          for (int r = 0; r < rows; ++r)  // phase B reads the rounded U
            std::copy_n(&uq.values[size_t(r) * keys], keys, &u_at(p0 + r, 0));
          const int last_col = last_visible_key(p0 + rows - 1, len, k_len, shape);
          for (int r = 0; r < rows; ++r) {
            double* dq = out.dq.row(begin + p0 + r, h);
            for (int j = 0; j <= last_col; ++j) {
              const double u = u_at(p0 + r, j);
              const DocOperand& kj = k.at(p0 + r, j);
              if (u != 0.0) axpy(u * scale * std::exp2(kj.exponents[j]), kj.row(j), dq, D);
            }
          }
          return;
        }
        if (partials) {
          // dQ by boosted FP16 partials (core/dq_partials.h): K's per-key scale folded into U
          // against one scale per row, sigma_i; each 128-key tile's partial (in double) is boosted
          // by 2^beta_i, rounded to FP16 and added to an FP16 accumulator, tiles ascending.
          std::vector<double> partial(D), acc(D);
          for (int p = p0; p < p0 + rows; ++p) {
            const dq_partials::RowFactors fct = factors[p - c0];
            const double sigma_scale = formats::decode_ue8m0(fct.sigma);  // NaN for the NaN scale
            const double* u_row = &u_at(p, 0);
            std::fill(acc.begin(), acc.end(), 0.0);
            const int last = last_visible_key(p, len, k_len, shape);  // causal: the row's keys are j <= last
            for (int j0 = 0; j0 <= last; j0 += kKT) {
              const int j1 = std::min(j0 + kKT, last + 1);
              std::fill(partial.begin(), partial.end(), 0.0);
              for (int j = j0; j < j1; ++j) {
                const double w = u_row[j] * std::exp2(k.frontier.exponents[j]);
                const double wt = formats::decode_scaled_e4m3(formats::encode_scaled_e4m3(w, fct.sigma), fct.sigma);
                const double ratio = std::fabs(w) / sigma_scale;
                if (ratio > formats::kE4M3Max) ++ts.saturated_u;  // false for NaN: the row is NaN anyway
                if (std::isfinite(ratio)) ts.dq_u_ratio_max = std::max(ts.dq_u_ratio_max, ratio);
                if (w != 0.0) {
                  ++ts.u_nonzero;
                  if (wt == 0.0) ++ts.u_zeroed;
                }
                if (wt != 0.0) axpy(wt, k.frontier.row(j), partial.data(), D);  // NaN wt: a NaN row
              }
              for (int f = 0; f < D; ++f) {
                const double p16 = formats::round_to_fp16(std::ldexp(partial[f], fct.beta));
                acc[f] = formats::round_to_fp16(acc[f] + p16);
                if (std::isfinite(acc[f]) && std::isfinite(p16))
                  ts.dq_acc_max = std::max({ts.dq_acc_max, std::fabs(p16), std::fabs(acc[f])});
              }
            }
            double* dq = out.dq.row(begin + p, h);
            for (int f = 0; f < D; ++f) dq[f] = std::ldexp(acc[f], -fct.beta) * scale;
          }
          return;
        }
        // dQ = U.K: fold K's per-key scale into U, one U scale per (row, key tile).
        for (int p = p0; p < p0 + rows; ++p) {
          const KeyRange seen = shape.keys_of(p, len, k_len);
          const double* u_row = &u_at(p, 0);
          double* dq = out.dq.row(begin + p, h);
          // Key tiles from the first that the row sees (a window's earlier ones hold only zeros).
          for (int j0 = seen.first - seen.first % kKT; j0 <= seen.last; j0 += kKT) {
            const int j1 = std::min(j0 + kKT, seen.last + 1);
            double amax = 0.0;
            // The key tile is wholly interior or wholly at the frontier for the row (core/tiling.h).
            const DocOperand& kt = k.at(p, j0);
            for (int j = j0; j < j1; ++j) amax = nan_max(amax, std::fabs(u_row[j] * std::exp2(kt.exponents[j])));
            const uint8_t sigma = formats::scale_for_amax(amax, ScaleRule::kCeil);
            for (int j = j0; j < j1; ++j) {
              const double w = u_row[j] * std::exp2(kt.exponents[j]);
              const double wt = formats::decode_scaled_e4m3(formats::encode_scaled_e4m3(w, sigma), sigma);
              if (w != 0.0) {
                ++ts.u_nonzero;
                if (wt == 0.0) ++ts.u_zeroed;
              }
              if (wt != 0.0) axpy(wt * scale, kt.row(j), dq, D);
            }
          }
        }
      });
      for (const auto& ts : tile_stats) st.merge(ts);

      // (B) one task per block of keys: dV, then dK, each summed over the chunk's rows in order.
      constexpr int kKeyBlock = 64;
      const double dv_factor = std::exp2(gamma - boost);
      parallel_for((keys + kKeyBlock - 1) / kKeyBlock, [&](int block) {
        const int b0 = block * kKeyBlock, b1 = std::min(keys, b0 + kKeyBlock);
        std::vector<double> column(kQT);
        for (int p0 = c0; p0 < c1; p0 += kQT) {
          const int rows = std::min(kQT, len - p0);
          for (int p = p0; p < p0 + rows; ++p) {
            const int last = last_visible_key(p, len, k_len, shape);
            for (int j = b0; j < std::min(b1, last + 1); ++j) {
              const double pt = PT[size_t(p - c0) * k_len + j];
              if (pt != 0.0) axpy(pt * dv_factor, g.row(p), &dv[size_t(j) * Dv], Dv);
            }
          }
          const int last_col = std::min(b1 - 1, last_visible_key(p0 + rows - 1, len, k_len, shape));
          for (int j = b0; j <= last_col; ++j) {
            if (squares) {
              for (int r = 0; r < rows; ++r) {
                const double u = u_at(p0 + r, j);
                if (u != 0.0) axpy(u * scale * std::exp2(q.exponents[p0 + r]), q.row(p0 + r), &dk[size_t(j) * D], D);
              }
              continue;
            }
            // dK = U^T.Q: fold Q's per-query scale into U, one U scale per (column, query tile).
            double amax = 0.0;
            for (int r = 0; r < rows; ++r)
              amax = nan_max(amax, std::fabs(column[r] = u_at(p0 + r, j) * std::exp2(q.exponents[p0 + r])));
            const uint8_t tau = formats::scale_for_amax(amax, ScaleRule::kCeil);
            for (int r = 0; r < rows; ++r) {
              const double wt = formats::decode_scaled_e4m3(formats::encode_scaled_e4m3(column[r], tau), tau);
              if (wt != 0.0) axpy(wt * scale, q.row(p0 + r), &dk[size_t(j) * D], D);
            }
          }
        }
      });
     }
      for (int p = 0; p < len; ++p) {  // statistics in row order, as one thread would sum them
        st.row_residual_max = nan_max(st.row_residual_max, std::fabs(residual[p]));
        st.row_residual_sum_sq += residual[p] * residual[p];
        ++st.rows;
      }
    }
    for (int j = 0; j < k_len; ++j) {
      std::copy_n(&dk[size_t(j) * D], D, out.dk.row(k_begin + j, kvh));
      std::copy_n(&dv[size_t(j) * Dv], Dv, out.dv.row(k_begin + j, kvh));
    }
  };
  parallel_for_small_then_large(
      docs.count() * Hkv, [&](int item) { return docs.length(item / Hkv) <= kQT; }, run_item);
  if (in.hadamard) {  // gradients w.r.t. the rotated Q and K rotate back with the same matrix
    hadamard_rotate(out.dq);
    hadamard_rotate(out.dk);
  }
  for (PackedTensor* t : {&out.dq, &out.dk, &out.dv})
    for (double& x : t->data) x = formats::round_to_bf16(x);  // the kernels return BF16
  if (stats) {
    for (const auto& st : item_stats) stats->merge(st);
    stats->saturated_g += g_codes.saturated;
  }
  return out;
}

TrainingOutputs mxfp8_training(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                               const PackedTensor& dout, const Documents& docs, const AttentionShape& shape,
                               const NumericsOptions& options) {
  return mxfp8_training(q, k, v, dout, docs, docs, shape, options);
}

TrainingOutputs mxfp8_training(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                               const PackedTensor& dout, const Documents& docs, const Documents& k_docs,
                               const AttentionShape& shape, const NumericsOptions& options) {
  TrainingOutputs out;
  const QuantizedInputs codes = quantize_inputs(q, k, v, docs, k_docs, options);
  out.fwd = mxfp8_forward(codes, docs, k_docs, shape, options, &out.stats);
  out.grads = mxfp8_backward(codes, out.fwd, dout, docs, k_docs, shape, options, &out.stats);
  return out;
}

}  // namespace flamia::reference
