"""The PyTorch twin of a seam model file, and a check of seam's first training step against it.

Twin(model) parses a model file as src/io/model_file.cpp does (a "layers" sequence, a
"nodes" graph, or a "model" such as the GPT, expanded into nodes as nn::gpt builds it;
the same defaults, names and errors) and is an nn.Module that computes
seam's forward with PyTorch's ops. Its parameters and buffers carry seam's names
("conv1.weight", "bn1.running_mean", ...): `twin.state_dict()` keys are seam's names
whenever they can be PyTorch module paths (always, unless a name has an empty part or a
part that is already an attribute of the module; then `twin.seam_names` maps the key), so
a seam checkpoint or `seam step`'s init.safetensors loads with `twin.load_seam_tensors`.
make_optimizer(twin) builds the optimizer and learning-rate schedule the file names, with
seam's formulas (src/optim/optim.cpp, src/backend/cpu/optim.cpp): weight decay only on
the parameters seam creates with decay (linear, conv2d and embedding weights; never biases
or norm parameters), warmup and cosine as Schedule::lr_at, clip_norm as clip_grad_norm_.
module_param_groups(module) applies the same decay rule to a plain torch module.

Precision: f32 is IEEE fp32 (the caller turns TF32 off), tf32 is fp32 values with TF32
matmuls and convolutions (allow_tf32), bf16 and f16 run the forward under torch.autocast
with fp32 parameters (the twin enters autocast itself), f16 with a GradScaler. Where
autocast and seam's mixed policy (src/passes/precision.h) differ, the twin follows seam:
softmax, log_softmax and the norms compute in fp32 and return their input's dtype, sums
and means of 16-bit values are fp32, an embedding reads its weight in 16 bits, and a
layer's own "precision" (f32, bf16 or f16) is honoured (autocast off or on for that node).

Dropout: dropout="torch" uses F.dropout (PyTorch's generator: what a PyTorch user runs);
"seam" draws seam's masks (Philox4x32-10 keyed by the model seed, counter (element/4,
step, the layer's index), src/common/philox.h), so the twin drops the very elements seam
drops; "off" makes dropout the identity.

check_step(seam, model) runs `seam step` (one training step on a random batch, written to
safetensors) and the same step on the twin from seam's initial tensors and batch, and
compares the loss, the logits, every gradient, the batch-norm running statistics after
the step, and seam's update (the torch optimizer, in double, from seam's own gradients,
against seam's updated parameters, in units of their last place), with a tolerance by
precision (TOLERANCE); with steps=N (`seam step --steps N`) it also follows the loss curve
of N steps on that batch (judge_curve). The twin in float64 is the reference that tells rounding apart from
a difference in what is computed: past the tolerance, a tensor still passes when seam is
no further from it than ERROR_RATIO times the twin is (deep batch-norm networks at 16 bits
are that far from exact on both sides). As a program:

    python3 bench/torch_twin.py examples/fmnist_cnn.json --seam build/seam --batch 8
    python3 bench/torch_twin.py --ops     # every op of seam's model files and its twin

exits 0 when every comparison passes, 1 when one does not, 2 on a usage error.

The modules, in the order they depend on each other: schema (seam's op table and the
model file's keys), optim (the optimizer config, schedule and decay split), parse (the
model-file reader), fused (fused_elementwise programs), ops (the forward op of every op
name), model (the Twin module), check (check_step and its judging rules), __main__ (the
command line). This file re-exports the names callers use, so `import twin` is enough.
"""
from .check import (ERROR_RATIO, TOLERANCE, CheckResult, Row, check_step, compare, judge_curve, near_ties, rel_l2,
                    run_seam_step, torch_step, ulps)
from .model import Twin
from .ops import OPS, philox_uniform
from .optim import (Optimizer, Schedule, SeamSchedule, make_optimizer, module_param_groups, param_groups,
                    split_decay, uses_f16)
from .parse import ModelFile, Node, gpt_nodes, load_model, parse_model, parse_nodes
from .fused import parse_program, run_program
from .schema import (DECAY_LAYERS, LAYERS, PRECISIONS, SCHEMAS, UNREACHABLE, ModelFileError, model_file_ops,
                     seam_ops)

__all__ = ["ERROR_RATIO", "TOLERANCE", "CheckResult", "Row", "check_step", "compare", "judge_curve", "near_ties",
           "rel_l2", "run_seam_step", "torch_step", "ulps", "Twin", "OPS", "philox_uniform", "Optimizer", "Schedule",
           "SeamSchedule", "make_optimizer", "module_param_groups", "param_groups", "split_decay", "uses_f16",
           "ModelFile", "Node", "gpt_nodes", "load_model", "parse_model", "parse_nodes", "parse_program", "run_program",
           "DECAY_LAYERS", "LAYERS", "PRECISIONS", "SCHEMAS", "UNREACHABLE", "ModelFileError", "model_file_ops",
           "seam_ops"]
