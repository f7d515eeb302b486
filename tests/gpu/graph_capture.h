// A flamia call captured once into a CUDA graph on a stream of its own, replayed on demand: the
// stream, the graph and its executable are destroyed with the object.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flamia/flamia.h"
#include "forward_harness.h"

namespace flamia::gpu_test {

class CapturedCall {
 public:
  // Captures launch(stream, &err), a callable returning the flamia_status of the launches it makes
  // on stream, and instantiates the graph when it succeeded (ok(); message() says why not).
  template <class Launch>
  explicit CapturedCall(Launch&& launch) {
    try {
      FLAMIA_CUDA_CHECK(cudaStreamCreate(&stream_));
      FLAMIA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
      status_ = launch(stream_, &err_);
      FLAMIA_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
      if (ok()) FLAMIA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    } catch (...) {
      release();
      throw;
    }
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
  ~CapturedCall() { release(); }

  bool ok() const { return status_ == FLAMIA_SUCCESS; }
  std::string message() const { return err_.message; }

  // Launches the graph `times` times back to back, then waits for the stream.
  void replay(int times = 1) {
    for (int rep = 0; rep < times; ++rep) FLAMIA_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    FLAMIA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void release() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
    exec_ = nullptr, graph_ = nullptr, stream_ = nullptr;
  }

  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  flamia_error err_{};
  flamia_status status_ = FLAMIA_SUCCESS;
};

}  // namespace flamia::gpu_test
