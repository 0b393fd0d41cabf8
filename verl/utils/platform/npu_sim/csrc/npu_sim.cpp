// Simulated Ascend device for CPU-only CI: a real PrivateUse1 ("npu") backend whose memory is host memory.
//
// Tensors created here are ordinary at::Tensors with device npu:<i> (same TensorImpl type as any device), so
// `param.data = t`, FSDP, DTensor and torch.save/load behave as with a real accelerator. Compute ops go through a
// boxed fallback that first enforces the device rule of real hardware (all tensor arguments on one device;
// 0-dim CPU tensors allowed, CPU index tensors allowed for indexing) and then runs the CPU kernel.
// Loaded by verl/utils/platform/npu_sim/build.py; never linked into verl itself.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 16;

thread_local c10::DeviceIndex g_current = 0;
std::atomic<int> g_device_count{1};
// Hooks cannot be unregistered: after uninstall the backend stays loaded but reports itself unavailable, so
// torch.accelerator and friends see a CPU-only process again.
std::atomic<bool> g_enabled{true};
std::array<std::atomic<int64_t>, kMaxDevices> g_allocated{};
std::array<std::atomic<int64_t>, kMaxDevices> g_peak{};

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < g_device_count.load(), "Invalid device ordinal npu:", int(index),
              " (simulated Ascend has ", g_device_count.load(), " device(s))");
}

// ---- device guard -------------------------------------------------------------------------------------------

struct SimGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = c10::Device(kNpu, g_current);
    if (d.has_index()) { check_index(d.index()); g_current = d.index(); }
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kNpu, g_current); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) { check_index(d.index()); g_current = d.index(); }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) g_current = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  // One in-order stream per device (every kernel completes before it returns): "new" streams are that stream.
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuard);

// ---- allocator: host memory, device-tagged, with per-device statistics ----------------------------------------

struct Block {
  void* ptr;
  size_t nbytes;
  c10::DeviceIndex device;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  g_allocated[block->device] -= static_cast<int64_t>(block->nbytes);
  c10::free_cpu(block->ptr);
  delete block;
}

struct SimAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const auto device = g_current;
    void* ptr = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    auto* block = new Block{ptr, nbytes, device};
    const int64_t now = (g_allocated[device] += static_cast<int64_t>(nbytes));
    int64_t peak = g_peak[device].load();
    while (now > peak && !g_peak[device].compare_exchange_weak(peak, now)) {}
    return {ptr, block, &free_block, c10::Device(kNpu, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { std::memcpy(dest, src, count); }
};
SimAllocator g_allocator;
REGISTER_ALLOCATOR(kNpu, &g_allocator);

// ---- RNG: one generator per simulated device, separate from the CPU generator ---------------------------------

std::mutex g_gen_mutex;
std::array<at::Generator, kMaxDevices> g_generators;

at::Generator& device_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_gen_mutex);
  if (!g_generators[index].defined()) g_generators[index] = at::detail::createCPUGenerator(c10::default_rng_seed_val);
  return g_generators[index];
}

// ---- hooks ------------------------------------------------------------------------------------------------------

struct SimHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_enabled.load(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { check_index(d); g_current = d; }
  c10::DeviceIndex getCurrentDevice() const override { return g_current; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override { auto o = g_current; g_current = d; return o; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kNpu, g_current); }
  // Simulated device memory is host memory, so "pinned" host memory is ordinary host memory.
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool isPinnedPtr(const void*) const override { return false; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return device_generator(index < 0 ? g_current : index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // FSDP2 frees unsharded parameters with untyped_storage().resize_(0) and re-grows them before all-gather.
    c10::DeviceGuard guard(storage.device());
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new SimHooks()); }
};
RegisterHooks g_register_hooks;

// ---- host views: a CPU tensor sharing the memory of a simulated-NPU tensor ------------------------------------

at::Tensor host_view(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNpu) return t;
  auto options = t.options().device(c10::kCPU);
  if (t.numel() == 0) return at::empty(t.sizes(), options);
  c10::Storage keep = t.storage();  // keeps the memory alive as long as the view
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, options);
}

// ---- explicit kernels: factories, copies, views, storage --------------------------------------------------------

at::Tensor sim_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor sim_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor sim_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor sim_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return sim_copy_from(self, dst, false);
}

at::Tensor& sim_set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                            c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, source, offset, size, stride);
}

at::Tensor& sim_set_source(at::Tensor& self, c10::Storage source) {
  const auto elements = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return at::native::set_storage_cpu_(self, source, 0, {elements}, {});
}

at::Tensor& sim_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

