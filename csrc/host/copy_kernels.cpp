#include "copy_kernels.h"

#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace odc {
namespace {

// Below this size a transfer's destination (and the sources, which the ranks share) can stay
// in cache, where libc memcpy is faster and leaves the data for its reader; above it,
// libc's loop reads every destination line before overwriting it, which costs a third of
// the memory bandwidth that a gather (all ranks copying at once) is bound by. On the 2-core
// dev box (32 MiB L3) the crossover of a 2-rank gather repeated in a tight loop was 10-12
// MiB, and with cold caches streaming won from 4 MiB. Override: ODC_PP_STREAMING_MIN_BYTES.
constexpr size_t kDefaultStreamingMinBytes = size_t(8) << 20;

size_t streaming_min_bytes_from_env() {
  const char* text = std::getenv("ODC_PP_STREAMING_MIN_BYTES");
  if (text == nullptr || *text == '\0') return kDefaultStreamingMinBytes;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0')
    throw std::invalid_argument(std::string("ODC_PP_STREAMING_MIN_BYTES must be a byte count, "
                                            "got '") + text + "'");
  return static_cast<size_t>(value);
}

#if defined(__x86_64__)
// Streaming (non-temporal) stores: the destination lines go to memory without being read.
// Both variants: unaligned head with memcpy, aligned stores, a fence so that the copy is
// visible to other processes before the caller signals completion, then the tail.
__attribute__((target("avx512f"))) void stream_copy_avx512(char* dst, const char* src,
                                                           size_t nbytes) {
  const size_t head = std::min(nbytes, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 256 <= nbytes; i += 256) {
    const __m512i a = _mm512_loadu_si512(src + i), b = _mm512_loadu_si512(src + i + 64);
    const __m512i c = _mm512_loadu_si512(src + i + 128), d = _mm512_loadu_si512(src + i + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i + 192), d);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, nbytes - i);
}

void stream_copy_sse2(char* dst, const char* src, size_t nbytes) {
  const size_t head = std::min(nbytes, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= nbytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, nbytes - i);
}

// AVX-512 when the CPU has it, unless ODC_PP_STREAMING_ISA=sse2 (tests and troubleshooting).
bool use_avx512() {
  static const bool value = [] {
    const char* isa = std::getenv("ODC_PP_STREAMING_ISA");
    if (isa != nullptr && std::strcmp(isa, "sse2") == 0) return false;
    return static_cast<bool>(__builtin_cpu_supports("avx512f"));
  }();
  return value;
}
#endif

std::array<float, 65536> make_half_table() {
  std::array<float, 65536> table{};
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float value;
    if (exponent == 0) {
      value = std::ldexp(static_cast<float>(mantissa), -24);
    } else if (exponent == 31) {
      value = mantissa ? std::nanf("") : INFINITY;
    } else {
      value = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
    }
    table[h] = sign ? -value : value;
  }
  return table;
}

const std::array<float, 65536>& half_table() {
  static const std::array<float, 65536> table = make_half_table();
  return table;
}

}  // namespace

size_t streaming_min_bytes() {
  static const size_t value = streaming_min_bytes_from_env();
  return value;
}

bool prefers_streaming(size_t total_bytes) {
#if defined(__x86_64__)
  return total_bytes >= streaming_min_bytes();
#else
  return false;
#endif
}

void fast_copy(void* dst, const void* src, size_t nbytes, bool streaming) {
#if defined(__x86_64__)
  if (streaming) {
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    if (use_avx512())
      stream_copy_avx512(out, in, nbytes);
    else
      stream_copy_sse2(out, in, nbytes);
    return;
  }
#endif
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

void libc_copy(void* dst, const void* src, size_t nbytes) {
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
}

const char* fast_copy_kernel() {
#if defined(__x86_64__)
  return use_avx512() ? "avx512 streaming stores" : "sse2 streaming stores";
#else
  return "memcpy";
#endif
}

size_t dtype_size(int dtype) {
  switch (dtype) {
    case kFloat32: return 4;
    case kBFloat16:
    case kFloat16: return 2;
    default: throw std::invalid_argument("unsupported dtype code " + std::to_string(dtype));
  }
}

void add_into_fp32(float* dst, const void* src, int dtype, size_t count) {
  switch (dtype) {
    case kFloat32: {
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] += s[i];
      return;
    }
    case kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
        float value;
        std::memcpy(&value, &bits, sizeof(value));
        dst[i] += value;
      }
      return;
    }
    case kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      const float* table = half_table().data();
      for (size_t i = 0; i < count; ++i) dst[i] += table[s[i]];
      return;
    }
    default:
      throw std::invalid_argument("unsupported dtype code " + std::to_string(dtype));
  }
}

}  // namespace odc
