// Step graphs: the work queued on a stream between two host waits (for decode, one token's forward
// pass, from one logits read to the next) is recorded instead of launched (cuda_launch.cuh: the
// recorder is attached to its stream with set_hooks) and sent as CUDA graphs, in pieces while it
// is still being recorded: the first piece after 4 nodes, then pieces twice as long up to
// max_piece nodes, so that the device starts early and the host records ahead of it (a whole step
// recorded before its graph started ran slower than the stream). A graph is built and
// instantiated once per sequence of nodes (the kernels, copies and fills in order) at a place in
// the step; the next step with the same sequence there reuses it, setting new parameters only on
// the nodes whose arguments changed (the cache offsets of the position, say), so a decode step
// costs the host a list of small records and the device few launch gaps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

namespace regolith::cuda {

class StepRecorder {
 public:
  // report: print the counters below on stderr when destroyed (REGOLITH_CUDA_PROFILE=1).
  // programmatic: a kernel that follows a kernel depends on it through a programmatic edge (the
  // graph form of programmatic dependent launch, cuda_launch.cuh), so it is scheduled while its
  // predecessor still runs. max_piece: the longest piece, in nodes (at least 1).
  StepRecorder(cudaStream_t stream, bool report, bool programmatic, size_t max_piece);
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void kernel(const void* func, dim3 grid, dim3 block, size_t smem, void** args, const size_t* arg_sizes,
              size_t n_args);
  // beside: the copy follows the node before it, but the next node does not wait for the copy
  // (only the graph's end does): a product's first rows go to the host while the rest is formed.
  void memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, bool beside = false);
  void memset(void* dst, size_t bytes);

  // Sends what is recorded and not yet sent (nothing when nothing is); the next node begins a new
  // step.
  void submit();
  // Sends the rest of this step as one graph at submit(), for a step issued while the device still
  // runs the one before (a queued step): it cannot start early, and pieces would only add launch
  // gaps between them.
  void whole_step() { piece_size_ = SIZE_MAX; }

 private:
  struct Node {
    enum Kind : uint8_t { Kernel, Memcpy, Memset } kind = Kernel;
    const void* func = nullptr;  // kernel
    dim3 grid, block;
    size_t smem = 0;
    uint32_t args_begin = 0, args_end = 0;  // bytes in the step's argument arena
    std::vector<uint32_t> arg_offsets;      // where each argument starts, relative to args_begin
    void* dst = nullptr;                    // memcpy, memset
    const void* src = nullptr;
    size_t bytes = 0;
    cudaMemcpyKind copy_kind = cudaMemcpyDefault;
    bool beside = false;  // memcpy
  };
  struct Graph {
    std::vector<Node> nodes;
    std::vector<uint8_t> args;  // argument bytes of the parameters the graph now holds
    std::vector<cudaGraphNode_t> handles;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    uint64_t shape = 0;
  };

  static bool same_shape(const std::vector<Node>& a, const std::vector<Node>& b);
  bool same_params(const Node& a, const uint8_t* a_args, const Node& b, const uint8_t* b_args) const;
  void build(Graph& g);
  void update(Graph& g);
  void kernel_params(const Node& n, const uint8_t* args, cudaKernelNodeParams& p, std::vector<void*>& ptrs) const;
  void recorded();  // after each node: sends a full piece
  void launch_pending();

  cudaStream_t stream_;
  std::vector<Node> pending_;
  std::vector<uint8_t> pending_args_;
  uint64_t pending_shape_ = 0;
  std::list<Graph> graphs_;  // most recently used first
  bool report_, programmatic_;
  size_t max_piece_, piece_size_;  // piece_size_: the length at which the current piece is sent
  uint64_t piece_ = 0;             // the current piece's place in the step
  // Graphs built, graph launches that reused one, nodes launched and nodes whose parameters had to
  // be set, host seconds in launch_pending().
  int64_t built_ = 0, reused_ = 0, nodes_ = 0, updated_ = 0;
  double submit_seconds_ = 0;
};

}  // namespace regolith::cuda
