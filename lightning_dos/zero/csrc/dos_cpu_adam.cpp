// DeepSpeed's CPU Adam (its own csrc/adam/cpu_adam_impl.cpp, compiled beside this file) with the update bound
// so that it releases the GIL: a thread running it leaves the interpreter to the training loop.
// deepspeed 0.19.8 binds adam_update without a call guard, so a worker thread in CPU Adam froze the main thread.

#include <omp.h>

#include "cpu_adam.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("adam_update",
          &ds_adam_step,
          "DeepSpeed CPU Adam update, GIL released",
          pybind11::call_guard<pybind11::gil_scoped_release>());
    m.def("create_adam", &create_adam_optimizer, "DeepSpeed CPU Adam (C++)");
    m.def("destroy_adam", &destroy_adam_optimizer, "DeepSpeed CPU Adam destroy (C++)");
    m.def(
        "set_omp_threads",
        [](int threads) { omp_set_num_threads(threads); },
        "OpenMP threads of parallel regions the calling thread starts");
}
