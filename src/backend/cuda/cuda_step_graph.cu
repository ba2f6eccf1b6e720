#include "backend/cuda/cuda_step_graph.cuh"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"

namespace regolith::cuda {

namespace {

// Graphs kept per stream: a decode step's pieces (about 10 for the benchmark model), for each
// sequence of kernels that decode takes (sessions at other context lengths, drafts, verifying
// steps). A full list drops its least recently used graph; one still running is freed by the
// driver when it completes (cudaGraphExecDestroy), so nothing waits for the stream.
constexpr size_t kMaxGraphs = 256;
constexpr size_t kFirstPiece = 4;
constexpr size_t kArgAlign = 16;

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

}  // namespace

StepRecorder::StepRecorder(cudaStream_t stream, bool report, bool programmatic, size_t max_piece)
    : stream_(stream),
      report_(report),
      programmatic_(programmatic),
      max_piece_(std::max<size_t>(max_piece, 1)),
      piece_size_(std::min(kFirstPiece, max_piece_)) {}

StepRecorder::~StepRecorder() {
  if (report_ && built_ + reused_ > 0)
    std::fprintf(stderr,
                 "cuda step graphs: %lld built, %lld reused; %.1f nodes and %.1f parameter updates per graph, "
                 "%.1f us of host time per graph\n",
                 static_cast<long long>(built_), static_cast<long long>(reused_),
                 static_cast<double>(nodes_) / static_cast<double>(built_ + reused_),
                 static_cast<double>(updated_) / static_cast<double>(built_ + reused_),
                 1e6 * submit_seconds_ / static_cast<double>(built_ + reused_));
  for (Graph& g : graphs_) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    if (g.graph) cudaGraphDestroy(g.graph);
  }
}

void StepRecorder::kernel(const void* func, dim3 grid, dim3 block, size_t smem, void** args, const size_t* arg_sizes,
                          size_t n_args) {
  Node n;
  n.kind = Node::Kernel;
  n.func = func, n.grid = grid, n.block = block, n.smem = smem;
  n.args_begin = static_cast<uint32_t>(pending_args_.size());
  for (size_t i = 0; i < n_args; ++i) {
    size_t at = (pending_args_.size() + kArgAlign - 1) / kArgAlign * kArgAlign;
    pending_args_.resize(at + arg_sizes[i]);
    std::memcpy(pending_args_.data() + at, args[i], arg_sizes[i]);
    n.arg_offsets.push_back(static_cast<uint32_t>(at - n.args_begin));
  }
  n.args_end = static_cast<uint32_t>(pending_args_.size());
  pending_shape_ = mix(mix(pending_shape_, Node::Kernel), reinterpret_cast<uintptr_t>(func));
  pending_.push_back(std::move(n));
  recorded();
}

void StepRecorder::memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, bool beside) {
  Node n;
  n.kind = Node::Memcpy;
  n.dst = dst, n.src = src, n.bytes = bytes, n.copy_kind = kind, n.beside = beside;
  pending_shape_ = mix(mix(mix(pending_shape_, Node::Memcpy), kind), beside);
  pending_.push_back(std::move(n));
  recorded();
}

void StepRecorder::memset(void* dst, size_t bytes) {
  Node n;
  n.kind = Node::Memset;
  n.dst = dst, n.bytes = bytes;
  pending_shape_ = mix(pending_shape_, Node::Memset);
  pending_.push_back(std::move(n));
  recorded();
}

void StepRecorder::recorded() {
  if (pending_.size() < piece_size_) return;
  launch_pending();
  ++piece_;
  piece_size_ = std::min(2 * piece_size_, max_piece_);
}

bool StepRecorder::same_shape(const std::vector<Node>& a, const std::vector<Node>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].kind != b[i].kind || a[i].func != b[i].func || a[i].copy_kind != b[i].copy_kind || a[i].beside != b[i].beside ||
        a[i].args_end - a[i].args_begin != b[i].args_end - b[i].args_begin)
      return false;
  return true;
}

bool StepRecorder::same_params(const Node& a, const uint8_t* a_args, const Node& b, const uint8_t* b_args) const {
  switch (a.kind) {
    case Node::Kernel:
      return a.grid.x == b.grid.x && a.grid.y == b.grid.y && a.grid.z == b.grid.z && a.block.x == b.block.x &&
             a.block.y == b.block.y && a.block.z == b.block.z && a.smem == b.smem &&
             std::memcmp(a_args + a.args_begin, b_args + b.args_begin, a.args_end - a.args_begin) == 0;
    case Node::Memcpy: return a.dst == b.dst && a.src == b.src && a.bytes == b.bytes;
    case Node::Memset: return a.dst == b.dst && a.bytes == b.bytes;
  }
  return false;
}

