/* The trainer's own CUDA kernels (trainer/src/device_kernels.rs): the recipe op's gradient columns, the
 * fused layers of fused.rs (RMS norm, SwiGLU, rope / to_heads / from_heads, with their backward) and the
 * fused LM head's per-chunk passes (head.rs, head_cpu.rs).
 *
 * Compiled at run time with NVRTC on a GPU; with compiler/src/backend/cuda_host.h in front the same
 * text is host C, which trainer/tests/device_kernels.rs compiles with the system C compiler and checks
 * against the CPU kernels. Every kernel has the recipe kernels' calling convention
 * (void* const* table, rlx_u64 g_begin, rlx_u64 g_end): `table` holds device addresses and, as 64-bit
 * words, the sizes (f32 parameters as their bits); g_begin and g_end are unused. Grid-stride loops, so
 * any grid covers the work; the row kernels want a power-of-two block of at most RLX_ROW_BLOCK threads
 * (their reductions are pairwise trees over the thread index: deterministic for a block size). */
#ifndef RLX_HOST
#define RLX_KERNEL extern "C" __global__
#define RLX_DEVICE static __device__ __forceinline__
#define RLX_HOST_LAUNCHER(name)
typedef unsigned long long rlx_u64;
typedef unsigned int rlx_u32;
/* The smallest index seen (a non-finite gradient's element). */
RLX_DEVICE void rlx_note_first(rlx_u64* at, rlx_u64 i) { atomicMin(at, i); }
RLX_DEVICE float rlx_f32_of_bits(rlx_u64 w) { return __uint_as_float((unsigned int)w); }
RLX_DEVICE float rlx_neg_inf_f(void) { return __int_as_float((int)0xff800000); }
#else
static float rlx_neg_inf_f(void) { return -INFINITY; }
typedef unsigned int rlx_u32;
static void rlx_note_first(rlx_u64* at, rlx_u64 i) {
    rlx_u64 seen = __atomic_load_n(at, __ATOMIC_RELAXED);
    while (i < seen && !__atomic_compare_exchange_n(at, &seen, i, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}
static float rlx_f32_of_bits(rlx_u64 w) {
    union {
        rlx_u32 u;
        float f;
    } v;
    v.u = (rlx_u32)w;
    return v.f;
}
#endif

#define RLX_ROW_BLOCK 1024
#define RLX_WORD(i) ((rlx_u64)(table[i]))
#define RLX_GRID_STRIDE(i, n)                                                                       \
    for (rlx_u64 i = (rlx_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                       \
         i += (rlx_u64)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------------------------------------------
 * The recipe op's gradient (op.rs): one column of ∂loss/∂input, as the recipe kernels left it, into its
 * column of the op's row-major [elements, width] argument layout; `map` (when has_map) gives each
 * value's element (a keep filter ran the last phase on the kept responses; the others stay 0).
 * table: 0 out (float*), 1 src (float* / double*), 2 map (rlx_u64*), 3 first_bad (rlx_u64*: the
 * smallest element whose value is not finite, left as is when all are), 4 len, 5 width, 6 column,
 * 7 has_map. */
RLX_KERNEL void rlx_gradient_column_f32(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    float* out = (float*)table[0];
    const float* src = (const float*)table[1];
    const rlx_u64* map = (const rlx_u64*)table[2];
    rlx_u64* first_bad = (rlx_u64*)table[3];
    rlx_u64 len = RLX_WORD(4), width = RLX_WORD(5), column = RLX_WORD(6), has_map = RLX_WORD(7);
    RLX_GRID_STRIDE(i, len) {
        float v = src[i];
        rlx_u64 e = has_map ? map[i] : i;
        out[e * width + column] = v;
        if (!(v - v == 0.0f)) rlx_note_first(first_bad, e);
    }
}
RLX_HOST_LAUNCHER(rlx_gradient_column_f32)

RLX_KERNEL void rlx_gradient_column_f64(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    float* out = (float*)table[0];
    const double* src = (const double*)table[1];
    const rlx_u64* map = (const rlx_u64*)table[2];
    rlx_u64* first_bad = (rlx_u64*)table[3];
    rlx_u64 len = RLX_WORD(4), width = RLX_WORD(5), column = RLX_WORD(6), has_map = RLX_WORD(7);
    RLX_GRID_STRIDE(i, len) {
        double v = src[i];
        rlx_u64 e = has_map ? map[i] : i;
        out[e * width + column] = (float)v;
        if (!(v - v == 0.0)) rlx_note_first(first_bad, e);
    }
}
RLX_HOST_LAUNCHER(rlx_gradient_column_f64)

/* ---------------------------------------------------------------------------------------------------
 * Block reductions: a pairwise tree over the thread index in shared memory (blockDim.x a power of two).
 * Every thread gets the result. */
__shared__ double rlx_red_d[RLX_ROW_BLOCK];
__shared__ float rlx_red_f[RLX_ROW_BLOCK];

RLX_DEVICE double rlx_block_sum_d(double v) {
    unsigned t = threadIdx.x;
    rlx_red_d[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) rlx_red_d[t] += rlx_red_d[t + s];
        __syncthreads();
    }
    double r = rlx_red_d[0];
    __syncthreads();
    return r;
}

RLX_DEVICE float rlx_block_sum_f(float v) {
    unsigned t = threadIdx.x;
    rlx_red_f[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) rlx_red_f[t] += rlx_red_f[t + s];
        __syncthreads();
    }
    float r = rlx_red_f[0];
    __syncthreads();
    return r;
}

RLX_DEVICE float rlx_block_max_f(float v) {
    unsigned t = threadIdx.x;
    rlx_red_f[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s && rlx_red_f[t + s] > rlx_red_f[t]) rlx_red_f[t] = rlx_red_f[t + s];
        __syncthreads();
    }
    float r = rlx_red_f[0];
    __syncthreads();
    return r;
}

/* ---------------------------------------------------------------------------------------------------
 * RMS norm (fused.rs): per row x of h values, r = 1/√(mean(x²) + ε) (the sum of squares in f64, as the
 * CPU kernel), y = x·r·w. One block per row (grid-stride over rows).
 * table: 0 x, 1 w, 2 y, 3 rows, 4 h, 5 eps (f32 bits). */
RLX_DEVICE float rlx_inv_rms(const float* x, rlx_u64 h, float eps) {
    double ss = 0.0;
    for (rlx_u64 k = threadIdx.x; k < h; k += blockDim.x) ss += (double)x[k] * (double)x[k];
    ss = rlx_block_sum_d(ss);
    return 1.0f / sqrtf((float)(ss / (double)h) + eps);
}

RLX_KERNEL void rlx_rms_norm(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* x = (const float*)table[0];
    const float* w = (const float*)table[1];
    float* y = (float*)table[2];
    rlx_u64 rows = RLX_WORD(3), h = RLX_WORD(4);
    float eps = rlx_f32_of_bits(RLX_WORD(5));
    for (rlx_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * h;
        float r = rlx_inv_rms(xr, h, eps);
        for (rlx_u64 k = threadIdx.x; k < h; k += blockDim.x) y[row * h + k] = xr[k] * r * w[k];
    }
}
RLX_HOST_LAUNCHER(rlx_rms_norm)

/* The backward's rows: with g = ∂y ⊙ w, ∂x = r·g − x·r³·mean(g ⊙ x) (the mean in f64); r of each row is
 * kept in `inv` for the weight's gradient.
 * table: 0 x, 1 w, 2 dy, 3 out ([rows + 1, h]: ∂x, then ∂w's row), 4 inv (float[rows]), 5 rows, 6 h,
 * 7 eps (f32 bits). */
RLX_KERNEL void rlx_rms_norm_bwd_rows(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* x = (const float*)table[0];
    const float* w = (const float*)table[1];
    const float* dy = (const float*)table[2];
    float* out = (float*)table[3];
    float* inv = (float*)table[4];
    rlx_u64 rows = RLX_WORD(5), h = RLX_WORD(6);
    float eps = rlx_f32_of_bits(RLX_WORD(7));
    for (rlx_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * h;
        const float* dyr = dy + row * h;
        float r = rlx_inv_rms(xr, h, eps);
        double gx = 0.0;
        for (rlx_u64 k = threadIdx.x; k < h; k += blockDim.x) gx += (double)(dyr[k] * w[k]) * (double)xr[k];
        gx = rlx_block_sum_d(gx);
        float c = (float)(gx / (double)h) * r * r * r;
        for (rlx_u64 k = threadIdx.x; k < h; k += blockDim.x) out[row * h + k] = r * dyr[k] * w[k] - xr[k] * c;
        if (threadIdx.x == 0) inv[row] = r;
    }
}
RLX_HOST_LAUNCHER(rlx_rms_norm_bwd_rows)

/* ∂w = Σ_rows ∂y ⊙ x·r (in f64, rounded once), one thread per column, into the last row of `out`.
 * table: 0 x, 1 dy, 2 inv, 3 out, 4 rows, 5 h. */
RLX_KERNEL void rlx_rms_norm_bwd_weight(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* x = (const float*)table[0];
    const float* dy = (const float*)table[1];
    const float* inv = (const float*)table[2];
    float* out = (float*)table[3];
    rlx_u64 rows = RLX_WORD(4), h = RLX_WORD(5);
    RLX_GRID_STRIDE(k, h) {
        double acc = 0.0;
        for (rlx_u64 row = 0; row < rows; row++) acc += (double)(dy[row * h + k] * x[row * h + k] * inv[row]);
        out[rows * h + k] = (float)acc;
    }
}
RLX_HOST_LAUNCHER(rlx_rms_norm_bwd_weight)

/* ---------------------------------------------------------------------------------------------------
 * SwiGLU (fused.rs): y = silu(a)·b; ∂a = ∂y·b·σ(a)·(1 + a·(1 − σ(a))), ∂b = ∂y·a·σ(a).
 * Forward table: 0 a, 1 b, 2 y, 3 n. Backward table: 0 a, 1 b, 2 dy, 3 out ([2n]: ∂a then ∂b), 4 n. */
RLX_DEVICE float rlx_sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

RLX_KERNEL void rlx_swiglu(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* a = (const float*)table[0];
    const float* b = (const float*)table[1];
    float* y = (float*)table[2];
    rlx_u64 n = RLX_WORD(3);
    RLX_GRID_STRIDE(i, n) { y[i] = a[i] * rlx_sigmoid(a[i]) * b[i]; }
}
RLX_HOST_LAUNCHER(rlx_swiglu)

RLX_KERNEL void rlx_swiglu_bwd(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* a = (const float*)table[0];
    const float* b = (const float*)table[1];
    const float* dy = (const float*)table[2];
    float* out = (float*)table[3];
    rlx_u64 n = RLX_WORD(4);
    RLX_GRID_STRIDE(i, n) {
        float s = rlx_sigmoid(a[i]);
        out[i] = dy[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
        out[n + i] = dy[i] * a[i] * s;
    }
}
RLX_HOST_LAUNCHER(rlx_swiglu_bwd)

/* ---------------------------------------------------------------------------------------------------
 * Rows of d values moved between layouts and rotated (fused.rs: rope, to_heads, from_heads). Each output
 * element is computed on its own: with the halves [x₁, x₂] of the source row at position p and angle θ
 * (cos, sin: [t, d/2]), y₁ = x₁ cos θ − x₂·sign·sin θ, y₂ = x₂ cos θ + x₁·sign·sin θ; without tables
 * (cos = 0) a copy.
 * mode 0 (rope): [rows, t, d] in place of layout; mode 1 (to_heads): [b, t, n, d] → [b, n, t, d];
 * mode 2 (from_heads): [b, n, t, d] → [b, t, n, d].
 * table: 0 x, 1 y, 2 cos (or 0), 3 sin (or 0), 4 b (rows for mode 0), 5 t, 6 n (1 for mode 0), 7 d,
 * 8 mode, 9 sign (f32 bits). */
RLX_KERNEL void rlx_heads(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* x = (const float*)table[0];
    float* y = (float*)table[1];
    const float* cos_t = (const float*)table[2];
    const float* sin_t = (const float*)table[3];
    rlx_u64 b = RLX_WORD(4), t = RLX_WORD(5), n = RLX_WORD(6), d = RLX_WORD(7), mode = RLX_WORD(8);
    float sign = rlx_f32_of_bits(RLX_WORD(9));
    rlx_u64 total = b * t * n * d;
    RLX_GRID_STRIDE(i, total) {
        rlx_u64 j = i % d, rest = i / d, row, head, p;
        if (mode == 2) { /* output [b, t, n, d] */
            head = rest % n;
            rest /= n;
            p = rest % t;
            row = rest / t;
        } else { /* output [b, n, t, d] (mode 0: n = 1) */
            p = rest % t;
            rest /= t;
            head = rest % n;
            row = rest / n;
        }
        rlx_u64 src = mode == 2 ? ((row * n + head) * t + p) * d /* [b, n, t, d] */
                                : ((row * t + p) * n + head) * d; /* [b, t, n, d] (mode 0: n = 1) */
        if (cos_t == 0) {
            y[i] = x[src + j];
        } else {
            rlx_u64 half = d / 2, k = j < half ? j : j - half;
            float c = cos_t[p * half + k], s = sign * sin_t[p * half + k];
            float x1 = x[src + k], x2 = x[src + half + k];
            y[i] = j < half ? x1 * c - x2 * s : x2 * c + x1 * s;
        }
    }
}
RLX_HOST_LAUNCHER(rlx_heads)

/* ---------------------------------------------------------------------------------------------------
 * The fused LM head (head.rs, head_cpu.rs), per chunk z: [rows, cols] of logits (vocabulary columns
 * c0 .. c0 + cols). Each row's state is (m, s, u, target logit): the running max, s = Σ exp(z − m),
 * u = Σ exp(z − m)·(z − m), the target's logit (0 until its chunk).
 * Forward table: 0 z, 1 targets (rlx_u32[rows]), 2 state (float[rows, 4]; m = −∞, the rest 0 before the
 * first chunk), 3 rows, 4 cols, 5 c0. One block per row. */
RLX_KERNEL void rlx_head_forward_chunk(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* z = (const float*)table[0];
    const rlx_u32* targets = (const rlx_u32*)table[1];
    float* state = (float*)table[2];
    rlx_u64 rows = RLX_WORD(3), cols = RLX_WORD(4), c0 = RLX_WORD(5);
    for (rlx_u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* zr = z + row * cols;
        float* st = state + row * 4;
        float chunk_max = rlx_neg_inf_f();
        for (rlx_u64 k = threadIdx.x; k < cols; k += blockDim.x)
            if (zr[k] > chunk_max) chunk_max = zr[k];
        chunk_max = rlx_block_max_f(chunk_max);
        float m_old = st[0];
        float m = m_old > chunk_max ? m_old : chunk_max;
        float s_c = 0.0f, u_c = 0.0f;
        for (rlx_u64 k = threadIdx.x; k < cols; k += blockDim.x) {
            float d = zr[k] - m, e = expf(d);
            s_c += e;
            u_c += e * d;
        }
        s_c = rlx_block_sum_f(s_c);
        u_c = rlx_block_sum_f(u_c);
        if (threadIdx.x == 0) {
            if (m_old == rlx_neg_inf_f()) {
                st[1] = s_c;
                st[2] = u_c;
            } else {
                /* Rescale by exp(m_old − m): s' = a·s, u' = a·(u + (m_old − m)·s). */
                float shift = m_old - m, a = expf(shift);
                st[2] = (st[2] + shift * st[1]) * a + u_c;
                st[1] = st[1] * a + s_c;
            }
            st[0] = m;
            rlx_u64 target = targets[row];
            if (target >= c0 && target < c0 + cols) st[3] += zr[target - c0];
        }
    }
}
RLX_HOST_LAUNCHER(rlx_head_forward_chunk)

/* The rows' (log p of the target, lse, entropy) from their states. table: 0 state, 1 out ([rows, 3]),
 * 2 rows. */
RLX_KERNEL void rlx_head_finish(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* state = (const float*)table[0];
    float* out = (float*)table[1];
    rlx_u64 rows = RLX_WORD(2);
    RLX_GRID_STRIDE(row, rows) {
        const float* st = state + row * 4;
        float ln_s = logf(st[1]), lse = st[0] + ln_s;
        out[row * 3] = st[3] - lse;
        out[row * 3 + 1] = lse;
        out[row * 3 + 2] = ln_s - st[2] / st[1];
    }
}
RLX_HOST_LAUNCHER(rlx_head_finish)

/* ∂loss/∂z of a chunk: ∂z = g1·1[j = t] − p·(g1 + g2·(log p + H)), log p = z − lse, p = exp(log p).
 * table: 0 z, 1 targets (rlx_u32), 2 lse, 3 entropy, 4 g1, 5 g2 (float[rows] each), 6 dz, 7 rows,
 * 8 cols, 9 c0. */
RLX_KERNEL void rlx_head_backward_chunk(void* const* table, rlx_u64 g_begin, rlx_u64 g_end) {
    const float* z = (const float*)table[0];
    const rlx_u32* targets = (const rlx_u32*)table[1];
    const float* lse = (const float*)table[2];
    const float* entropy = (const float*)table[3];
    const float* g1 = (const float*)table[4];
    const float* g2 = (const float*)table[5];
    float* dz = (float*)table[6];
    rlx_u64 rows = RLX_WORD(7), cols = RLX_WORD(8), c0 = RLX_WORD(9);
    rlx_u64 total = rows * cols;
    RLX_GRID_STRIDE(i, total) {
        rlx_u64 row = i / cols, j = i % cols;
        float log_p = z[i] - lse[row], p = expf(log_p);
        float d = -(p * ((log_p + entropy[row]) * g2[row] + g1[row]));
        if ((rlx_u64)targets[row] == c0 + j) d += g1[row];
        dz[i] = d;
    }
}
RLX_HOST_LAUNCHER(rlx_head_backward_chunk)
