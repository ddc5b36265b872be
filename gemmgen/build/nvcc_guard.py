"""Run one nvcc command and fail it on warnings that mean a silently slow kernel.

ptxas warning C7510 ("wgmma ... serialized") means the kernel's tensor-core pipeline was
serialized: correct but far slower. It is an error unless --allow-wgmma-serialization is given.
Runs as a plain script from build.ninja (stdlib only, nothing of gemmgen imported).
"""

import subprocess
import sys
from pathlib import Path

SERIALIZED_WGMMA = "C7510"


def main(argv: list[str]) -> int:
    allow = "--allow-wgmma-serialization" in argv[: argv.index("--")]
    command = argv[argv.index("--") + 1:]
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        return proc.returncode
    if SERIALIZED_WGMMA in proc.stdout and not allow:
        output = Path(command[command.index("-o") + 1])
        output.unlink(missing_ok=True)
        sys.stdout.write(f"gemmgen: error: ptxas warning {SERIALIZED_WGMMA} (wgmma serialized) in "
                         f"{output.name}: the kernel would be correct but silently slow. Change the "
                         "config, or pass --allow-wgmma-serialization to build it anyway.\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
