/* Host memcpy variants for benchmarks/tuning/video_stream_tune.py (loaded with ctypes; no torch):
 * glibc memcpy or 16-byte non-temporal (streaming) stores, over a chosen number of OpenMP threads,
 * each thread one contiguous chunk.
 *
 *   gcc -O3 -fopenmp -shared -fPIC -o /tmp/host_copy.so benchmarks/tuning/host_copy.c
 */
#include <emmintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

static void stream_copy(char* d, const char* s, size_t n) {
  size_t head = (size_t)(-(uintptr_t)d) & 15u;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  memcpy(d + body, s + body, n - body);
  _mm_sfence();
}

void copy_parallel(void* dst, const void* src, size_t n, int threads, int streaming) {
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    size_t chunk = ((n + (size_t)T - 1) / (size_t)T + 63) & ~(size_t)63;
    size_t b = (size_t)t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) {
      if (streaming)
        stream_copy((char*)dst + b, (const char*)src + b, e - b);
      else
        memcpy((char*)dst + b, (const char*)src + b, e - b);
    }
  }
}
