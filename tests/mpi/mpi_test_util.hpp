// Helpers the N-rank GoogleTest programs share (MPI is owned by mpi_main.cpp's environment).
#pragma once

#include <mpi.h>

namespace wd::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// The sum of every rank's failure count: all ranks agree on the verdict.
inline int failures_anywhere(int mine) {
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

}  // namespace wd::test
