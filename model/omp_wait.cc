#include "model/omp_wait.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace kvl {

void ReexecWithPassiveOpenMpWait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0) != 0) return;
  execv("/proc/self/exe", argv);
  std::perror("re-executing with OMP_WAIT_POLICY=PASSIVE (continuing without)");
}

}  // namespace kvl
