"""Ray's spilling under `skyriver bench spill`'s workload: an object store of S bytes, a working
set of 4xS at each size put with `ray.put`, then read back with `ray.get` in write order and in
a random order, in batches as the Skyriver side does. Prints one JSON document on stdout.

Run by `skyriver bench spill` when `ray` is importable:
    python3 ray_spill.py --memory BYTES --sizes B,B,... --spill-dir DIR --batch-bytes BYTES
"""
import argparse
import json
import os
import random
import sys
import time


def drop_caches():
    """As the Skyriver side does before each get phase (root only): reads come from the disk."""
    if os.geteuid() == 0:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
        except OSError:
            pass


def phase(objects, size, seconds):
    seconds = max(seconds, 1e-9)
    return {
        "objects": objects,
        "seconds": seconds,
        "objects_per_sec": objects / seconds,
        "mib_per_sec": objects * size / seconds / (1 << 20),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory", type=int, required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--spill-dir", required=True)
    parser.add_argument("--max-batch", type=int, default=256)
    args = parser.parse_args()
    import numpy as np
    import ray

    ray.init(
        num_cpus=1,
        object_store_memory=args.memory,
        include_dashboard=False,
        logging_level="ERROR",
        _system_config={
            # The bench checked the free space itself; Ray's own check refuses to spill on a
            # disk over 95% used, however much is free.
            "local_fs_capacity_threshold": 1.0,
            "object_spilling_config": json.dumps(
                {"type": "filesystem", "params": {"directory_path": args.spill_dir}}
            ),
        },
    )
    results = []
    working_set = 4 * args.memory
    for size in [int(s) for s in args.sizes.split(",")]:
        count = max(working_set // size, 1)
        batch = int(min(max(working_set // 16 // size, 1), args.max_batch))
        buffer = np.arange(size, dtype=np.uint64).astype(np.uint8)
        started = time.perf_counter()
        refs = []
        for n in range(count):
            buffer[0] = n % 251
            refs.append(ray.put(buffer))
        write = phase(count, size, time.perf_counter() - started)

        def get_all(order):
            for at in range(0, len(order), batch):
                chunk = order[at:at + batch]
                values = ray.get([refs[n] for n in chunk])
                for n, value in zip(chunk, values):
                    if len(value) != size or value[0] != n % 251:
                        raise SystemExit(f"ray returned other bytes for object {n} of {size}")
                del values

        order = list(range(count))
        drop_caches()
        started = time.perf_counter()
        get_all(order)
        sequential = phase(count, size, time.perf_counter() - started)
        random.Random(size).shuffle(order)
        drop_caches()
        started = time.perf_counter()
        get_all(order)
        shuffled = phase(count, size, time.perf_counter() - started)
        del refs
        results.append({
            "size_bytes": size,
            "objects": count,
            "get_batch": batch,
            "write": write,
            "get_sequential": sequential,
            "get_random": shuffled,
        })
        print(f"ray: {size} bytes done", file=sys.stderr, flush=True)
    ray.shutdown()
    json.dump({"ray_version": ray.__version__, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
