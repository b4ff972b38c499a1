// Intra-op threads of this process: LibTorch's pool and, where the active libblas.so.3 is
// OpenBLAS, OpenBLAS's own pool, which torch::set_num_threads does not reach.
#pragma once

#include <string>

namespace wd {

/// Sets LibTorch's intra-op threads and OpenBLAS's threads (when OpenBLAS is loaded) to `n`.
/// Debian's LibTorch runs fp32 matmuls in libblas.so.3; without this, OpenBLAS keeps the pool
/// size OPENBLAS_NUM_THREADS gave it, or every core of the host when that is unset, and ranks
/// sharing a node's cores oversubscribe it.
void set_intra_op_threads(int n);

/// Sets both pools to `n` for its lifetime and gives back what they were (a timing that must
/// run as a rank of the job would, inside a process that keeps other settings).
class ScopedIntraOpThreads {
 public:
  explicit ScopedIntraOpThreads(int n);
  ~ScopedIntraOpThreads();
  ScopedIntraOpThreads(const ScopedIntraOpThreads&) = delete;
  ScopedIntraOpThreads& operator=(const ScopedIntraOpThreads&) = delete;

 private:
  int torch_before_;
  int blas_before_;
};

/// OpenBLAS's thread count, or 0 when the active BLAS is not OpenBLAS.
int openblas_threads();

/// OpenBLAS's build line ("OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen MAX_THREADS=64"), or a note
/// that the active libblas.so.3 is not OpenBLAS: for benchmark headers.
std::string blas_config();

/// "OpenBLAS 2 thread(s)" or "" when OpenBLAS is not loaded: for log lines.
std::string describe_blas_threads();

}  // namespace wd
