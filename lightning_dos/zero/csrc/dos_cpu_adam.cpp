// The host lane's CPU Adam: DeepSpeed's kernel (its own csrc/adam/cpu_adam_impl.cpp, included below),
// bound so that it releases the GIL and so that it can apply the step's gradient factor (unscale and clip) as it
// reads the gradient.
//
// - deepspeed 0.19.8 binds adam_update without a call guard, so a worker thread in CPU Adam froze the main thread.
// - Vanilla ZeRO-3 multiplies the host gradient by the factor in a pass of its own (unscale_and_clip_grads), then
//   runs CPU Adam: two passes over the gradient in host memory. Here each thread scales a tile of the gradient
//   into a small buffer of its own (it stays in cache) and runs DeepSpeed's kernel on that tile. The values are
//   the same bit for bit: the product is one fp32 multiply either way, and tiles start at multiples of the
//   kernel's widest step, so every element takes the same vector or scalar path as in one call over the tensor.
//   The host gradient itself is left unscaled.
// - A host gradient kept in its 16-bit dtype (bf16 or fp16: the dtype the backward produced) is widened in the same
//   tile as it is read, exactly (every 16-bit value is an fp32 value): the values vanilla's fp32 host gradient holds.

#include <omp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu_adam.h"
// the kernel's templates are defined there: included, so that this file instantiates the ones it calls
#include "cpu_adam_impl.cpp"

namespace {

// Elements per tile: a multiple of the kernel's widest step (8 x SIMD_WIDTH); 64 KB of fp32 per thread.
constexpr size_t kTile = 16384;
static_assert(kTile % (8 * 16) == 0, "tiles must start where the whole-tensor kernel's vector steps start");

std::unordered_map<int, std::shared_ptr<Adam_Optimizer>> optimizers;

std::shared_ptr<Adam_Optimizer> find(int id)
{
    auto it = optimizers.find(id);
    if (it == optimizers.end()) throw std::runtime_error("no CPU Adam instance " + std::to_string(id));
    return it->second;
}

void check(const torch::Tensor& t, const char* name, int64_t numel)
{
    if (t.device().type() != torch::kCPU || t.scalar_type() != torch::kFloat32 || !t.is_contiguous() ||
        t.numel() != numel)
        throw std::runtime_error(std::string(name) +
                                 " must be a contiguous fp32 host tensor of the master's size");
}

void check_grads(const torch::Tensor& t, int64_t numel)
{
    const auto type = t.scalar_type();
    if (t.device().type() != torch::kCPU || !t.is_contiguous() || t.numel() != numel ||
        (type != torch::kFloat32 && type != torch::kBFloat16 && type != torch::kHalf))
        throw std::runtime_error("grads must be a contiguous fp32, bf16 or fp16 host tensor of the master's size");
}

// Step_8 over the tensor a tile at a time, each thread reading its tile of the gradient into its own fp32 buffer:
// widened from T and multiplied by grad_scale.
template <typename T>
void step_tiles(Adam_Optimizer* opt, float* p, const T* g, float* m, float* v, size_t size, float grad_scale)
{
    const int64_t tiles = static_cast<int64_t>((size + kTile - 1) / kTile);
#pragma omp parallel
    {
        std::vector<float> scaled(kTile);
        float* s = scaled.data();
#pragma omp for schedule(static)
        for (int64_t k = 0; k < tiles; ++k) {
            const size_t begin = static_cast<size_t>(k) * kTile;
            const size_t len = std::min(kTile, size - begin);
            const T* src = g + begin;
            for (size_t i = 0; i < len; ++i) s[i] = static_cast<float>(src[i]) * grad_scale;
            opt->Step_8(p + begin, s, m + begin, v + begin, len, false);
        }
    }
}

}  // namespace

int dos_create_adam(int id, float lr, float beta1, float beta2, float eps, float weight_decay, bool adamw)
{
    optimizers[id] = std::make_shared<Adam_Optimizer>(lr, beta1, beta2, eps, weight_decay, adamw);
    return 0;
}

int dos_destroy_adam(int id)
{
    optimizers.erase(id);
    return 0;
}

// DeepSpeed's ds_adam_step for one fp32 tensor, with the gradient (fp32, bf16 or fp16) widened and multiplied by
// grad_scale as it is read.
int dos_adam_step(int id,
                  size_t step,
                  float lr,
                  float beta1,
                  float beta2,
                  float eps,
                  float weight_decay,
                  bool bias_correction,
                  torch::Tensor& params,
                  torch::Tensor& grads,
                  torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq,
                  float grad_scale)
{
    const int64_t n = params.numel();
    check(params, "params", n);
    check_grads(grads, n);
    check(exp_avg, "exp_avg", n);
    check(exp_avg_sq, "exp_avg_sq", n);
    auto opt = find(id);
    opt->IncrementStep(step, beta1, beta2);
    opt->update_state(lr, eps, weight_decay, bias_correction);
    float* p = params.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    const size_t size = static_cast<size_t>(n);
    switch (grads.scalar_type()) {
        case torch::kBFloat16:
            step_tiles(opt.get(), p, grads.data_ptr<at::BFloat16>(), m, v, size, grad_scale);
            break;
        case torch::kHalf: step_tiles(opt.get(), p, grads.data_ptr<at::Half>(), m, v, size, grad_scale); break;
        default:
            if (grad_scale == 1.0f) {  // x * 1 == x: DeepSpeed's call as it is
                opt->Step_8(p, grads.data_ptr<float>(), m, v, size, true);
            } else {
                step_tiles(opt.get(), p, grads.data_ptr<float>(), m, v, size, grad_scale);
            }
    }
    return 0;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("adam_step",
          &dos_adam_step,
          "DeepSpeed's CPU Adam on one fp32 tensor, gradient widened and scaled as read, GIL released",
          pybind11::call_guard<pybind11::gil_scoped_release>());
    m.def("create_adam", &dos_create_adam, "a CPU Adam instance (DeepSpeed's C++ class)");
    m.def("destroy_adam", &dos_destroy_adam, "free a CPU Adam instance");
    m.def(
        "set_omp_threads",
        [](int threads) { omp_set_num_threads(threads); },
        "OpenMP threads of parallel regions the calling thread starts");
}
