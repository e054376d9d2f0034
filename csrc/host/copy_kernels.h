// Single-threaded byte copy and fp32 accumulate kernels of the host backend.
//
// Contract of every function here: the ranges do not overlap, any size (0 included) and
// any alignment are valid, and the kernel runs on the calling thread only (callers split
// large work over threads themselves).
#pragma once

#include <cstddef>
#include <cstdint>

namespace odc {

// dtype codes shared with odc_pp/odc/transport_host.py
enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Whether a copy of total_bytes in all (over every thread that shares it) should bypass
// the cache: on x86-64 (where streaming stores exist) from streaming_min_bytes() on.
bool prefers_streaming(size_t total_bytes);
// 8 MiB, or ODC_PP_STREAMING_MIN_BYTES read at first use (std::invalid_argument if it is
// not a byte count).
size_t streaming_min_bytes();
// dst[0, nbytes) = src[0, nbytes). streaming: with non-temporal stores (AVX-512 where the
// CPU has it, else SSE2), which do not read the destination lines first, fenced before
// returning; ignored where prefers_streaming is always false. Else libc memcpy.
void fast_copy(void* dst, const void* src, size_t nbytes, bool streaming);
// dst[0, nbytes) = src[0, nbytes) with libc memcpy (the reference the benchmark compares to).
void libc_copy(void* dst, const void* src, size_t nbytes);
// Name of the kernel fast_copy uses for large copies on this CPU (e.g. "avx512 streaming stores").
const char* fast_copy_kernel();

// fp32 dst[i] += src[i] for i < count; src is fp32 (dtype 0), bf16 (1) or fp16 (2), every
// conversion exact. Throws std::invalid_argument for another dtype code.
void add_into_fp32(float* dst, const void* src, int dtype, size_t count);
// Bytes per element of a dtype code (throws for an unknown code).
size_t dtype_size(int dtype);

}  // namespace odc
