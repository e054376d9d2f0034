#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "cuda_transport.h"

namespace odc_cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("odc cuda: ") + what + " failed: " +
                             cudaGetErrorString(status));
}

// Sets `device` for the scope and restores the previous one only when it changed, so a
// thread whose current device already is `device` never touches another GPU (a fresh
// thread's default device 0 would otherwise get a context when restored).
struct DeviceGuard {
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  int previous_ = 0;
  bool changed_ = false;
};

__device__ __forceinline__ float load_as_float(const float* src, size_t i) { return src[i]; }
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* src, size_t i) {
  return __bfloat162float(src[i]);
}
__device__ __forceinline__ float load_as_float(const __half* src, size_t i) {
  return __half2float(src[i]);
}

// Four consecutive source values as fp32 (one 16-byte load for fp32, one 8-byte load of
// two bf16x2 / half2 pairs otherwise); src + 4 * i must be aligned to 4 * sizeof(T).
__device__ __forceinline__ float4 load4(const float* src, size_t i) {
  return reinterpret_cast<const float4*>(src)[i];
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* src, size_t i) {
  const uint2 raw = reinterpret_cast<const uint2*>(src)[i];
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load4(const __half* src, size_t i) {
  const uint2 raw = reinterpret_cast<const uint2*>(src)[i];
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

template <bool kAtomic>
__device__ __forceinline__ void add4(float4* dst, float4 value) {
  if (kAtomic) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(dst, value);  // one 128-bit atomic (sm_90+)
#else
    float* d = reinterpret_cast<float*>(dst);
    atomicAdd(d, value.x);
    atomicAdd(d + 1, value.y);
    atomicAdd(d + 2, value.z);
    atomicAdd(d + 3, value.w);
#endif
  } else {
    float4 out = *dst;
    out.x += value.x;
    out.y += value.y;
    out.z += value.z;
    out.w += value.w;
    *dst = out;
  }
}

// Scalar: dst[i] += src[i] for i < count (heads, tails and misaligned pairs).
template <typename T, bool kAtomic>
__global__ void accumulate_kernel(float* dst, const T* src, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float value = load_as_float(src, i);
    if (kAtomic) {
      atomicAdd(dst + i, value);
    } else {
      dst[i] += value;
    }
  }
}

// Vectorised: groups of four (dst 16-byte aligned, src aligned to 4 * sizeof(T)).
template <typename T, bool kAtomic>
__global__ void accumulate_vec4_kernel(float* dst, const T* src, size_t groups) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  float4* out = reinterpret_cast<float4*>(dst);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += stride) {
    add4<kAtomic>(out + i, load4(src, i));
  }
}

int grid_for(size_t work, int threads) {
  const size_t wanted = (work + threads - 1) / threads;
  return static_cast<int>(wanted < 4096 ? (wanted ? wanted : 1) : 4096);
}

template <typename T, bool kAtomic>
void launch_scalar(float* dst, const T* src, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  accumulate_kernel<T, kAtomic><<<grid_for(count, 256), 256, 0, stream>>>(dst, src, count);
}

// Splits [0, count) into a scalar head up to dst's first 16-byte boundary, a float4 body
// (when src is then aligned to 4 elements too) and a scalar tail.
template <typename T, bool kAtomic>
void launch_typed(float* dst, const T* src, size_t count, cudaStream_t stream) {
  const uintptr_t dst_address = reinterpret_cast<uintptr_t>(dst);
  size_t head = (dst_address % 16 == 0) ? 0 : (16 - dst_address % 16) / sizeof(float);
  if (dst_address % sizeof(float) != 0 || head >= count) {
    launch_scalar<T, kAtomic>(dst, src, count, stream);
    check(cudaGetLastError(), "accumulate kernel launch");
    return;
  }
  const uintptr_t src_body = reinterpret_cast<uintptr_t>(src + head);
  if (src_body % (4 * sizeof(T)) != 0) {
    launch_scalar<T, kAtomic>(dst, src, count, stream);
    check(cudaGetLastError(), "accumulate kernel launch");
    return;
  }
  const size_t groups = (count - head) / 4;
  const size_t tail_start = head + 4 * groups;
  launch_scalar<T, kAtomic>(dst, src, head, stream);
  if (groups) {
    accumulate_vec4_kernel<T, kAtomic><<<grid_for(groups, 256), 256, 0, stream>>>(
        dst + head, src + head, groups);
  }
  launch_scalar<T, kAtomic>(dst + tail_start, src + tail_start, count - tail_start, stream);
  check(cudaGetLastError(), "accumulate kernel launch");
}

