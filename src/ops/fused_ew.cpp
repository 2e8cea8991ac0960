// fused_elementwise: its program text and its schema.
#include "ops/fused_ew.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "ops/elementwise.h"
#include "ops/registry.h"

namespace seam {

int ew_arity(Op op) {
  if (op == Op::cast || ew_draws(op)) return 1;
  if (const UnaryInfo* u = unary_info(op)) return op == u->op ? 1 : (u->uses == Uses::N ? 1 : 2);
  if (const BinaryInfo* b = binary_info(op)) return op == b->op ? 2 : 3;
  return 0;
}

const char* ew_attr(Op op) {
  if (op == Op::cast) return "dtype";
  if (ew_draws(op)) return "p";
  const UnaryInfo* u = unary_info(op);
  return u ? u->attr : "";
}

namespace {

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Built piecewise: GCC 12 warns (-Wrestrict, falsely) on "literal" + std::string&&.
std::string temp_name(int k) {
  std::string s(1, 't');
  s += std::to_string(k);
  return s;
}
std::string operand(int a) {
  if (a < 0) return temp_name(-a - 1);
  std::string s(1, 'i');
  s += std::to_string(a);
  return s;
}

}  // namespace

std::string EwProgram::str() const {
  std::string s;
  for (size_t k = 0; k < code.size(); ++k) {
    const EwInstr& in = code[k];
    if (k) s += ';';
    s += op_name(in.op);
    if (in.op == Op::cast || *ew_attr(in.op)) {
      s += '[';
      s += in.op == Op::cast ? std::string(dtype_name(in.dtype)) : number(in.p);
      if (ew_draws(in.op)) s += "," + std::to_string(in.stream);
      s += ']';
    }
    s += '(';
    for (size_t j = 0; j < in.args.size(); ++j) {
      if (j) s += ',';
      s += operand(in.args[j]);
    }
    s += ')';
  }
  s += "->";
  for (size_t j = 0; j < outputs.size(); ++j) {
    const std::string t = temp_name(outputs[j]);
    const EwReduce r = reduce[j];
    if (r == EwReduce::ln_mean || r == EwReduce::ln_rstd) continue;  // written with ln_y
    s += j ? "," : "";
    if (r == EwReduce::none) s += t;
    else if (r == EwReduce::ln_y)
      s += "layer_norm[" + number(ln_eps) + "](" + t + "," + operand(ln_gamma) + "," + operand(ln_beta) + ")";
    else {
      s += r == EwReduce::sum ? "sum(" : "mean(";
      s += t;
      s += ')';
    }
  }
  return s;
}

bool EwProgram::reduces() const {
  return std::any_of(reduce.begin(), reduce.end(), summed);
}

bool EwProgram::draws() const {
  return std::any_of(code.begin(), code.end(), [](const EwInstr& in) { return ew_draws(in.op); });
}

EwProgram EwProgram::parse(const std::string& text) {
  EwProgram p;
  size_t i = 0;
  auto bad = [&](const std::string& what) {
    fail("fused_elementwise program, at character ", i, " of '", text, "': ", what);
  };
  auto integer = [&]() {
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    int v = 0;
    auto r = std::from_chars(text.data() + i, text.data() + j, v);
    if (j == i || r.ec != std::errc()) bad("expected a number");
    i = j;
    return v;
  };
  auto temp = [&](const char* what) {
    if (i >= text.size() || text[i] != 't') bad(std::string("expected a temp t<k> ") + what);
    ++i;
    const int t = integer();
    if (t >= static_cast<int>(p.code.size())) bad("temp t" + std::to_string(t) + " is not defined yet");
    return t;
  };
  const size_t arrow = text.find("->");
  if (arrow == std::string::npos) bad("no '->' before the outputs");
  while (i < arrow) {
    size_t j = i;
    while (j < arrow && text[j] != '(' && text[j] != '[') ++j;
    const std::string name = text.substr(i, j - i);
    auto op = parse_op(name);
    if (!op || ew_arity(*op) == 0) bad("'" + name + "' is not an elementwise op");
    EwInstr in{*op, 0, {}};
    i = j;
    if (*ew_attr(*op)) {
      if (i >= arrow || text[i] != '[') bad(name + " needs its " + ew_attr(*op) + " in [...]");
      const size_t close = text.find(']', i);
      if (close == std::string::npos || close > arrow) bad("unclosed [");
      const std::string num = text.substr(i + 1, close - i - 1);
      if (*op == Op::cast) {
        const auto t = parse_dtype(num);
        if (!t || !is_float(*t)) bad("'" + num + "' is not a float dtype (f32, f64, bf16, f16)");
        in.dtype = *t;
      } else {
        const size_t comma = ew_draws(*op) ? num.find(',') : std::string::npos;
        if (ew_draws(*op) && comma == std::string::npos) bad(name + " needs [p,stream]");
        const std::string prob = num.substr(0, comma);
        char* end = nullptr;
        in.p = std::strtod(prob.c_str(), &end);
        if (prob.empty() || *end) bad("'" + prob + "' is not a number");
        if (ew_draws(*op)) {
          const std::string st = num.substr(comma + 1);
          unsigned long long v = 0;
          auto r = std::from_chars(st.data(), st.data() + st.size(), v);
          if (st.empty() || r.ec != std::errc() || r.ptr != st.data() + st.size() || v > 0xFFFFFFFFull)
            bad("'" + st + "' is not a random stream (a whole number below 2^32)");
          in.stream = static_cast<uint32_t>(v);
          if (!(in.p >= 0 && in.p < 1)) bad(name + "'s p must be in [0, 1), got " + prob);
        }
      }
      i = close + 1;
    }
    if (i >= arrow || text[i] != '(') bad("expected '('");
    ++i;
    while (true) {
      if (i < arrow && text[i] == 'i') {
        ++i;
        const int k = integer();
        in.args.push_back(k);
        p.inputs = std::max(p.inputs, k + 1);
      } else {
        in.args.push_back(-temp("or an input i<j>") - 1);
      }
      if (i < arrow && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < arrow && text[i] == ')') break;
      bad("expected ',' or ')'");
    }
    ++i;
    if (static_cast<int>(in.args.size()) != ew_arity(*op))
      bad(name + " takes " + std::to_string(ew_arity(*op)) + " operand(s), got " + std::to_string(in.args.size()));
    p.code.push_back(std::move(in));
    if (i < arrow) {
      if (text[i] != ';') bad("expected ';'");
      ++i;
    }
  }
  i = arrow + 2;
  auto input = [&](const char* what) {
    if (i >= text.size() || text[i] != 'i') bad(std::string("expected an input i<j> ") + what);
    ++i;
    const int k = integer();
    p.inputs = std::max(p.inputs, k + 1);
    return k;
  };
  auto expect = [&](char c) {
    if (i >= text.size() || text[i] != c) bad(std::string("expected '") + c + "'");
    ++i;
  };
  while (i < text.size()) {
    if (text.compare(i, 11, "layer_norm[") == 0) {
      if (p.normalizes()) bad("a second layer norm");
      i += 11;
      const size_t close = text.find(']', i);
      if (close == std::string::npos) bad("unclosed [");
      const std::string num = text.substr(i, close - i);
      char* end = nullptr;
      p.ln_eps = std::strtod(num.c_str(), &end);
      if (num.empty() || *end) bad("'" + num + "' is not a number");
      i = close + 1;
      expect('(');
      const int t = temp("to normalize");
      expect(',');
      p.ln_gamma = input("as gamma");
      expect(',');
      p.ln_beta = input("as beta");
      expect(')');
      for (EwReduce r : {EwReduce::ln_y, EwReduce::ln_mean, EwReduce::ln_rstd}) {
        p.outputs.push_back(t);
        p.reduce.push_back(r);
      }
      if (i < text.size()) expect(',');
      continue;
    }
    EwReduce r = EwReduce::none;
    for (auto [word, kind] : {std::pair{"sum(", EwReduce::sum}, std::pair{"mean(", EwReduce::mean}})
      if (text.compare(i, std::strlen(word), word) == 0) {
        r = kind;
        i += std::strlen(word);
      }
    p.outputs.push_back(temp("as an output"));
    p.reduce.push_back(r);
    if (r != EwReduce::none) {
      if (i >= text.size() || text[i] != ')') bad("expected ')'");
      ++i;
    }
    if (i < text.size()) {
      if (text[i] != ',') bad("expected ','");
      ++i;
    }
  }
  if (p.code.empty() || p.outputs.empty()) bad("a program needs an instruction and an output");
  if (p.normalizes() && p.reduces()) bad("a program ends in sums or in a layer norm, not both");
  return p;
}

const EwProgram& EwProgram::cached(const std::string& text) {
  static std::mutex mu;
  static auto* parsed = new std::map<std::string, std::unique_ptr<const EwProgram>>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = parsed->find(text);
  if (it == parsed->end()) it = parsed->emplace(text, std::make_unique<const EwProgram>(parse(text))).first;
  return *it->second;
}

std::vector<DType> EwProgram::temp_dtypes(const std::vector<DType>& in) const {
  std::vector<DType> t;
  for (const EwInstr& c : code) {
    if (c.op == Op::cast) {
      t.push_back(c.dtype);
      continue;
    }
    std::optional<DType> common;
    bool agree = true, f64 = false;
    for (int v : c.args) {
      const DType d = v >= 0 ? in.at(static_cast<size_t>(v)) : t.at(static_cast<size_t>(-v - 1));
      agree = agree && (!common || *common == d);
      common = d;
      f64 = f64 || d == DType::f64;
    }
    t.push_back(agree && common ? *common : f64 ? DType::f64 : DType::f32);
  }
  return t;
}

std::vector<DType> ew_output_dtypes(const EwProgram& p, const std::string& dtypes, DType first_input) {
  std::vector<DType> out;
  if (dtypes.empty()) {
    for (EwReduce r : p.reduce)
      out.push_back(r == EwReduce::ln_mean || r == EwReduce::ln_rstd ? compute_dtype(first_input) : first_input);
    return out;
  }
  for (size_t at = 0;;) {
    const size_t comma = std::min(dtypes.find(',', at), dtypes.size());
    const std::string name = dtypes.substr(at, comma - at);
    const auto t = parse_dtype(name);
    if (!t || !is_float(*t))
      fail("dtypes '", dtypes, "': '", name, "' is not a float dtype (f32, f64, bf16, f16)");
    out.push_back(*t);
    if (comma == dtypes.size()) break;
    at = comma + 1;
  }
  if (out.size() != p.reduce.size())
    fail("dtypes '", dtypes, "' names ", out.size(), " dtype(s) for the program's ", p.reduce.size(),
         " outputs (a layer norm counts three: y, mean, rstd)");
  return out;
}

std::string ew_dtypes_str(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType t : dtypes) {
    if (!s.empty()) s += ',';
    s += dtype_name(t);
  }
  return s;
}

