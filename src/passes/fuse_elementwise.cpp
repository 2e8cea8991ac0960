// Elementwise fusion: chains of elementwise ops of one output shape become one
// fused_elementwise node whose intermediates never reach memory.
#include <optional>
#include <queue>
#include <set>
#include <utility>

#include "ops/fused_ew.h"
#include "ops/registry.h"
#include "passes/fuse.h"

namespace seam {

namespace {

// A node the pass may put in a group: an elementwise op on floats whose operands all
// broadcast to its output's shape (a binary gradient's output is at dy's shape; its sum
// over broadcast axes is a separate node), or a cast between float dtypes: the kernel
// loads each operand in its own dtype and stores each value in its own, so casts cost
// nothing inside a group. f64 (the CPU's gradient checks) stays among f64.
bool fusable(const Graph& g, const Node& n) {
  if (ew_arity(n.op) == 0 || n.out.size() != 1) return false;
  const TensorType& out = g.value(n.out[0]).type;
  if (!is_float(out.dtype)) return false;
  if (n.op == Op::cast) {
    const DType from = g.value(n.in[0]).type.dtype;
    return is_float(from) && (from == out.dtype || (from != DType::f64 && out.dtype != DType::f64));
  }
  for (ValueId v : n.in) {
    const TensorType& t = g.value(v).type;
    if (t.dtype != out.dtype) return false;
    auto b = broadcast_shapes(t.shape, out.shape);
    if (!b || *b != out.shape) return false;
  }
  return true;
}

}  // namespace

FuseResult fuse_elementwise(const Graph& g, const std::vector<ValueId>& keep_list) {
  const auto& nodes = g.nodes();
  const int nn = static_cast<int>(nodes.size());
  const std::set<ValueId> keep(keep_list.begin(), keep_list.end());
  const std::vector<std::vector<int>> users = value_users(g);
  auto producer = [&](ValueId v) { return g.value(v).node; };

  // 1. Groups, in node order: a node joins the group of one of its operands' producers,
  //    or else of an earlier reader of one of its full-size operands (siblings: the kernel
  //    then reads that operand once for both), when it has that group's shape and joining
  //    makes no cycle: none of its operands from outside depends on the group, where a
  //    group counts as one node (it runs as one kernel, so whatever one member reads, all
  //    of it waits for).
  std::vector<int> group(static_cast<size_t>(nn), -1);
  std::vector<std::vector<int>> members;
  std::vector<Shape> group_shape;
  // Whether a walk up the graph from `starts` (through operands' producers, a group
  // counting as one node: reaching a member reaches all of them) meets a node for which
  // stop(k) holds.
  auto upstream = [&](std::vector<int> stack, auto&& stop) {
    std::vector<bool> seen(static_cast<size_t>(nn), false);
    auto visit = [&](int p) {
      if (p >= 0 && !seen[static_cast<size_t>(p)]) seen[static_cast<size_t>(p)] = true, stack.push_back(p);
    };
    for (int s : std::exchange(stack, {})) visit(s);
    while (!stack.empty()) {
      const int k = stack.back();
      stack.pop_back();
      if (stop(k)) return true;
      if (const int h = group[static_cast<size_t>(k)]; h >= 0)
        for (int m : members[static_cast<size_t>(h)]) visit(m);
      for (ValueId v : nodes[static_cast<size_t>(k)].in) visit(producer(v));
    }
    return false;
  };
  auto depends_on = [&](int start, int gid) {  // whether node `start` follows group gid
    return upstream({start}, [&](int k) { return group[static_cast<size_t>(k)] == gid; });
  };
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (!fusable(g, n)) continue;
    const Shape& shape = g.value(n.out[0]).type.shape;
    std::vector<int> options;  // candidate groups, producers' first
    for (ValueId v : n.in)
      if (const int p = producer(v); p >= 0 && group[static_cast<size_t>(p)] >= 0)
        options.push_back(group[static_cast<size_t>(p)]);
    for (ValueId v : n.in)
      if (g.value(v).type.shape == shape)
        for (int u : users[static_cast<size_t>(v)])
          if (u < k && group[static_cast<size_t>(u)] >= 0) options.push_back(group[static_cast<size_t>(u)]);
    int join = -1;
    for (int gid : options) {
      if (join >= 0) break;
      if (group_shape[static_cast<size_t>(gid)] != shape) continue;
      bool safe = true;
      for (ValueId w : n.in) {
        const int q = producer(w);
        if (q >= 0 && group[static_cast<size_t>(q)] != gid && depends_on(q, gid)) safe = false;
      }
      if (safe) join = gid;
    }
    if (join < 0) {
      join = static_cast<int>(members.size());
      members.emplace_back();
      group_shape.push_back(shape);
    }
    group[static_cast<size_t>(k)] = join;
    members[static_cast<size_t>(join)].push_back(k);
  }
  // 2. Reductions ending a group: a sum or mean of a member's value joins the group (its
  //    kernel adds the value up as it goes, and stores it only if it is read elsewhere)
  //    when the group reduces over no other axes and none of its members depends on the
  //    reduction: a bias or broadcast operand's gradient, a mean of a loss term.
  struct Reduction {
    std::vector<int> axes;
    bool keepdims = false;
    bool operator==(const Reduction&) const = default;
  };
  std::vector<std::optional<Reduction>> reduction(members.size());
  auto reaches = [&](int gid, int target) {  // whether a member of gid depends on node target
    std::vector<int> starts;
    for (int m : members[static_cast<size_t>(gid)])
      for (ValueId v : nodes[static_cast<size_t>(m)].in)
        if (const int p = producer(v); p >= 0 && group[static_cast<size_t>(p)] != gid) starts.push_back(p);
    return upstream(std::move(starts), [&](int k) { return k == target; });
  };
  //    A layer norm of a member's value (a residual add + layer norm) ends its group the
  //    same way, in place of sums: the kernel normalizes each row as it computes it, and
  //    the layer norm's input is stored only if it is read elsewhere. Its gamma and beta
  //    become the group's inputs, so they must not depend on the group.
  std::vector<bool> normalized(members.size(), false);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op != Op::layer_norm) continue;
    const int p = producer(n.in[0]);
    if (p < 0 || group[static_cast<size_t>(p)] < 0 || ew_arity(nodes[static_cast<size_t>(p)].op) == 0) continue;
    const int gid = group[static_cast<size_t>(p)];
    if (normalized[static_cast<size_t>(gid)] || reaches(gid, k)) continue;
    bool safe = true;
    for (size_t i = 1; i < n.in.size(); ++i)
      if (const int q = producer(n.in[i]); q >= 0 && depends_on(q, gid)) safe = false;
    if (!safe) continue;
    normalized[static_cast<size_t>(gid)] = true;
    group[static_cast<size_t>(k)] = gid;
    members[static_cast<size_t>(gid)].push_back(k);
  }
  //    Where a group's value is reduced over several sets of axes, the set most of its
  //    reductions share wins (the most values kept from memory).
  struct Candidate {
    int node, gid;
    Reduction r;
  };
  std::vector<Candidate> candidates;
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    if (n.op != Op::sum && n.op != Op::mean) continue;
    const int p = producer(n.in[0]);
    if (p < 0 || group[static_cast<size_t>(p)] < 0) continue;
    const int gid = group[static_cast<size_t>(p)];
    if (normalized[static_cast<size_t>(gid)]) continue;
    candidates.push_back({k, gid,
                          {reduce_axes(n.attrs.ints("axes"), g.value(n.in[0]).type.shape.size(), nullptr),
                           n.attrs.i("keepdims") != 0}});
  }
  auto shared_by = [&](const Candidate& c) {  // how many of its group's candidates reduce as c does
    return std::count_if(candidates.begin(), candidates.end(),
                         [&](const Candidate& o) { return o.gid == c.gid && o.r == c.r; });
  };
  for (const Candidate& c : candidates) {
    auto& have = reduction[static_cast<size_t>(c.gid)];
    if (!have) {
      std::ptrdiff_t best = 0;
      for (const Candidate& o : candidates)
        if (o.gid == c.gid && shared_by(o) > best) best = shared_by(o), have = o.r;
    }
    if (!(*have == c.r) || reaches(c.gid, c.node)) continue;
    group[static_cast<size_t>(c.node)] = c.gid;
    members[static_cast<size_t>(c.gid)].push_back(c.node);
  }
  //    A cast left alone reading a group's layer-norm y or sum, and nothing else reads that
  //    value: the group stores it in the cast's dtype instead (the store rounds as the
  //    cast would), e.g. a layer norm's output for the GEMM after it. Its only operand is
  //    the group's, so it closes no cycle.
  std::vector<int> stored_by(g.values().size(), -1);  // value -> the cast that stores it
  std::vector<bool> absorbed(static_cast<size_t>(nn), false);
  for (int k = 0; k < nn; ++k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    const int own = group[static_cast<size_t>(k)];
    if (n.op != Op::cast || !fusable(g, n) || (own >= 0 && members[static_cast<size_t>(own)].size() > 1)) continue;
    const ValueId v = n.in[0];
    const int p = producer(v);
    if (p < 0 || group[static_cast<size_t>(p)] < 0 || keep.count(v) || users[static_cast<size_t>(v)].size() != 1) continue;
    const Op pop = nodes[static_cast<size_t>(p)].op;
    if (!((pop == Op::layer_norm && nodes[static_cast<size_t>(p)].out[0] == v) || pop == Op::sum || pop == Op::mean))
      continue;
    if (own >= 0) members[static_cast<size_t>(own)].clear();
    group[static_cast<size_t>(k)] = group[static_cast<size_t>(p)];
    members[static_cast<size_t>(group[static_cast<size_t>(p)])].push_back(k);
    stored_by[static_cast<size_t>(v)] = k;
    absorbed[static_cast<size_t>(k)] = true;
  }
  // The value that stands for v outside the group: v, or the cast that stores it.
  auto stored_value = [&](ValueId v) {
    const int c = stored_by[static_cast<size_t>(v)];
    return c < 0 ? v : nodes[static_cast<size_t>(c)].out[0];
  };
  for (int k = 0; k < nn; ++k)  // a group of one node stays that node
    if (group[static_cast<size_t>(k)] >= 0 && members[static_cast<size_t>(group[static_cast<size_t>(k)])].size() < 2)
      group[static_cast<size_t>(k)] = -1;

  // 3. Emit items (a node, or a whole group at once) in node order as far as their
  //    operands allow: a group goes out when its last operand from outside exists.
  FuseResult r = start_rebuild(g);
  Graph& ng = r.graph;
  auto ready = [&](ValueId v) { return r.map[static_cast<size_t>(v)] >= 0; };
  std::vector<bool> done(static_cast<size_t>(nn), false);
  auto emit_node = [&](int k) {
    const Node& n = nodes[static_cast<size_t>(k)];
    std::vector<ValueId> in;
    for (ValueId v : n.in) in.push_back(mapped(r, v));
    copy_node(r, g, n, in);
    done[static_cast<size_t>(k)] = true;
  };
  auto emit_group = [&](int gid) {
    const auto& ms = members[static_cast<size_t>(gid)];
    std::vector<ValueId> ext;  // operands from outside, in first-use order
    auto input_of = [&](ValueId v) {
      auto it = std::find(ext.begin(), ext.end(), v);
      if (it == ext.end()) it = ext.insert(ext.end(), v);
      return static_cast<int>(it - ext.begin());
    };
    std::vector<int> temp_of(g.values().size(), -1);
    EwProgram prog;
    auto is_reduction = [&](int k) { return ew_arity(nodes[static_cast<size_t>(k)].op) == 0; };
    for (int k : ms) {
      const Node& n = nodes[static_cast<size_t>(k)];
      if (is_reduction(k) || absorbed[static_cast<size_t>(k)]) continue;
      const DType dtype = g.value(n.out[0]).type.dtype;
      EwInstr in{n.op, 0.0, {}};
      if (n.op == Op::cast) {
        in.dtype = dtype;
      } else if (ew_draws(n.op)) {  // the op in evaluation is the identity: p = 0 keeps every element
        in.p = n.attrs.i("training") ? n.attrs.f("p") : 0.0;
        in.stream = static_cast<uint32_t>(n.attrs.i("stream"));
      } else if (*ew_attr(n.op)) {
        in.p = n.attrs.f(ew_attr(n.op));
      }
      for (ValueId v : n.in) {
        const int t = temp_of[static_cast<size_t>(v)];
        if (t >= 0) {
          in.args.push_back(-t - 1);
          continue;
        }
        in.args.push_back(input_of(v));
      }
      temp_of[static_cast<size_t>(n.out[0])] = static_cast<int>(prog.code.size());
      prog.code.push_back(std::move(in));
      // The unfused op stores a 16-bit value rounded, and its readers see that: so does
      // the group, by a cast right after it (temps are floats).
      if (n.op != Op::cast && is_half(dtype)) {
        const int t = temp_of[static_cast<size_t>(n.out[0])];
        prog.code.push_back(EwInstr{Op::cast, 0.0, {-t - 1}, dtype});
        temp_of[static_cast<size_t>(n.out[0])] = t + 1;
      }
    }
    std::vector<ValueId> outs;
    std::vector<std::string> names;
    for (int k : ms) {
      const Node& n = nodes[static_cast<size_t>(k)];
      const ValueId v = n.out[0];
      if (absorbed[static_cast<size_t>(k)]) continue;  // stored with the value it reads
      if (n.op == Op::layer_norm) {  // y, mean and rstd
        prog.ln_gamma = input_of(n.in[1]);
        prog.ln_beta = input_of(n.in[2]);
        prog.ln_eps = n.attrs.f("eps");
        for (EwReduce kind : {EwReduce::ln_y, EwReduce::ln_mean, EwReduce::ln_rstd}) {
          prog.outputs.push_back(temp_of[static_cast<size_t>(n.in[0])]);
          prog.reduce.push_back(kind);
        }
        for (ValueId o : n.out) {
          outs.push_back(stored_value(o));
          names.push_back(g.value(stored_value(o)).name);
        }
        continue;
      }
      if (is_reduction(k)) {
        prog.outputs.push_back(temp_of[static_cast<size_t>(n.in[0])]);
        prog.reduce.push_back(n.op == Op::sum ? EwReduce::sum : EwReduce::mean);
      } else {
        bool outside = keep.count(v) > 0;
        for (int u : users[static_cast<size_t>(v)]) outside = outside || group[static_cast<size_t>(u)] != gid;
        if (!outside) continue;
        prog.outputs.push_back(temp_of[static_cast<size_t>(v)]);
        prog.reduce.push_back(EwReduce::none);
      }
      outs.push_back(stored_value(v));
      names.push_back(g.value(stored_value(v)).name);
    }
    if (outs.empty()) {  // a dead chain: left as it is, for the lowering to drop
      for (int k : ms) emit_node(k);
      return;
    }
    std::vector<ValueId> in;
    for (ValueId v : ext) in.push_back(mapped(r, v));
    Attrs attrs{{"program", prog.str()}};
    if (const auto& red = reduction[static_cast<size_t>(gid)]) {
      attrs.set("axes", std::vector<int64_t>(red->axes.begin(), red->axes.end()));
      attrs.set("keepdims", int64_t{red->keepdims});
    }
    // Each output in the dtype of the value it stands for; the attribute only where that
    // is not what it defaults to, so that f32 plans read as before.
    std::vector<DType> dtypes;
    for (ValueId v : outs) dtypes.push_back(g.value(v).type.dtype);
    if (dtypes != ew_output_dtypes(prog, "", g.value(ext[0]).type.dtype)) attrs.set("dtypes", ew_dtypes_str(dtypes));
    auto made = ng.add_named(Op::fused_elementwise, in, attrs, names);
    for (size_t i = 0; i < outs.size(); ++i) r.map[static_cast<size_t>(outs[i])] = made[i];
    for (int k : ms) done[static_cast<size_t>(k)] = true;
    ++r.forward;
  };
  auto can_emit = [&](int k) {
    const int gid = group[static_cast<size_t>(k)];
    if (gid < 0) {
      for (ValueId v : nodes[static_cast<size_t>(k)].in)
        if (!ready(v)) return false;
      return true;
    }
    for (int m : members[static_cast<size_t>(gid)])
      for (ValueId v : nodes[static_cast<size_t>(m)].in) {
        const int p = producer(v);
        if (!ready(v) && (p < 0 || group[static_cast<size_t>(p)] != gid)) return false;
      }
    return true;
  };
  // The earliest node not yet emitted whose item can go out: the original order where
  // it holds, a group as soon as its outside operands exist.
  for (int first = 0;;) {
    while (first < nn && done[static_cast<size_t>(first)]) ++first;
    if (first == nn) break;
    int pick = -1;
    for (int k = first; k < nn && pick < 0; ++k)
      if (!done[static_cast<size_t>(k)] && can_emit(k)) pick = k;
    SEAM_ASSERT(pick >= 0);  // the grouping admits no cycle
    const int gid = group[static_cast<size_t>(pick)];
    if (gid < 0) emit_node(pick);
    else emit_group(gid);
  }
  return r;
}

}  // namespace seam
