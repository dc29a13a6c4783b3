// A CPU emulation of the CUDA thread model, enough to run some of redco-cuda's kernels on
// the host: every CUDA thread of a block is a ucontext fiber on one OS thread, switched
// round-robin at barriers (__syncthreads, __syncwarp, and the two barriers of each warp
// shuffle); blocks run one after another. Dynamic shared memory is one global array.
#include <ucontext.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
using std::exp; using std::log; using std::fmax; using std::fmin; using std::sqrt;

struct dim3 { unsigned x = 1, y = 1, z = 1; };
dim3 threadIdx, blockIdx, blockDim, gridDim;
double smem_raw[1 << 16];

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__

namespace emu {
struct Fiber { ucontext_t ctx; std::vector<char> stack; bool done; };
std::vector<Fiber> fibers;
ucontext_t main_ctx;
unsigned cur;
std::function<void()> kernel;

// Hands the CPU to the next fiber that has not finished (back here when it is our turn).
inline void yield() {
    unsigned from = cur, n = (unsigned)fibers.size();
    for (unsigned s = 1; s < n; ++s) {
        unsigned nx = (from + s) % n;
        if (fibers[nx].done) continue;
        cur = nx;
        threadIdx.x = nx;
        swapcontext(&fibers[from].ctx, &fibers[nx].ctx);
        cur = from;
        threadIdx.x = from;
        return;
    }
}
struct Barrier {
    unsigned count, arrived = 0, gen = 0;
    void wait() {
        unsigned g = gen;
        if (++arrived == count) { arrived = 0; ++gen; return; }
        while (gen == g) yield();
    }
};
std::vector<Barrier> warps;
Barrier block{0};
double slot[32 * 32];
int or_acc;

void entry() { kernel(); fibers[cur].done = true; }
}  // namespace emu

inline void __syncthreads() { emu::block.wait(); }
inline int __syncthreads_or(int p) {
    if (p) emu::or_acc = 1;
    emu::block.wait();
    int r = emu::or_acc;
    emu::block.wait();
    if (threadIdx.x == 0) emu::or_acc = 0;
    emu::block.wait();
    return r;
}
inline void __syncwarp() { emu::warps[threadIdx.x / 32].wait(); }
template <typename T> T __shfl_sync(unsigned, T v, int src) {
    unsigned w = threadIdx.x / 32;
    emu::slot[threadIdx.x] = (double)v;
    emu::warps[w].wait();
    T r = (T)emu::slot[w * 32 + (src & 31)];
    emu::warps[w].wait();
    return r;
}
template <typename T> T __shfl_xor_sync(unsigned m, T v, int o) {
    return __shfl_sync(m, v, (int)((threadIdx.x % 32) ^ o));
}

// Runs `k` over a `grid_x` x `grid_y` grid of blocks of `block` threads (a multiple of 32,
// at most 1024); blocks run in row order (x fastest).
void launch(unsigned grid_x, unsigned block, const std::function<void()>& k, unsigned grid_y = 1) {
    gridDim.x = grid_x;
    gridDim.y = grid_y;
    blockDim.x = block;
    emu::kernel = k;
    emu::fibers.assign(block, emu::Fiber{});
    for (auto& f : emu::fibers) f.stack.resize(1 << 16);
    for (unsigned b = 0; b < grid_x * grid_y; ++b) {
        blockIdx.x = b % grid_x;
        blockIdx.y = b / grid_x;
        for (auto& x : smem_raw) x = NAN;  // shared memory starts as garbage
        emu::block = emu::Barrier{block};
        emu::warps.assign(block / 32, emu::Barrier{32});
        emu::or_acc = 0;
        for (unsigned t = 0; t < block; ++t) {
            auto& f = emu::fibers[t];
            f.done = false;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = &emu::main_ctx;
            makecontext(&f.ctx, emu::entry, 0);
        }
        for (bool left = true; left;) {
            left = false;
            for (unsigned t = 0; t < block; ++t) {
                if (emu::fibers[t].done) continue;
                left = true;
                emu::cur = t;
                threadIdx.x = t;
                swapcontext(&emu::main_ctx, &emu::fibers[t].ctx);
            }
        }
    }
}
