/* Host memcpy variants for benchmarks/tuning/video/video_stream_tune.py (loaded with ctypes; no torch):
 * glibc memcpy or 16-byte non-temporal (streaming) stores, over a chosen number of OpenMP threads,
 * each thread one contiguous chunk.
 *
 *   gcc -O3 -fopenmp -shared -fPIC -o /tmp/host_copy.so benchmarks/tuning/video/host_copy.c
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

/* A persistent pthread pool for the same copy, callable from any thread (one job at a time):
 * workers spin for up to spin_us after a job before sleeping on a condition variable, so that
 * back-to-back copies (a frame every ~130 us) find them awake. libgomp's own spin-wait is
 * throttled to ~100 spins once more OpenMP threads exist than CPUs (a second thread opening
 * parallel regions makes a second team): this pool is not counted there. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER, job_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static atomic_ulong pool_gen;
static atomic_int pool_left;
static int pool_workers, pool_parts;
static char* job_dst;
static const char* job_src;
static size_t job_n;
static long pool_spin_ns = 200000;
static unsigned long pool_start_gen[256];  /* the generation each worker was created at */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void part(int i) {
  size_t chunk = ((job_n + (size_t)pool_parts - 1) / (size_t)pool_parts + 63) & ~(size_t)63;
  size_t b = (size_t)i * chunk, e = b + chunk < job_n ? b + chunk : job_n;
  if (b < e) memcpy(job_dst + b, job_src + b, e - b);
}

static void* pool_main(void* arg) {
  int me = (int)(intptr_t)arg;
  unsigned long seen = pool_start_gen[me];
  for (;;) {
    double t0 = now_ns();
    unsigned long g;
    int k = 0;
    while ((g = atomic_load_explicit(&pool_gen, memory_order_acquire)) == seen) {
      _mm_pause();
      if ((++k & 255) == 0 && now_ns() - t0 > pool_spin_ns) {
        pthread_mutex_lock(&pool_mu);
        while ((g = atomic_load(&pool_gen)) == seen) pthread_cond_wait(&pool_cv, &pool_mu);
        pthread_mutex_unlock(&pool_mu);
        break;
      }
    }
    seen = g;
    if (me < pool_parts) part(me);
    atomic_fetch_sub_explicit(&pool_left, 1, memory_order_release);
  }
  return NULL;
}

void pool_copy(void* dst, const void* src, size_t n, int threads, long spin_us) {
  pthread_mutex_lock(&job_mu);
  pool_spin_ns = spin_us * 1000;
  while (pool_workers < threads - 1 && pool_workers < 255) {
    pthread_t t;
    pool_start_gen[pool_workers + 1] = atomic_load(&pool_gen);
    pthread_create(&t, NULL, pool_main, (void*)(intptr_t)(pool_workers + 1));
    pthread_detach(t);
    pool_workers++;
  }
  job_dst = (char*)dst, job_src = (const char*)src, job_n = n;
  pool_parts = threads < pool_workers + 1 ? threads : pool_workers + 1;
  atomic_store(&pool_left, pool_workers);
  pthread_mutex_lock(&pool_mu);
  atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
  pthread_cond_broadcast(&pool_cv);
  pthread_mutex_unlock(&pool_mu);
  part(0);
  while (atomic_load_explicit(&pool_left, memory_order_acquire) > 0) _mm_pause();
  pthread_mutex_unlock(&job_mu);
}