const at::Tensor& sim_resize(const at::Tensor& self, c10::IntArrayRef size,
                             std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

bool sim_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  // Like torch_npu: dense CPU and dense NPU tensors may replace each other's data (`param.data = t.npu()`,
  // Module.to / offload move parameters in place); stock PyTorch only lists the in-tree devices as dense.
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().is_cpu() || t.device().type() == kNpu);
  };
  return dense(self) && dense(from);
}

// ---- the fallback: device rule first, then the CPU kernel -------------------------------------------------------

bool allows_cpu_indices(const c10::OperatorName& name) {
  // Indexing an accelerator tensor with CPU index tensors is accepted by real backends (indices are moved).
  return name.name == "aten::index" || name.name == "aten::index_put_" || name.name == "aten::index_put" ||
         name.name == "aten::_index_put_impl_";
}

struct DeviceSeen {
  std::optional<c10::Device> npu;
  std::optional<c10::Device> cpu;
};

void note_tensor(const at::Tensor& t, DeviceSeen& seen, bool cpu_ok) {
  if (!t.defined()) return;
  if (t.device().type() == kNpu) {
    if (seen.npu && *seen.npu != t.device()) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  seen.npu->str(), " and ", t.device().str(), "!");
    }
    seen.npu = t.device();
  } else if (t.device().is_cpu() && t.dim() > 0 && !cpu_ok) {
    seen.cpu = t.device();
  }
}

void check_same_device(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const auto first = stack->size() - args.size();
  const bool index_op = allows_cpu_indices(op.operator_name());
  DeviceSeen seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& iv = (*stack)[first + i];
    const bool cpu_ok = index_op && args[i].name() == "indices";
    if (iv.isTensor()) {
      note_tensor(iv.toTensor(), seen, cpu_ok);
    } else if (iv.isList()) {
      for (const auto& element : iv.toListRef()) {
        if (element.isTensor()) note_tensor(element.toTensor(), seen, cpu_ok);
      }
    }
  }
  if (seen.npu && seen.cpu) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                seen.npu->str(), " and cpu! (simulated Ascend, in ", op.schema().operator_name(), ")");
  }
}

std::optional<c10::DeviceIndex> npu_index_of(const torch::jit::Stack* stack, size_t first) {
  for (size_t i = first; i < stack->size(); ++i) {
    const auto& iv = (*stack)[i];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().type() == kNpu) {
      return iv.toTensor().device().index();
    }
  }
  return std::nullopt;
}

void use_device_generator(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Random ops on the simulated NPU draw from that device's generator, not the CPU one (as on hardware).
  const auto& args = op.schema().arguments();
  const auto first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    auto type = args[i].type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    if (type->kind() != c10::TypeKind::GeneratorType || !(*stack)[first + i].isNone()) continue;
    auto index = npu_index_of(stack, first);
    if (!index) index = g_current;
    (*stack)[first + i] = c10::IValue(device_generator(*index));
  }
}

// ---- convolution: ATen routes non-CPU/CUDA devices to the *_overrideable ops, which have no fallback ------------

void check_tensors_same_device(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  DeviceSeen seen;
  for (const auto* t : tensors) note_tensor(*t, seen, false);
  if (seen.npu && seen.cpu) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                seen.npu->str(), " and cpu! (simulated Ascend, in ", op, ")");
  }
}

at::Tensor on_host(const at::Tensor& t) { return t.defined() ? host_view(t).clone() : t; }
at::Tensor to_npu(const at::Tensor& t, c10::Device device) { return t.defined() ? t.to(device) : t; }

at::Tensor sim_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                           bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  check_tensors_same_device("aten::convolution_overrideable", {&input, &weight, &b});
  auto out = at::convolution(on_host(input), on_host(weight), b.defined() ? std::optional<at::Tensor>(on_host(b))
                                                                           : std::nullopt,
                             stride, padding, dilation, transposed, output_padding, groups);
  return out.to(input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sim_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  check_tensors_same_device("aten::convolution_backward_overrideable", {&grad_output, &input, &weight});
  const int64_t bias_size = transposed ? weight.size(1) * groups : weight.size(0);
  auto [gi, gw, gb] = at::convolution_backward(on_host(grad_output), on_host(input), on_host(weight),
                                               std::vector<int64_t>{bias_size}, stride, padding, dilation, transposed,
                                               output_padding, groups, output_mask);
  const auto device = input.device();
  return {to_npu(gi, device), to_npu(gw, device), to_npu(gb, device)};
}

// ---- kernels whose CPU version lacks dtypes the accelerator kernels accept ------------------------------------------

