#include "reference/attention_fp64.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel.h"

namespace flamia::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tile shape of the dense products: kRows query rows at a time, kCols keys per score block and
// kCols features per combine block (kRows * kCols accumulators stay in registers).
constexpr int kRows = 4;
constexpr int kCols = 4;
// Query rows per parallel task (a multiple of kRows, so tiles never straddle two tasks).
constexpr int kRowBlock = 256;
static_assert(kRowBlock % kRows == 0);

int round_up(int x, int m) { return (x + m - 1) / m * m; }

std::string shape_of(const PackedTensor& x) {
  std::string s(1, '[');  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string
  s += std::to_string(x.tokens);
  s += ", ";
  s += std::to_string(x.heads);
  s += ", ";
  s += std::to_string(x.dim);
  s += ']';
  return s;
}

void check_tensor(const char* fn, const char* name, const PackedTensor& x) {
  if (x.tokens < 0 || x.heads <= 0 || x.dim <= 0)
    throw std::invalid_argument(std::string(fn) + ": " + name +
                                " must have tokens >= 0, heads >= 1 and dim >= 1, got " + shape_of(x));
  if (x.data.size() != size_t(x.tokens) * size_t(x.heads) * size_t(x.dim))
    throw std::invalid_argument(std::string(fn) + ": " + name + " holds " + std::to_string(x.data.size()) +
                                " values but its shape " + shape_of(x) + " needs " +
                                std::to_string(size_t(x.tokens) * size_t(x.heads) * size_t(x.dim)));
}

void check_same_shape(const char* fn, const char* name, const PackedTensor& x, const PackedTensor& q) {
  check_tensor(fn, name, x);
  if (x.tokens != q.tokens || x.heads != q.heads || x.dim != q.dim)
    throw std::invalid_argument(std::string(fn) + ": " + name + " must have the shape of q with v's head dim " +
                                shape_of(q) + ", got " + shape_of(x));
}

// The shape of O and dO: q's tokens and heads with v's head dim.
PackedTensor out_shape_of(const PackedTensor& q, const PackedTensor& v) {
  PackedTensor shape;
  shape.tokens = q.tokens, shape.heads = q.heads, shape.dim = v.dim;
  return shape;
}

// k_docs: the key documents (cu_seqlens_k); the same object as q_docs for self-attention over one
// packing, whose messages compare k and v with q.
void check_qkv(const char* fn, const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
               const Documents& q_docs, const Documents& k_docs) {
  const bool one_packing = &q_docs == &k_docs;
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  check_tensor(fn, "v", v);
  const int k_expected = one_packing ? q.tokens : k_docs.total_tokens();
  const std::string k_source = one_packing ? " but q has " : " but cu_seqlens_k covers ";
  if (k.tokens != k_expected)
    throw std::invalid_argument(std::string(fn) + ": k has " + std::to_string(k.tokens) + " tokens" + k_source +
                                std::to_string(k_expected));
  if (v.tokens != k_expected)
    throw std::invalid_argument(std::string(fn) + ": v has " + std::to_string(v.tokens) + " tokens" + k_source +
                                std::to_string(k_expected));
  if (k.dim != q.dim)
    throw std::invalid_argument(std::string(fn) + ": k has head dim " + std::to_string(k.dim) + " but q has " +
                                std::to_string(q.dim));
  if (v.heads != k.heads)
    throw std::invalid_argument(std::string(fn) + ": v has " + std::to_string(v.heads) + " heads but k has " +
                                std::to_string(k.heads));
  if (q.heads % k.heads != 0)
    throw std::invalid_argument(std::string(fn) + ": q heads (" + std::to_string(q.heads) +
                                ") must be a multiple of k/v heads (" + std::to_string(k.heads) + ")");
  if (q_docs.total_tokens() != q.tokens)
    throw std::invalid_argument(std::string(fn) + ": docs (cu_seqlens) cover " + std::to_string(q_docs.total_tokens()) +
                                " tokens but q has " + std::to_string(q.tokens));
  if (q_docs.count() != k_docs.count())
    throw std::invalid_argument(std::string(fn) + ": cu_seqlens_q holds " + std::to_string(q_docs.count()) +
                                " documents but cu_seqlens_k " + std::to_string(k_docs.count()));
}

