/* cuda_host.h: the portability header that makes rlx's generated CUDA C plain host C (C11 + POSIX
 * threads), so the test suite compiles every recipe's kernels with the system C compiler and runs them
 * on the CPU against the interpreter (rlx_compiler::backend::cuda, docs/gpu.md).
 *
 * A launch of GRID blocks of BLOCK threads runs BLOCK POSIX threads; each runs the kernel for block 0,
 * 1, ... in turn, with a barrier after every block, so the threads of one block run concurrently and
 * blocks one after another. `threadIdx`/`blockIdx` are thread-local, `blockDim`/`gridDim` are the
 * launch's, `__shared__` variables are statics (one block at a time uses them) and `__syncthreads()` is
 * the launch's barrier: block reductions really run across threads, as on the GPU. Launches are
 * serialised by a mutex.
 *
 * Each kernel gets a host entry point (RLX_HOST_LAUNCHER):
 *   int rlx_host_NAME(void* const* table, uint64_t g_begin, uint64_t g_end, unsigned grid,
 *                     unsigned block);
 * returning 0, or an errno value when threads cannot be created or the block is out of range. */
#define RLX_HOST 1
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#endif
#include <math.h>
#include <pthread.h>
#include <stdint.h>

typedef unsigned long long rlx_u64;
typedef struct {
    unsigned x, y, z;
} rlx_dim3;

static _Thread_local rlx_dim3 threadIdx;
static _Thread_local rlx_dim3 blockIdx;
static rlx_dim3 blockDim;
static rlx_dim3 gridDim;

#define __global__
#define __device__
#define __forceinline__
#define __shared__ static
#define RLX_KERNEL static
#define RLX_DEVICE static inline

static pthread_barrier_t rlx_barrier;
static pthread_mutex_t rlx_launch_lock = PTHREAD_MUTEX_INITIALIZER;

static void __syncthreads(void) { pthread_barrier_wait(&rlx_barrier); }
static double rlx_inf(void) { return INFINITY; }
static double rlx_nan(void) { return NAN; }

typedef void (*rlx_kernel_fn)(void* const*, rlx_u64, rlx_u64);

struct rlx_thread_args {
    rlx_kernel_fn kernel;
    void* const* table;
    rlx_u64 g_begin, g_end;
    unsigned grid, tid;
};

static void* rlx_thread_main(void* raw) {
    struct rlx_thread_args* a = (struct rlx_thread_args*)raw;
    threadIdx.x = a->tid;
    threadIdx.y = threadIdx.z = 0;
    for (unsigned b = 0; b < a->grid; b++) {
        blockIdx.x = b;
        blockIdx.y = blockIdx.z = 0;
        a->kernel(a->table, a->g_begin, a->g_end);
        /* The block is finished before the next one reuses the shared variables. */
        pthread_barrier_wait(&rlx_barrier);
    }
    return 0;
}

static int rlx_host_launch(rlx_kernel_fn kernel, void* const* table, rlx_u64 g_begin, rlx_u64 g_end,
                           unsigned grid, unsigned block) {
    enum { MAX_THREADS = 1024 };
    if (block == 0 || block > MAX_THREADS) return 22; /* EINVAL */
    if (grid == 0) return 0;
    static pthread_t threads[MAX_THREADS];
    static struct rlx_thread_args args[MAX_THREADS];
    pthread_mutex_lock(&rlx_launch_lock);
    int status = pthread_barrier_init(&rlx_barrier, 0, block);
    if (status != 0) {
        pthread_mutex_unlock(&rlx_launch_lock);
        return status;
    }
    blockDim.x = block;
    blockDim.y = blockDim.z = 1;
    gridDim.x = grid;
    gridDim.y = gridDim.z = 1;
    unsigned started = 0;
    for (unsigned t = 0; t < block; t++) {
        args[t].kernel = kernel;
        args[t].table = table;
        args[t].g_begin = g_begin;
        args[t].g_end = g_end;
        args[t].grid = grid;
        args[t].tid = t;
        if (t == 0) continue; /* thread 0 is this thread, started last */
        status = pthread_create(&threads[t], 0, rlx_thread_main, &args[t]);
        if (status != 0) break;
        started++;
    }
    if (status != 0) {
        /* The started threads wait at the barrier forever: we cannot recover them; report. */
        pthread_mutex_unlock(&rlx_launch_lock);
        return status;
    }
    rlx_thread_main(&args[0]);
    for (unsigned t = 1; t <= started; t++) pthread_join(threads[t], 0);
    pthread_barrier_destroy(&rlx_barrier);
    pthread_mutex_unlock(&rlx_launch_lock);
    return 0;
}

#define RLX_HOST_LAUNCHER(name)                                                                     \
    int rlx_host_##name(void* const* table, rlx_u64 g_begin, rlx_u64 g_end, unsigned grid,          \
                        unsigned block) {                                                           \
        return rlx_host_launch(name, table, g_begin, g_end, grid, block);                           \
    }
