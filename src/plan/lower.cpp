// Lowering a graph to a Plan: dead-node elimination, storage placement, memory planning.
#include "plan/lower.h"

#include <algorithm>

#include "ops/geometry.h"
#include "ops/registry.h"
#include "passes/memplan.h"

namespace seam {

namespace {
constexpr size_t kAlign = 256;  // cuBLAS/cuDNN-friendly, and 16-byte vector access
size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Elements of a shape before `axis` (1: a range along the axis is one contiguous run).
int64_t outer_of(const Shape& s, int axis) {
  int64_t n = 1;
  for (int d = 0; d < axis; ++d) n *= s[static_cast<size_t>(d)];
  return n;
}

// Where a slice reads one contiguous run of its input at a kAlign-aligned byte offset
// (step 1, nothing outside the axis before it), its output is that run: the offset, or
// -1 where it must copy.
int64_t slice_view_offset(const Graph& g, const Node& n) {
  const TensorType& t = g.value(n.in[0]).type;
  const int axis = normalize_axis(n.attrs.i("axis"), t.shape.size());
  if (n.attrs.i("step") != 1 || outer_of(t.shape, axis) != 1) return -1;
  const SliceRange r = normalize_slice(n.attrs.i("start"), n.attrs.i("end"), 1, t.shape[static_cast<size_t>(axis)]);
  const int64_t offset = r.start * (t.numel() / t.shape[static_cast<size_t>(axis)]) * dtype_size(t.dtype);
  return offset % static_cast<int64_t>(kAlign) == 0 ? offset : -1;
}
}  // namespace

Layout make_layout(const Graph& g) {
  Layout l;
  if (!g.params().empty()) l.param_dtype = g.value(g.params()[0]).type.dtype;
  for (bool decay : {true, false})
    for (ValueId id : g.params()) {
      const Value& v = g.value(id);
      if (v.decay != decay) continue;
      if (v.type.dtype != l.param_dtype)
        fail("parameter ", g.describe(id), " differs in dtype from ", g.describe(g.params()[0]),
             ": all parameters of a model share one dtype");
      l.params.push_back({v.name, v.type, l.param_bytes, v.init, v.decay});
      l.param_bytes += align_up(v.type.bytes());
      if (decay) l.decay_bytes = l.param_bytes;
    }
  for (ValueId id : g.states()) {
    const Value& v = g.value(id);
    l.states.push_back({v.name, v.type, l.state_bytes, v.init, false});
    l.state_bytes += align_up(v.type.bytes());
  }
  return l;
}

Plan lower(const Graph& g, const Layout& layout, const LowerRequest& req) {
  const size_t nv = g.values().size();
  const int nn = static_cast<int>(g.nodes().size());

  // 1. Which nodes are needed.
  std::vector<bool> needed(nv, false);
  for (ValueId o : req.outputs) needed[static_cast<size_t>(o)] = true;
  for (auto& [v, slot] : req.grads) needed[static_cast<size_t>(v)] = true;
  std::vector<bool> live_node(static_cast<size_t>(nn), false);
  for (int k = nn - 1; k >= 0; --k) {
    const Node& n = g.node(k);
    const OpDef& d = op_def(n.op);
    bool any = d.side_effect && !(n.attrs.has("training") && n.attrs.i("training") == 0);
    for (ValueId o : n.out) any = any || needed[static_cast<size_t>(o)];
    if (!any) continue;
    live_node[static_cast<size_t>(k)] = true;
    for (ValueId i : n.in) needed[static_cast<size_t>(i)] = true;
  }
  // A live node writes all its outputs, read or not (batch norm's saved statistics in
  // evaluation): each needs a place of its own.
  for (int k = 0; k < nn; ++k)
    if (live_node[static_cast<size_t>(k)])
      for (ValueId o : g.node(k).out) needed[static_cast<size_t>(o)] = true;

  // A cast of an f32 parameter to the working dtype reads the parameter's working copy
  // (at half its offset): no step, no arena space, no cast kernel on the step's path.
  std::vector<bool> working_cast(static_cast<size_t>(nn), false);
  if (req.working && layout.param_dtype == DType::f32)
    for (int k = 0; k < nn; ++k) {
      const Node& n = g.node(k);
      working_cast[static_cast<size_t>(k)] = live_node[static_cast<size_t>(k)] && n.op == Op::cast &&
                                             g.value(n.in[0]).kind == ValueKind::param &&
                                             g.value(n.out[0]).type.dtype == *req.working;
    }

  // 2. Where each needed value lives. Views resolve to the value they alias, at a byte
  // offset into it: reshapes and the like at 0; a slice that is one contiguous run of its
  // input (rows of a row-major matrix: the output layer's chunks) at the run's start; and
  // the inputs of a concat along such runs are written in place into its output, each at
  // its run's start, so neither copies. Offsets stay multiples of kAlign, as every place
  // the arena gives is.
  std::vector<ValueId> parent(nv);
  std::vector<size_t> parent_offset(nv, 0);
  for (size_t v = 0; v < nv; ++v) parent[v] = static_cast<ValueId>(v);
  std::vector<bool> aliased(static_cast<size_t>(nn), false);  // a view: no step
  std::vector<int> producer(nv, -1);
  std::vector<int> joined;  // concats written in place, in graph order
  std::vector<bool> is_grad(nv, false);
  for (auto& [v, slot] : req.grads) is_grad[static_cast<size_t>(v)] = true;
  for (int k = 0; k < nn; ++k)
    if (live_node[static_cast<size_t>(k)])
      for (ValueId o : g.node(k).out) producer[static_cast<size_t>(o)] = k;
  for (int k = 0; k < nn; ++k) {
    if (!live_node[static_cast<size_t>(k)]) continue;
    const Node& n = g.node(k);
    const auto out = static_cast<size_t>(n.out.empty() ? 0 : n.out[0]);
    // A gradient keeps a buffer of its own (its slot), so a slice into one copies.
    const int64_t slice_at = n.op == Op::slice && !is_grad[out] ? slice_view_offset(g, n) : -1;
    if (const int view = op_def(n.op).view_of; view >= 0) {
      parent[out] = n.in[static_cast<size_t>(view)];
      aliased[static_cast<size_t>(k)] = true;
    } else if (slice_at >= 0) {
      parent[out] = n.in[0];
      parent_offset[out] = static_cast<size_t>(slice_at);
      aliased[static_cast<size_t>(k)] = true;
    } else if (n.op == Op::concat) {
      // The output and each input: intermediates of their own (no gradient buffer), each
      // input written by a step of its own (not a working copy, which no step writes) and
      // read once here.
      const TensorType& t = g.value(n.out[0]).type;
      const int axis = normalize_axis(n.attrs.i("axis"), t.shape.size());
      bool in_place = outer_of(t.shape, axis) == 1 && parent[out] == n.out[0] &&
                      g.value(n.out[0]).kind == ValueKind::intermediate && !is_grad[out];
      size_t offset = 0;
      std::vector<size_t> at;
      for (size_t i = 0; i < n.in.size() && in_place; ++i) {
        const auto v = static_cast<size_t>(n.in[i]);
        const int p = producer[v];
        // An input that is itself a concat written in place (the only concat a view)
        // joins this one too: its inputs land at their offsets within its run.
        const bool written =
            p >= 0 && (!aliased[static_cast<size_t>(p)] || g.node(p).op == Op::concat);
        in_place = g.value(n.in[i]).kind == ValueKind::intermediate && !is_grad[v] && parent[v] == n.in[i] && written &&
                   !g.node(p).in.empty() && op_def(g.node(p).op).view_of < 0 && !working_cast[static_cast<size_t>(p)] &&
                   offset % kAlign == 0 && std::count(n.in.begin(), n.in.end(), n.in[i]) == 1;
        at.push_back(offset);
        offset += g.value(n.in[i]).type.bytes();
      }
      if (in_place) {
        for (size_t i = 0; i < n.in.size(); ++i) {
          parent[static_cast<size_t>(n.in[i])] = n.out[0];
          parent_offset[static_cast<size_t>(n.in[i])] = at[i];
        }
        aliased[static_cast<size_t>(k)] = true;
        joined.push_back(k);
      }
    }
  }
  std::vector<ValueId> root(nv);
  std::vector<size_t> view_offset(nv, 0);
  for (size_t v = 0; v < nv; ++v) {
    size_t r = v, offset = 0;
    while (parent[r] != static_cast<ValueId>(r)) offset += parent_offset[r], r = static_cast<size_t>(parent[r]);
    root[v] = static_cast<ValueId>(r);
    view_offset[v] = offset;
  }
  std::vector<BufferRef> place(nv);
  std::vector<bool> placed(nv, false);
  auto fixed = [&](ValueId v, Region r, size_t off) {
    place[static_cast<size_t>(v)] = {r, off, g.value(v).type};
    placed[static_cast<size_t>(v)] = true;
  };
  for (ValueId id : g.params())
    if (needed[static_cast<size_t>(id)]) fixed(id, Region::params, layout.param(g.value(id).name)->offset);
  for (ValueId id : g.states())
    if (needed[static_cast<size_t>(id)]) fixed(id, Region::state, layout.state(g.value(id).name)->offset);
  Plan plan;
  plan.layout = layout;
  plan.optimizer = req.optimizer;
  for (int k = 0; k < nn; ++k)
    if (working_cast[static_cast<size_t>(k)]) {
      const Node& n = g.node(k);
      fixed(n.out[0], Region::working, layout.param(g.value(n.in[0]).name)->offset / 2);
      plan.working = req.working;
    }
  for (auto& [v, slot] : req.grads) {
    const Slot& s = layout.params.at(slot);
    if (root[static_cast<size_t>(v)] != v || g.value(v).kind != ValueKind::intermediate)
      fail("internal error: gradient of '", s.name, "' is not an intermediate of its own");
    fixed(v, Region::grads, s.offset);
    plan.grads.push_back({s.name, place[static_cast<size_t>(v)]});
  }

  // 3. Steps, and the lifetime of every arena value (by its root).
  std::vector<int> first(nv, -1), last(nv, -2);
  auto use = [&](ValueId v, int step) {
    auto r = static_cast<size_t>(root[static_cast<size_t>(v)]);
    last[r] = std::max(last[r], step);
  };
  for (ValueId id : g.inputs())
    if (needed[static_cast<size_t>(id)]) first[static_cast<size_t>(id)] = -1, last[static_cast<size_t>(id)] = -1;
  std::vector<std::pair<int, int>> step_values;  // (node, step)
  std::vector<int> init_nodes;  // constants: computed once, when the plan is prepared
  for (int k = 0; k < nn; ++k) {
    if (!live_node[static_cast<size_t>(k)]) continue;
    const Node& n = g.node(k);
    const OpDef& d = op_def(n.op);
    if (aliased[static_cast<size_t>(k)] || working_cast[static_cast<size_t>(k)]) continue;
    // A node of no inputs (the gradient seed) gives the same value every step; its output
    // keeps its arena place, so it is computed once. (Not into the gradient buffers:
    // another program of the model may write there.)
    if (n.in.empty() && !d.side_effect && !d.per_step && !placed[static_cast<size_t>(n.out[0])]) {
      init_nodes.push_back(k);
      continue;
    }
    int s = static_cast<int>(plan.steps.size());
    PlanStep step{n.op, n.attrs, {}, {}, n.name, 0};
    for (ValueId i : n.in) use(i, s);
    for (ValueId o : n.out) {
      first[static_cast<size_t>(o)] = s;
      last[static_cast<size_t>(o)] = std::max(last[static_cast<size_t>(o)], s);
    }
    plan.steps.push_back(std::move(step));
    step_values.emplace_back(k, s);
  }
  const int end = static_cast<int>(plan.steps.size());
  // A concat written in place lives from its first input's step (an inner concat's, set
  // before it: graph order).
  for (int k : joined) {
    const Node& n = g.node(k);
    int from = end;
    for (ValueId i : n.in) from = std::min(from, first[static_cast<size_t>(i)]);
    first[static_cast<size_t>(n.out[0])] = from;
  }
  for (ValueId o : req.outputs) use(o, end);
  // Backends keep each input where a run copies it from into the arena as the step
  // begins (an input set once stays valid for later steps), so a float input's place is
  // free after its last reader: under a mixed policy the f32 batch is read once, by its
  // cast. Integer inputs (labels, ids) keep theirs for the whole step: a step replayed
  // alone for timing (Executable::time_steps) must not read a label or id out of range
  // from a buffer another step reused.
  for (ValueId id : g.inputs())
    if (needed[static_cast<size_t>(id)] && !is_float(g.value(id).type.dtype)) use(id, end);
  for (int k : init_nodes)
    for (ValueId o : g.node(k).out) first[static_cast<size_t>(o)] = -1, use(o, end);
  // Values read by views live as long as the views' readers: handled by root in use().

  // An output written over an input nothing reads later (OpDef::in_place) shares its
  // root: one buffer where there were two (a language model's logits and their gradient).
  // Not over inputs (a run may keep them for the next) or values placed elsewhere. An
  // output in a gradient buffer takes the input into that buffer instead (a tied weight's
  // gradient, its GEMM's part written there first and the embedding's rows added).
  if (req.reuse_memory)
    for (auto& [k, s] : step_values) {
      const Node& n = g.node(k);
      const auto [o, i] = op_def(n.op).in_place;
      if (o < 0 || static_cast<size_t>(i) >= n.in.size()) continue;
      const ValueId out = n.out[static_cast<size_t>(o)];
      const auto ri = static_cast<size_t>(root[static_cast<size_t>(n.in[static_cast<size_t>(i)])]);
      const auto ro = static_cast<size_t>(out);
      const bool into_grads = placed[ro] && place[ro].region == Region::grads;
      if (placed[ri] || (placed[ro] && !into_grads) || root[ro] != out ||
          g.value(static_cast<ValueId>(ri)).kind != ValueKind::intermediate || last[ri] != s ||
          g.value(static_cast<ValueId>(ri)).type.bytes() != g.value(out).type.bytes())
        continue;
      const auto to = static_cast<ValueId>(into_grads ? ro : ri), from = into_grads ? static_cast<ValueId>(ri) : out;
      for (size_t v = 0; v < nv; ++v)
        if (root[v] == from) root[v] = to;
      if (!into_grads) last[ri] = std::max(last[ri], last[ro]);
    }

  // 4. Arena placement.
  std::vector<Lifetime> life;
  std::vector<ValueId> who;
  for (size_t v = 0; v < nv; ++v) {
    if (!needed[v] || placed[v] || root[v] != static_cast<ValueId>(v)) continue;
    if (last[v] < -1) last[v] = std::max(first[v], -1);  // produced but unread (extra outputs)
    Lifetime l{g.value(static_cast<ValueId>(v)).type.bytes(), first[v], last[v]};
    if (!req.reuse_memory) l.first = -1, l.last = end;
    else if (l.last >= 0) l.last = std::min(end, l.last + req.reuse_gap);
    life.push_back(l);
    who.push_back(static_cast<ValueId>(v));
  }
  MemPlan mp = plan_memory(life, kAlign);
  for (size_t i = 0; i < who.size(); ++i) fixed(who[i], Region::arena, mp.offsets[i]);
  plan.arena_bytes = mp.peak;
  plan.naive_bytes = mp.naive;
  plan.live_bytes = mp.lower_bound;
  for (size_t v = 0; v < nv; ++v) {
    if (!needed[v] || placed[v]) continue;
    BufferRef r = place[static_cast<size_t>(root[v])];
    SEAM_ASSERT(placed[static_cast<size_t>(root[v])]);
    r.type = g.value(static_cast<ValueId>(v)).type;
    r.offset += view_offset[v];
    place[v] = r;
    placed[v] = true;
  }

  // 5. Operands of every step; bindings.
  for (int k : init_nodes) {
    const Node& n = g.node(k);
    plan.init.push_back({n.op, n.attrs, {}, {}, n.name, 0});
    step_values.emplace_back(k, -1 - static_cast<int>(plan.init.size() - 1));
  }
  for (auto& [k, s] : step_values) {
    const Node& n = g.node(k);
    PlanStep& step = s >= 0 ? plan.steps[static_cast<size_t>(s)] : plan.init[static_cast<size_t>(-1 - s)];
    std::vector<TensorType> in_t, out_t;
    for (ValueId i : n.in) step.in.push_back(place[static_cast<size_t>(i)]), in_t.push_back(g.value(i).type);
    for (ValueId o : n.out) step.out.push_back(place[static_cast<size_t>(o)]), out_t.push_back(g.value(o).type);
    const OpDef& d = op_def(n.op);
    OpCostCtx cc{in_t, out_t, n.attrs};
    step.flops = d.flops ? d.flops(cc) : out_t.empty() ? 0.0 : static_cast<double>(out_t[0].numel());
  }
  for (ValueId id : g.inputs())
    if (needed[static_cast<size_t>(id)]) plan.inputs.push_back({g.value(id).name, place[static_cast<size_t>(id)]});
  for (ValueId o : req.outputs) plan.outputs.push_back({g.value(o).name, place[static_cast<size_t>(o)]});
  return plan;
}

}  // namespace seam
