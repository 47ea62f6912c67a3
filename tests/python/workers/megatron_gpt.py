"""Worker of test_megatron_gpt: a real Megatron-Core GPTModel, PP 2 x DP 2 on 4 Gloo ranks.

Stage 0 (ranks 0, 1) holds the embedding and the first transformer layer, stage 1 (ranks
2, 3) the second layer, the output layer and the loss; Megatron-Core's own 1F1B schedule
(get_forward_backward_func) drives MICROBATCHES microbatches per step and the gradients
are all-reduced within each data-parallel group under Megatron's `all-grads-sync` timer.
Every rank's forward sleeps BASE_S per microbatch (a stage long against the scheduling
noise of 4 ranks on 2 cores); from each phase's first step on, the phase's slowed ranks
sleep SLOW x BASE_S. The analyzer is the product's default (megatron.install with the
pipeline comparison groups), reporting every INTERVAL steps to a JSONL file.

Rank 0 writes OUTPUT_JSON: {"phases": [{name, first, last, slowed}], "stage_of": [pp
stage per rank], "losses": {rank: [mean loss per step]} of the last stage's ranks,
"reports": [{step, status, skipped_samples, stages, device_ms, verdict: straggler/verdict/* metrics,
findings: [{rank, group, stage, state, cause, excess_ms}]}] read back from the JSONL sink, "step_s": every rank's
step times}.
Usage (under torchrun, 4 ranks): megatron_gpt.py OUTPUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist

from megatron_worker import finish_pp2, grads_finalize, start_pp2  # beside this file
from step_times import StepClock

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, MICRO_BATCH = 2, 32, 2, 16, 128, 2
MICROBATCHES = 4
BASE_S = 0.020
SLOW = 3.0  # +40 ms per microbatch, 160 ms per step: 4 ranks sharing 2 cores with other work
# stretch the stages they compute in by tens of ms (a rank sleeping longer leaves its peers
# more CPU); how small a slowdown is found is measured in benchmarks/, not here
INTERVAL, WARMUP = 2, 2
# (name, steps, slowed ranks): 7 healthy reports to learn the noise; a slowed rank for 12
# reports (confirming takes 3 to 8 in a row, more with more jitter), then 8 calm ones
# (recovering takes 3, or up to the 8 of the median a window-confirmed finding holds on
# to); the whole of stage 1 for 8 (imbalance takes 3).
PHASES = (("healthy", 16, ()), ("slow rank 1", 24, (1,)), ("recovery", 16, ()),
          ("slow rank 2", 24, (2,)), ("recovery", 16, ()), ("slow stage 1", 16, (2, 3)))


def gpt_chunk(layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB,
              seq: int = SEQ) -> torch.nn.Module:
    """This rank's pipeline chunk of a tiny GPTModel (local layer spec, no dropout)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32, batch_p2p_comm=False,
                               hidden_dropout=0.0, attention_dropout=0.0)
    # Untied output weights: tied ones would need the first / last stage embedding group.
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=vocab,
                    max_sequence_length=seq, pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage(),
                    share_embeddings_and_output_weights=False)


def microbatches(dp_rank: int, count: int = MICROBATCHES, seq_len: int = SEQ,
                 vocab: int = VOCAB) -> list[dict[str, torch.Tensor]]:
    """The data-parallel rank's fixed microbatches (both stages of a pipeline read the same):
    tokens, next-token labels, positions and the causal mask (True = masked)."""
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1).view(1, 1, seq_len, seq_len)
    positions = torch.arange(seq_len).unsqueeze(0).expand(MICRO_BATCH, seq_len)
    out = []
    for _ in range(count):
        seq = torch.randint(0, vocab, (MICRO_BATCH, seq_len + 1), generator=gen)
        out.append({"tokens": seq[:, :-1], "labels": seq[:, 1:], "position_ids": positions, "attention_mask": mask})
    return out


def forward_step(data: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module):
    """Megatron's forward_step_func: the chunk's output and, on the last stage, the loss."""
    batch = next(data)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])

    def loss_func(per_token: torch.Tensor):
        loss = per_token.float().mean()
        return loss, {"lm loss": loss.detach()}

    return output, loss_func


def verdicts(jsonl: str) -> list[dict[str, Any]]:
    """The confirmed verdict of every report in the JSONL sink's file."""
    reports = []
    with open(jsonl) as fh:
        for line in fh:
            r = json.loads(line)
            reports.append({"step": r["step"], "status": r["verdict"]["status"],
                            "skipped_samples": r["metrics"]["straggler/skipped_samples"],
                            "stages": r["stages"], "device_ms": r["device_ms"],
                            "verdict": {k: v for k, v in r["metrics"].items() if k.startswith("straggler/verdict/")},
                            "findings": [{k: f[k] for k in ("rank", "group", "stage", "state", "cause")}
                                         | {"excess_ms": f["facts"]["excess_ms"]} for f in r["verdict"]["findings"]]})
    return reports


def main() -> None:
    out = sys.argv[1]
    rank = start_pp2()

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_straggler import StragglerConfig
    from relax_straggler.integrations import megatron

    model = gpt_chunk()
    model.config.finalize_model_grads_func = grads_finalize(parallel_state.get_data_parallel_group)
    delay = [BASE_S]
    model.register_forward_pre_hook(lambda module, args: time.sleep(delay[0]))  # this rank's forward
    jsonl = os.path.join(os.path.dirname(os.path.abspath(out)), "straggler.jsonl")
    if rank == 0 and os.path.exists(jsonl):
        os.remove(jsonl)  # the sink appends; only the metrics rank (0) writes it
    analysis = megatron.install(model, None, config=StragglerConfig(enabled=True, interval=INTERVAL,
                                                                    warmup_steps=WARMUP, jsonl_path=jsonl))
    data = microbatches(parallel_state.get_data_parallel_rank())
    fb = get_forward_backward_func()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    phases, losses, step = [], [], 0
    clock = StepClock()
    for name, steps, slowed in PHASES:
        phases.append({"name": name, "first": step, "last": step + steps - 1, "slowed": list(slowed)})
        delay[0] = SLOW * BASE_S if rank in slowed else BASE_S
        for _ in range(steps):
            with clock, analysis.train_step(step=step):
                result = fb(forward_step_func=forward_step, data_iterator=iter(data), model=model,
                            num_microbatches=MICROBATCHES, seq_length=SEQ, micro_batch_size=MICRO_BATCH,
                            forward_only=False)
                with analysis.section("optimizer"):
                    opt.step()
                opt.zero_grad()
            if result:  # the last stage: one loss dict per microbatch
                losses.append(sum(r["lm loss"].item() for r in result) / len(result))
            step += 1
    analysis.uninstall()
    stage_of: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(stage_of, parallel_state.get_pipeline_model_parallel_rank())
    every_loss: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every_loss, losses)
    step_s: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"phases": phases, "stage_of": stage_of, "reports": verdicts(jsonl), "step_s": step_s,
                       "losses": {str(r): v for r, v in enumerate(every_loss) if v}}, fh)
    finish_pp2()


if __name__ == "__main__":
    main()
