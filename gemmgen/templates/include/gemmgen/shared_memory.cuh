/*
 * gemmgen/shared_memory.cuh — shared-memory access by 32-bit address for the families' own
 * kernels (the mixed family's direct and wgmma kernels, the MoE family's wgmma kernel and its
 * SwiGLU pass): cp.async copies with zero-fill, TMA copies and their transaction barriers, vector
 * loads without a generic-to-shared conversion in the loop, the wgmma descriptor of a K-major
 * operand tile in 128-byte swizzle, and a thread-block cluster's barriers and reads of another
 * CTA's shared memory (sm90).
 */
#pragma once

#include <cstdint>

#include "cute/arch/mma_sm90_desc.hpp"

namespace gemmgen::smem {

// 16 bytes global → shared, bypassing L1; src_bytes 16, or 0: zero-fill (nothing is read).
__device__ __forceinline__ void cp_async16(uint32_t dst, void const* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ float lds32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
// Four 8 x 8 matrices of 16-bit values (rows of 16 bytes; lanes 8i .. 8i + 7 give matrix i's row
// addresses): lane (g, q) gets row g, columns 2q and 2q + 1 of each, the mma.sync fragment order.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Orders this thread's shared-memory accesses through the generic proxy (loads, stores, landed
// cp.async copies) with the async proxy's after it (wgmma's reads, the TMA's writes).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A cp.async ring's slot made ready for wgmma: wait until at most `Pending` commit groups of
// this thread's copies are in flight, make its copies visible to the async proxy (wgmma reads
// shared memory through it), then a CTA barrier (every thread's copies of the slot landed).
template <int Pending>
__device__ __forceinline__ void cp_async_wait_for_wgmma() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
  fence_proxy_async();
  __syncthreads();
}

// A TMA ring's transaction barriers (sm90; `bar` an 8-byte aligned shared-memory address).
// mbarrier_init: one arrival a phase (the thread that queues the slot's copies); visible to the
// async proxy (the copies' completions) and, after a CTA barrier, to every thread.
// mbarrier_expect_tx: that arrival, announcing the bytes the phase's copies bring.
// mbarrier_wait: until the phase of parity `phase` completed (the slot's bytes landed; they are
// then visible to this thread and to its wgmmas). mbarrier_inval: before the barrier's memory
// is initialized again.
__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}" ::"r"(bar),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void mbarrier_inval(uint32_t bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// A box of a 2-D or 3-D tensor (`map`: a CUtensorMap in kernel-parameter or global memory) to
// shared memory at `dst`, completing `bytes` (the whole box, zero-filled past the tensor) on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, void const* map, uint32_t bar, int c0,
                                            int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, void const* map, uint32_t bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The wgmma descriptor of a K-major operand tile with 128-byte swizzle at `addr` (1024-aligned,
// plus 32 bytes a K step of 32 bytes): rows of 128 bytes, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t sw128_k_major_descriptor(uint32_t addr) {
  cute::GmmaDescriptor desc;
  desc.bitfield.start_address_ = static_cast<uint16_t>(addr >> 4);
  desc.bitfield.leading_byte_offset_ = 1;
  desc.bitfield.stride_byte_offset_ = 1024 >> 4;
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = 1;  // SWIZZLE_128B
  return desc.desc_;
}

// Thread-block clusters (sm90). cluster_sync: every CTA's shared-memory writes before it are
// visible to the cluster after it (release / acquire). cluster_sync_relaxed: only keeps every CTA
// until the others arrive (a CTA whose shared memory others still read must not exit first);
// no release, which would also wait for the CTA's global stores to drain.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
               "barrier.cluster.wait.aligned;" ::: "memory");
}
// The shared-memory address `addr` of this CTA, in the cluster's CTA `rank` (a shared::cluster
// address for ld.shared::cluster).
__device__ __forceinline__ uint32_t cluster_address(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}
__device__ __forceinline__ float load_cluster_f32(uint32_t remote) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace gemmgen::smem