at::Tensor sim_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  // Accelerator histc counts integer inputs too (HF's grouped-mm MoE relies on it); the CPU kernel is float-only.
  const auto host = host_view(self);
  const auto counts = at::histc(c10::isIntegralType(self.scalar_type(), true) ? host.to(at::kFloat) : host, bins,
                                min, max);
  return counts.to(self.scalar_type()).to(self.device());
}

// ---- streams ------------------------------------------------------------------------------------------------------
//
// record_stream(t, s) tells a caching allocator not to hand t's block to another stream until the work queued on s
// so far has finished. Here every kernel has finished when it returns (there is no queued work) and freed memory goes
// straight back to the host allocator (there is no cache to reuse it from), so there is nothing to record: a no-op is
// the exact semantics, not an approximation. (torch_npu's allocator does not check the stream's device either.)
void sim_record_stream(at::Tensor& self, c10::Stream stream) {}

void sim_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_device(op, stack);
  use_device_generator(op, stack);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

// ---- simulator control ops (torch.ops.npu_sim.*) ----------------------------------------------------------------

int64_t sim_set_device_count(int64_t n) {
  TORCH_CHECK(n >= 1 && n <= kMaxDevices, "simulated Ascend: device count must be in [1, ", kMaxDevices, "]");
  g_device_count = static_cast<int>(n);
  return n;
}
int64_t sim_device_count() { return g_device_count.load(); }
int64_t sim_set_enabled(bool enabled) { g_enabled = enabled; return enabled ? 1 : 0; }
int64_t sim_current_device() { return g_current; }
int64_t sim_set_device(int64_t index) { check_index(index); g_current = static_cast<c10::DeviceIndex>(index); return index; }
int64_t sim_memory_allocated(int64_t d) { check_index(d); return g_allocated[d].load(); }
int64_t sim_max_memory_allocated(int64_t d) { check_index(d); return g_peak[d].load(); }
int64_t sim_reset_peak(int64_t d) { check_index(d); g_peak[d] = g_allocated[d].load(); return 0; }
int64_t sim_manual_seed(int64_t d, int64_t seed) {
  check_index(d);
  auto& gen = device_generator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(static_cast<uint64_t>(seed));
  return seed;
}
int64_t sim_initial_seed(int64_t d) { check_index(d); return static_cast<int64_t>(device_generator(d).current_seed()); }
at::Tensor sim_get_rng_state(int64_t d) {
  check_index(d);
  auto& gen = device_generator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
int64_t sim_set_rng_state(int64_t d, const at::Tensor& state) {
  check_index(d);
  auto& gen = device_generator(d);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return 0;
}
at::Tensor sim_host_view(const at::Tensor& t) { return host_view(t); }

}  // namespace

TORCH_LIBRARY(npu_sim, m) {
  m.def("set_device_count(int n) -> int", &sim_set_device_count);
  m.def("device_count() -> int", &sim_device_count);
  m.def("set_enabled(bool enabled) -> int", &sim_set_enabled);
  m.def("current_device() -> int", &sim_current_device);
  m.def("set_device(int index) -> int", &sim_set_device);
  m.def("memory_allocated(int device) -> int", &sim_memory_allocated);
  m.def("max_memory_allocated(int device) -> int", &sim_max_memory_allocated);
  m.def("reset_peak_memory_stats(int device) -> int", &sim_reset_peak);
  m.def("manual_seed(int device, int seed) -> int", &sim_manual_seed);
  m.def("initial_seed(int device) -> int", &sim_initial_seed);
  m.def("get_rng_state(int device) -> Tensor", &sim_get_rng_state);
  m.def("set_rng_state(int device, Tensor state) -> int", &sim_set_rng_state);
  m.def("host_view(Tensor(a) self) -> Tensor(a)");
}

TORCH_LIBRARY_IMPL(npu_sim, PrivateUse1, m) { m.impl("host_view", &sim_host_view); }
TORCH_LIBRARY_IMPL(npu_sim, CPU, m) { m.impl("host_view", &sim_host_view); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &sim_empty);
  m.impl("empty_strided", &sim_empty_strided);
  m.impl("_copy_from", &sim_copy_from);
  m.impl("_copy_from_and_resize", &sim_copy_from_and_resize);
  m.impl("set_.source_Storage_storage_offset", &sim_set_storage);
  m.impl("set_.source_Storage", &sim_set_source);
  m.impl("set_", &sim_set_empty);
  m.impl("resize_", &sim_resize);
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("convolution_overrideable", &sim_convolution);
  m.impl("histc", &sim_histc);
  m.impl("convolution_backward_overrideable", &sim_convolution_backward);
  m.impl("record_stream", &sim_record_stream);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", &sim_compatible_shallow_copy_type);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&sim_fallback>()); }
