"""A tiny `TrainTask` for the loop's tests (linear regression with dropout), runnable as a script:

    python -m tests.train.loop_fixtures OUT STEPS [grad_accum] [sleep_s] [stop_after]   (also under torchrun: DDP; no dropout)

writes OUT/state.safetensors (resumable; rank 0 writes it, every rank resumes from it) and, at the end, OUT/weights-rank<R>.safetensors and OUT/log-rank<R>.txt.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from specgen.train.loop import At, Loop, LoopOptions, Optim, StateFile, TrainTask

TRUE_W = torch.tensor([[1.0, -2.0, 0.5, 3.0]])


class Regression(TrainTask):
    """y = x @ TRUE_W.T + noise; the data of a step is a function of the step; dropout draws from the global RNG."""

    def __init__(self, batch_size: int = 4, lr: float = 0.02, sleep: float = 0.0, dropout: float = 0.1) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(4, 1))
        self.b, self.sleep, self.evals = batch_size, sleep, []
        self.modules = {"model": self.model}
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.optims = {"optim": Optim(opt, lambda s: lr * (1 - s / 100), grad_clip=1.0)}

    def batch(self, at: At):
        g = torch.Generator().manual_seed(1000 + at.step)
        x = torch.randn(at.shards * self.b, 4, generator=g)
        y = x @ TRUE_W.T + 0.01 * torch.randn(at.shards * self.b, 1, generator=g)
        keep = slice(at.shard * self.b, (at.shard + 1) * self.b)
        return x[keep], y[keep]

    def loss(self, batch):
        if self.sleep:
            time.sleep(self.sleep)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        return loss, {"loss": float(loss.detach())}

    def evaluate(self, progress):
        self.evals.append(progress.step)
        return {"step": progress.step, "w0": round(float(self.model[1].weight[0, 0].detach()), 4)}


def main(out: str, steps: int, accum: int = 1, sleep: float = 0.0, stop_after: int = 0) -> None:
    from safetensors.torch import save_file

    out_dir = Path(out)
    lines: list[str] = []
    loop = Loop(LoopOptions(steps=steps, stop_after=stop_after, grad_accum=accum, log_every=1, ckpt_every=1),
                lines.append)
    task = Regression(sleep=sleep, dropout=0.0)
    progress = loop.run(task, StateFile(out_dir / "state.safetensors"))  # one state: rank 0 writes, every rank reads
    state = {k: v.contiguous() for k, v in task.model.state_dict().items()}
    save_file(state, str(out_dir / f"weights-rank{loop.rank}.safetensors"))
    (out_dir / f"log-rank{loop.rank}.txt").write_text("\n".join(lines + [f"world {loop.world} step {progress.step}"]))


if __name__ == "__main__":
    args = sys.argv[1:] + ["1", "0", "0"][len(sys.argv) - 3:]
    main(args[0], int(args[1]), int(args[2]), float(args[3]), int(args[4]))
