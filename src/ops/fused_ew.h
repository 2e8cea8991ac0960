// A fused elementwise group (fused_elementwise): a straight-line program over the
// elementwise ops of ops.def, evaluated per element of one output shape. Its text form is
// the op's "program" attribute, so plans print it and every backend reads the same:
//   relu(i0);mul(t0,i1);scale[0.5](t1)->t1,t2
// Instruction k defines temp t<k>; an operand is i<j> (the op's input j, broadcast to the
// output shape) or an earlier t<k>. Ops take their unfused operands in the unfused order
// (a unary gradient: dy then x or y; a binary gradient: dy, a, b) and a scalar attribute
// in [...], written so that it reads back to the same double. After "->", the temps
// written out, one output of the op each: t<k> stores the temp at every element;
// sum(t<k>) and mean(t<k>) store its sum or mean over the op's "axes" (a reduction ending
// the group, e.g. a bias gradient), at the shape sum would give with "keepdims":
//   mul(i0,i1);relu_grad(t0,i2)->t1,sum(t1)
// layer_norm[eps](t<k>,i<g>,i<b>) stores the layer norm of the temp over the last dim
// with gamma i<g> and beta i<b>: three outputs, as layer_norm's (y, mean, rstd). A
// program ends in sums or in one layer norm, not both (a residual add + layer norm):
//   add(i0,i1)->t0,layer_norm[1.0000000000000001e-05](t0,i2,i3)
// dropout and dropout_grad take their probability and random stream, [p,stream]; the
// mask of element e is the op's own (dropout_uniform(seed, step, stream, e) >= p), so a
// group draws what the op alone draws:
//   relu(i0);dropout[0.10000000000000001,7](t0)->t1
//
// Mixed precision: each input is loaded in its own dtype and every temp is computed in
// float (double when the data is f64), never rounded except by cast[<dtype>](x), which
// rounds x to that dtype (to nearest even) and goes on in float: cast[f32] is the identity
// on float data and rounds f64 data to float. Each output is stored in its own dtype (the
// op's "dtypes" attribute). The fusion pass writes the rounding of every 16-bit value of
// the unfused graph as a cast, so that fused and unfused compute the same bits:
//   cast[f32](i0);add(t0,i1);cast[bf16](t1)->t2        (dtypes=bf16: a bf16 result)
#pragma once
#include <string>
#include <vector>

#include "seam/dtype.h"
#include "seam/op.h"

namespace seam {

struct EwInstr {
  Op op;
  double p = 0;           // the op's scalar attribute (0 if it has none)
  std::vector<int> args;  // >= 0: input index; < 0: temp -(arg + 1)
  DType dtype = DType::f32;  // Op::cast: the dtype it rounds to (its attribute, a name)
  // Op::dropout and dropout_grad: the mask's random stream; p is the drop probability
  // (0 in evaluation, where the op is the identity).
  uint32_t stream = 0;
};

// Whether an instruction draws a dropout mask: it reads the element's index in the group's
// index space (the dropped tensor's own flat index, as the op alone draws it) and the
// step's seed and counter.
inline bool ew_draws(Op op) { return op == Op::dropout || op == Op::dropout_grad; }

enum class EwReduce { none, sum, mean, ln_y, ln_mean, ln_rstd };
inline bool summed(EwReduce r) { return r == EwReduce::sum || r == EwReduce::mean; }

struct EwProgram {
  std::vector<EwInstr> code;
  std::vector<int> outputs;        // temp indices
  std::vector<EwReduce> reduce;    // per output: stored as is, or summed / averaged
  int inputs = 0;            // 1 + the largest input index read
  int ln_gamma = -1, ln_beta = -1;  // a layer norm's inputs
  double ln_eps = 0;

  // Throws seam::Error naming the problem and its position in the text.
  static EwProgram parse(const std::string& text);
  // The same, parsed once per process: for what reads a program every step (the CPU
  // kernel, the cost rule). Thread-safe; the reference stays valid.
  static const EwProgram& cached(const std::string& text);
  std::string str() const;
  bool reduces() const;  // whether some output is a sum or mean
  bool draws() const;    // whether some instruction draws a dropout mask
  bool normalizes() const { return ln_gamma >= 0; }  // whether it ends in a layer norm
  // The dtype each temp would be stored in by one kernel per op, given the inputs': a
  // cast's target; another op's, its operands' dtype where they agree, else the one they
  // compute in (f32, or f64). The fusion pass's programs round every 16-bit temp by a cast
  // right after the op, so these are the dtypes of the unfused graph's values.
  std::vector<DType> temp_dtypes(const std::vector<DType>& inputs) const;
};

// The outputs' dtypes from the op's "dtypes" attribute ("bf16,f32,f32": a name per output,
// in order, a layer norm's y, mean and rstd included), or, when it is empty, the first
// input's dtype for every output except a layer norm's mean and rstd, which take the
// dtype it computes in (f32 for 16-bit data). Throws seam::Error on a bad list.
std::vector<DType> ew_output_dtypes(const EwProgram& p, const std::string& dtypes, DType first_input);
std::string ew_dtypes_str(const std::vector<DType>& dtypes);  // "bf16,f32,f32"

// The bytes a group moves as one kernel and as one kernel per op (the split: each op reads
// its operands and writes its value; a sum or mean reads the value and writes its result;
// a layer norm reads the value, gamma and beta and writes y and its statistics), counted
// from the program, its input types, the reduced axes and the outputs' dtypes (empty: as
// ew_output_dtypes gives them without a "dtypes" attribute), each operand at its own
// element size. A cast to the dtype its operand already has (the rounding the pass writes
// after a 16-bit op) is no kernel of the split.
struct EwTraffic {
  double fused_bytes = 0, split_bytes = 0;
  int split_kernels = 0;
  // "0.43x the bytes of one kernel per op (50.3 of 117.5 MB, 3 kernels)"
  std::string str() const;
};
EwTraffic ew_traffic(const EwProgram& p, const std::vector<TensorType>& inputs, const std::vector<int64_t>& axes,
                     const std::vector<DType>& outputs = {});

// Where the model decides between the generated kernel and the split without timing them:
// when the kernel moves at most half the split's bytes. Generated kernels reach 60-85% of
// the bandwidth roofline and the unfused ops' kernels 85-95% (docs/perf.md), so half the
// bytes is faster by a margin no efficiency gap closes, before counting the split's extra
// launches. Closer than that, the GPU times both.
inline bool fused_clearly_faster(const EwTraffic& t) { return 2 * t.fused_bytes <= t.split_bytes; }

// Whether an op can be part of a fused elementwise program, and how many operands it
// takes there (0 if it cannot): the ops of ops.def, their gradients, and cast.
int ew_arity(Op op);
// The op's scalar attribute name ("" if none): a number, except cast's "dtype", a dtype
// name (EwInstr::dtype).
const char* ew_attr(Op op);

}  // namespace seam
