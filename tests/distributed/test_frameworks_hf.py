"""A Hugging Face ``Trainer`` fine-tune, as its docs write it, in a ``%%distributed`` cell on 2 gloo ranks.

The model is a tiny ``BertConfig`` built in code (no download). The Trainer must join the cell's job (world size 2,
process index = rank), shard the data between the ranks (each trains on its own half) and keep the replicas
identical (DDP), exactly as under ``torchrun --nproc_per_node 2``.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

N_SAMPLES = 32  # 2 ranks x 4 per device x 4 steps: one epoch, each rank a disjoint half

HF_CELL = """%%distributed -o hf
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import hashlib


def digest(module):
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


seen = []  # the indices this rank's Trainer fetched: the test's window on the sharding


class TinyTextDataset(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(1, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        seen.append(int(i))
        return {{"input_ids": self.input_ids[i], "attention_mask": torch.ones(12, dtype=torch.long),
                "labels": self.labels[i]}}


config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=37, max_position_embeddings=32)
model = BertForSequenceClassification(config)
before = digest(model)
args = TrainingArguments(
    output_dir={out!r},
    per_device_train_batch_size=4,
    max_steps=4,
    learning_rate=1e-3,
    use_cpu=True,
    report_to=[],
    save_strategy="no",
    logging_strategy="no",
    disable_tqdm=True,
)
trainer = Trainer(model=model, args=args, train_dataset=TinyTextDataset({n}))
result = trainer.train()

(trainer.args.world_size, trainer.args.process_index, trainer.args.parallel_mode.value,
 trainer.state.global_step, sorted(seen), before, digest(model), type(trainer.model_wrapped).__name__)
"""


def test_a_hugging_face_trainer_fine_tune_joins_the_cells_job(ip, shared, tmp_path):
    res = ip.run_cell(HF_CELL.format(out=str(tmp_path / "hf-out"), n=N_SAMPLES))
    assert res.success, res.error_in_exec and "\n".join(res.error_in_exec._render_traceback_())
    first, second = ip.user_ns["hf"]
    (w0, p0, mode0, steps0, seen0, b0, d0, wrap0) = first
    (w1, p1, mode1, steps1, seen1, b1, d1, wrap1) = second
    assert (w0, w1) == (2, 2)  # the Trainer's world is the cell's
    assert (p0, p1) == (0, 1)  # its process index is the rank
    assert mode0 == mode1 == "distributed"
    assert steps0 == steps1 == 4
    assert wrap0 == wrap1 == "DistributedDataParallel"
    # each rank trained on its own half of the data: disjoint, together the whole dataset
    assert len(seen0) == len(seen1) == N_SAMPLES // 2
    assert set(seen0).isdisjoint(seen1) and set(seen0) | set(seen1) == set(range(N_SAMPLES))
    assert d0 == d1  # DDP kept the two replicas identical
    assert d0 != b0 and d1 != b1  # ...and they did train