// Head h of one document of x, copied into the two panel layouts the products stream through
// contiguously (in place, packed rows of one head sit H * D values apart, which for H * D * 8 a
// multiple of 4 KiB puts every row on its own page and on the same cache sets):
//   by_keys      [ld / kCols][D][kCols]   kCols consecutive keys side by side, for q . k_j
//   by_features  [dp / kCols][len][kCols] kCols consecutive features side by side, for sum_j w_j k_j
// with keys zero-padded to ld = round_up(len, kCols) and features to dp = round_up(D, kCols).
struct DocHead {
  int len = 0, dim = 0, dp = 0, ld = 0;
  std::vector<double> by_keys, by_features;
  const double* key_panel(int j0) const { return by_keys.data() + size_t(j0) * dim; }
  const double* feature_panel(int f0) const { return by_features.data() + size_t(f0) * len; }
};

DocHead load_head(const PackedTensor& x, int begin, int len, int h, bool want_by_keys, bool want_by_features) {
  DocHead out;
  out.len = len, out.dim = x.dim, out.dp = round_up(x.dim, kCols), out.ld = round_up(len, kCols);
  if (want_by_keys) out.by_keys.assign(size_t(out.ld) * out.dim, 0.0);
  if (want_by_features) out.by_features.assign(size_t(out.dp) * len, 0.0);
  for (int j = 0; j < len; ++j) {
    const double* src = x.row(begin + j, h);
    for (int f = 0; f < x.dim; ++f) {
      if (want_by_keys) out.by_keys[(size_t(j / kCols) * x.dim + f) * kCols + j % kCols] = src[f];
      if (want_by_features) out.by_features[(size_t(f / kCols) * len + j) * kCols + f % kCols] = src[f];
    }
  }
  return out;
}

// A tile of kRows query rows p0 .. p0 + kRows - 1 of one head: row r sees the keys [first[r],
// last[r]] (AttentionShape::keys_of); rows past the document end and rows that see no key hold
// [0, -1], so that every loop from common_last + 1 starts at a key.
// The products run over keys 0 .. tile_last with the invisible pairs' weights 0.
struct RowTile {
  int p0 = 0, n = 0;
  int first[kRows], last[kRows];
  int common_last = 0, tile_last = -1;  // min and max of last over the tile
  bool sees(int r, int j) const { return first[r] <= j && j <= last[r]; }
};

RowTile make_tile(int p0, int q_len, int k_len, const AttentionShape& shape) {
  RowTile t;
  t.p0 = p0, t.n = std::min(kRows, q_len - p0);
  t.common_last = k_len;
  for (int r = 0; r < kRows; ++r) {
    KeyRange keys = r < t.n ? shape.keys_of(p0 + r, q_len, k_len) : KeyRange{0, -1};
    if (keys.last < keys.first) keys = {0, -1};
    t.first[r] = keys.first, t.last[r] = keys.last;
    t.common_last = std::min(t.common_last, t.last[r]);
    t.tile_last = std::max(t.tile_last, t.last[r]);
  }
  return t;
}

// The tile's rows of head h of x, zero-padded, both row-major [kRows][dp] and transposed [D][kRows].
struct TileRows {
  std::vector<double> rows, cols;
  TileRows(int dim, int dp) : rows(size_t(kRows) * dp), cols(size_t(kRows) * dim) {}
  void load(const PackedTensor& x, int begin, const RowTile& t, int h, int dp) {
    std::fill(rows.begin(), rows.end(), 0.0);
    std::fill(cols.begin(), cols.end(), 0.0);
    for (int r = 0; r < t.n; ++r) {
      const double* src = x.row(begin + t.p0 + r, h);
      for (int f = 0; f < x.dim; ++f) rows[size_t(r) * dp + f] = cols[size_t(f) * kRows + r] = src[f];
    }
  }
};

using Acc = double[kRows][kCols];

