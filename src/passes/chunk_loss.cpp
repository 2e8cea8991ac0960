// The output layer in row chunks: the logits, their loss and their gradient GEMMs one
// chunk of rows at a time, so that only one chunk's logits exist at once.
#include <algorithm>
#include <set>

#include "passes/fuse.h"
#include "ops/registry.h"

namespace seam {

namespace {

// The rows of a value read as a matrix of `cols` columns.
int64_t rows_of(const TensorType& t, int64_t cols) { return cols > 0 ? t.numel() / cols : 0; }

// v itself, or what a view (a reshape) made v from: the same bytes.
ValueId source_of(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (val.kind != ValueKind::intermediate) return v;
  const Node& n = g.node(val.node);
  const int view = op_def(n.op).view_of;
  return view >= 0 ? n.in[static_cast<size_t>(view)] : v;
}

// One output layer: the GEMM that makes the logits, the fused loss that reads them, and
// the GEMMs that read the logits' gradient (through reshapes).
struct OutputLayer {
  int linear = -1;
  std::vector<int> views;         // reshapes of the gradient
  std::vector<int> input_grads;   // matmul(dlogits, w): rows of the input's gradient
  std::vector<int> weight_grads;  // matmul(dlogits^T, x): the weight's gradient, summed
};

}  // namespace

FuseResult chunk_output_layer(const Graph& g, const std::vector<ValueId>& keep_list, int chunks) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  // A value the loss's place can read: made before it, or not made by a node.
  auto before = [&](ValueId v, int k) {
    const Value& val = g.value(v);
    return val.kind != ValueKind::intermediate || val.node < k;
  };

