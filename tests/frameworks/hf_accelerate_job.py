"""A tiny HF transformers model (GPT-2 built from a config: no download) trained with accelerate's DDP on CPU.

`accelerate launch --multi_gpu --num_processes 2 hf_accelerate_job.py` (gloo: no GPU here). Rank 1's loader
never returns at step 3 (`next_batch`); rank 0 then waits in DDP's gradient all-reduce inside `backward`.
"""

import threading
import time

# The hang clock runs from launch: start-up keeps talking until the model is prepared (the imports and DDP's
# set-up take longer than the test's --hang-timeout on a busy machine).
started = threading.Event()


def say_starting() -> None:
    print("importing torch, accelerate and transformers", flush=True)
    while not started.wait(1.0):
        print("starting", flush=True)


threading.Thread(target=say_starting, daemon=True).start()

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


def next_batch(step: int, rank: int) -> torch.Tensor:
    if rank == 1 and step == 3:
        time.sleep(3600)  # the stuck rank
    return torch.randint(0, 64, (2, 16))


acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = acc.prepare(model, opt)
started.set()
for step in range(20):
    ids = next_batch(step, acc.process_index)
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    acc.print(f"step {step} loss {loss.item():.3f}")
