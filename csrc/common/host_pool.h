// A persistent pool of host threads for short, memory-bound parallel work that any thread may start
// (torch-free).
//
// Why not at::parallel_for: PyTorch's wheels run it on OpenMP, where every thread that opens a
// parallel region gets a team of its own, and once the teams hold more threads than there are
// CPUs libgomp throttles its spin-wait to ~100 spins: each region then wakes its workers from
// sleep. A 6 MB frame copy from a FrameStream's staging thread took 2.5x as long as from the main
// thread for that reason (benchmarks/tuning/LOG.md, "Video"). These workers spin for a short while
// after each job (kHostPoolSpin), then sleep; a stream of copies finds them awake.
#pragma once

#include <functional>

namespace opforge {

// Runs fn(i) for every i in [0, parts) on up to `threads` threads (the caller's included) and
// returns when all have run. fn must not throw. One job runs at a time (concurrent callers wait
// their turn); a call from inside a job, or with parts or threads of 1, runs on the caller alone.
// Safe after fork(): a child process starts a pool of its own.
void host_parallel(int parts, int threads, const std::function<void(int)>& fn);

// Threads the pool can run at most (its workers and the caller): the CPUs there are.
int host_pool_max_threads();

}  // namespace opforge