// acc[r][c] += sum_{i in [i0, i1)} a[i][r] * b[i][c], summed in i order, with a [.][kRows] and
// b [.][kCols]. Every product below is this outer-product accumulation over a register tile.
void accumulate(const double* a, const double* b, int i0, int i1, Acc& acc) {
  for (int i = i0; i < i1; ++i) {
    const double* ai = a + size_t(i) * kRows;
    const double* bi = b + size_t(i) * kCols;
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c] += ai[r] * bi[c];
  }
}

// out[j][r] = a_r . b_j for keys j < ncols (a multiple of kCols), summed in feature order: each
// entry is the plain dot product, whatever tile computes it. a is a tile's cols [D][kRows].
void scores(const std::vector<double>& a, const DocHead& b, int ncols, double* out) {
  for (int j0 = 0; j0 < ncols; j0 += kCols) {
    Acc acc = {};
    accumulate(a.data(), b.key_panel(j0), 0, b.dim, acc);
    for (int c = 0; c < kCols; ++c)
      for (int r = 0; r < kRows; ++r) out[size_t(j0 + c) * kRows + r] = acc[r][c];
  }
}

// out[r][f] = sum_{j <= last[r]} w[j][r] * b_j[f], summed in key order (rows share the keys up to
// common_last, then each row adds its own remaining keys).
void combine(const double* w, const DocHead& b, const RowTile& t, double* out) {
  for (int f0 = 0; f0 < b.dp; f0 += kCols) {
    Acc acc = {};
    accumulate(w, b.feature_panel(f0), 0, t.common_last + 1, acc);
    const double* panel = b.feature_panel(f0);
    for (int r = 0; r < kRows; ++r)
      for (int j = t.common_last + 1; j <= t.last[r]; ++j)
        for (int c = 0; c < kCols; ++c) acc[r][c] += w[size_t(j) * kRows + r] * panel[size_t(j) * kCols + c];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) out[size_t(r) * b.dp + f0 + c] = acc[r][c];
  }
}

// x[j][f] += sum_r w[j][r] * a[r][f] for keys first_key <= j <= last_key (w is 0 where a row does not see j).
void rank_update(const double* w, const std::vector<double>& a, int dp, int first_key, int last_key, double* x) {
  for (int j = first_key; j <= last_key; ++j) {
    const double* wj = w + size_t(j) * kRows;
    double* xj = x + size_t(j) * dp;
    for (int f = 0; f < dp; ++f) {
      double s = xj[f];
      for (int r = 0; r < kRows; ++r) s += wj[r] * a[size_t(r) * dp + f];
      xj[f] = s;
    }
  }
}

}  // namespace

ForwardOutputs reference_forward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                 const Documents& docs, const AttentionShape& shape) {
  return reference_forward(q, k, v, docs, docs, shape);
}

ForwardOutputs reference_forward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                                 const Documents& docs, const Documents& k_docs, const AttentionShape& shape) {
  static constexpr const char* kFn = "reference_forward";
  check_qkv(kFn, q, k, v, docs, k_docs);
  const int T = q.tokens, Hq = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim, group = Hq / Hkv;
  const double scale = shape.scale_for(D);
  ForwardOutputs out{PackedTensor(T, Hq, Dv), HeadTokenTensor(Hq, T), {}};  // no p_max: the FP64 backward has no FP16 partials

  // Rows are independent: one task per (document, query head, block of rows), so a long document
  // spreads over every core; each row's arithmetic is the same whatever the split.
  const std::vector<RowBlock> tasks = row_blocks(docs, Hq, kRowBlock);
  parallel_for(int(tasks.size()), [&](int task) {
    const auto [doc, h, b0] = tasks[task];
    const int begin = docs.begin(doc), len = docs.length(doc), b1 = std::min(len, b0 + kRowBlock);
    const int k_begin = k_docs.begin(doc), k_len = k_docs.length(doc);
    const int g = h / group, keys = std::max(0, shape.keys_of(b1 - 1, len, k_len).last + 1);  // the keys these rows see
    const DocHead kh = load_head(k, k_begin, keys, g, true, false), vh = load_head(v, k_begin, keys, g, false, true);
    const int dp = kh.dp, ld = kh.ld, dpv = vh.dp;
    TileRows qt(D, dp);
    std::vector<double> s(size_t(ld) * kRows), acc(size_t(kRows) * dpv);  // s: [key][row]
    for (int p0 = b0; p0 < b1; p0 += kRows) {
      const RowTile t = make_tile(p0, len, k_len, shape);
      qt.load(q, begin, t, h, dp);
      scores(qt.cols, kh, round_up(t.tile_last + 1, kCols), s.data());
      double m[kRows], l[kRows];
      for (int r = 0; r < kRows; ++r) {
        m[r] = -kInf;
        for (int j = t.first[r]; j <= t.last[r]; ++j) {
          double& x = s[size_t(j) * kRows + r];
          m[r] = std::max(m[r], x = shape.score(x * scale));
        }
        // A non-finite max would turn into inf - inf; 0 lets inf/NaN logits propagate instead.
        if (!std::isfinite(m[r])) m[r] = 0.0;
        l[r] = 0.0;
        for (int j = 0; j <= t.tile_last; ++j) {
          double& e = s[size_t(j) * kRows + r];
          e = t.sees(r, j) ? std::exp(e - m[r]) : 0.0;
          l[r] += e;
        }
      }
      combine(s.data(), vh, t, acc.data());
      for (int r = 0; r < t.n; ++r) {
        double* o = out.o.row(begin + p0 + r, h);
        // A row that sees no key (a causal query before its document's first key): O = 0, LSE = -inf.
        for (int f = 0; f < Dv; ++f) o[f] = l[r] > 0 ? acc[size_t(r) * dpv + f] / l[r] : 0.0;
        out.lse.at(h, begin + p0 + r) = l[r] > 0 ? m[r] + std::log(l[r]) : -kInf;
      }
    }
  });
  return out;
}

