"""The optimizer and learning-rate schedule of a model file, with seam's formulas.

The optimizer settings a model file names (Optimizer, Schedule: io::OptimizerConfig and
Schedule::lr_at of src/optim/optim.cpp), the torch optimizer that runs them
(make_optimizer, with SeamSchedule setting its learning rate), and seam's weight-decay
split (param_groups for a twin, module_param_groups for any torch module). Apart from
the model-file reader because bench/compare_torch.py builds optimizers for modules that
are no twin, and from the check because a training loop needs it without `seam step`.
"""
import dataclasses
import math

import torch

from .schema import DECAY_LAYERS


@dataclasses.dataclass
class Schedule:
    kind: str = "constant"
    warmup_steps: int = 0
    step_size: int = 1
    gamma: float = 0.1
    total_steps: int = 0
    min_lr: float = 0.0

    def lr_at(self, base, step):
        """Schedule::lr_at: the learning rate of update number `step` (0-based)."""
        if step < self.warmup_steps:
            return base * (step + 1) / self.warmup_steps
        t = step - self.warmup_steps
        if self.kind == "step":
            return base * self.gamma ** (t // max(self.step_size, 1))
        if self.kind == "cosine":
            progress = min(1.0, t / max(self.total_steps, 1))
            return self.min_lr + (base - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return base


@dataclasses.dataclass
class Optimizer:
    kind: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    schedule: Schedule = dataclasses.field(default_factory=Schedule)
    total_from_run: bool = False  # cosine without total_steps: set from the run's length


class SeamSchedule:
    """Sets the optimizer's learning rate to Schedule::lr_at(lr, step) before each update:
    step() after optimizer.step(), as a torch LR scheduler."""

    def __init__(self, opt, cfg, total_steps):
        self.opt, self.cfg, self.count = opt, cfg, 0
        self.schedule = dataclasses.replace(cfg.schedule, total_steps=total_steps)
        self._set()

    def lr(self):
        return self.schedule.lr_at(self.cfg.lr, self.count)

    def _set(self):
        for g in self.opt.param_groups:
            g["lr"] = self.lr()

    def step(self):
        self.count += 1
        self._set()


def split_decay(named_params, decays, weight_decay):
    """seam's decay split of (name, parameter) pairs: weight decay on those whose name
    decays(name) accepts, none on the rest; the decaying group first, empty groups left out."""
    decay, rest = [], []
    for n, p in named_params:
        (decay if decays(n) else rest).append(p)
    return [g for g in (dict(params=decay, weight_decay=weight_decay), dict(params=rest, weight_decay=0.0))
            if g["params"]]


def param_groups(twin, weight_decay):
    """seam's decay split of a twin's parameters: decay on the parameters created with decay."""
    return split_decay(twin.named_seam_parameters(), twin.decay_names.__contains__, weight_decay)


# The torch modules that are seam's layers, by the layer's op name (DECAY_LAYERS).
_TORCH_LAYERS = ((torch.nn.Linear, "linear"), (torch.nn.Conv2d, "conv2d"), (torch.nn.Embedding, "embedding"))


def module_decay_names(module):
    """The parameter names of a torch module that seam would decay: the weight of each
    Linear, Conv2d and Embedding, as DECAY_LAYERS says; no bias, no norm parameter."""
    names = set()
    for prefix, m in module.named_modules():
        for cls, op in _TORCH_LAYERS:
            if isinstance(m, cls) and op in DECAY_LAYERS and m.weight is not None:
                names.add(f"{prefix}.weight" if prefix else "weight")
    return names


def module_param_groups(module, weight_decay):
    """seam's decay split of a plain torch module's parameters (a torchvision model, say), so
    that its optimizer is the one seam and the twin run."""
    return split_decay(module.named_parameters(), module_decay_names(module).__contains__, weight_decay)


def make_optimizer(twin, steps_per_epoch=None, groups=None, **kwargs):
    """(optimizer, schedule) as the model file names them. kwargs go to the torch optimizer
    (fused=True, foreach=True, capturable=True: SGD has no capturable and drops it).
    steps_per_epoch sets a cosine schedule's length when the file leaves it out (seam step
    and seam bench: 60000 // batch)."""
    m = twin.model_file
    c = m.optimizer
    if groups is None:
        groups = param_groups(twin, c.weight_decay)
    spe = steps_per_epoch or max(1, 60000 // m.batch_size)
    lr0 = c.schedule.lr_at(c.lr, 0)
    if c.kind == "sgd":
        kwargs.pop("capturable", None)
        opt = torch.optim.SGD(groups, lr=lr0, momentum=c.momentum, dampening=c.dampening, nesterov=c.nesterov,
                              **kwargs)
    else:
        cls = torch.optim.Adam if c.kind == "adam" else torch.optim.AdamW
        opt = cls(groups, lr=lr0, betas=c.betas, eps=c.eps, **kwargs)
    return opt, SeamSchedule(opt, c, m.total_steps(spe))


def uses_f16(twin):
    """Whether the step runs with a loss scale (a GradScaler): f16 anywhere in the model."""
    return twin.precision == "f16" or any(n.precision == "f16" for n in twin.nodes)