template <typename T>
void launch(float* dst, const void* src, size_t count, bool atomic, cudaStream_t stream) {
  const T* typed = static_cast<const T*>(src);
  if (atomic) {
    launch_typed<T, true>(dst, typed, count, stream);
  } else {
    launch_typed<T, false>(dst, typed, count, stream);
  }
}

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string pci_bus_id(int device) {
  char id[32] = {0};
  check(cudaDeviceGetPCIBusId(id, sizeof(id), device), "cudaDeviceGetPCIBusId");
  return std::string(id);
}

int device_by_pci_bus_id(const std::string& bus_id) {
  int device = -1;
  if (cudaDeviceGetByPCIBusId(&device, bus_id.c_str()) != cudaSuccess) {
    cudaGetLastError();  // not visible in this process: clear the (non-sticky) error
    return -1;
  }
  return device;
}

bool native_peer_atomics(int device, int peer_device) {
  if (peer_device < 0) return false;
  if (peer_device == device) return true;  // the same GPU (two processes sharing it)
  int value = 0;
  check(cudaDeviceGetP2PAttribute(&value, cudaDevP2PAttrNativeAtomicSupported, device,
                                  peer_device),
        "cudaDeviceGetP2PAttribute(NativeAtomicSupported)");
  return value != 0;
}

uintptr_t malloc_device(size_t nbytes, int device) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, nbytes ? nbytes : 1), "cudaMalloc");
  return reinterpret_cast<uintptr_t>(ptr);
}

void free_device(uintptr_t ptr, int device) {
  DeviceGuard guard(device);
  check(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree");
}

std::string ipc_handle(uintptr_t ptr, int device) {
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  check(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)), "cudaIpcGetMemHandle");
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

uintptr_t ipc_open(const std::string& bytes, int device) {
  if (bytes.size() != sizeof(cudaIpcMemHandle_t))
    throw std::invalid_argument("odc cuda: IPC handle has the wrong size");
  DeviceGuard guard(device);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, bytes.data(), sizeof(handle));
  void* ptr = nullptr;
  check(cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return reinterpret_cast<uintptr_t>(ptr);
}

void ipc_close(uintptr_t ptr, int device) {
  DeviceGuard guard(device);
  check(cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)), "cudaIpcCloseMemHandle");
}

uintptr_t stream_create(int device) {
  DeviceGuard guard(device);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return reinterpret_cast<uintptr_t>(stream);
}

void stream_destroy(uintptr_t stream, int device) {
  DeviceGuard guard(device);
  check(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
}

uintptr_t event_create(int device) {
  DeviceGuard guard(device);
  cudaEvent_t event;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  return reinterpret_cast<uintptr_t>(event);
}

void event_destroy(uintptr_t event, int device) {
  DeviceGuard guard(device);
  check(cudaEventDestroy(reinterpret_cast<cudaEvent_t>(event)), "cudaEventDestroy");
}

void event_record(uintptr_t event, uintptr_t stream, int device) {
  DeviceGuard guard(device);
  check(cudaEventRecord(reinterpret_cast<cudaEvent_t>(event), reinterpret_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

void stream_wait_event(uintptr_t stream, uintptr_t event, int device) {
  DeviceGuard guard(device);
  check(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream),
                            reinterpret_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

bool event_wait(uintptr_t event, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const cudaError_t status = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) check(status, "cudaEventQuery");
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void copy_async(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes,
                        cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

void accumulate_async(uintptr_t dst, uintptr_t src, int dtype, size_t count, bool atomic,
                      uintptr_t stream, int device) {
  if (count == 0) return;
  DeviceGuard guard(device);
  float* out = reinterpret_cast<float*>(dst);
  const void* in = reinterpret_cast<const void*>(src);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: launch<float>(out, in, count, atomic, s); break;
    case 1: launch<__nv_bfloat16>(out, in, count, atomic, s); break;
    case 2: launch<__half>(out, in, count, atomic, s); break;
    default: throw std::invalid_argument("odc cuda: unsupported dtype code");
  }
}

}  // namespace odc_cuda
