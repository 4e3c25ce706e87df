import cupy, numpy as np
bits = np.arange(65536, dtype=np.uint16).view(np.float16)
x = bits[np.isfinite(bits)]
for n in (3, 5, 7):
    host = np.true_divide(x, n, dtype=np.float16)
    dev = cupy.asnumpy(cupy.true_divide(cupy.asarray(x), n))
    out = cupy.empty(x.size, cupy.float16); cupy.true_divide(cupy.asarray(x), n, out=out)
    k = cupy.ElementwiseKernel("float32 d", "float16 y", "y = (float16)((float)y / d)", "k")
    y = cupy.asarray(x); k(np.float32(n), y)
    both = lambda a: int(np.sum(a.view(np.uint16) != host.view(np.uint16)))
    print(f"float16 / {n}: cupy true_divide differs from numpy in {both(dev)} of {x.size}, with out= {both(cupy.asnumpy(out))}, float32 kernel {both(cupy.asnumpy(y))}; dtype {dev.dtype}")