EwTraffic ew_traffic(const EwProgram& p, const std::vector<TensorType>& inputs, const std::vector<int64_t>& axes,
                     const std::vector<DType>& outputs) {
  SEAM_ASSERT(!inputs.empty() && static_cast<int>(inputs.size()) >= p.inputs);
  Shape shape;
  std::vector<DType> in_dtypes;
  for (const TensorType& t : inputs) {
    shape = broadcast_shapes(shape, t.shape).value_or(shape);
    in_dtypes.push_back(t.dtype);
  }
  const std::vector<DType> temp = p.temp_dtypes(in_dtypes);
  const std::vector<DType> out = outputs.empty() ? ew_output_dtypes(p, "", inputs[0].dtype) : outputs;
  SEAM_ASSERT(out.size() == p.reduce.size());
  // Elements of the index space, of the reduced shape and of the layer norm's rows, and
  // their bytes in a dtype.
  const double full = static_cast<double>(numel(shape));
  const double reduced = static_cast<double>(numel(reduced_shape(shape, reduce_axes(axes, shape.size(), nullptr), false)));
  const double rows = shape.empty() ? 0 : full / static_cast<double>(shape.back());
  auto bytes = [](double elems, DType t) { return elems * static_cast<double>(dtype_size(t)); };
  auto in_bytes = [&](int k) { return static_cast<double>(inputs[static_cast<size_t>(k)].bytes()); };
  auto operand_bytes = [&](int v) { return v >= 0 ? in_bytes(v) : bytes(full, temp[static_cast<size_t>(-v - 1)]); };
  EwTraffic t;
  for (const TensorType& in : inputs) t.fused_bytes += static_cast<double>(in.bytes());
  for (size_t c = 0; c < p.code.size(); ++c) {
    const EwInstr& in = p.code[c];
    if (in.op == Op::cast) {
      const int v = in.args[0];
      if ((v >= 0 ? in_dtypes[static_cast<size_t>(v)] : temp[static_cast<size_t>(-v - 1)]) == in.dtype) continue;
    }
    for (int v : in.args) t.split_bytes += operand_bytes(v);
    t.split_bytes += bytes(full, temp[c]);
    ++t.split_kernels;
  }
  for (size_t j = 0; j < p.reduce.size(); ++j) {
    const double value = bytes(full, temp[static_cast<size_t>(p.outputs[j])]);
    switch (p.reduce[j]) {
      case EwReduce::none: t.fused_bytes += bytes(full, out[j]); break;
      case EwReduce::sum: case EwReduce::mean:
        t.fused_bytes += bytes(reduced, out[j]);
        t.split_bytes += value + bytes(reduced, out[j]);
        ++t.split_kernels;
        break;
      case EwReduce::ln_y:
        t.fused_bytes += bytes(full, out[j]);
        t.split_bytes += value + in_bytes(p.ln_gamma) + in_bytes(p.ln_beta) + bytes(full, out[j]) +
                         bytes(rows, out[j + 1]) + bytes(rows, out[j + 2]);
        ++t.split_kernels;
        break;
      case EwReduce::ln_mean: case EwReduce::ln_rstd: t.fused_bytes += bytes(rows, out[j]); break;
    }
  }
  return t;
}