  std::vector<OutputLayer> layers;
  std::vector<int> layer_at(static_cast<size_t>(nn), -1);  // loss node -> layer
  std::vector<bool> gone(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn && chunks > 1; ++k) {
    const Node& f = nodes[static_cast<size_t>(k)];
    if (f.op != Op::cross_entropy_with_grad || f.in.size() != 3 || f.attrs.i("row_offset") >= 0) continue;
    const ValueId logits = f.in[0], dlogits = f.out[1];
    const Value& lv = g.value(logits);
    if (lv.kind != ValueKind::intermediate || keep.count(logits) || keep.count(dlogits)) continue;
    const Node& lin = g.node(lv.node);
    // Bias-free (a language model's head): a bias's gradient would be one more sum over chunks.
    if (lin.op != Op::linear || lin.in.size() != 2 || users[static_cast<size_t>(logits)].size() != 1) continue;
    const int64_t classes = lv.type.shape.back(), rows = rows_of(lv.type, classes);
    const ValueId x = lin.in[0];
    if (rows < 2 || !before(x, k)) continue;
    OutputLayer o{lv.node, {}, {}, {}};
    bool ok = true;
    // Every reader of the gradient: a GEMM that takes it as its [rows, classes] a, maybe
    // through reshapes, with no addend; the weight's gradient reading x's bytes as b.
    std::vector<ValueId> grads{dlogits};
    for (size_t i = 0; i < grads.size() && ok; ++i)
      for (int u : users[static_cast<size_t>(grads[i])]) {
        const Node& n = nodes[static_cast<size_t>(u)];
        if (op_def(n.op).view_of == 0 && !keep.count(n.out[0]) &&
            g.value(n.out[0]).type.shape == Shape{rows, classes}) {
          o.views.push_back(u);
          grads.push_back(n.out[0]);
          continue;
        }
        const bool gemm = n.op == Op::matmul && n.in.size() == 2 && n.in[0] == grads[i] && n.attrs.i("transpose_b") == 0 &&
                          g.value(n.in[0]).type.shape.size() == 2 && g.value(n.in[1]).type.shape.size() == 2;
        if (!gemm || n.in[1] == grads[i]) {
          ok = false;
          break;
        }
        if (n.attrs.i("transpose_a") == 0 && before(n.in[1], k)) {
          o.input_grads.push_back(u);
        } else if (n.attrs.i("transpose_a") != 0 && source_of(g, n.in[1]) == source_of(g, x) &&
                   g.value(n.in[1]).type.shape[0] == rows) {
          o.weight_grads.push_back(u);
        } else {
          ok = false;
          break;
        }
      }
    if (!ok || o.input_grads.size() + o.weight_grads.size() == 0) continue;
    layer_at[static_cast<size_t>(k)] = static_cast<int>(layers.size());
    gone[static_cast<size_t>(o.linear)] = true;
    for (int v : o.views) gone[static_cast<size_t>(v)] = true;
    for (int m : o.input_grads) gone[static_cast<size_t>(m)] = true;
    for (int m : o.weight_grads) gone[static_cast<size_t>(m)] = true;
    layers.push_back(o);
  }

  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  auto map = [&](ValueId v) { return mapped(r, v); };
  for (int k = 0; k < nn; ++k) {
    if (gone[static_cast<size_t>(k)]) continue;
    const Node& n = nodes[static_cast<size_t>(k)];
    const int li = layer_at[static_cast<size_t>(k)];
    if (li < 0) {
      std::vector<ValueId> in;
      for (ValueId v : n.in) in.push_back(map(v));
      copy_node(r, g, n, in);
      continue;
    }
    const OutputLayer& o = layers[static_cast<size_t>(li)];
    const Node& lin = nodes[static_cast<size_t>(o.linear)];
    const TensorType& lt = g.value(n.in[0]).type;
    const int64_t classes = lt.shape.back(), rows = rows_of(lt, classes);
    const int64_t width = g.value(lin.in[0]).type.shape.back();
    const int parts = static_cast<int>(std::min<int64_t>(chunks, rows));
    ValueId x = map(lin.in[0]);
    if (g.value(lin.in[0]).type.shape.size() != 2)
      x = ng.add_named(Op::reshape, {x}, Attrs{{"shape", std::vector<int64_t>{rows, width}}}, lin.name + ".rows")[0];
    std::vector<std::vector<ValueId>> dx_parts(o.input_grads.size());
    std::vector<ValueId> dw(o.weight_grads.size(), -1);
    ValueId loss = -1, correct = -1;
    for (int c = 0; c < parts; ++c) {
      const int64_t r0 = rows * c / parts, r1 = rows * (c + 1) / parts;
      const std::string tag = ".chunk" + std::to_string(c);
      const Attrs rows_c{{"axis", int64_t{0}}, {"start", r0}, {"end", r1}, {"step", int64_t{1}}};
      const ValueId xc = ng.add_named(Op::slice, {x}, rows_c, lin.name + tag + ".x")[0];
      const ValueId lc = ng.add_named(Op::linear, {xc, map(lin.in[1])}, lin.attrs, lin.name + tag)[0];
      std::vector<ValueId> f_in{lc, map(n.in[1]), map(n.in[2])};
      if (c > 0) {
        f_in.push_back(loss);
        if (correct >= 0) f_in.push_back(correct);
      }
      Attrs fa = n.attrs;
      fa.set("row_offset", r0);
      // The last chunk's loss and count are the layer's, under its names.
      std::vector<std::string> names;
      for (ValueId out : n.out) names.push_back(g.value(out).name + (c + 1 < parts ? tag : ""));
      const std::vector<ValueId> fo = ng.add_named(Op::cross_entropy_with_grad, f_in, fa, names);
      loss = fo[0];
      correct = fo.size() > 2 ? fo[2] : -1;
      for (size_t j = 0; j < o.input_grads.size(); ++j) {
        const Node& m = nodes[static_cast<size_t>(o.input_grads[j])];
        dx_parts[j].push_back(ng.add_named(Op::matmul, {fo[1], map(m.in[1])}, m.attrs, m.name + tag)[0]);
      }
      for (size_t j = 0; j < o.weight_grads.size(); ++j) {
        const Node& m = nodes[static_cast<size_t>(o.weight_grads[j])];
        std::vector<ValueId> in{fo[1], xc};
        if (dw[j] >= 0) in.push_back(dw[j]);  // summed in place over the chunks
        dw[j] = ng.add_named(Op::matmul, in, m.attrs, c + 1 < parts ? m.name + tag : m.name)[0];
      }
    }
    r.map[static_cast<size_t>(n.out[0])] = loss;
    r.map[static_cast<size_t>(n.out[1])] = -1;
    if (n.out.size() > 2) r.map[static_cast<size_t>(n.out[2])] = correct;
    for (size_t j = 0; j < o.input_grads.size(); ++j) {
      const Node& m = nodes[static_cast<size_t>(o.input_grads[j])];
      r.map[static_cast<size_t>(m.out[0])] =
          ng.add_named(Op::concat, dx_parts[j], Attrs{{"axis", int64_t{0}}}, m.name)[0];
    }
    for (size_t j = 0; j < o.weight_grads.size(); ++j)
      r.map[static_cast<size_t>(nodes[static_cast<size_t>(o.weight_grads[j])].out[0])] = dw[j];
    r.backward += 1;
  }
  return r;
}

}  // namespace seam
