#include "backend/cuda/graph_memset.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/check.h"

namespace seam::cuda {

namespace {

// height rows of width elements, rows `pitch` bytes apart: what a memset node writes.
template <class U>
__global__ void fill_rows(char* dst, U value, size_t width, size_t height, size_t pitch) {
  const size_t n = width * height, stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t row = i / width;
    reinterpret_cast<U*>(dst + row * pitch)[i - row * width] = value;
  }
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t g) {
  size_t n = 0;
  SEAM_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SEAM_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  return nodes;
}

struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

Edges edges(cudaGraphNode_t node, bool in) {
  size_t n = 0;
  auto get = in ? cudaGraphNodeGetDependencies : cudaGraphNodeGetDependentNodes;
  SEAM_CUDA_CHECK(get(node, nullptr, nullptr, &n));
  Edges e{std::vector<cudaGraphNode_t>(n), std::vector<cudaGraphEdgeData>(n)};
  if (n) SEAM_CUDA_CHECK(get(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

template <class U>
void add_fill(cudaGraphNode_t* out, cudaGraph_t g, const Edges& in, cudaMemsetParams p) {
  char* dst = static_cast<char*>(p.dst);
  U value = static_cast<U>(p.value);
  size_t width = p.width, height = p.height, pitch = p.height > 1 ? p.pitch : p.width * sizeof(U);
  void* args[] = {&dst, &value, &width, &height, &pitch};
  const size_t n = width * height;
  cudaKernelNodeParams k{};
  k.func = reinterpret_cast<void*>(&fill_rows<U>);
  k.gridDim = dim3(static_cast<unsigned>(std::clamp<size_t>((n + 255) / 256, 1, 1024)));
  k.blockDim = dim3(256);
  k.kernelParams = args;
  // Default edges in: a memset node's dependencies carry no programmatic ports.
  SEAM_CUDA_CHECK(cudaGraphAddKernelNode(out, g, in.nodes.data(), in.nodes.size(), &k));
}

}  // namespace

void memsets_as_kernels(cudaGraph_t g) {
  for (cudaGraphNode_t node : nodes_of(g)) {
    cudaGraphNodeType t;
    SEAM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams p{};
    SEAM_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
    const Edges in = edges(node, true), out = edges(node, false);
    cudaGraphNode_t k = nullptr;
    switch (p.elementSize) {
      case 1: add_fill<unsigned char>(&k, g, in, p); break;
      case 2: add_fill<unsigned short>(&k, g, in, p); break;
      default: add_fill<unsigned int>(&k, g, in, p); break;  // 4, the only other size a memset node takes
    }
    for (size_t i = 0; i < out.nodes.size(); ++i)
      SEAM_CUDA_CHECK(cudaGraphAddDependencies(g, &k, &out.nodes[i], &out.data[i], 1));
    SEAM_CUDA_CHECK(cudaGraphDestroyNode(node));
  }
}

}  // namespace seam::cuda
