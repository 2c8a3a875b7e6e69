/*
 * A CPU-only stand-in for the CUDA driver library (libcuda.so.1), for the SGLang system tests.
 *
 * Why: SGLang 0.5.11 imports sgl_kernel unconditionally (mem_cache/memory_pool_host.py), and
 * PyPI's sglang-kernel 0.4.2 ships only CUDA builds of its ops library, which the dynamic loader
 * refuses to load without libcuda.so.1 (a driver file, absent on a machine without a GPU). With
 * SGLANG_USE_CPU_ENGINE=1 and --device cpu none of these entry points is ever called; each one
 * answers CUDA_ERROR_NO_DEVICE should anything try. These are exactly the driver symbols the ops
 * library imports (nm -D --undefined-only sgl_kernel/sm100/common_ops.abi3.so). torch still
 * reports torch.cuda.is_available() == False with this file on the library path.
 *
 * Built by scripts/install-sglang.sh into the SGLang venv; put on LD_LIBRARY_PATH by
 * tests/plugins/sglang.py only for the server it starts.
 */
#define CUDA_ERROR_NO_DEVICE 100

int cuGetErrorString(int error, const char **text) {
    (void)error;
    if (text) {
        *text = "no CUDA device (CPU-only driver stub)";
    }
    return 0;
}

int cuMemAddressFree(void) { return CUDA_ERROR_NO_DEVICE; }
int cuMemGetAddressRange_v2(void) { return CUDA_ERROR_NO_DEVICE; }
int cuMemRelease(void) { return CUDA_ERROR_NO_DEVICE; }
int cuMemRetainAllocationHandle(void) { return CUDA_ERROR_NO_DEVICE; }
int cuMemSetAccess(void) { return CUDA_ERROR_NO_DEVICE; }
int cuMemUnmap(void) { return CUDA_ERROR_NO_DEVICE; }
int cuPointerGetAttribute(void) { return CUDA_ERROR_NO_DEVICE; }
