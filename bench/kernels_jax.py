"""JAX (CPU) baseline for the native-kernel call overhead benchmark.

Runs f(x) = fori_loop(0, iterations, v -> xn_increment(v), x) on an f32
scalar, where xn_increment is the XLA FFI handler from the kernel library
built by scripts/kernels.sh (or, with --no-kernel, v -> v + 1). Writes the
lowered module to --module-out so the node can run the identical program, and
prints one JSON line with the median timings. With --serve it instead times one
run per line read from stdin and answers each with the run's microseconds, so
that a benchmark can interleave JAX's runs with another runner's one by one.

Usage: PYTHONPATH=$JAX_DIR python3 bench/kernels_jax.py --library PATH \
           [--iterations 10000] [--repeats 20] [--module-out FILE] [--no-kernel] [--serve]
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", help="path of the kernel .so (not needed with --no-kernel)")
    parser.add_argument("--iterations", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--module-out", help="where to write the lowered StableHLO")
    parser.add_argument("--no-kernel", action="store_true", help="loop body v + 1, no FFI call")
    parser.add_argument("--serve", action="store_true",
                        help="time one run per line of stdin, answering with its microseconds")
    args = parser.parse_args()
    if not 0 <= args.iterations <= 2**24:
        parser.error("--iterations must be in [0, 2**24] (exact in f32)")

    if args.no_kernel:
        body = lambda i, v: v + jnp.float32(1)  # noqa: E731
    else:
        if not args.library:
            parser.error("--library is required unless --no-kernel is given")
        lib = ctypes.cdll.LoadLibrary(os.path.abspath(args.library))
        jax.ffi.register_ffi_target(
            "xn_increment", jax.ffi.pycapsule(lib.xn_increment), platform="cpu")
        increment = jax.ffi.ffi_call("xn_increment", jax.ShapeDtypeStruct((), jnp.float32))
        body = lambda i, v: increment(v)  # noqa: E731

    iterations = args.iterations

    def f(x):
        return jax.lax.fori_loop(0, iterations, body, x)

    x = np.float32(0.0)
    jitted = jax.jit(f)
    if args.module_out:
        with open(args.module_out, "w") as fh:
            fh.write(jitted.lower(x).as_text())

    result = jitted(x).block_until_ready()  # compile and warm up
    if args.serve:
        print("ready", flush=True)
        for _ in sys.stdin:
            start = time.perf_counter()
            jitted(x).block_until_ready()
            print(f"{(time.perf_counter() - start) * 1e6:.1f}", flush=True)
        return 0
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = jitted(x).block_until_ready()
        times.append(time.perf_counter() - start)

    expected = np.float32(x + iterations)
    if np.asarray(result) != expected:
        sys.exit(f"kernels_jax: wrong result {result}, expected {expected}")

    run_s = statistics.median(times)
    print(json.dumps({
        "per_iteration_us_median": run_s * 1e6 / max(iterations, 1),
        "run_ms_median": run_s * 1e3,
        "iterations": iterations,
        "repeats": args.repeats,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
