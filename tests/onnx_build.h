// Small ONNX models written node by node, for the importer's tests.
#pragma once
#include <string>
#include <vector>

#include "onnx.pb.h"
#include "seam/graph.h"

namespace seam::testing::onnx_build {

namespace P = ::onnx;

inline void add_tensor(P::GraphProto& g, const std::string& name, const Shape& shape, const std::vector<float>& v) {
  P::TensorProto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(P::TensorProto::FLOAT);
  for (int64_t d : shape) t->add_dims(d);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

inline void add_io(google::protobuf::RepeatedPtrField<P::ValueInfoProto>* list, const std::string& name, const Shape& shape,
            const std::string& symbolic = "") {
  P::ValueInfoProto* v = list->Add();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(P::TensorProto::FLOAT);
  for (size_t i = 0; i < shape.size(); ++i) {
    auto* d = tt->mutable_shape()->add_dim();
    if (i == 0 && !symbolic.empty()) d->set_dim_param(symbolic);
    else d->set_dim_value(shape[i]);
  }
}

inline P::NodeProto* add_node(P::GraphProto& g, const std::string& op, std::vector<std::string> in,
                       std::vector<std::string> out) {
  P::NodeProto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(out[0] + "_node");
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

inline void set_ints(P::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(P::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

}  // namespace seam::testing::onnx_build
