// The Plan's accessors and its printed form.
#include <iomanip>
#include <sstream>

#include "seam/plan.h"

namespace seam {

std::string bytes_str(size_t b) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2);
  if (b >= (1u << 20)) s << static_cast<double>(b) / (1 << 20) << " MiB";
  else if (b >= 1024) s << static_cast<double>(b) / 1024 << " KiB";
  else s << b << " B";
  return s.str();
}

const char* region_name(Region r) {
  switch (r) {
    case Region::arena: return "arena";
    case Region::params: return "params";
    case Region::grads: return "grads";
    case Region::state: return "state";
    case Region::working: return "working";
  }
  return "?";
}

int64_t Layout::param_count() const {
  int64_t n = 0;
  for (auto& p : params) n += p.type.numel();
  return n;
}

const Slot* Layout::param(const std::string& name) const {
  for (auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const Slot* Layout::state(const std::string& name) const {
  for (auto& s : states)
    if (s.name == name) return &s;
  return nullptr;
}

double Plan::flops() const {
  double f = 0;
  for (auto& s : steps) f += s.flops;
  return f;
}

namespace {
const Binding* find(const std::vector<Binding>& v, const std::string& name) {
  for (auto& b : v)
    if (b.name == name) return &b;
  return nullptr;
}

std::string ref_str(const BufferRef& r) {
  return r.type.str() + "@" + region_name(r.region) + "+" + std::to_string(r.offset);
}
}  // namespace

const Binding* Plan::input(const std::string& name) const { return find(inputs, name); }
const Binding* Plan::output(const std::string& name) const { return find(outputs, name); }
const Binding* Plan::grad(const std::string& name) const { return find(grads, name); }

std::string Plan::str() const {
  std::ostringstream s;
  auto print = [&](const PlanStep& st, const std::string& label) {
    s << std::setw(4) << label << "  " << std::left << std::setw(20) << op_name(st.op) << std::right << " " << st.name
      << "\n        in:";
    for (auto& r : st.in) s << " " << ref_str(r);
    s << "\n        out:";
    for (auto& r : st.out) s << " " << ref_str(r);
    if (!st.attrs.items().empty()) s << "\n        attrs: " << st.attrs.str();
    s << "\n        flops: " << st.flops << "\n";
  };
  if (!init.empty()) s << "once, when prepared: " << init.size() << " constant(s)\n";
  for (auto& st : init) print(st, "-");
  // A bucket's sum over the ranks, where it starts: after the last step writing into it.
  auto reduce = [&](int after) {
    for (size_t k = 0; k < buckets.size(); ++k) {
      const GradBucket& b = buckets[k];
      if (b.after != after) continue;
      s << "   +  all-reduce bucket " << k << ": " << bytes_str(b.bytes()) << " in " << b.parts.size()
        << " part(s), the gradients of " << b.params.size() << " parameter(s) from " << b.params.front()
        << (zero ? ", each rank's shard of it summed over " : ", summed over ") << ranks << " ranks and divided by "
        << ranks << "\n";
    }
  };
  s << "plan: " << steps.size() << " steps\n";
  reduce(-1);
  for (size_t i = 0; i < steps.size(); ++i) print(steps[i], std::to_string(i)), reduce(static_cast<int>(i));
  if (optimizer) s << "update: " << optimizer->str() << " over " << layout.param_count() << " parameters\n";
  s << "inputs:";
  for (auto& b : inputs) s << " " << b.name << "=" << ref_str(b.ref);
  s << "\noutputs:";
  for (auto& b : outputs) s << " " << b.name << "=" << ref_str(b.ref);
  s << "\nparameters: " << layout.param_count() << " (" << dtype_name(layout.param_dtype) << ", "
    << bytes_str(layout.param_bytes) << ")";
  if (working) s << ", their " << dtype_name(*working) << " working copies: " << bytes_str(layout.param_bytes / 2);
  s << ", state: " << bytes_str(layout.state_bytes) << "\n"
    << "arena peak: " << bytes_str(arena_bytes) << " (busiest step: " << bytes_str(live_bytes)
    << ", without reuse: " << bytes_str(naive_bytes) << ")\n"
    << (budget_note.empty() ? "" : budget_note + "\n")
    << "flops per step: " << flops() << "\n";
  return s.str();
}

}  // namespace seam