void StepRecorder::kernel_params(const Node& n, const uint8_t* args, cudaKernelNodeParams& p,
                                 std::vector<void*>& ptrs) const {
  ptrs.clear();
  for (uint32_t off : n.arg_offsets) ptrs.push_back(const_cast<uint8_t*>(args + n.args_begin + off));
  p = {};
  p.func = const_cast<void*>(n.func);
  p.gridDim = n.grid;
  p.blockDim = n.block;
  p.sharedMemBytes = static_cast<unsigned>(n.smem);
  p.kernelParams = ptrs.data();
}

namespace {

cudaMemsetParams memset_params(void* dst, size_t bytes) {
  cudaMemsetParams p = {};
  p.dst = dst;
  p.value = 0;
  p.elementSize = bytes % 4 == 0 ? 4 : 1;
  p.width = bytes / p.elementSize;
  p.height = 1;
  return p;
}

}  // namespace

void StepRecorder::build(Graph& g) {
  check(cudaGraphCreate(&g.graph, 0), "graph create");
  std::vector<void*> ptrs;
  cudaGraphNode_t prev = nullptr;
  const Node* prev_node = nullptr;
  for (const Node& n : g.nodes) {
    cudaGraphNode_t node = nullptr;
    const size_t n_deps = prev ? 1 : 0;
    switch (n.kind) {
      case Node::Kernel: {
        cudaKernelNodeParams p;
        kernel_params(n, g.args.data(), p, ptrs);
        if (programmatic_ && prev_node && prev_node->kind == Node::Kernel) {
          // The edge a launch with programmatic stream serialization gets when captured.
          check(cudaGraphAddKernelNode(&node, g.graph, nullptr, 0, &p), "graph kernel node");
          cudaGraphEdgeData edge{};
          edge.from_port = cudaGraphKernelNodePortProgrammatic;
          edge.type = cudaGraphDependencyTypeProgrammatic;
          check(cudaGraphAddDependencies(g.graph, &prev, &node, &edge, 1), "graph programmatic edge");
        } else {
          check(cudaGraphAddKernelNode(&node, g.graph, &prev, n_deps, &p), "graph kernel node");
        }
        break;
      }
      case Node::Memcpy:
        check(cudaGraphAddMemcpyNode1D(&node, g.graph, &prev, n_deps, n.dst, n.src, n.bytes, n.copy_kind),
              "graph copy node");
        break;
      case Node::Memset: {
        cudaMemsetParams p = memset_params(n.dst, n.bytes);
        check(cudaGraphAddMemsetNode(&node, g.graph, &prev, n_deps, &p), "graph fill node");
        break;
      }
    }
    g.handles.push_back(node);
    if (n.beside) continue;  // the chain goes on from the node before it
    prev = node;
    prev_node = &n;
  }
  check(cudaGraphInstantiate(&g.exec, g.graph, 0), "graph instantiation");
}

void StepRecorder::update(Graph& g) {
  std::vector<void*> ptrs;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Node& n = pending_[i];
    if (same_params(g.nodes[i], g.args.data(), n, pending_args_.data())) continue;
    ++updated_;
    switch (n.kind) {
      case Node::Kernel: {
        cudaKernelNodeParams p;
        kernel_params(n, pending_args_.data(), p, ptrs);
        check(cudaGraphExecKernelNodeSetParams(g.exec, g.handles[i], &p), "graph kernel update");
        break;
      }
      case Node::Memcpy:
        check(cudaGraphExecMemcpyNodeSetParams1D(g.exec, g.handles[i], n.dst, n.src, n.bytes, n.copy_kind),
              "graph copy update");
        break;
      case Node::Memset: {
        cudaMemsetParams p = memset_params(n.dst, n.bytes);
        check(cudaGraphExecMemsetNodeSetParams(g.exec, g.handles[i], &p), "graph fill update");
        break;
      }
    }
  }
  g.nodes.swap(pending_);
  g.args.swap(pending_args_);
}

void StepRecorder::submit() {
  if (!pending_.empty()) launch_pending();
  piece_ = 0;
  piece_size_ = std::min(kFirstPiece, max_piece_);
}

void StepRecorder::launch_pending() {
  const auto t0 = std::chrono::steady_clock::now();
  nodes_ += static_cast<int64_t>(pending_.size());
  pending_shape_ = mix(pending_shape_, piece_);
  auto it = graphs_.begin();
  while (it != graphs_.end() && !(it->shape == pending_shape_ && same_shape(it->nodes, pending_))) ++it;
  if (it != graphs_.end()) {
    graphs_.splice(graphs_.begin(), graphs_, it);
    update(graphs_.front());
    ++reused_;
  } else {
    if (graphs_.size() == kMaxGraphs) {
      cudaGraphExecDestroy(graphs_.back().exec);
      cudaGraphDestroy(graphs_.back().graph);
      graphs_.pop_back();
    }
    graphs_.emplace_front();
    Graph& g = graphs_.front();
    g.shape = pending_shape_;
    g.nodes.swap(pending_);
    g.args.swap(pending_args_);
    build(g);
    ++built_;
  }
  pending_.clear();
  pending_args_.clear();
  pending_shape_ = 0;
  check(cudaGraphLaunch(graphs_.front().exec, stream_), "graph launch");
  submit_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace regolith::cuda
