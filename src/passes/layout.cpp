// The layout pass (src/passes/layout.h).
#include "passes/layout.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/registry.h"
#include "seam/ops.h"

namespace seam {

namespace {

bool has_nhwc_op(const Graph& g) {
  for (const Node& n : g.nodes())
    if (is_nhwc(n.attrs)) return true;
  return false;
}

// Ops that run in either layout and follow their input's: their schema has `layout`.
bool follows_input(Op op) {
  return op == Op::batch_norm || op == Op::max_pool2d || op == Op::avg_pool2d || op == Op::global_avg_pool;
}

// Forward elementwise ops, whose result at an element depends only on the operands'
// elements at the same (broadcast) index. Dropout is not one here: its mask is a function
// of the element's index, so running it channels-last would drop other elements.
bool elementwise(Op op) {
  if (const UnaryInfo* u = unary_info(op)) return u->op == op;
  if (const BinaryInfo* b = binary_info(op)) return b->op == op;
  return op == Op::cast || op == Op::copy || op == Op::stop_gradient;
}

// perm keeps the dims of size > 1 in their order: the data's memory order is unchanged.
bool moves_only_ones(const Shape& s, const std::vector<int64_t>& perm) {
  int64_t last = -1;
  for (int64_t p : perm) {
    if (s[static_cast<size_t>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

class Rewriter {
 public:
  Rewriter(const Graph& g, const std::set<std::string>& convs)
      : g_(g), convs_(convs), r_(start_rebuild(g)), nhwc_(g.values().size(), false) {
    for (const std::string& name : channels_last_params(g, convs)) {
      const ValueId old = *g.find(name);
      Value& v = ng().value(mapped(r_, old));
      v.type.shape = nhwc_order(v.type.shape);
      v.type.layout = DataLayout::nhwc;
      nhwc_[static_cast<size_t>(old)] = true;
    }
  }

  FuseResult run() {
    for (const Node& n : g_.nodes()) rewrite(n);
    return std::move(r_);
  }

 private:
  Graph& ng() { return r_.graph; }
  const Shape& shape(ValueId old) const { return g_.value(old).type.shape; }

  // "<value>.<suffix>", or with _2, _3... where that name is taken.
  std::string fresh_name(ValueId nv, const char* suffix) {
    const std::string base = ng().value(nv).name + "." + suffix;
    std::string name = base;
    for (int k = 2; ng().find(name); ++k) name = base + "_" + std::to_string(k);
    return name;
  }

  // The new value reordered by perm: a view where the memory order stays, else one
  // transpose (cached, named after the value).
  ValueId reorder(ValueId nv, const std::vector<int64_t>& perm, const char* suffix) {
    auto [it, fresh] = cache_.try_emplace({nv, suffix}, -1);
    if (!fresh) return it->second;
    const Shape s = ng().value(nv).type.shape;
    const std::string name = fresh_name(nv, suffix);
    if (moves_only_ones(s, perm)) {
      Shape to;
      for (int64_t p : perm) to.push_back(s[static_cast<size_t>(p)]);
      it->second = ng().add_named(Op::reshape, {nv}, {{"shape", to}}, name).at(0);
    } else {
      it->second = ng().add_named(Op::transpose, {nv}, {{"perm", perm}}, name).at(0);
    }
    return it->second;
  }

  ValueId as_nchw(ValueId old) {
    const ValueId nv = mapped(r_, old);
    return nhwc_[static_cast<size_t>(old)] ? reorder(nv, to_nchw_perm(), "nchw") : nv;
  }
  ValueId as_nhwc(ValueId old) {
    const ValueId nv = mapped(r_, old);
    return nhwc_[static_cast<size_t>(old)] ? nv : reorder(nv, to_nhwc_perm(), "nhwc");
  }
  // An operand broadcast against a channels-last result of rank 4: written as a 4-d
  // shape (leading 1s), then in channels-last order.
  ValueId as_nhwc_operand(ValueId old) {
    if (nhwc_[static_cast<size_t>(old)] || shape(old).size() == 4) return as_nhwc(old);
    const ValueId nv = mapped(r_, old);
    auto [it, fresh] = cache_.try_emplace({nv, "4d"}, -1);
    if (fresh) {
      Shape s4(4 - shape(old).size(), 1);
      s4.insert(s4.end(), shape(old).begin(), shape(old).end());
      it->second = ng().add_named(Op::reshape, {nv}, {{"shape", s4}}, fresh_name(nv, "4d")).at(0);
    }
    return reorder(it->second, to_nhwc_perm(), "nhwc");
  }

  void emit(const Node& n, const std::vector<ValueId>& in, const Attrs& attrs, bool nhwc) {
    std::vector<std::string> names;
    for (ValueId v : n.out) names.push_back(g_.value(v).name);
    const std::vector<ValueId> out =
        names.empty() ? ng().add_named(n.op, in, attrs, n.name) : ng().add_named(n.op, in, attrs, names);
    for (size_t i = 0; i < out.size(); ++i) {
      r_.map[static_cast<size_t>(n.out[i])] = out[i];
      nhwc_[static_cast<size_t>(n.out[i])] = nhwc && shape(n.out[i]).size() == 4;
    }
  }

  void rewrite(const Node& n) {
    std::vector<ValueId> in;
    Attrs attrs = n.attrs;
    const bool image = !n.in.empty() && shape(n.in[0]).size() == 4;
    const bool conv = n.op == Op::conv2d && image && convs_.count(g_.value(n.out[0]).name);
    if (conv || (follows_input(n.op) && image && nhwc_[static_cast<size_t>(n.in[0])])) {
      for (size_t i = 0; i < n.in.size(); ++i) in.push_back(shape(n.in[i]).size() == 4 ? as_nhwc(n.in[i]) : mapped(r_, n.in[i]));
      attrs.set("layout", std::string("nhwc"));
      return emit(n, in, attrs, true);
    }
    if (elementwise(n.op) && !n.out.empty() && shape(n.out[0]).size() == 4) {
      const Shape& out = shape(n.out[0]);
      bool nhwc = false;
      for (ValueId v : n.in) nhwc = nhwc || (nhwc_[static_cast<size_t>(v)] && shape(v) == out);
      if (nhwc) {
        for (ValueId v : n.in) in.push_back(shape(v) == out ? as_nhwc(v) : as_nhwc_operand(v));
        return emit(n, in, attrs, true);
      }
    }
    for (ValueId v : n.in) in.push_back(as_nchw(v));
    emit(n, in, attrs, false);
  }

  const Graph& g_;
  const std::set<std::string>& convs_;
  FuseResult r_;
  std::vector<bool> nhwc_;  // by old value: its new value is channels-last
  std::map<std::pair<ValueId, std::string>, ValueId> cache_;
};

}  // namespace

namespace {

// Union-find over a graph's values: the regions.
class Regions {
 public:
  explicit Regions(size_t n) : parent_(n) {
    for (size_t i = 0; i < n; ++i) parent_[i] = static_cast<ValueId>(i);
  }
  ValueId find(ValueId v) {
    while (parent_[static_cast<size_t>(v)] != v) v = parent_[static_cast<size_t>(v)] = parent_[static_cast<size_t>(parent_[static_cast<size_t>(v)])];
    return v;
  }
  void join(ValueId a, ValueId b) { parent_[static_cast<size_t>(find(a))] = find(b); }

 private:
  std::vector<ValueId> parent_;
};

bool image(const Graph& g, ValueId v) { return g.value(v).type.shape.size() == 4; }

// Microseconds of a training step's three passes of convolution n in either layout
// ({channels-last, NCHW}), by its operands' dtype: 16-bit data and f32 under TF32 on the
// tensor cores, other f32 on the FMA units.
std::pair<double, double> conv_us(const Graph& g, const Node& n, const LayoutCosts& m) {
  const TensorType &x = g.value(n.in[0]).type, &w = g.value(n.in[1]).type, &y = g.value(n.out[0]).type;
  const double e = static_cast<double>(dtype_size(x.dtype));
  const double bx = e * static_cast<double>(x.numel()), bw = e * static_cast<double>(w.numel()),
               by = e * static_cast<double>(y.numel());
  const double flops = 2.0 * static_cast<double>(y.numel()) * static_cast<double>(w.shape[1] * w.shape[2] * w.shape[3]);
  const bool fma = x.dtype == DType::f32 && m.precision != Precision::tf32;
  const double tflops = is_half(x.dtype) ? m.half_tflops : fma ? m.fma_tflops : m.tf32_tflops;
  const double bytes_us = 1e-3 / m.bandwidth_gbps;  // per byte
  const double pass = std::max(flops / (tflops * 1e6), (bx + bw + by) * bytes_us);
  const double transposes = 2 * (bx + by) * bytes_us;  // each operand read and written once more
  if (!m.gpu) return {3 * (pass + transposes), 3 * pass};  // channels-last steps run on permuted copies
  if (n.attrs.i("groups") > 1 && w.shape[1] < 8) {  // depthwise and thin groups: FMA units
    const double direct = 3 * std::max(flops / (m.fma_tflops * 1e6), (bx + bw + by) * bytes_us);
    return {direct * m.grouped_nhwc_slowdown, direct};
  }
  if (fma) return {3 * pass * m.fma_nhwc_slowdown, 3 * pass};
  return {3 * pass, 3 * (pass + transposes)};  // NCHW: cuDNN transposes to its NHWC kernels' order
}

}  // namespace

LayoutCosts layout_costs(Device device, Precision precision) {
  LayoutCosts m;
  m.gpu = device == Device::cuda;
  m.precision = precision;
  if (!m.gpu) {  // OpenBLAS's SGEMM on two cores, and their memory
    m.bandwidth_gbps = 10;
    m.tf32_tflops = m.half_tflops = m.fma_tflops = 0.11;
  }
  return m;
}

std::string LayoutRegion::str() const {
  char est[160];
  std::snprintf(est, sizeof est, "%s: %.1f us channels-last (%.1f of it boundary transposes), %.1f us NCHW (%s)",
                nhwc ? "channels-last" : "NCHW", nhwc_us, boundary_us, nchw_us, why.c_str());
  std::string names = convs.front();
  if (convs.size() > 1) names += " .. " + convs.back();
  return "layout region of " + std::to_string(convs.size()) + " convolution" + (convs.size() > 1 ? "s" : "") + " (" +
         names + "), " + est;
}

std::vector<LayoutRegion> choose_layouts(const Graph& g, LayoutPolicy policy, const LayoutCosts& m) {
  if (has_nhwc_op(g)) return {};
  Regions regions(g.values().size());
  const auto& nodes = g.nodes();
  auto flexible = [&](const Node& n) {
    if (n.in.empty() || n.out.empty()) return false;
    if (n.op == Op::conv2d || follows_input(n.op)) return image(g, n.in[0]);
    return elementwise(n.op) && image(g, n.out[0]);
  };
  for (const Node& n : nodes) {
    if (!flexible(n)) continue;
    if (n.op == Op::conv2d || follows_input(n.op)) regions.join(n.in[0], n.out[0]);  // shapes may differ
    for (size_t i = 0; i < n.in.size() && n.op != Op::conv2d; ++i)
      if (g.value(n.in[i]).type.shape == g.value(n.out[0]).type.shape) regions.join(n.in[i], n.out[0]);
  }
  // Each region's convolutions, and its estimates: the convolutions, then the boundary's
  // transposes as the rewrite with every convolution channels-last would place them.
  std::map<ValueId, LayoutRegion> by_root;
  for (const Node& n : nodes)
    if (n.op == Op::conv2d && image(g, n.in[0])) {
      LayoutRegion& r = by_root[regions.find(n.out[0])];
      r.convs.push_back(g.value(n.out[0]).name);
      const auto [nhwc, nchw] = conv_us(g, n, m);
      r.nhwc_us += nhwc;
      r.nchw_us += nchw;
    }
  std::vector<bool> nhwc(g.values().size(), false);
  std::set<ValueId> moved;  // values transposed once, forward and back in the backward
  auto transpose = [&](ValueId v) {
    if (!moved.insert(v).second) return;
    const Shape& s = g.value(v).type.shape;
    if (moves_only_ones(s, to_nhwc_perm())) return;  // a view
    auto it = by_root.find(regions.find(v));
    if (it == by_root.end()) return;
    const double bytes = static_cast<double>(g.value(v).type.bytes());
    it->second.boundary_us += 2 * 2 * bytes * 1e-3 / m.bandwidth_gbps;  // read + write, and the gradient's
  };
  for (const Node& n : nodes) {
    bool out_nhwc = false;
    if (flexible(n)) {
      if (n.op == Op::conv2d) out_nhwc = true;
      else if (follows_input(n.op)) out_nhwc = nhwc[static_cast<size_t>(n.in[0])];
      else
        for (ValueId v : n.in) out_nhwc = out_nhwc || (nhwc[static_cast<size_t>(v)] && g.value(v).type.shape == g.value(n.out[0]).type.shape);
    }
    for (size_t i = 0; i < n.in.size(); ++i) {
      const ValueId v = n.in[i];
      const bool operand = out_nhwc && image(g, v) && !(n.op == Op::conv2d && i == 1);
      if (operand != nhwc[static_cast<size_t>(v)] && image(g, v) && !(n.op == Op::conv2d && i == 1)) transpose(v);
    }
    if (out_nhwc)
      for (ValueId v : n.out) nhwc[static_cast<size_t>(v)] = image(g, v);
  }
  std::vector<LayoutRegion> out;
  for (auto& [root, r] : by_root) {
    r.nhwc_us += r.boundary_us;
    if (policy == LayoutPolicy::automatic) {
      r.nhwc = r.nhwc_us < r.nchw_us;
      r.why = std::string("cost model, ") + (m.gpu ? "GPU" : "CPU") + " at " + precision_name(m.precision);
    } else {
      r.nhwc = policy == LayoutPolicy::nhwc;
      r.why = std::string("layout ") + layout_policy_name(policy);
    }
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [&](const LayoutRegion& a, const LayoutRegion& b) {
    return g.value(*g.find(a.convs.front())).node < g.value(*g.find(b.convs.front())).node;
  });
  return out;
}

std::set<std::string> nhwc_convs(const std::vector<LayoutRegion>& regions) {
  std::set<std::string> out;
  for (const LayoutRegion& r : regions)
    if (r.nhwc) out.insert(r.convs.begin(), r.convs.end());
  return out;
}

std::set<std::string> channels_last_params(const Graph& g, const std::set<std::string>& convs) {
  std::set<std::string> out, refused;  // refused: a filter some NCHW convolution reads too
  if (has_nhwc_op(g)) return out;
  for (const Node& n : g.nodes()) {
    if (n.op != Op::conv2d || n.in.size() < 2 || g.value(n.in[0]).type.shape.size() != 4) continue;
    ValueId w = n.in[1];
    while (g.value(w).kind == ValueKind::intermediate && g.node(g.value(w).node).op == Op::cast)
      w = g.node(g.value(w).node).in[0];
    const Value& v = g.value(w);
    if (v.kind != ValueKind::param || v.type.shape.size() != 4) continue;
    (convs.count(g.value(n.out[0]).name) ? out : refused).insert(v.name);
  }
  for (const std::string& name : refused) out.erase(name);
  return out;
}

FuseResult apply_layout(const Graph& g, const std::set<std::string>& convs) {
  if (convs.empty() || has_nhwc_op(g)) {
    FuseResult r = start_rebuild(g);
    for (const Node& n : g.nodes()) {
      std::vector<ValueId> in;
      for (ValueId v : n.in) in.push_back(mapped(r, v));
      std::vector<std::string> names;
      for (ValueId v : n.out) names.push_back(g.value(v).name);
      auto out = names.empty() ? r.graph.add_named(n.op, in, n.attrs, n.name) : r.graph.add_named(n.op, in, n.attrs, names);
      for (size_t i = 0; i < out.size(); ++i) r.map[static_cast<size_t>(n.out[i])] = out[i];
    }
    return r;
  }
  return Rewriter(g, convs).run();
}

}  // namespace seam
