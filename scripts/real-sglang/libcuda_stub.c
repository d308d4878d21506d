/*
 * A stand-in for the NVIDIA driver library (libcuda.so.1) on a machine without a GPU.
 *
 * PyPI's sglang-kernel is built for CUDA only, and SGLang 0.5.23 imports it even with
 * SGLANG_USE_CPU_ENGINE=1; its extension modules link a few driver symbols, so without a
 * libcuda.so.1 the import fails ("ImportError: libcuda.so.1: cannot open shared object file").
 * Every function here answers CUDA_ERROR_NO_DEVICE (100): torch.cuda.is_available() stays false,
 * and the CPU path (--device cpu --attention-backend torch_native) never calls them.
 *
 * The names are the undefined `cu*` symbols of sglang-kernel 0.4.10's extension modules
 * (`nm -D --undefined-only`); scripts/setup builds this file with gcc and puts the library on
 * the real-server units' LD_LIBRARY_PATH only.
 */
#define NO_DEVICE 100
#define STUB(name) int name(void) { return NO_DEVICE; }

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuGetErrorString)
STUB(cuGetProcAddress_v2)
STUB(cuPointerGetAttribute)
STUB(cuStreamCreate)
STUB(cuCtxPushCurrent_v2)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxFromGreenCtx)
STUB(cuDevResourceGenerateDesc)
STUB(cuDevSmResourceSplitByCount)
STUB(cuDeviceGetDevResource)
STUB(cuGreenCtxCreate)
STUB(cuGreenCtxDestroy)
STUB(cuGreenCtxGetDevResource)
