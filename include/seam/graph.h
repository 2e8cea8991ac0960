// The IR: a graph of nodes (ops) over typed, statically shaped values. A graph is built
// in topological order: a node can only use values that exist, so node order is a valid
// execution order and no cycle can form. Shapes are inferred and checked when a node is
// added; a mismatch throws seam::Error naming the op, the node and its operands.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "seam/attrs.h"
#include "seam/dtype.h"
#include "seam/op.h"

namespace seam {

using ValueId = int32_t;

// input: fed each step (a batch); param: trained, lives in the flat parameter buffer;
// state: persistent but not trained (batch-norm running statistics); intermediate:
// produced by a node, lives in the arena.
enum class ValueKind : uint8_t { intermediate, input, param, state };

// How a parameter or state tensor is initialized. fan_in-scaled kinds match PyTorch's
// defaults for Linear and Conv2d (kaiming_uniform with a = sqrt(5)).
struct Init {
  enum class Kind : uint8_t { zeros, ones, constant, uniform, normal } kind = Kind::zeros;
  double a = 0, b = 0;  // constant: a; uniform: [a, b); normal: mean a, stddev b

  static Init zeros() { return {}; }
  static Init ones() { return {Kind::ones}; }
  static Init constant(double v) { return {Kind::constant, v}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  static Init normal(double mean, double stddev) { return {Kind::normal, mean, stddev}; }
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's Linear/Conv2d weight and bias default.
  static Init fan_in_uniform(int64_t fan_in);
  std::string str() const;
};

struct Value {
  TensorType type;
  std::string name;
  ValueKind kind = ValueKind::intermediate;
  int node = -1;       // producing node, -1 for inputs, params and states
  int out_index = 0;   // which output of that node
  Init init;           // params and states
  bool decay = true;   // params: weight decay applies
};

struct Node {
  Op op;
  std::vector<ValueId> in, out;
  Attrs attrs;
  std::string name;
};

class Graph;

// A handle to a value of a graph, used by the builder functions in seam/ops.h.
class Var {
 public:
  Var() = default;
  Var(Graph* g, ValueId id) : g_(g), id_(id) {}
  Graph& graph() const { return *g_; }
  ValueId id() const { return id_; }
  bool valid() const { return g_ != nullptr; }
  // By value: adding nodes may move the graph's storage, so references would dangle.
  TensorType type() const;
  Shape shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int64_t dim(int64_t axis) const;  // negative counts from the end
  size_t rank() const { return type().shape.size(); }
  std::string name() const;

 private:
  Graph* g_ = nullptr;
  ValueId id_ = -1;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = default;
  Graph& operator=(const Graph&) = default;

  Var input(const std::string& name, Shape shape, DType dtype = DType::f32);
  Var param(const std::string& name, Shape shape, Init init, bool decay = true,
            DType dtype = DType::f32);
  Var state(const std::string& name, Shape shape, Init init, DType dtype = DType::f32);

  // Adds a node: fills default attributes, rejects unknown ones, infers and checks the
  // output types. Returns the output values.
  std::vector<ValueId> add(Op op, const std::vector<ValueId>& inputs, Attrs attrs = {});
  // The same with the node's name given (it must be new to the graph); used by passes
  // that rebuild a graph and keep its names.
  std::vector<ValueId> add_named(Op op, const std::vector<ValueId>& inputs, Attrs attrs, const std::string& name);
  // The same with every output's name given (the node takes the first): a fused node
  // keeps the names of the values it stands for.
  std::vector<ValueId> add_named(Op op, const std::vector<ValueId>& inputs, Attrs attrs,
                                 const std::vector<std::string>& out_names);
  Var add1(Op op, const std::vector<ValueId>& inputs, Attrs attrs = {}) {
    return Var(this, add(op, inputs, std::move(attrs)).at(0));
  }

  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values_.at(static_cast<size_t>(id)); }
  const Node& node(int index) const { return nodes_.at(static_cast<size_t>(index)); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& params() const { return params_; }
  const std::vector<ValueId>& states() const { return states_; }
  Var var(ValueId id) { return Var(this, id); }

  // Changes one attribute of an existing node (it must be in the op's schema and keep
  // its type); used by passes such as switching dropout and batch norm to evaluation.
  void set_attr(int node, const std::string& name, AttrValue value);

  std::optional<ValueId> find(const std::string& name) const;
  // "'fc1/relu' f32[128,256]": how errors name a value.
  std::string describe(ValueId id) const;
  // Rechecks every node (types, attributes, operand order); throws seam::Error.
  void verify() const;

  // Names of nodes created while a scope is alive are prefixed with "prefix/".
  class Scope {
   public:
    Scope(Graph& g, const std::string& prefix);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Graph& g_;
  };
  Scope scope(const std::string& prefix) { return Scope(*this, prefix); }

 private:
  ValueId new_leaf(const std::string& name, TensorType type, ValueKind kind);
  std::vector<ValueId> add_impl(Op op, const std::vector<ValueId>& inputs, Attrs attrs, std::string name,
                                const std::vector<std::string>* out_names = nullptr);
  std::string unique_name(const std::string& base);

  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_, params_, states_;
  std::map<std::string, ValueId, std::less<>> by_name_;
  std::map<std::string, int, std::less<>> name_counts_;
  std::vector<std::string> scopes_;
};

}  // namespace seam
