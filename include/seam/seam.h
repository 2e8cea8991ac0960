// Everything a program that builds and trains models with seam needs.
#pragma once
#include "seam/dtype.h"
#include "seam/error.h"
#include "seam/graph.h"
#include "seam/model.h"
#include "seam/nn.h"
#include "seam/ops.h"
#include "seam/optim.h"
#include "seam/plan.h"
