"""The local runner's GPU assignment on this host's real GPUs (no test needs a GPU; run this
where there is one): ``python3 scripts/gpu_check.py`` from the checkout's root.

It starts, through the runner (and so its launcher), a job asking for every GPU
``nvidia-smi`` lists, which must see exactly those (``CUDA_VISIBLE_DEVICES`` and, when
PyTorch is installed, a matrix product on each); a job asking for one more GPU, which must be
refused while they are held; a job asking for none, which must see none; and, once the first
is deleted, a job asking for one, which must get one. Exits 1 on the first check that fails.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.getcwd())

from bastion.runners.base import Attempt, Handle, RunnerError, TryAgain, attempt_name
from bastion.runners.local import LocalRunner, detect_gpus

TORCH = (
    "python3 -c \"import torch; n = torch.cuda.device_count(); print('torch sees', n); "
    "[print(torch.cuda.get_device_name(i), float((torch.ones(1024, 1024, device=i) @ "
    'torch.ones(1024, 1024, device=i)).sum())) for i in range(n)]" 2>/dev/null || true'
)


def main() -> int:
    gpus = detect_gpus()
    if not gpus:
        print("no GPU here (nvidia-smi lists none): nothing to check")
        return 0
    work = tempfile.mkdtemp(prefix="bastion-gpu-check-")
    root = os.path.join(work, "root")
    os.makedirs(root)
    runner = LocalRunner(os.path.join(work, "attempts"), root=root)
    try:
        return check(runner, root, gpus)
    finally:
        runner.close()
        shutil.rmtree(work, ignore_errors=True)


def check(runner: LocalRunner, root: str, gpus: list[int]) -> int:
    def start(job: str, count: int, command: str) -> Handle:
        name = attempt_name(root, job, uuid.uuid4().hex[:8], 1, "run")
        attempt = Attempt(name, job, 1, command, env={}, resources={"gpu": count})
        return runner.start(attempt)

    def output(handle: Handle) -> str:
        deadline = time.time() + 300
        while not runner.poll(handle).finished:
            if time.time() > deadline:
                raise SystemExit(f"{handle['name']} did not finish in 300 s")
            time.sleep(0.1)
        return runner.read_output(handle, 0, 1 << 16).decode()

    def expect(ok: bool, what: str) -> None:
        print(("ok:   " if ok else "FAIL: ") + what)
        if not ok:
            raise SystemExit(1)

    every = start("all", len(gpus), f"echo CVD=$CUDA_VISIBLE_DEVICES; nvidia-smi -L; {TORCH}")
    try:
        start("one-more", 1, "true")
        expect(False, "a job asking for a GPU while all are held was started")
    except (RunnerError, TryAgain) as e:
        expect(True, f"a GPU job waits while all are held ({e})")
    none = start("none", 0, "echo CVD=[$CUDA_VISIBLE_DEVICES]")
    text = output(every)
    print(text)
    expect(f"CVD={','.join(map(str, gpus))}" in text, f"the job sees GPUs {gpus}")
    expect("CVD=[]" in output(none), "a job asking for no GPU sees none")
    while not runner.delete(every):
        time.sleep(0.2)
    one = output(start("one", 1, "echo CVD=$CUDA_VISIBLE_DEVICES"))
    expect(
        one.strip() in {f"CVD={g}" for g in gpus},
        f"once freed, a GPU is handed out ({one.strip()})",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
