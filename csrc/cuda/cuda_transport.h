// CUDA backend of the ODC transport: plain C++ declarations so the pybind11 side is
// compiled by the host compiler and only cuda_transport.cu goes through nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace odc_cuda {

// Every function throws std::runtime_error naming the CUDA call that failed; `device` is
// the CUDA ordinal the call runs on (the caller's current device is restored afterwards).

// Number of visible devices; 0 when there is no driver or no device.
int device_count();
// PCI bus id ("0000:3b:00.0") of a device: names one GPU across processes, whatever
// CUDA_VISIBLE_DEVICES each of them has.
std::string pci_bus_id(int device);
// This process's ordinal of the GPU with that bus id, or -1 when it is not visible here.
int device_by_pci_bus_id(const std::string& bus_id);
// Whether float atomics issued on `device` into memory of `peer_device` are native over
// the link between them (cudaDevP2PAttrNativeAtomicSupported; NVLink yes, PCIe no). True
// for the same device, false for peer_device < 0 (not visible).
bool native_peer_atomics(int device, int peer_device);

// cudaMalloc of nbytes (at least 1) on device; freed by free_device.
uintptr_t malloc_device(size_t nbytes, int device);
void free_device(uintptr_t ptr, int device);
// 64-byte cudaIpcMemHandle_t of an allocation made by malloc_device.
std::string ipc_handle(uintptr_t ptr, int device);
// Maps a peer process's allocation (lazy peer access); the pointer is valid until ipc_close.
// A process cannot open its own handles.
uintptr_t ipc_open(const std::string& handle, int device);
void ipc_close(uintptr_t ptr, int device);

// A non-blocking stream (no implicit sync with the legacy default stream).
uintptr_t stream_create(int device);
void stream_destroy(uintptr_t stream, int device);
// Events without timing; record/wait follow CUDA's usual ordering rules.
uintptr_t event_create(int device);
void event_destroy(uintptr_t event, int device);
void event_record(uintptr_t event, uintptr_t stream, int device);
void stream_wait_event(uintptr_t stream, uintptr_t event, int device);
// Polls until the event completed; false if timeout_s passed first (never blocks longer).
bool event_wait(uintptr_t event, double timeout_s);

// Asynchronous device-to-device copy on stream (either side may be an IPC mapping);
// nbytes == 0 is a no-op.
void copy_async(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream, int device);
// fp32 dst += src (dtype code 0 fp32, 1 bf16, 2 fp16) on stream; atomic when several ranks
// may add into the same memory at once (only where native_peer_atomics holds for remote
// dst); count == 0 is a no-op. Vectorised: four values per thread (float4 stores, 128-bit
// atomics on sm_90+) between a scalar head and tail, scalar when src and dst are not
// co-aligned.
void accumulate_async(uintptr_t dst, uintptr_t src, int dtype, size_t count, bool atomic,
                      uintptr_t stream, int device);

}  // namespace odc_cuda