Gradients reference_backward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                             const PackedTensor& o, const HeadTokenTensor& lse, const PackedTensor& dout,
                             const Documents& docs, const AttentionShape& shape) {
  return reference_backward(q, k, v, o, lse, dout, docs, docs, shape);
}

Gradients reference_backward(const PackedTensor& q, const PackedTensor& k, const PackedTensor& v,
                             const PackedTensor& o, const HeadTokenTensor& lse, const PackedTensor& dout,
                             const Documents& docs, const Documents& k_docs, const AttentionShape& shape) {
  static constexpr const char* kFn = "reference_backward";
  check_qkv(kFn, q, k, v, docs, k_docs);
  check_same_shape(kFn, "o", o, out_shape_of(q, v));
  check_same_shape(kFn, "dout", dout, out_shape_of(q, v));
  if (lse.heads != q.heads || lse.tokens != q.tokens || lse.data.size() != size_t(lse.heads) * size_t(lse.tokens))
    throw std::invalid_argument(std::string(kFn) + ": lse must be [Hq, T] = [" + std::to_string(q.heads) + ", " +
                                std::to_string(q.tokens) + "] with as many values, got [" + std::to_string(lse.heads) +
                                ", " + std::to_string(lse.tokens) + "] holding " + std::to_string(lse.data.size()));
  const int T = q.tokens, Hq = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim, group = Hq / Hkv;
  const double scale = shape.scale_for(D);
  const int Tk = k.tokens;
  Gradients out{PackedTensor(T, Hq, D), PackedTensor(Tk, Hkv, D), PackedTensor(Tk, Hkv, Dv)};

  // Item (doc, g) owns the dk/dv rows of kv head g in doc and the dq rows of its query heads. Inside
  // a long item, each query head and chunk of rows runs two parallel phases: (A) blocks of row
  // tiles compute P and dS (kept for phase B) and finish their dq rows; (B) blocks of keys add
  // their dk and dv rows tile by tile in row order, as a single thread would, so the split changes
  // no bit. Items of one row block or less run side by side instead.
  constexpr int kChunkRows = 1024, kTaskTiles = kRowBlock / kRows, kKeyBlock = 64;
  auto run_item = [&](int item) {
    const int doc = item / Hkv, g = item % Hkv, begin = docs.begin(doc), len = docs.length(doc);
    const int k_begin = k_docs.begin(doc), k_len = k_docs.length(doc);
    if (len == 0 || k_len == 0) return;  // no pair: the item's rows of dq, dk and dv stay 0
    const DocHead kh = load_head(k, k_begin, k_len, g, true, true), vh = load_head(v, k_begin, k_len, g, true, false);
    const int dp = kh.dp, ld = kh.ld, dpv = vh.dp;
    std::vector<double> dk(size_t(k_len) * dp), dv(size_t(k_len) * dpv);
    const int chunk_tiles = (std::min(len, kChunkRows) + kRows - 1) / kRows;
    std::vector<double> P(size_t(chunk_tiles) * ld * kRows), DS(size_t(chunk_tiles) * ld * kRows);  // [tile][key][row]
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int c0 = 0; c0 < len; c0 += kChunkRows) {
        const int c1 = std::min(len, c0 + kChunkRows), tiles = (c1 - c0 + kRows - 1) / kRows;
        auto tile_at = [&](int i) { return make_tile(c0 + i * kRows, len, k_len, shape); };

        parallel_for((tiles + kTaskTiles - 1) / kTaskTiles, [&](int task) {  // (A)
          TileRows qt(D, dp), gt(Dv, dpv);
          std::vector<double> dq(size_t(kRows) * dp);
          for (int i = task * kTaskTiles; i < std::min(tiles, (task + 1) * kTaskTiles); ++i) {
            const RowTile t = tile_at(i);
            const int p0 = t.p0;
            double* p = &P[size_t(i) * ld * kRows];
            double* ds = &DS[size_t(i) * ld * kRows];
            qt.load(q, begin, t, h, dp);
            gt.load(dout, begin, t, h, dpv);
            const int ncols = round_up(t.tile_last + 1, kCols);
            scores(qt.cols, kh, ncols, p);   // q . k
            scores(gt.cols, vh, ncols, ds);  // dout . v
            for (int r = 0; r < kRows; ++r) {
              double lse_r = 0.0, d_r = 0.0;
              if (r < t.n) {
                lse_r = lse.at(h, begin + p0 + r);
                const double* orow = o.row(begin + p0 + r, h);
                for (int f = 0; f < Dv; ++f) d_r += gt.rows[size_t(r) * dpv + f] * orow[f];
              }
              for (int j = 0; j <= t.tile_last; ++j) {
                double& pj = p[size_t(j) * kRows + r];
                double& dsj = ds[size_t(j) * kRows + r];
                if (t.sees(r, j)) {
                  const double s_ij = shape.score(scale * pj);
                  pj = std::exp(s_ij - lse_r);
                  dsj = scale * shape.score_slope(s_ij) * pj * (dsj - d_r);  // scale * dS
                } else {
                  pj = dsj = 0.0;
                }
              }
            }
            combine(ds, kh, t, dq.data());
            for (int r = 0; r < t.n; ++r) std::copy_n(dq.data() + size_t(r) * dp, D, out.dq.row(begin + p0 + r, h));
          }
        });

        const int keys = std::max(0, shape.keys_of(c1 - 1, len, k_len).last + 1);  // the keys the chunk's rows see
        parallel_for((keys + kKeyBlock - 1) / kKeyBlock, [&](int block) {  // (B)
          const int j0 = block * kKeyBlock, j1 = std::min(keys, j0 + kKeyBlock);
          TileRows qt(D, dp), gt(Dv, dpv);
          for (int i = 0; i < tiles; ++i) {
            const RowTile t = tile_at(i);
            if (t.tile_last < j0) continue;
            qt.load(q, begin, t, h, dp);
            gt.load(dout, begin, t, h, dpv);
            const int last = std::min(j1 - 1, t.tile_last);
            rank_update(&DS[size_t(i) * ld * kRows], qt.rows, dp, j0, last, dk.data());
            rank_update(&P[size_t(i) * ld * kRows], gt.rows, dpv, j0, last, dv.data());
          }
        });
      }
    }
    for (int j = 0; j < k_len; ++j) {
      std::copy_n(dk.data() + size_t(j) * dp, D, out.dk.row(k_begin + j, g));
      std::copy_n(dv.data() + size_t(j) * dpv, Dv, out.dv.row(k_begin + j, g));
    }
  };
  parallel_for_small_then_large(
      docs.count() * Hkv, [&](int item) { return docs.length(item / Hkv) <= kRowBlock; }, run_item);
  return out;
}

}  // namespace flamia::reference
