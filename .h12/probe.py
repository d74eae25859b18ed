import time, numpy as np, anyio, cupy
from concurrent.futures import ThreadPoolExecutor
import aiocubie._walk as w
n = 256 << 20
a = np.ones(n // 4, np.float32); b = np.empty_like(a); b[...] = 0
for threads in (1, 4, 8, 16):
    pool = ThreadPoolExecutor(threads)
    parts = np.array_split(np.arange(a.size), threads)
    def run():
        list(pool.map(lambda p: np.copyto(b[p[0]:p[-1]+1], a[p[0]:p[-1]+1]), parts))
    run(); t = time.perf_counter(); run(); dt = time.perf_counter() - t
    print(f"threads {threads}: {n/dt/1e9:.1f} GB/s")
async def viaw():
    await w._host_copy(b.reshape(-1, 1024), a.reshape(-1, 1024))
    t = time.perf_counter(); await w._host_copy(b.reshape(-1, 1024), a.reshape(-1, 1024)); dt = time.perf_counter() - t
    print(f"_host_copy ({w._COPY_THREADS} threads): {n/dt/1e9:.1f} GB/s")
anyio.run(viaw)
d1 = cupy.empty(n // 4, np.float32); d2 = cupy.zeros(n // 4, np.float32)
s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
for rep in range(2):
    cupy.cuda.Device().synchronize(); t = time.perf_counter()
    cupy.cuda.runtime.memcpyAsync(d1.data.ptr, a.ctypes.data, n, 4, s1.ptr)
    cupy.cuda.runtime.memcpyAsync(b.ctypes.data, d2.data.ptr, n, 4, s2.ptr)
    s1.synchronize(); s2.synchronize(); dt = time.perf_counter() - t
print(f"raw CUDA pageable both ways: {2*n/dt/1e9:.1f} GB/s")