std::string EwTraffic::str() const {
  char b[160];
  std::snprintf(b, sizeof b, "%.2fx the bytes of one kernel per op (%.1f of %.1f MB, %d kernels)",
                fused_bytes / std::max(split_bytes, 1.0), fused_bytes / 1e6, split_bytes / 1e6, split_kernels);
  return b;
}

void register_fused_elementwise(OpTable& t) {
  OpDef& d = def(t, Op::fused_elementwise);
  d.name = "fused_elementwise";
  d.inputs = {"xs..."};
  d.outputs = {"ys..."};
  d.attrs = {{"program", std::string(), true},
             {"axes", std::vector<int64_t>{}},
             {"keepdims", int64_t{0}},
             {"dtypes", std::string()}};
  d.doc = "a chain of elementwise ops evaluated per element in one kernel, intermediates never "
          "stored, outputs stored or summed over axes (made by fusion; the program names the ops); "
          "each input in its own float dtype, each output in its entry of `dtypes` (\"\": the "
          "first input's; f32 statistics of a 16-bit layer norm)";
  d.infer = [](const InferCtx& c) {
    EwProgram p = EwProgram::parse(c.attrs.s("program"));
    if (p.inputs > static_cast<int>(c.n()))
      c.fail("the program reads input i", p.inputs - 1, " of ", c.n());
    Shape shape;
    for (size_t k = 0; k < c.n(); ++k) {
      c.expect_float(k);
      auto b = broadcast_shapes(shape, c.shape(k));
      if (!b) c.fail("inputs do not broadcast together");
      shape = *b;
    }
    std::vector<DType> dtypes;
    try {
      dtypes = ew_output_dtypes(p, c.attrs.s("dtypes"), c.type(0).dtype);
    } catch (const Error& e) {
      c.fail(e.what());
    }
    // f64 is the CPU's gradient-check dtype: a group computes in double only as a whole.
    std::vector<DType> all;  // the inputs', then the outputs'
    for (size_t k = 0; k < c.n(); ++k) all.push_back(c.type(k).dtype);
    all.insert(all.end(), dtypes.begin(), dtypes.end());
    if (std::count(all.begin(), all.end(), DType::f64) > 0)
      for (size_t k = 0; k < all.size(); ++k)
        if (all[k] != DType::f64)
          c.fail("inputs differ in dtype: ", k < c.n() ? "input " : "output ", k < c.n() ? k : k - c.n(), " is ",
                 dtype_name(all[k]), " where another operand is f64 (f64 only with f64 everywhere)");
    if (!p.reduces() && (!c.attrs.ints("axes").empty() || c.attrs.i("keepdims")))
      c.fail("axes or keepdims given, but no output of the program is a sum or mean");
    const Shape reduced =
        reduced_shape(shape, reduce_axes(c.attrs.ints("axes"), shape.size(), &c), c.attrs.i("keepdims") != 0);
    Shape rows = shape;
    if (p.normalizes()) {
      if (shape.empty()) c.fail("a layer norm needs rank >= 1");
      rows.pop_back();
      const Shape dim{shape.back()};
      if (c.shape(static_cast<size_t>(p.ln_gamma)) != dim || c.shape(static_cast<size_t>(p.ln_beta)) != dim)
        c.fail("the layer norm's gamma and beta must have shape ", shape_str(dim));
    }
    std::vector<TensorType> out;
    for (size_t j = 0; j < p.reduce.size(); ++j) {
      const EwReduce r = p.reduce[j];
      const bool stat = r == EwReduce::ln_mean || r == EwReduce::ln_rstd;
      const bool full = r == EwReduce::none || r == EwReduce::ln_y;
      if (r == EwReduce::ln_y)
        for (size_t s = j + 1; s < j + 3; ++s)
          if (dtypes[s] != compute_dtype(dtypes[j]))
            c.fail("the layer norm's mean and rstd (outputs ", j + 1, " and ", j + 2, ") must be ",
                   dtype_name(compute_dtype(dtypes[j])), " for its ", dtype_name(dtypes[j]), " y, got ",
                   dtype_name(dtypes[s]));
      out.push_back({dtypes[j], full ? shape : stat ? rows : reduced});
    }
    return out;
  };
  d.flops = [](const OpCostCtx& c) {  // an op per instruction and an add per reduced element
    Shape shape;
    for (const TensorType& t : c.in) shape = broadcast_shapes(shape, t.shape).value_or(shape);
    const EwProgram& p = EwProgram::cached(c.attrs.s("program"));
    const auto sums = std::count_if(p.reduce.begin(), p.reduce.end(), summed);
    const double per = static_cast<double>(p.code.size() + static_cast<size_t>(sums)) + (p.normalizes() ? 8.0 : 0.0);
    return static_cast<double>(numel(shape)) * per;  // layer_norm counts 8 an element
  };
}

}  // namespace seam
