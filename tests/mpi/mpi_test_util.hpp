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

}  // namespace wd::test
