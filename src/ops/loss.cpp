// Losses, reduced to a scalar by the mean (cross_entropy: over non-ignored rows).
#include "ops/registry.h"

namespace seam {

void register_loss(OpTable& t) {
  {
    OpDef& d = def(t, Op::cross_entropy);
    d.name = "cross_entropy";
    d.inputs = {"logits", "labels"};
    d.outputs = {"loss"};
    d.attrs = {{"ignore_index", int64_t{-100}}, {"label_smoothing", 0.0}, {"classes", int64_t{0}}};
    d.doc = "mean over rows with label != ignore_index of -log softmax(logits)[label] "
            "(label smoothing as in PyTorch); 0 if every row is ignored; in f32 for 16-bit logits; classes > 0: "
            "only the first `classes` columns are classes (the rest padding, left out, their gradient 0)";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_dtype(1, DType::i32);
      Shape rows(c.shape(0).begin(), c.shape(0).end() - (c.shape(0).empty() ? 0 : 1));
      if (c.shape(0).empty() || rows != c.shape(1))
        c.fail("labels must have the shape of logits without its last (class) dim: expected ",
               shape_str(rows), ", got ", shape_str(c.shape(1)));
      double ls = c.attrs.f("label_smoothing");
      if (ls < 0 || ls > 1) c.fail("label_smoothing must be in [0, 1], got ", ls);
      const int64_t classes = c.attrs.i("classes");
      if (classes < 0 || classes > c.shape(0).back())
        c.fail("classes must be 0 (every column) or in [1, ", c.shape(0).back(), "], got ", classes);
      return std::vector<TensorType>{{compute_dtype(c.type(0).dtype), {}}};
    };
    d.flops = [](const OpCostCtx& c) { return 4.0 * static_cast<double>(c.in[0].numel()); };
    d.grad = [](GradCtx& c) {
      c.set(0, c.g.add1(Op::cross_entropy_grad, {c.dy().id(), c.x(0).id(), c.x(1).id()}, c.attrs()));
    };
  }
  {
    OpDef& d = def(t, Op::cross_entropy_grad);
    d.name = "cross_entropy_grad";
    d.inputs = {"dy", "logits", "labels"};
    d.outputs = {"dlogits"};
    d.attrs = def(t, Op::cross_entropy).attrs;
    d.doc = "dlogits = dy * (softmax(logits) - target) / rows";
    d.infer = [](const InferCtx& c) {
      if (!c.shape(0).empty()) c.fail("dy must be a scalar");
      return std::vector<TensorType>{c.type(1)};
    };
    d.flops = [](const OpCostCtx& c) { return 4.0 * static_cast<double>(c.in[1].numel()); };
  }
  {
    OpDef& d = def(t, Op::cross_entropy_with_grad);
    d.name = "cross_entropy_with_grad";
    d.inputs = {"logits", "labels", "dy", "loss_acc?", "correct_acc?"};
    d.outputs = {"loss", "dlogits", "correct?"};
    d.attrs = def(t, Op::cross_entropy).attrs;
    d.attrs.push_back({"count_correct", int64_t{0}});
    d.attrs.push_back({"row_offset", int64_t{-1}});
    d.in_place = {1, 0};  // dlogits over the logits, when nothing reads them later
    d.doc = "cross_entropy and cross_entropy_grad in one pass over the logits (made by fusion); "
            "count_correct 1: also correct, the number of counted rows whose argmax over the classes (the "
            "first largest value; NaN never chosen unless it is the first) is the label: "
            "count_equal(argmax(logits), labels) where ignore_index is negative (fuse_losses). "
            "row_offset >= 0: the logits are a chunk, the labels' rows [row_offset, row_offset + rows) "
            "(chunk_output_layer): the mean and the gradient divide by the rows of every label that count, "
            "and loss_acc and correct_acc (the chunks' before) are added to the loss and the count";
    d.infer = [](const InferCtx& c) {
      if (!c.shape(2).empty()) c.fail("dy must be a scalar");
      const int64_t correct = c.attrs.i("count_correct");
      if (correct != 0 && correct != 1) c.fail("count_correct must be 0 or 1, got ", correct);
      const int64_t offset = c.attrs.i("row_offset");
      std::vector<TensorType> loss;
      if (offset < 0) {
        loss = op_def(Op::cross_entropy).infer(c);
      } else {
        c.expect_float(0);
        c.expect_dtype(1, DType::i32);
        if (c.shape(0).empty()) c.fail("logits need a class dim");
        const double ls = c.attrs.f("label_smoothing");
        if (ls < 0 || ls > 1) c.fail("label_smoothing must be in [0, 1], got ", ls);
        const int64_t rows = c.type(0).numel() / std::max<int64_t>(c.shape(0).back(), 1);
        if (offset + rows > c.type(1).numel())
          c.fail("a chunk of ", rows, " rows from row ", offset, " needs that many labels; there are ",
                 c.type(1).numel());
        const int64_t classes = c.attrs.i("classes");
        if (classes < 0 || classes > c.shape(0).back())
          c.fail("classes must be 0 (every column) or in [1, ", c.shape(0).back(), "], got ", classes);
        loss.push_back({compute_dtype(c.type(0).dtype), {}});
      }
      if (c.n() > 3 && (offset < 0 || c.type(3) != loss[0]))
        c.fail("loss_acc needs row_offset >= 0 and the loss's type ", loss[0].str());
      if (c.n() > 4 && (!correct || c.type(4) != TensorType{DType::i32, {}}))
        c.fail("correct_acc needs count_correct and an i32 scalar");
      std::vector<TensorType> out{loss[0], c.type(0)};
      if (correct) out.push_back({DType::i32, {}});
      return out;
    };
    d.flops = [](const OpCostCtx& c) { return 8.0 * static_cast<double>(c.in[0].numel()); };
  }
  {
    OpDef& d = def(t, Op::mse);
    d.name = "mse";
    d.inputs = {"prediction", "target"};
    d.outputs = {"loss"};
    d.doc = "mean((prediction - target)^2), in f32 for 16-bit operands";
    d.infer = [](const InferCtx& c) {
      c.expect_float(0);
      c.expect_same_dtype();
      if (c.shape(0) != c.shape(1)) c.fail("prediction and target differ in shape");
      return std::vector<TensorType>{{compute_dtype(c.type(0).dtype), {}}};
    };
    d.flops = [](const OpCostCtx& c) { return 3.0 * static_cast<double>(c.in[0].numel()); };
    d.grad = [](GradCtx& c) {
      Var dp = c.g.add1(Op::mse_grad, {c.dy().id(), c.x(0).id(), c.x(1).id()});
      c.set(0, dp);
      if (c.needs(1)) c.set(1, neg(dp));
    };
  }
  {
    OpDef& d = def(t, Op::mse_grad);
    d.name = "mse_grad";
    d.inputs = {"dy", "prediction", "target"};
    d.outputs = {"dprediction"};
    d.doc = "dprediction = dy * 2 (prediction - target) / n";
    d.infer = [](const InferCtx& c) {
      if (!c.shape(0).empty()) c.fail("dy must be a scalar");
      return std::vector<TensorType>{c.type(1)};
    };
  }
}

Var cross_entropy(Var logits, Var labels, int64_t ignore_index, double label_smoothing) {
  return logits.graph().add1(Op::cross_entropy, {logits.id(), labels.id()},
                             {{"ignore_index", ignore_index}, {"label_smoothing", label_smoothing}});
}
Var mse(Var prediction, Var target) {
  return prediction.graph().add1(Op::mse, {prediction.id(), target.id()});
}

}  // namespace seam
