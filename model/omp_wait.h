// How idle OpenMP threads wait, set before LibTorch's thread pool exists.
#pragma once

namespace kvl {

// LibTorch and OpenBLAS share libgomp's thread pool. By default an idle pool
// thread spins (and calls sched_yield) for a while before it sleeps, which on
// a 2-core machine slows a 2-thread prefill several-fold against
// OMP_WAIT_POLICY=PASSIVE (measured: docs/model-runtime.md, "OpenMP wait
// policy").
// libgomp reads the variable once, when it is loaded, so it cannot be changed
// from main(): when OMP_WAIT_POLICY is unset, this sets it to PASSIVE and
// re-executes the program (/proc/self/exe, same argv and pid). An explicit
// OMP_WAIT_POLICY (e.g. ACTIVE) is respected. Call it first in main(), before
// any thread starts. Returns only if no re-execution happened (the variable
// was set, or exec failed: the program then runs with libgomp's default).
void ReexecWithPassiveOpenMpWait(char** argv);

}  // namespace kvl
