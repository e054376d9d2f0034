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

struct DeviceGuard {
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  int previous_ = 0;
};

__device__ __forceinline__ float load_as_float(const float* src, size_t i) { return src[i]; }
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* src, size_t i) {
  return __bfloat162float(src[i]);
}
__device__ __forceinline__ float load_as_float(const __half* src, size_t i) {
  return __half2float(src[i]);
}

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

template <typename T>
void launch(float* dst, const void* src, size_t count, bool atomic, cudaStream_t stream) {
  const int threads = 256;
  const size_t wanted = (count + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 4096 ? wanted : 4096);
  if (atomic) {
    accumulate_kernel<T, true><<<blocks, threads, 0, stream>>>(dst, static_cast<const T*>(src), count);
  } else {
    accumulate_kernel<T, false><<<blocks, threads, 0, stream>>>(dst, static_cast<const T*>(src), count);
  }
  check(cudaGetLastError(), "accumulate kernel launch");
}

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
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
