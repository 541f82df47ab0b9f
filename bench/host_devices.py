"""`--host-devices N` for a bench script: XLA splits the CPU into N host devices. XLA reads its flags once, when
jax starts, so a script calls `split_cpu()` before it imports jax (this module imports no jax)."""

import argparse
import os
import sys


def split_cpu(default: int) -> int:
    """Read --host-devices (else `default`) from the command line and, above 1, set XLA_FLAGS to split the
    CPU into that many host devices. Returns the count; the script's own parser documents the option."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--host-devices", type=int, default=default)
    devices = pre.parse_known_args(sys.argv[1:])[0].host_devices
    if devices > 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    return devices
