/*
 * gemmgen/c_api.h — the plain C ABI every generated kernel library exports, whatever its op family.
 *
 * The library links neither Python nor torch: Python loads it with ctypes and passes raw device
 * pointers, strides and the current CUDA stream. Every kernel of every family has the same two
 * entry points over an opaque pointer to its family's argument struct (declared in the family's
 * own header, e.g. gemmgen/w8a8/scaled_mm_args.h), so the bindings need one ctypes prototype;
 * each family's struct size is exported once per library and checked at load.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define GEMMGEN_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes returned by every kernel entry point; gemmgen_last_error() has the details. */
enum gemmgen_status {
  GEMMGEN_OK = 0,
  GEMMGEN_CANNOT_IMPLEMENT = 1, /* CUTLASS can_implement() refused the problem (alignment, size) */
  GEMMGEN_WORKSPACE_TOO_SMALL = 2,
  GEMMGEN_INITIALIZE_FAILED = 3,
  GEMMGEN_LAUNCH_FAILED = 4,    /* the launch or a CUDA call before it failed */
  GEMMGEN_WRONG_ARCH = 5        /* the current device cannot run this kernel's SASS */
};

/* A family argument struct's `launch_flags`: launch as a programmatic dependent of the stream's
 * previous kernel (PDL, sm90; the kernels wait on the GPU before their first global access). */
#define GEMMGEN_LAUNCH_PDL 1

/* gemmgen_run_<kernel>(args, workspace, workspace_bytes, stream) and
 * gemmgen_workspace_<kernel>(args): `args` points to the kernel's family argument struct. */
typedef int (*gemmgen_run_fn)(const void* args, void* workspace, size_t workspace_bytes,
                              void* stream);
typedef size_t (*gemmgen_workspace_fn)(const void* args);

/* Exported once per library (library.cu), plus gemmgen_<family>_args_size() per family. */
GEMMGEN_EXPORT const char* gemmgen_last_error(void);
GEMMGEN_EXPORT const char* gemmgen_library_fingerprint(void);

#ifdef __cplusplus
}
#endif
